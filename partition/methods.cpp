// The --method dispatch and the comparison of every method (methods.h): scripts of the phases in phases.h.
#include "partition/methods.h"

#include <chrono>

#include <nlohmann/json.hpp>

#include "graph/error.h"
#include "partition/phases.h"

namespace apart {

const std::vector<Method> kAllMethods = {Method::kApart,        Method::kUniform,   Method::kParams,
                                         Method::kGpipeBalance, Method::kPipeDream, Method::kMetis};

Plan partition_by_method(const TaskGraph& graph, const CostTable& costs, const PartitionOptions& options,
                         const CostTable* costs_at_other_size, const ProgressFn& progress) {
  if (options.method == Method::kApart) return partition_graph(graph, costs, options, costs_at_other_size, progress);
  const SearchClock clock{
      .time_limit_s = options.stage.time_limit_s, .progress = progress, .threads = options.search_threads()};
  check_request(options);
  const SearchGrid grid = search_grid(options);
  const AtomicGraph atomic = atomic_level(graph, costs, options, costs_at_other_size);
  BlockLevel blocks;  // none, but for METIS
  CandidateSet found;
  switch (options.method) {
    case Method::kMetis:
      blocks = metis_block_level(atomic, options, grid);
      found = block_candidates(atomic, blocks.assignment, options, grid, clock, CutRefinement::kOff);
      break;
    case Method::kPipeDream: found = pipedream_candidates(atomic, options, grid); break;
    default: found = fixed_split_candidates(atomic, options.method, options, grid, clock);
  }
  return choose_plan(graph, atomic, std::move(found), blocks, options, clock);
}

// ---------------- The comparison ----------------

MethodResult method_result(const Plan& plan, Method method, double planning_s) {
  MethodResult r;
  r.method = method;
  r.feasible = true;
  r.planning_s = planning_s;
  r.iteration_s = plan.simulated.iteration_s;
  r.samples_per_s = plan.samples_per_s;
  r.peak_memory_bytes = plan.peak_memory_bytes;
  r.stages = static_cast<int>(plan.stages.size());
  r.microbatches = plan.microbatches;
  r.recompute = plan.recompute;
  for (const PlanStage& s : plan.stages) {
    r.replicas.push_back(s.replicas);
    r.devices_used += static_cast<int>(s.devices.size());  // replicas × tensor-parallel degree
  }
  r.compute_lower_bound_s = plan.compute_lower_bound_s;
  return r;
}

std::vector<MethodResult> compare_methods(const TaskGraph& graph, const CostTable& costs,
                                          const PartitionOptions& options, const CostTable* other,
                                          const Plan* apart_plan) {
  std::vector<MethodResult> results;
  for (Method method : kAllMethods) {
    if (method == Method::kApart && apart_plan) {
      results.push_back(method_result(*apart_plan, method, apart_plan->search.seconds));
      continue;
    }
    PartitionOptions o = options;
    o.method = method;
    const auto start = std::chrono::steady_clock::now();
    auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    try {
      const Plan plan = partition_by_method(graph, costs, o, other);
      results.push_back(method_result(plan, method, seconds()));
    } catch (const Infeasible& e) {
      MethodResult r;
      r.method = method;
      r.reason = e.what();
      r.planning_s = seconds();
      results.push_back(std::move(r));
    }
  }
  return results;
}

PlanWithBaselines partition_with_baselines(const TaskGraph& graph, const CostTable& costs,
                                           const PartitionOptions& options, const CostTable* other,
                                           const ProgressFn& progress) {
  APART_CHECK(options.method == Method::kApart, "partition_with_baselines plans --method apart");
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  const SearchClock clock{
      .time_limit_s = options.stage.time_limit_s, .progress = progress, .threads = options.search_threads()};
  check_request(options);
  const SearchGrid grid = search_grid(options);
  const ApartCandidates search = apart_candidates(graph, costs, options, grid, clock, other);
  PlanWithBaselines r;
  // The rows re-solve the best (split, S, m) of their own candidates under --schedule auto; apart's are over the same
  // splits, and the options differ only in --method: each re-solve runs once.
  ScheduleResolveCache resolves;
  r.plan = choose_plan(graph, search.atomic, search.all(), search.blocks, options, clock, &resolves);

  const auto baselines_start = std::chrono::steady_clock::now();
  clock.report("the baselines for baselines.json (--no-baselines skips)");
  for (Method method : kAllMethods) {
    if (method == Method::kApart) {
      r.baselines.push_back(method_result(r.plan, method, r.plan.search.seconds));
      continue;
    }
    PartitionOptions o = options;
    o.method = method;
    const auto method_start = std::chrono::steady_clock::now();
    const ApartCandidates::BaselineSplit* reused = nullptr;
    for (const auto& split : search.baseline_splits)
      if (split.method == method && split.same_as_method) reused = &split;
    try {
      // The split's own choice, as partition_by_method makes it: no blocks, a clock of its own for the time limit.
      SearchClock own = clock.silent();
      own.start = method_start;
      const Plan plan = reused ? choose_plan(graph, search.atomic, reused->found, reused->blocks, o, own, &resolves)
                               : partition_by_method(graph, costs, o, other);
      r.baselines.push_back(method_result(plan, method, since(method_start) + (reused ? reused->seconds : 0.0)));
    } catch (const Infeasible& e) {
      MethodResult row;
      row.method = method;
      row.reason = e.what();
      row.planning_s = since(method_start) + (reused ? reused->seconds : 0.0);
      r.baselines.push_back(std::move(row));
    }
  }
  r.baselines_s = since(baselines_start);
  return r;
}

std::string baselines_json(const std::vector<MethodResult>& results, int64_t global_batch, int devices) {
  using json = nlohmann::ordered_json;
  json methods = json::array();
  for (const MethodResult& r : results) {
    json m = {{"method", method_name(r.method)}};
    if (r.feasible) {
      m["iteration_s"] = r.iteration_s;
      m["samples_per_s"] = r.samples_per_s;
      m["feasible"] = true;
      m["planning_s"] = r.planning_s;
      m["peak_memory_bytes"] = r.peak_memory_bytes;
      m["stages"] = r.stages;
      m["replicas"] = r.replicas;
      m["devices_used"] = r.devices_used;
      m["microbatches"] = r.microbatches;
      m["recompute"] = r.recompute;
      m["compute_lower_bound_s"] = r.compute_lower_bound_s;
    } else {
      m["iteration_s"] = nullptr;
      m["samples_per_s"] = nullptr;
      m["feasible"] = false;
      m["reason"] = r.reason;
      m["planning_s"] = r.planning_s;
    }
    methods.push_back(std::move(m));
  }
  const json doc = {{"schema", "apart.baselines/1"},
                    {"global_batch", global_batch},
                    {"devices", devices},
                    {"methods", std::move(methods)}};
  return doc.dump(2) + "\n";
}

}  // namespace apart
