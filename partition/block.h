// Block level (paper §IV-B): multilevel coarsening of atomic components into k blocks whose quotient graph is
// acyclic, balanced in time and in memory (METIS-style multi-constraint, ncon = 2), boundary refinement while
// uncoarsening.
#pragma once

#include <cstdint>
#include <vector>

#include "partition/atomic.h"
#include "partition/options.h"

namespace apart {

// One level of the hierarchy: cluster_of[c] maps a node of the finer level to a node of this level.
struct CoarseLevel {
  std::vector<uint32_t> parent_of;  // finer node → node of this level
  uint32_t nodes = 0;
};

// The two weights a block is balanced in, both at the reference micro-batch u (docs/partitioning.md):
// time = forward + backward seconds; memory = distinct weight bytes × state_bytes_per_param_byte (weights,
// gradients, optimizer state) + saved activation bytes × u. The stage cost model's own formulas
// (stage_cost.cpp), without the in-flight count and the workspace, which depend on the stage.
struct BlockWeight {
  double time_s = 0;
  double memory_bytes = 0;
};

// What one block may weigh: balance_cap × total / k in each constraint (0 = no limit: the total is 0).
struct BlockCaps {
  double time_s = 0;
  double memory_bytes = 0;
  bool admits(const BlockWeight& w) const {
    return (time_s <= 0 || w.time_s <= time_s) && (memory_bytes <= 0 || w.memory_bytes <= memory_bytes);
  }
  // The larger of the two fractions of the caps: > 1 when a cap is exceeded.
  double load(const BlockWeight& w) const;
};

struct BlockStatistics {
  int levels = 0;
  int moves = 0;             // boundary moves made by refinement
  double cut_bytes_per_sample = 0;
  BlockCaps caps;
  double max_load = 0;       // the heaviest block's BlockCaps::load
  bool rebalanced = false;   // the multilevel blocks broke a cap and the contiguous fallback replaced them
};

// Weights per component, and of any set of components (a weight read by several counts once).
BlockWeight block_weight_of(const AtomicGraph& atomic, const std::vector<uint32_t>& components,
                            const TrainingSpec& training, double reference_microbatch);
std::vector<BlockWeight> block_weights(const AtomicGraph& atomic, const BlockAssignment& assignment,
                                       const TrainingSpec& training, double reference_microbatch);
BlockCaps block_caps(const AtomicGraph& atomic, int blocks, const BlockOptions& options, const TrainingSpec& training,
                     double reference_microbatch);

// Edges: the transfers' bytes. Blocks are numbered in a topological order of the quotient graph; every transfer
// goes forward (or stays inside a block). Every block is within both caps (block_caps) whenever some split of
// the components' order into k contiguous runs is; deterministic.
BlockAssignment build_blocks(const AtomicGraph& atomic, int blocks, const BlockOptions& options,
                             const TrainingSpec& training, double reference_microbatch,
                             BlockStatistics* stats = nullptr);

// k when BlockOptions::blocks is 0 (docs/partitioning.md "Choice of k").
int automatic_block_count(size_t components, int devices);

}  // namespace apart
