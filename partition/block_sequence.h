// The stage DP's input: blocks in topological order with affine costs, and the values crossing them.
#pragma once

#include <cstdint>
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
};

// Aggregated costs of one block (or atomic component) per micro-batch.
struct BlockCost {
  WorkCurve forward;
  WorkCurve backward;
  int64_t param_bytes = 0;         // distinct weights the block reads (as stored in the model)
  double saved_per_sample = 0;     // bytes kept for backward per sample
  double workspace_per_sample = 0; // transient working set per sample (largest task)
  double workspace_fixed = 0;
  int64_t largest_task_param_bytes = 0;  // the most weights one task reads: ZeRO-3 gathers one task's at a time
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
