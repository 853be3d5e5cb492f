// Stage-cut refinement: the stage DP (§IV-C) cuts only at the k blocks' boundaries. This moves each cut of a
// candidate to the best component boundary near it, uncoarsening the blocks around the cuts level by level —
// the multilevel scheme of §IV-B applied to the stage split — and solves the cuts exactly at component
// granularity over the components' topological order. docs/partitioning.md, "Stage-cut refinement".
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "partition/atomic.h"
#include "partition/stage_dp.h"

namespace apart {

struct RefinedCandidate {
  BlockAssignment assignment;                 // runs of components; solution.boundaries index these runs
  std::shared_ptr<const BlockSequence> sequence;  // make_block_sequence(atomic, assignment)
  std::shared_ptr<const StageEvaluator> evaluator;  // over `sequence`
  StageSolution solution;
  std::string kind = "refined";  // how it was found: "refined", "task cuts" (least bottleneck), "compute-balanced"
};

// Moves the interior cuts of `coarse` (a solution over `blocks`) to better component boundaries nearby, keeping
// its stage count, micro-batches, schedule, recomputation and replica counts. Each cut gets a window as wide as
// the coarse blocks on either side of it, centred on the cut; a round places runs at every component boundary
// in the windows (or, when that would make more than `max_runs` runs, at as many positions per side as fit,
// spaced geometrically away from the cut) and solves the least bottleneck exactly over those positions (a DP
// over the windows), then re-centres the windows on the new cuts until none moves. The bottleneck never rises
// above the coarse one. nullopt when no cut moved, or for more than max_runs / 4 stages.
std::optional<RefinedCandidate> refine_stage_cuts(const AtomicGraph& atomic, const BlockAssignment& blocks,
                                                  const StageSolution& coarse, const Cluster& cluster,
                                                  const TrainingSpec& training, size_t max_runs = 512);

// Task-granular cuts: splits of the components' topological order (their index order) into coarse.stages
// contiguous runs, keeping coarse's micro-batches, schedule, per-stage replicas and recomputation, each run one
// block of `assignment` (so solution.boundaries are 0, 1, …, S):
//   least_bottleneck  the split with the least bottleneck max_s h_s over every such split that fits memory (ties:
//                     least Σ steps, then the earliest cuts). Exact: a threshold M bounds every stage's compute
//                     (compute ≤ h, and compute grows with the run), so every split of bottleneck ≤ M cuts inside
//                     windows a greedy pass finds in O(S log n); a min-max DP over the windows, pruned at M, is
//                     therefore optimal whenever it finds a split. M starts just above the compute optimum and
//                     doubles its margin until a split is found or the windows hold more than `max_pairs` (run
//                     start, run end) pairs; then nullopt. Nothing depends on the blocks, so --blocks cannot move it.
//   least_compute     the split with the least compute bottleneck max_s (forward + backward (+ recompute)), cuts as
//                     late as that optimum allows (greedy at the optimum); nullopt when it does not fit memory.
struct ExactCuts {
  std::optional<RefinedCandidate> least_bottleneck;
  std::optional<RefinedCandidate> least_compute;
};
inline constexpr size_t kExactCutMaxPairs = size_t{1} << 21;
ExactCuts exact_stage_cuts(const AtomicGraph& atomic, const StageSolution& coarse, const Cluster& cluster,
                           const TrainingSpec& training, size_t max_pairs = kExactCutMaxPairs);

// exact_stage_cuts' answers by what they read of the coarse solution: its stage count, micro-batches, schedule and
// per-stage replicas, recomputation, ZeRO and TP degrees — not its blocks or cuts. One cache serves the calls of one
// search over one atomic graph, cluster and training spec: the block levels of partition/phases.cpp block_candidates
// each refine the best candidate of the same stage counts, mostly with the same pins. Thread-safe.
class ExactCutCache {
 public:
  // The cached answer for `coarse`'s pins, else solve() stored under them.
  template <class Solve>
  ExactCuts get_or_solve(const StageSolution& coarse, Solve&& solve) {
    const Key key = key_of(coarse);
    {
      std::lock_guard lock(mutex_);
      if (const auto it = found_.find(key); it != found_.end()) return it->second;
    }
    ExactCuts cuts = solve();
    std::lock_guard lock(mutex_);
    return found_.emplace(key, std::move(cuts)).first->second;
  }

 private:
  using Key = std::tuple<int, int64_t, Schedule, int, RecomputeScope, std::vector<RecomputeScope>, int,
                         std::vector<int>, std::vector<int>, std::vector<int>>;
  static Key key_of(const StageSolution& s) {
    return {s.stages, s.microbatches, s.schedule, s.virtual_stages, s.recompute, s.stage_recompute,
            s.zero, s.stage_zero, s.stage_tp, s.replicas};
  }
  std::mutex mutex_;
  std::map<Key, ExactCuts> found_;
};

// The stage counts refine_best_candidates refines: those whose best candidate's estimate is within 5 % of the best,
// fastest first.
std::vector<int> refined_stage_counts(const std::vector<StageSolution>& candidates);

// For the best candidate of every stage count among `candidates` (solutions over `blocks`) whose estimate is within
// 5 % of the best: its refine_stage_cuts split (when a cut moved) and its exact_stage_cuts splits, fastest estimate
// first (ties: in that order). The simulated selection chooses among them and the candidates.
// (Before task-granular cuts it returned only the fastest refined split, and only when it beat every candidate.)
// The candidates are refined on `threads` threads, gathered in order (the same result whatever the count).
// `exact`: where the exact cuts of earlier calls of the same search are kept (nullptr: none kept).
std::vector<RefinedCandidate> refine_best_candidates(const AtomicGraph& atomic, const BlockAssignment& blocks,
                                                     const std::vector<StageSolution>& candidates,
                                                     const Cluster& cluster, const TrainingSpec& training,
                                                     int threads = 1, ExactCutCache* exact = nullptr);

}  // namespace apart
