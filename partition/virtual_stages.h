// An interleaved plan's chunks: the model cut into the P·v virtual stages the devices run (plan.json virtual_stages).
#pragma once

#include <vector>

#include "graph/task_graph.h"
#include "partition/partition.h"
#include "profiler/cost_table.h"

namespace apart {

// The P·v chunks of an interleaved plan (v = plan.virtual_stages), in pipeline order: the plan's batch tasks in the
// order its stages list them (a topological order: stages are contiguous and read only from earlier ones) cut into
// P·v consecutive runs, run c ending where the tasks' forward + backward times (`costs`) first reach Σ_{c' ≤ c} of
// stage (c' mod P)'s forward + backward / v, scaled to the table's total: so chunk c carries about the 1/v of stage
// c mod P's time the simulator gives it (docs/simulator.md), device k's chunks together about stage k's. Each chunk
// also holds the constant tasks its batch tasks read (through other constant tasks), as a stage does; its boundary
// values are add_stage_boundaries' over the chunks. Chunk c's replicas, devices and cost are stage c mod P's (the
// cost fixes what a boundary carries per device). With tensor-parallel stages a cut that falls inside a TP region
// moves to the nearest position (by time) between regions, as the runtime computes a region a boundary cuts whole on
// every TP rank. Infeasible when there are fewer batch tasks than chunks; empty
// for a plan that is not interleaved.
std::vector<PlanStage> cut_virtual_stages(const Plan& plan, const TaskGraph& graph, const CostTable& costs);

}  // namespace apart
