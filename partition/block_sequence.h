// The stage DP's input: blocks in topological order with affine costs, and the values crossing them.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "partition/options.h"

namespace apart {

// A time that grows with the micro-batch size u: fixed_s + per_sample_s × u (seconds).
struct WorkCurve {
  double fixed_s = 0;
  double per_sample_s = 0;
  double at(double u) const { return fixed_s + per_sample_s * u; }
  WorkCurve& operator+=(const WorkCurve& o) {
    fixed_s += o.fixed_s;
    per_sample_s += o.per_sample_s;
    return *this;
  }
  WorkCurve& operator-=(const WorkCurve& o) {
    fixed_s -= o.fixed_s;
    per_sample_s -= o.per_sample_s;
    return *this;
  }
};

// What a tensor-parallel degree t changes in a block (partition/tensor_parallel.h, docs/cost-model.md "Tensor
// parallelism"): the work, saved activations and weights of its split tasks divide by t, and its regions'
// all-reduces run over the TP group. Parts of the block's totals (BlockCost), not additions to them.
struct TpWork {
  WorkCurve forward, backward;                 // the split tasks' share of the block's forward and backward
  double saved_per_sample = 0;                 // their saved activations (bytes per sample, fp32 as stored)
  int64_t param_bytes = 0;                     // the weights they read
  double forward_collective_per_sample = 0;    // bytes the regions' closing all-reduces carry (fp32 as stored)
  double backward_collective_per_sample = 0;   // bytes of the gradients of the regions' inputs, all-reduced
  int64_t forward_collectives = 0;             // how many of each per micro-batch (each pays the ring's latency)
  int64_t backward_collectives = 0;
  uint8_t refused = 0;  // bit i set: degree kTpDegrees[i + 1] (2, 4, 8) does not divide a region's heads/features
  // Sequence parallelism (Korthikanti et al., MLSys'23 §4.2.2): the replicated tasks between regions (norms, residual
  // adds, dropouts; TensorParallelRegions::between_regions), which it shards along the sequence.
  WorkCurve sp_forward, sp_backward;
  double sp_saved_per_sample = 0;
  // The regions' sequence length (TensorParallelRegions::sequence; 0 unknown): a degree that does not divide it
  // leaves the busiest rank ⌈L/t⌉ of L positions (tp_sequence_share). The same for every element: kept, not summed.
  int64_t sequence = 0;
  // Selective recomputation (§4.2.3): the attention cores (TpRegion::core_tasks), part of the split share above —
  // their forward, which a selective stage runs again before backward, and the saved bytes it then does not keep.
  WorkCurve core_forward;
  double core_saved_per_sample = 0;
  // Whether any task is split: without, a degree has nothing to divide (and sequence parallelism nothing to shard).
  bool splits_work() const { return forward.at(1) > 0 || backward.at(1) > 0 || param_bytes > 0; }
  TpWork& operator+=(const TpWork& o) {
    refused |= o.refused;
    sequence = std::max(sequence, o.sequence);
    return each(o, [](auto& a, const auto& b) { a += b; });
  }
  // The difference of two prefix sums: a range's shares. `refused` is left alone (it is no sum).
  TpWork& operator-=(const TpWork& o) {
    return each(o, [](auto& a, const auto& b) { a -= b; });
  }

 private:
  // Applies `op` to every summed field, paired with o's.
  template <class Op>
  TpWork& each(const TpWork& o, Op op) {
    op(forward, o.forward);
    op(backward, o.backward);
    op(sp_forward, o.sp_forward);
    op(sp_backward, o.sp_backward);
    op(sp_saved_per_sample, o.sp_saved_per_sample);
    op(core_forward, o.core_forward);
    op(core_saved_per_sample, o.core_saved_per_sample);
    op(saved_per_sample, o.saved_per_sample);
    op(param_bytes, o.param_bytes);
    op(forward_collective_per_sample, o.forward_collective_per_sample);
    op(backward_collective_per_sample, o.backward_collective_per_sample);
    op(forward_collectives, o.forward_collectives);
    op(backward_collectives, o.backward_collectives);
    return *this;
  }
};

// Prefix sums of a sequence's TpWork, with per degree the count of elements refusing it: any range's shares and
// refused degrees in O(1). StageEvaluator keeps one over blocks, the component-level cut search over components.
class TpPrefix {
 public:
  TpPrefix() : sums_(1), refusing_(1, std::array<uint32_t, kRefusable>{}) {}
  void push_back(const TpWork& w) {
    sums_.push_back(sums_.back());
    sums_.back() += w;
    refusing_.push_back(refusing_.back());
    for (size_t i = 0; i < kRefusable; ++i) refusing_.back()[i] += (w.refused >> i) & 1u;
  }
  // The elements [first, last): their summed shares, refused by any of them.
  TpWork range(size_t first, size_t last) const {
    TpWork r = sums_[last];
    r -= sums_[first];
    r.refused = refused(first, last);
    return r;
  }
  uint8_t refused(size_t first, size_t last) const {
    uint8_t bits = 0;
    for (size_t i = 0; i < kRefusable; ++i)
      if (refusing_[last][i] > refusing_[first][i]) bits |= static_cast<uint8_t>(1u << i);
    return bits;
  }

 private:
  static constexpr size_t kRefusable = std::size(kTpDegrees) - 1;  // degree 1 is never refused
  std::vector<TpWork> sums_;
  std::vector<std::array<uint32_t, kRefusable>> refusing_;
};

// Aggregated costs of one block (or atomic component) per micro-batch.
// The share of a weight-reading task's backward that is its weight gradient: for a MatMul, Gemm or Conv, dW and dX
// cost the same FLOPs (docs/cost-model.md §2). ZB-H1 runs that share as the deferred W pass.
inline constexpr double kWeightGradientShare = 0.5;

struct BlockCost {
  WorkCurve forward;
  WorkCurve backward;
  // The weight-gradient part of `backward` (ZB-H1's W pass): half the backward of each task that reads weights
  // (a MatMul/Gemm/Conv's dW costs the FLOPs of its dX), none of the others' (docs/cost-model.md §2).
  WorkCurve backward_weight;
  int64_t param_bytes = 0;         // distinct weights the block reads (as stored in the model)
  double saved_per_sample = 0;     // bytes kept for backward per sample
  double workspace_per_sample = 0; // transient working set per sample (largest task)
  double workspace_fixed = 0;
  int64_t largest_task_param_bytes = 0;  // the most weights one task reads: ZeRO-3 gathers one task's at a time
  TpWork tp;                             // the part a tensor-parallel degree divides, and its collectives
};

// A value produced in one block and read in later blocks. Sent once to each later stage reading it.
struct Transfer {
  uint32_t producer = 0;               // block index
  std::vector<uint32_t> consumers;     // block indices, sorted, all > producer
  double bytes_per_sample = 0;
};

// A weight and the blocks that read it: a stage holds it once however many of its blocks read it
// (tied embeddings, shared layers). Without any ParamUse, each block's param_bytes counts as its own.
struct ParamUse {
  int64_t bytes = 0;
  std::vector<uint32_t> readers;  // block (or component) indices, sorted, unique
};

struct BlockSequence {
  std::vector<BlockCost> blocks;      // in topological order
  std::vector<Transfer> transfers;
  std::vector<ParamUse> params;
  size_t size() const { return blocks.size(); }
};

}  // namespace apart
