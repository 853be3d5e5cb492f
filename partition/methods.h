// The --method dispatch above the phases: apart's search (partition_graph) or a baseline's phase script, and every
// method side by side on the same inputs (baselines.json). Nothing below this file calls it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/task_graph.h"
#include "partition/options.h"
#include "partition/partition.h"
#include "profiler/cost_table.h"

namespace apart {

// The plan of options.method: partition_graph for apart; for the others the same phases with the method's split
// in place of apart's blocks (phases.h): metis: METIS blocks → stage DP; uniform, params, gpipe-balance: a fixed
// split per stage count; pipedream: PipeDream's split and replicas. The same errors as partition_graph.
Plan partition_by_method(const TaskGraph& graph, const CostTable& costs, const PartitionOptions& options,
                         const CostTable* costs_at_other_size = nullptr, const ProgressFn& progress = {});

// ---------------- The comparison (plan/baselines.json) ----------------
struct MethodResult {
  Method method = Method::kApart;
  bool feasible = false;
  std::string reason;  // why not, when infeasible
  double iteration_s = 0;
  double samples_per_s = 0;
  double planning_s = 0;
  int64_t peak_memory_bytes = 0;
  int stages = 0;
  int devices_used = 0;
  int64_t microbatches = 0;
  bool recompute = false;
  std::vector<int> replicas;
  double compute_lower_bound_s = 0;
};

// Every method in kAllMethods order on the same inputs (the options' method is ignored), each through
// partition_by_method. `apart_plan`: apart's plan for these inputs when the caller already has it (its row then
// reuses it and its search.seconds).
extern const std::vector<Method> kAllMethods;
std::vector<MethodResult> compare_methods(const TaskGraph& graph, const CostTable& costs,
                                          const PartitionOptions& options,
                                          const CostTable* costs_at_other_size = nullptr,
                                          const Plan* apart_plan = nullptr);
MethodResult method_result(const Plan& plan, Method method, double planning_s);

// partition_graph and compare_methods in one search, what compile() runs for baselines.json: the uniform, params and
// gpipe-balance rows choose among the splits apart's search evaluated already (StageOptions::include_baselines)
// instead of solving them again, so the plan and every row are those of the two calls. options.method must be apart.
struct PlanWithBaselines {
  Plan plan;
  std::vector<MethodResult> baselines;  // kAllMethods order, apart's row from `plan`
  double baselines_s = 0;               // wall seconds spent on the rows beyond apart's own search
};
PlanWithBaselines partition_with_baselines(const TaskGraph& graph, const CostTable& costs,
                                           const PartitionOptions& options,
                                           const CostTable* costs_at_other_size = nullptr,
                                           const ProgressFn& progress = {});
// {"schema":"apart.baselines/1","methods":[…]} as text (2-space indented JSON, trailing newline).
std::string baselines_json(const std::vector<MethodResult>& results, int64_t global_batch, int devices);

}  // namespace apart
