// The final choice among the stage DP's candidates (DESIGN.md "Partitioning", step 3): the (S, m, schedule,
// recompute, layout) whose *simulated* iteration time is least. Candidates are placed on devices first, so the
// links they are costed and simulated with are the ones their devices really have.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "partition/atomic.h"
#include "partition/placement.h"
#include "partition/stage_dp.h"
#include "simulator/simulate.h"

namespace apart {

struct Candidate {
  StageSolution solution;  // costs and estimate with the placement's links
  std::vector<StageLinks> links;  // per stage, the placed links (placed_links of placement())
  std::shared_ptr<const BlockSequence> sequence;
  std::shared_ptr<const BlockAssignment> assignment;
  std::shared_ptr<const StageEvaluator> evaluator;
  std::string source;  // which split it came from: "apart", "uniform", "params", "gpipe-balance", …
  // Where its stages run: place_stages of its replicas and degrees by its evaluator's layout, computed again when
  // asked (a placement on many devices lists every one; of thousands of candidates, a few are replayed).
  Placement placement() const;
};

// Places a DP solution on devices by the evaluator's layout and re-costs it with the placed links.
// Returns false when it no longer fits memory (it cannot: links do not change memory) — kept as a check.
Candidate place_candidate(StageSolution solution, std::shared_ptr<const BlockSequence> sequence,
                          std::shared_ptr<const BlockAssignment> assignment,
                          std::shared_ptr<const StageEvaluator> evaluator, std::string source);

// The candidate as the simulator's plan: stage times, all-reduce, memory, the devices, and the boundary bytes between
// each pair of stages (per micro-batch of one replica of the receiver, at the run's activation precision).
// Without `devices` the stages' device lists stay empty (what the lower bound reads needs none of them).
sim::SimPlan candidate_sim_plan(const Candidate& candidate, bool devices = true);

// A bound the simulated iteration time cannot go under: each stage's serial work (m micro-batches of forward and
// backward, then its exposed all-reduce), and, when the stages form a chain, the schedule's warm-up, micro-batch
// 0's way down the pipeline and back, and the last gradient's way back to stage 0 (select.cpp).
double simulated_lower_bound(const Candidate& candidate);

struct SelectionStatistics {
  int simulated = 0;        // candidates replayed by the simulator
  int pruned = 0;           // skipped: lower bound ≥ the best simulated time so far
  int not_simulated = 0;    // skipped by the simulation cap or the time limit (their estimate stands unverified)
};

struct Selection {
  size_t index = 0;       // into the candidates
  sim::SimResult result;  // the chosen candidate's replay
  SelectionStatistics stats;
};

// Simulates candidates best first by their lower bound on the simulated time and keeps the least simulated time;
// a candidate whose bound is not below the best so far cannot win and is skipped, so the choice equals simulating
// every candidate, and no order replays fewer (but for a batch's second, below). At most `max_simulations`
// replays (0 = no cap) and none after `deadline` once one is done. Replays run in batches of kSelectionBatch on
// `threads`. Deterministic for every thread count: ties go to the earlier candidate in (bound, estimate, index) order.
inline constexpr size_t kSelectionBatch = 2;
Selection select_by_simulation(const std::vector<Candidate>& candidates, int max_simulations = 0,
                               std::chrono::steady_clock::time_point deadline =
                                   std::chrono::steady_clock::time_point::max(),
                               int threads = 1);

}  // namespace apart
