// partition_graph: --method apart's search, read top to bottom as its phases (phases.h), paper §IV.
#include "partition/partition.h"

#include "graph/error.h"
#include "partition/phases.h"

namespace apart {

Plan partition_graph(const TaskGraph& graph, const CostTable& costs, const PartitionOptions& options,
                     const CostTable* costs_at_other_size, const ProgressFn& progress) {
  APART_CHECK(options.method == Method::kApart,
              "partition_graph runs --method apart; partition_by_method (partition/methods.h) runs --method " +
                  std::string(method_name(options.method)));
  const SearchClock clock{.time_limit_s = options.stage.time_limit_s, .progress = progress};
  check_request(options);
  const SearchGrid grid = search_grid(options);

  // ---------------- Atomic level (§IV-A): one component per batch task ----------------
  const AtomicGraph atomic = atomic_level(graph, costs, options, costs_at_other_size);

  // ---------------- Block level (§IV-B): k blocks, acyclic, balanced in time and memory ----------------
  const BlockLevel blocks = block_level(atomic, options, grid);

  // ---------------- Stage DP (§IV-C) → placed candidates ----------------
  CandidateSet found = block_candidates(atomic, blocks.assignment, options, grid, clock, CutRefinement::kOn);
  // Every baseline's candidates (uniform, params and gpipe-balance cut at component granularity, which k blocks may
  // not offer; PipeDream's split and replicas; METIS's blocks through the same stage DP): apart's simulated choice
  // is over a superset of each baseline's, so no baseline's plan is faster under the same cost model and simulator.
  // METIS gets its automatic block count whatever --blocks says, so that more blocks still never hurt.
  if (options.stage.include_baselines) {
    for (Method split : {Method::kUniform, Method::kParams, Method::kGpipeBalance})
      found.add(fixed_split_candidates(atomic, split, options, grid, clock));
    found.add(pipedream_candidates(atomic, options, grid));
    PartitionOptions as_metis = options;  // its candidates say "metis"
    as_metis.method = Method::kMetis;
    as_metis.block.blocks = 0;
    found.add(block_candidates(atomic, metis_block_level(atomic, as_metis, grid).assignment, as_metis, grid,
                               clock.silent(), CutRefinement::kOff));
  }

  // ---------------- Simulated selection → the Plan ----------------
  return choose_plan(graph, atomic, found, blocks, options, clock);
}

}  // namespace apart
