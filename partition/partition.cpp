// partition_graph: --method apart's search, read top to bottom as its phases (phases.h), paper §IV.
#include "partition/partition.h"

#include <chrono>
#include <future>

#include "graph/error.h"
#include "partition/phases.h"
#include "partition/target.h"

namespace apart {

ApartCandidates apart_candidates(const TaskGraph& graph, const CostTable& costs, const PartitionOptions& options,
                                 const SearchGrid& grid, const SearchClock& clock, const CostTable* costs_at_other_size) {
  ApartCandidates search;
  // ---------------- Atomic level (§IV-A): one component per batch task ----------------
  search.atomic = atomic_level(graph, costs, options, costs_at_other_size);

  // ---------------- Block level (§IV-B): k blocks, acyclic, balanced in time and memory ----------------
  search.blocks = block_level(search.atomic, options, grid);

  // ---------------- Stage DP (§IV-C) → placed candidates ----------------
  // Every baseline's candidates (uniform, params and gpipe-balance cut at component granularity, which k blocks may
  // not offer; PipeDream's split and replicas; METIS's blocks through the same stage DP): apart's simulated choice
  // is over a superset of each baseline's, so no baseline's plan is faster under the same cost model and simulator.
  // METIS gets its automatic block count whatever --blocks says, so that more blocks still never hurt.
  auto baselines = [&] {
    auto timed = [&](Method method, const std::string& what, auto&& solve) {
      clock.report(what);
      const auto start = std::chrono::steady_clock::now();
      ApartCandidates::BaselineSplit split;
      split.method = method;
      solve(split);
      split.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      search.baseline_splits.push_back(std::move(split));
    };
    for (Method method : {Method::kUniform, Method::kParams, Method::kGpipeBalance})
      timed(method, "stage DP over the " + std::string(method_name(method)) + " split at every stage count",
            [&](ApartCandidates::BaselineSplit& split) {
              split.found = fixed_split_candidates(search.atomic, method, options, grid, clock);
            });
    timed(Method::kPipeDream, "PipeDream's split and replicas", [&](ApartCandidates::BaselineSplit& split) {
      split.found = pipedream_candidates(search.atomic, options, grid);
    });
    timed(Method::kMetis, "stage DP over METIS's blocks", [&](ApartCandidates::BaselineSplit& split) {
      PartitionOptions as_metis = options;  // its candidates say "metis"
      as_metis.method = Method::kMetis;
      as_metis.block.blocks = 0;
      split.blocks = metis_block_level(search.atomic, as_metis, grid);
      split.found = block_candidates(search.atomic, split.blocks.assignment, as_metis, grid, clock.silent(),
                                     CutRefinement::kOff);
      split.same_as_method = options.block.blocks == 0;  // --method metis uses --blocks as given
    });
  };
  // Neither side reads the other's candidates: with more than one thread the baselines are solved beside apart's own
  // search (each side's DPs still on clock.threads), so that no phase's last DP leaves a core idle. Each side writes
  // only its own fields, and all() gathers them in a fixed order: the plan is the same whatever the thread count.
  std::future<void> beside;
  if (options.stage.include_baselines && clock.threads > 1) beside = std::async(std::launch::async, baselines);
  search.own = block_candidates(search.atomic, search.blocks.assignment, options, grid, clock, CutRefinement::kOn);
  if (beside.valid()) beside.get();
  else if (options.stage.include_baselines) baselines();
  return search;
}

CandidateSet ApartCandidates::all() const& {
  ApartCandidates sets;  // a copy of the candidate sets only
  sets.own = own;
  sets.baseline_splits = baseline_splits;
  return std::move(sets).all();
}

CandidateSet ApartCandidates::all() && {
  CandidateSet every = std::move(own);
  for (BaselineSplit& split : baseline_splits) every.add(std::move(split.found));
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
  if (options.stage.target) {  // --target: the stage DP over whole layers, every stage alike (partition/target.h)
    const AtomicGraph atomic = atomic_level(graph, costs, options, costs_at_other_size);
    return choose_plan(graph, atomic, target_candidates(graph, atomic, options, clock), BlockLevel{}, options, clock);
  }
  const SearchGrid grid = search_grid(options);
  ApartCandidates search = apart_candidates(graph, costs, options, grid, clock, costs_at_other_size);

  // ---------------- Simulated selection → the Plan ----------------
  return choose_plan(graph, search.atomic, std::move(search).all(), search.blocks, options, clock);
}

}  // namespace apart
