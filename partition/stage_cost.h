// The stage-level cost model (paper §IV-C, function h): time, communication, all-reduce and memory of
// one stage B(i..j-1) with sd replicas, and the analytic pipeline-time estimate.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "partition/block_sequence.h"
#include "partition/options.h"
#include "profiler/memory_model.h"

namespace apart {

// What a stage costs for one micro-batch step, at per-replica micro-batch size `microbatch`.
struct StageCost {
  double compute_s = 0;     // forward + backward (+ recomputed forward)
  double forward_s = 0;
  double backward_s = 0;    // includes the recomputed forward (recompute_s)
  double recompute_s = 0;   // the forward work backward_s runs again: forward_s (full), the attention cores (selective)
  double backward_weight_s = 0;  // the weight-gradient part of backward_s (ZB-H1's W pass; BlockCost)
  double comm_s = 0;        // boundary transfers: activations in/out and their gradients
  double allreduce_s = 0;   // gradient all-reduce among the replicas, once per iteration (ZeRO: the collectives
                            // after the pipeline, see stage_cost.cpp)
  double allreduce_exposed_s = 0;  // the part of it not hidden behind the last backward (TrainingSpec)
  double zero_collective_s = 0;    // ZeRO-2/3: per micro-batch collectives beside forward/backward (all of them)
  int zero = 0;             // the ZeRO stage costed (effective: 0 with one replica)
  int tp = 1;               // the tensor-parallel degree costed: each replica is a group of tp devices
  bool sequence_parallel = false;  // tp > 1 under TrainingSpec::sequence_parallel
  int boundary_parts = 1;   // the slices each boundary value travels in: tp where the stage splits work, else 1
  RecomputeScope recompute = RecomputeScope::kNone;
  double step_s = 0;        // compute + comm: one pipeline step
  double optimizer_s = 0;   // the optimizer step after the all-reduce, once per iteration (memory-bound)
  double h = 0;             // the DP's objective term: step + (exposed all-reduce + optimizer step) / m
  int64_t memory_bytes = 0; // peak bytes on one device: ceil(memory_static + in_flight × memory_per_in_flight)
  double memory_static = 0;       // state + workspace (+ one recomputed micro-batch's saved bytes)
  double memory_per_in_flight = 0;  // activation bytes kept per in-flight micro-batch
  int64_t param_bytes = 0;
  int64_t microbatch = 0;   // samples per replica per micro-batch
  double in_bytes = 0;      // boundary bytes received per micro-batch
  double out_bytes = 0;     // boundary bytes sent per micro-batch
};

// The share of a boundary value one device of a stage sends or receives on the pipeline's link: each device of a
// tensor-parallel group that splits work sends 1/tp of it (Megatron-LM's scatter/gather, Narayanan et al. SC21
// §4.1; under sequence parallelism the sequence shard it holds), and the receiver all-gathers the slices over the
// group's own link where it needs them whole (stage_cost()). A group without split work runs as degree 1 does.
inline double boundary_share(const StageCost& c) { return 1.0 / c.boundary_parts; }
// The samples of a boundary value one device sends or receives per micro-batch: its micro-batch's, times that share.
inline double boundary_samples(const StageCost& c) { return static_cast<double>(c.microbatch) * boundary_share(c); }

// The links of one placed stage: to the previous and next stage (activations forward, their gradients back)
// and among its replicas (the gradient all-reduce ring).
struct StageLinks {
  Link previous, next, replicas;
  Link tensor;  // among a tensor-parallel group's devices: inside one node (DESIGN.md: a TP group never straddles one)
  double memory_bandwidth = 0;  // bytes/s of each device's own memory, which the optimizer step streams through
};

// How stages and replicas map onto nodes (partition/placement.h places devices by it). Before placement the
// DP assumes the links the layout aims for:
//   stage-major:    a stage's replicas sit side by side, inside one node when they fit (all-reduce over NVLink
//                   for ≤ devices-per-node replicas); neighbouring stages talk across nodes unless the job is one node.
//   pipeline-major: each pipeline replica (one device of every stage) fills consecutive devices of one node
//                   (boundary transfers over NVLink); a stage's replicas are in different nodes.
enum class Layout : uint8_t { kStageMajor, kPipelineMajor };
std::string_view layout_name(Layout layout);

// What one stage's cost depends on, summed over its blocks [first, last): times as curves in the micro-batch size,
// bytes per sample as the graph stores them (fp32), weights counted once however many of its blocks read them.
struct StageRange {
  WorkCurve forward;
  WorkCurve backward;
  WorkCurve backward_weight;  // the weight-gradient part of backward
  double saved_per_sample = 0;
  double in_per_sample = 0;   // boundary values received from earlier stages
  double out_per_sample = 0;  // boundary values sent to later stages
  int64_t param_bytes = 0;    // distinct weights
  double workspace_per_sample = 0;  // the largest working set among its blocks
  double workspace_fixed = 0;
  int64_t largest_task_param_bytes = 0;  // among its blocks (ZeRO-3's gathered working set)
  TpWork tp;                  // its blocks' tensor-parallel shares (refused: any block's)
};

// Whether every block of `range` allows tensor-parallel degree `tp` (1 always; 2, 4, 8 when no region's heads or
// features refuse it).
bool tp_allows(const StageRange& range, int tp);
// Seconds one device of a tensor-parallel group of `tp` spends on work of `total_s` whose split tasks take `split_s`
// (the group's devices run 1/tp of those each); without the group's collectives.
double tp_device_time(double total_s, double split_s, int tp);

// The stage cost model h (paper §IV-C) of one range with `replicas` replicas over `links`: the one formula, which
// StageEvaluator evaluates over block ranges and the component-level cut search (stage_refine.cpp) over runs of
// components. `zero`: the ZeRO stage (0..3) its replicas shard with (profiler/memory_model.h; a 1-replica stage
// runs as stage 0). `tp`: each replica is a tensor-parallel group of `tp` devices (1, 2, 4 or 8, one tp_allows;
// InvalidArgument otherwise): the split tasks' work, saved bytes and weights divide by it, and the regions'
// all-reduces run over links.tensor inside the forward and backward (docs/cost-model.md "Tensor parallelism");
// under training.sequence_parallel the work, saved bytes and boundaries between regions divide by it too and each
// all-reduce is a reduce-scatter plus an all-gather. `recompute`: what backward runs again (recompute_s) and what
// the stage then does not keep per micro-batch in flight (docs/cost-model.md §4).
StageCost stage_cost(const StageRange& range, int replicas, int64_t microbatches, double in_flight,
                     RecomputeScope recompute, const StageLinks& links, const TrainingSpec& training, int zero = 0,
                     int tp = 1);
// The links `layout` assumes for a stage on `devices` devices (replicas × tensor-parallel degree) before devices are
// placed (see Layout): its replicas' rings stay inside a node when all its devices fit in one.
StageLinks assumed_links(const Cluster& cluster, Layout layout, int devices);
// Per-replica micro-batch size: ceil(B / m / replicas).
int64_t microbatch_size(int64_t global_batch, int64_t microbatches, int replicas);

// Evaluates stage costs over a block sequence in O(1) per call after O(k² + transfers·k) setup.
class StageEvaluator {
 public:
  StageEvaluator(const BlockSequence& seq, const Cluster& cluster, const TrainingSpec& training,
                 Layout layout = Layout::kStageMajor);

