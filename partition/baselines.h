// Published partitioners as baselines on apart's own cost model, as splits of the component chain: uniform,
// params, torchgpipe's balance_by_time, PipeDream's replication DP, METIS k-way with cycle repair. Leaves of
// partition/: the phases (phases.h) run them; the method dispatch and the comparison are in methods.h.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "partition/atomic.h"
#include "partition/options.h"
#include "partition/stage_cost.h"

namespace apart {

// Baseline splits of the component sequence into S stages (same cost model and memory check afterwards):
// uniform: equal numbers of components (Megatron's even layer split); params: equal parameter bytes
// (DeepSpeed's partition_method="parameters"); gpipe-balance: torchgpipe's balance_by_time of the components'
// times at `microbatch`. Returns a block assignment with S blocks.
BlockAssignment baseline_split(const AtomicGraph& atomic, Method method, int stages, double microbatch = 1);

// Forward + backward seconds of every component at micro-batch size u (the chain's "layer times").
std::vector<double> component_times(const AtomicGraph& atomic, double microbatch);

// ---------------- torchgpipe balance_by_time ----------------
// torchgpipe.balance.blockpartition.solve (Bárány et al., "Block partitions of sequences", 2015): normalise the
// costs to [0, 1], start from equal counts, and repeatedly move one element towards the lightest block nearest
// the heaviest until max ≤ min + 1 (one normalised element). Returns the sizes of the `parts` contiguous blocks
// (each ≥ 1; the sizes are torchgpipe's `balance`). Requires 1 ≤ parts ≤ costs.size().
std::vector<size_t> block_partition(const std::vector<double>& costs, int parts);

// balance_by_time over the component chain at micro-batch `microbatch`: S contiguous blocks.
BlockAssignment gpipe_balance_split(const AtomicGraph& atomic, int stages, double microbatch);

// ---------------- PipeDream (Narayanan et al., SOSP 2019, §3.1) ----------------
// A chain of n layers on `units` workers. The DP's costs, as PipeDream's optimizer defines them:
//   stage_s(i, j, r): T(i→j, r) = max(Σ compute of layers [i, j), all-reduce of their weights over r) / r
//   comm_s(i):        2 · C_i, activations out of layer i−1 and their gradients (cut before layer i)
//   fits(i, j, r):    the optimizer's memory check for the stage (PipeDream's --memory_size)
struct PipeDreamCosts {
  size_t layers = 0;
  int units = 1;  // workers; a replica count r is in units
  std::function<double(size_t, size_t, int)> stage_s;
  std::function<double(size_t)> comm_s;
  std::function<bool(size_t, size_t, int)> fits;
};
struct PipeDreamSplit {
  std::vector<size_t> boundaries;  // S + 1 layer indices, 0 … n
  std::vector<int> replicas;       // per stage, in units
  double bottleneck_s = 0;         // A(n, units used): the slowest of stage times and cut communications
};
// A(j, u) = min( T(0→j, u), min_{i<j, 1≤r<u} max(A(i, u−r), comm(i), T(i→j, r)) ), optimal over every
// contiguous split × replica vector using at most `units` workers (ties: fewer workers, then fewer stages).
// Returns an empty split when nothing fits.
PipeDreamSplit pipedream_dp(const PipeDreamCosts& costs);

// PipeDream on the component chain: contiguous groups of about equal time become the layers (all components
// when there are ≤ max_layers), workers are units of ⌈devices / max_units⌉ devices (PipeDream's hierarchical
// planner likewise treats a server as one worker at the upper level). Costs at micro-batch `microbatch` (the
// minibatch of one worker): T = forward + backward of the layers; C_i = bytes crossing a cut before layer i over
// the pipeline link; W = the stage's ring all-reduce over r·unit devices amortised over the minibatches of one
// iteration, B / (microbatch · r · unit); fits = weights + gradients + optimizer state + one minibatch's saved
// activations + workspace ≤ device memory.
struct PipeDreamPlan {
  BlockAssignment layers;  // component → layer
  PipeDreamSplit split;    // over layers; replicas in devices (units × unit)
  int unit = 1;
};
PipeDreamPlan pipedream_split(const AtomicGraph& atomic, const Cluster& cluster, const TrainingSpec& training,
                              double microbatch, int max_layers = 128, int max_units = 64);

// ---------------- METIS k-way + cycle repair ----------------
// METIS_PartGraphKway on the undirected component graph (vertex weight = time at `microbatch`, integerised;
// edge weight = transfer bytes per sample, integerised), then repair_part_order(). Deterministic (fixed seed).
BlockAssignment metis_blocks(const AtomicGraph& atomic, int parts, double microbatch);

// Makes a part labelling of a DAG whose nodes are numbered in topological order acyclic between parts:
// 1. rank the parts by the mean topological index of their nodes (ties: lower part id first);
// 2. in topological order, every node goes to max(rank of its own part, part of every predecessor), i.e. a node
//    only ever moves to a later part, and only when a predecessor already sits later;
// 3. renumber the non-empty parts 0…k'−1 in rank order.
// Every edge then goes to an equal or later part. `edges` are (from, to) with from < to.
BlockAssignment repair_part_order(size_t nodes, const std::vector<std::pair<uint32_t, uint32_t>>& edges,
                                  const std::vector<uint32_t>& part_of);

}  // namespace apart
