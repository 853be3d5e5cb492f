// Stage-cut refinement: the stage DP (§IV-C) cuts only at the k blocks' boundaries; this moves each cut of a
// candidate to the best component boundary near it, uncoarsening the blocks around the cuts level by level —
// the multilevel scheme of §IV-B applied to the stage split. docs/partitioning.md, "Stage-cut refinement".
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "partition/atomic.h"
#include "partition/stage_dp.h"

namespace apart {

struct RefinedCandidate {
  BlockAssignment assignment;                 // runs of components; solution.boundaries index these runs
  std::shared_ptr<const BlockSequence> sequence;  // make_block_sequence(atomic, assignment)
  std::unique_ptr<StageEvaluator> evaluator;  // over `sequence`
  StageSolution solution;
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

// Refines the best candidate of every stage count among `candidates` (solutions over `blocks`) and returns the
// refined one with the least estimated iteration time if it beats every candidate; nullopt otherwise.
std::optional<RefinedCandidate> refine_best_candidates(const AtomicGraph& atomic, const BlockAssignment& blocks,
                                                       const std::vector<StageSolution>& candidates,
                                                       const Cluster& cluster, const TrainingSpec& training);

}  // namespace apart