  size_t blocks() const { return k_; }
  // Stage = blocks [first, last) with `replicas` replicas; m micro-batches; `in_flight` micro-batches' activations
  // the stage keeps (profiler's stage_in_flight_activations: a fraction under interleaving).
  // `links`: the placed stage's links; without, the ones the layout assumes (see Layout). `zero`, `tp`: stage_cost's.
  StageCost evaluate(uint32_t first, uint32_t last, int replicas, int64_t microbatches, double in_flight,
                     RecomputeScope recompute, const StageLinks* links = nullptr, int zero = 0, int tp = 1) const;
  // The same for a range() already taken (the DP evaluates one range under many variants), unplaced.
  StageCost evaluate(const StageRange& range, int replicas, int64_t microbatches, double in_flight,
                     RecomputeScope recompute, int zero, int tp) const;
  // Whether every block of [first, last) allows tensor-parallel degree `tp` (tp_allows of its range, in O(1)).
  bool allows_tp(uint32_t first, uint32_t last, int tp) const;
  // The sums stage_cost takes for blocks [first, last).
  StageRange range(uint32_t first, uint32_t last) const;
  // The links the layout assumes for a stage on `devices` devices before they are placed.
  StageLinks assumed_links(int devices) const;
  // Per-replica micro-batch size: ceil(B / (m · replicas)).
  int64_t microbatch_size(int64_t microbatches, int replicas) const;
  double in_bytes_per_sample(uint32_t first, uint32_t last) const { return in_[first * (k_ + 1) + last]; }
  double out_bytes_per_sample(uint32_t first, uint32_t last) const { return out_[first * (k_ + 1) + last]; }
  // Sum over all blocks of per-sample forward+backward seconds: the compute lower bound's numerator.
  double total_per_sample_s() const;
  const Cluster& cluster() const { return cluster_; }
  const TrainingSpec& training() const { return training_; }
  Layout layout() const { return layout_; }

