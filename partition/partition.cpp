// partition_graph: --method apart's search, read top to bottom as its phases (phases.h), paper §IV.
#include "partition/partition.h"

#include <chrono>

#include "graph/error.h"
#include "partition/phases.h"

namespace apart {

ApartCandidates apart_candidates(const TaskGraph& graph, const CostTable& costs, const PartitionOptions& options,
                                 const SearchGrid& grid, const SearchClock& clock, const CostTable* costs_at_other_size) {
  ApartCandidates search;
  // ---------------- Atomic level (§IV-A): one component per batch task ----------------
  search.atomic = atomic_level(graph, costs, options, costs_at_other_size);

  // ---------------- Block level (§IV-B): k blocks, acyclic, balanced in time and memory ----------------
  search.blocks = block_level(search.atomic, options, grid);

  // ---------------- Stage DP (§IV-C) → placed candidates ----------------
  search.own = block_candidates(search.atomic, search.blocks.assignment, options, grid, clock, CutRefinement::kOn);
  // The baseline splits over every S cut at component granularity, which k blocks may not offer: so apart is never
  // worse than either baseline under the same cost model.
  if (options.stage.include_baselines)
    for (Method split : {Method::kUniform, Method::kParams, Method::kGpipeBalance}) {
      clock.report("stage DP over the " + std::string(method_name(split)) + " split at every stage count");
      const auto start = std::chrono::steady_clock::now();
      CandidateSet found = fixed_split_candidates(search.atomic, split, options, grid, clock);
      search.baseline_splits.push_back(
          {split, std::move(found), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()});
    }
  return search;
}

CandidateSet ApartCandidates::all() const {
  CandidateSet every = own;
  for (const BaselineSplit& split : baseline_splits) every.add(split.found);
  return every;
}

Plan partition_graph(const TaskGraph& graph, const CostTable& costs, const PartitionOptions& options,
                     const CostTable* costs_at_other_size, const ProgressFn& progress) {
  APART_CHECK(options.method == Method::kApart,
              "partition_graph runs --method apart; partition_by_method (partition/methods.h) runs --method " +
                  std::string(method_name(options.method)));
  const SearchClock clock{
      .time_limit_s = options.stage.time_limit_s, .progress = progress, .threads = options.search_threads()};
  check_request(options);
  const SearchGrid grid = search_grid(options);
  const ApartCandidates search = apart_candidates(graph, costs, options, grid, clock, costs_at_other_size);

  // ---------------- Simulated selection → the Plan ----------------
  return choose_plan(graph, search.atomic, search.all(), search.blocks, options, clock);
}

}  // namespace apart
