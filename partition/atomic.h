// Atomic level (paper §IV-A): one component per batch task; constant tasks join the components that use them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "graph/task_graph.h"
#include "partition/ids.h"
#include "partition/block_sequence.h"
#include "partition/options.h"
#include "partition/tensor_parallel.h"
#include "profiler/cost_table.h"

namespace apart {

struct AtomicComponent {
  TaskId batch_task;
  std::vector<TaskId> constant_tasks;  // replicated into this component, in topological order
  BlockCost cost;
};

struct AtomicGraph {
  std::vector<AtomicComponent> components;    // ordered by batch task id: a topological order
  std::vector<Transfer> transfers;            // between components (indices into components)
  std::vector<ValueId> transfer_values;       // the value of each transfer
  std::vector<ParamUse> params;               // every weight, with the components that read it
  int64_t graph_batch = 1;                    // batch size the graph's value bytes were bound at
  // The tensor-parallel regions found in the graph (once, here: the costs and plan.json both read them).
  std::shared_ptr<const TensorParallelRegions> tensor_parallel;
  size_t size() const { return components.size(); }
  const AtomicComponent& component(ComponentId c) const { return components[c.value()]; }
};

// Per-sample costs come from `costs` at its micro-batch size u0 (time ∝ u); when `costs_at_other_size` is
// given (a second table at u1 ≠ u0), times become affine fixed + per_sample·u fitted through both points,
// which keeps per-kernel overheads from shrinking with the micro-batch. Throws InvalidArgument on a table that
// does not match the graph, Infeasible when the graph has no batch task.
AtomicGraph build_atomic_graph(const TaskGraph& graph, const CostTable& costs, const AtomicOptions& options,
                               const CostTable* costs_at_other_size = nullptr);

// Blocks made of components: block_of[c] is the block of component c (block_of_component); blocks are numbered in topological order
// (every transfer goes from a block to the same or a later one).
struct BlockAssignment {
  std::vector<BlockId> block_of;  // indexed by ComponentId::value()
  uint32_t blocks = 0;
  BlockId block_of_component(ComponentId c) const { return block_of[c.value()]; }
};

// Aggregates components into the DP's block sequence. CHECKs that transfers only go forward.
BlockSequence make_block_sequence(const AtomicGraph& atomic, const BlockAssignment& assignment);

}  // namespace apart