 private:
  size_t k_;
  Cluster cluster_;
  TrainingSpec training_;
  Layout layout_;
  // Prefix sums over blocks (index 0..k).
  std::vector<double> fwd_fixed_, fwd_ps_, bwd_fixed_, bwd_ps_, saved_ps_;
  std::vector<WorkCurve> bwd_weight_;  // prefix sums of BlockCost::backward_weight
  // Range tables, (k+1)×(k+1), row = first, column = last.
  std::vector<int64_t> params_;  // distinct weight bytes read by blocks [first, last)
  std::vector<double> in_, out_, ws_ps_max_, ws_fixed_max_;
  std::vector<int64_t> largest_task_params_max_;
  TpPrefix tp_;  // the blocks' TP shares and refused degrees
};

// The analytic pipeline estimate, in one place so a simulator can replace it (docs/cost-model.md, "Pipeline"):
// (m − 1) · max step + Σ steps + max exposed all-reduce + max optimizer step (the stages' replicas all-reduce, then
// step, concurrently at the end). Interleaved with `chunks` = v: each device's step grows by the transfers its
// chunks add (v − 1 more of its own, and on the first and last device the v − 1 wraps from the last device to the
// first, each carrying the last stage boundary's bytes as the simulator's do), and the fill shrinks v-fold:
// m · max step + (Σ steps − max step) / v, the bubble (p − 1)/(v · m) of the bottleneck on equal stages.
// ZB-H1 (Qi et al., ICLR 2024 §3.1): the deferred weight-gradient passes fill the bubble, each stage but the
// bottleneck adding step − W − min(W, F, B) (at least 0; B = backward − W) instead of its step: m · max step +
// Σ_{s ≠ bottleneck} max(0, step_s − W_s − min(W_s, F_s, B_s)), (p − 1)(T_F + T_B − min(T_W, T_F, T_B)) on equal
// stages (the paper's (p − 1)(T_F + T_B − T_W) when W is the shortest), where 1F1B has (p − 1)(T_F + T_B + T_W).
struct PipelineEstimate {
  double iteration_s = 0;
  double pipeline_s = 0;      // without all-reduce
  double bubble_fraction = 0; // idle share of the bottleneck stage's devices during the pipeline
  int bottleneck_stage = 0;
};
PipelineEstimate estimate_iteration_time(std::span<const StageCost> stages, int64_t microbatches, Schedule schedule,
                                         int chunks = 1);

// estimate_iteration_time(stages with one stage's cost replaced).iteration_s, for the many trials of
// spend_leftover_devices (stage_dp.h): O(1) per trial under GPipe and 1F1B, from the sum of the steps and the top two
// of each maximum the formula takes (equal to the full formula up to the rounding of that sum), the full formula
// otherwise (interleaved and ZB-H1 read which stage is first, last or the bottleneck).
class StageReplacementEstimate {
 public:
  StageReplacementEstimate(std::span<const StageCost> stages, int64_t microbatches, Schedule schedule, int chunks);
  // Starts again from `stages` (the same schedule), reusing the storage.
  void reset(std::span<const StageCost> stages);
  // Starts again from the current stages with one replaced: reset's result, from the kept figures.
  void replace(size_t stage, const StageCost& replacement);
  double iteration_s(size_t stage, const StageCost& replacement);
  // GPipe and 1F1B: estimate_iteration_time(the current stages).iteration_s, bit for bit (the same sums in the same
  // order); nullopt otherwise.
  std::optional<double> current_iteration_s() const;

 private:
  struct TopTwo {  // the largest value (first index on ties) and the largest at any other index
    double first = 0, second = 0;
    size_t at = 0;
    void add(double value, size_t index);
    static TopTwo of(const std::vector<double>& values);  // every value added in order
    double without(size_t index) const { return index == at ? second : first; }
    // values[index] becomes `value`: the same first, second and at as adding every value again (non-negative
    // values), in O(1) unless the old value was one of the two and fell.
    void replace(std::vector<double>& values, size_t index, double value);
  };
  static double sum_in_stage_order(const std::vector<double>& values);
  int64_t microbatches_;
  Schedule schedule_;
  int chunks_;
  bool closed_form_;
  double sum_steps_ = 0;
  std::vector<double> steps_, allreduces_, optimizers_;
  TopTwo step_, allreduce_, optimizer_;
  std::vector<StageCost> scratch_;  // the full formula's copy (interleaved, ZB-H1)
};

}  // namespace apart
