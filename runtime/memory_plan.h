// Static memory planner: one arena, a buffer per activation placed by liveness (greedy by size).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/task_graph.h"

namespace apart {

struct MemoryPlanOptions {
  int64_t alignment = 64;  // bytes; every buffer starts on this boundary
  // Steps to plan: tasks with run_task[t] false (precomputed or skipped) produce no arena buffer.
  // Empty = every task runs each step.
  std::vector<bool> run_task;
  // false: graph outputs get no arena buffer (the executor allocates each run's outputs apart and hands them over
  // as they are, instead of copying them out of an arena the next run overwrites).
  bool outputs_in_arena = true;
  // Per task (empty = none): its output 0 is a view of its input 0 (the executor aliases Reshape and its kin,
  // codegen/kernel_program.h). Such an output gets no buffer; the buffer it views stays intact until the view's last
  // reader (through chains of views).
  std::vector<bool> alias_task;
};

// A value's slice of the arena and the steps (task positions) during which it must stay intact:
// from its producer to its last consumer (graph outputs: to the end of the step).
struct BufferAssignment {
  ValueId value;
  int64_t offset = 0;
  int64_t bytes = 0;  // rounded up to the alignment
  int64_t first_step = 0;
  int64_t last_step = 0;
};

struct MemoryPlan {
  std::vector<BufferAssignment> buffers;  // in placement order (largest first)
  std::vector<int64_t> offset_of;         // by ValueId; -1 = not in the arena (param, input, unknown shape)
  int64_t peak_bytes = 0;                 // arena size: the most bytes live at once under this placement
  int64_t total_bytes = 0;                // sum of all planned buffers (what no reuse would need)
  int64_t lower_bound_bytes = 0;          // max over steps of bytes live at that step (no placement beats it)

  bool planned(ValueId v) const { return v.value() < offset_of.size() && offset_of[v.value()] >= 0; }
};

// Plans the activations of `graph` (finalized, static shapes): values produced by a planned task
// with a known shape. Two buffers share bytes only if their step intervals are disjoint.
MemoryPlan plan_memory(const TaskGraph& graph, const MemoryPlanOptions& options = {});

// Throws Error(kInternal) when two buffers with overlapping lifetimes overlap in the arena.
void check_memory_plan(const MemoryPlan& plan);

}  // namespace apart
