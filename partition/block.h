// Block level (paper §IV-B): multilevel coarsening of atomic components into k blocks whose quotient graph is
// acyclic, boundary refinement while uncoarsening, and compaction to k blocks.
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

struct BlockStatistics {
  int levels = 0;
  int moves = 0;             // boundary moves made by refinement
  double cut_bytes_per_sample = 0;
};

// Weights: a component's time at `reference_microbatch`; edges: its transfers' bytes. Blocks are numbered in
// a topological order of the quotient graph; every transfer goes forward (or stays inside a block).
BlockAssignment build_blocks(const AtomicGraph& atomic, int blocks, const BlockOptions& options,
                             double reference_microbatch, BlockStatistics* stats = nullptr);

// k when BlockOptions::blocks is 0 (docs/partitioning.md "Choice of k").
int automatic_block_count(size_t components, int devices);

}  // namespace apart
