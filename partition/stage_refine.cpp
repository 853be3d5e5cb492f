// Stage-cut refinement (docs/partitioning.md, Algorithm 4): windows around the DP's cuts, an exact bottleneck DP
// over the positions inside them, windows re-centred on the new cuts until none moves.
#include "partition/stage_refine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "graph/error.h"
#include "profiler/memory_model.h"

namespace apart {
namespace {

constexpr int kMaxRounds = 12;
// Candidates slower than the best by more than this are not refined: moving each cut within about one of
// k = 64 blocks gained up to 4.8 % of a candidate's estimate on GPT-3 13B × 64 devices (all stage counts).
constexpr double kRefineSlack = 0.05;

// Distances from a cut at which a window of `reach` components gets positions: all of them when at most `points`
// fit, else about `points` distances growing geometrically from 1 to `reach` (fine near the cut, coarse far).
std::vector<size_t> window_offsets(size_t reach, size_t points) {
  std::vector<size_t> offsets;
  if (reach <= points) {
    for (size_t d = 1; d <= reach; ++d) offsets.push_back(d);
    return offsets;
  }
  for (size_t i = 1; i <= points; ++i)
    offsets.push_back(static_cast<size_t>(std::ceil(std::pow(static_cast<double>(reach), static_cast<double>(i) / points))));
  offsets.push_back(1);
  std::sort(offsets.begin(), offsets.end());
  offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
  return offsets;
}

struct WindowDpState {
  double max_h = std::numeric_limits<double>::infinity();
  double sum_step = 0;
  size_t previous = 0;
  bool reached = false;
};

}  // namespace

std::optional<RefinedCandidate> refine_stage_cuts(const AtomicGraph& atomic, const BlockAssignment& blocks,
                                                  const StageSolution& coarse, const Cluster& cluster,
                                                  const TrainingSpec& training, size_t max_runs) {
  const size_t n = atomic.size();
  const int stages = coarse.stages;
  APART_CHECK(blocks.block_of.size() == n, "refine_stage_cuts: assignment size");
  APART_CHECK(static_cast<int>(coarse.boundaries.size()) == stages + 1, "refine_stage_cuts: boundaries");
  // Every cut needs a position on each side; past max_runs / 4 stages the windows would be too coarse to help.
  if (stages < 2 || static_cast<size_t>(stages) > max_runs / 4) return std::nullopt;
  // A topological order in which every block is one run: by block, then by component index (blocks are numbered
  // topologically and component indices are a topological order).
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return blocks.block_of[a] < blocks.block_of[b]; });
  std::vector<size_t> block_start(blocks.blocks + 1, n);  // position of each block's first component in `order`
  for (size_t p = n; p-- > 0;) block_start[blocks.block_of[order[p]].value()] = p;
  for (size_t b = blocks.blocks; b-- > 0;) block_start[b] = std::min(block_start[b], block_start[b + 1]);

  // Cut s sits at position cut[s] of `order`; its window reaches `before[s]` components back and `after[s]`
  // forward: the coarse blocks on either side of the coarse cut.
  std::vector<size_t> cut(stages + 1), before(stages + 1, 0), after(stages + 1, 0);
  for (int s = 0; s <= stages; ++s) {
    const uint32_t b = coarse.boundaries[s];
    cut[s] = block_start[b];
    if (s == 0 || s == stages) continue;
    before[s] = cut[s] - block_start[b - 1];
    after[s] = block_start[b + 1] - cut[s];
  }
  // Positions per window side, so that a round's sequence stays within max_runs runs.
  const size_t per_side = std::max<size_t>(1, (max_runs - static_cast<size_t>(stages)) / (2 * (stages - 1)));
  const std::vector<size_t> coarse_cut = cut;
  std::vector<size_t> result_cut = cut;
  std::optional<RefinedCandidate> result;
  double bottleneck = coarse.bottleneck_h;
  for (int round = 0; round < kMaxRounds; ++round) {
    // This round's runs: cut at every position of every window (and at 0 and n).
    std::vector<size_t> positions{0, n};
    for (int s = 1; s < stages; ++s) {
      positions.push_back(cut[s]);
      for (size_t d : window_offsets(before[s], per_side)) positions.push_back(cut[s] - std::min(d, cut[s]));
      for (size_t d : window_offsets(after[s], per_side)) positions.push_back(std::min(n, cut[s] + d));
    }
    std::sort(positions.begin(), positions.end());
    positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
    const size_t runs = positions.size() - 1;
    auto run_of = [&](size_t position) {
      return static_cast<size_t>(std::lower_bound(positions.begin(), positions.end(), position) - positions.begin());
    };
    RefinedCandidate candidate;
    candidate.assignment.blocks = static_cast<uint32_t>(runs);
    candidate.assignment.block_of.resize(n);
    for (size_t r = 0; r < runs; ++r)
      for (size_t p = positions[r]; p < positions[r + 1]; ++p)
        candidate.assignment.block_of[order[p]] = BlockId(static_cast<uint32_t>(r));
    candidate.sequence = std::make_shared<const BlockSequence>(make_block_sequence(atomic, candidate.assignment));
    candidate.evaluator = std::make_unique<StageEvaluator>(*candidate.sequence, cluster, training);

    // The window DP: stage s = runs [t_s, t_{s+1}) with the coarse replica count, every stage within device
    // memory; least bottleneck, then least Σ steps (ties: the earliest cut).
    std::vector<std::vector<size_t>> allowed(stages + 1);  // runs a cut may start at
    for (int s = 0; s <= stages; ++s) {
      const size_t from = cut[s] - std::min(before[s], cut[s]), to = std::min(n, cut[s] + after[s]);
      for (size_t t = run_of(from); t <= runs && positions[t] <= to; ++t) allowed[s].push_back(t);
    }
    std::vector<std::map<size_t, WindowDpState>> state(stages + 1);
    state[0][0] = WindowDpState{0, 0, 0, true};
    for (int s = 0; s < stages; ++s) {
      const int64_t flight = stage_in_flight_microbatches(coarse.schedule, s, stages, coarse.microbatches);
      for (size_t j : allowed[s + 1]) {
        WindowDpState best;
        for (const auto& [i, from] : state[s]) {
          if (i >= j) break;
          const StageCost c = candidate.evaluator->evaluate(static_cast<uint32_t>(i), static_cast<uint32_t>(j),
                                                           coarse.replicas[s], coarse.microbatches, flight,
                                                           coarse.recompute);
          if (c.memory_bytes > cluster.usable_memory_bytes()) continue;
          const double max_h = std::max(from.max_h, c.h), sum_step = from.sum_step + c.step_s;
          if (!best.reached || max_h < best.max_h || (max_h == best.max_h && sum_step < best.sum_step))
            best = WindowDpState{max_h, sum_step, i, true};
        }
        if (best.reached) state[s + 1][j] = best;
      }
    }
    // The previous split is among the positions, so the DP reaches the end unless rounding moved a stage's
    // memory across the limit between run structures; then keep what the previous round found.
    if (state[stages].find(runs) == state[stages].end()) break;
    StageSolution refined = coarse;
    refined.boundaries.assign(stages + 1, 0);
    refined.boundaries[stages] = static_cast<uint32_t>(runs);
    for (int s = stages; s > 0; --s)
      refined.boundaries[s - 1] = static_cast<uint32_t>(state[s][refined.boundaries[s]].previous);
    if (!evaluate_solution(*candidate.evaluator, refined) || refined.bottleneck_h > bottleneck * (1 + 1e-12)) break;
    bottleneck = refined.bottleneck_h;

    bool moved = false;
    for (int s = 1; s < stages; ++s) {
      moved |= positions[refined.boundaries[s]] != cut[s];
      cut[s] = positions[refined.boundaries[s]];
    }
    // Keep the round with the least estimated time (the DP minimises the bottleneck; the estimate decides).
    if (!result || refined.estimate.iteration_s < result->solution.estimate.iteration_s * (1 - 1e-12)) {
      candidate.solution = std::move(refined);
      result = std::move(candidate);
      result_cut = cut;
    }
    if (!moved) break;  // the next round would search the same windows
  }
  if (!result || result_cut == coarse_cut) return std::nullopt;
  return result;
}

std::optional<RefinedCandidate> refine_best_candidates(const AtomicGraph& atomic, const BlockAssignment& blocks,
                                                       const std::vector<StageSolution>& candidates,
                                                       const Cluster& cluster, const TrainingSpec& training) {
  // The best candidate of each stage count (the first of equals, as the final choice does), fastest first.
  std::map<int, const StageSolution*> best_per_count;
  for (const StageSolution& s : candidates) {
    const StageSolution*& best = best_per_count[s.stages];
    if (!best || s.estimate.iteration_s < best->estimate.iteration_s * (1 - 1e-12)) best = &s;
  }
  std::vector<const StageSolution*> queue;
  for (const auto& [count, best] : best_per_count) queue.push_back(best);
  std::stable_sort(queue.begin(), queue.end(), [](const StageSolution* a, const StageSolution* b) {
    return a->estimate.iteration_s < b->estimate.iteration_s;
  });
  std::optional<RefinedCandidate> winner;
  double best_time = queue.empty() ? 0.0 : queue.front()->estimate.iteration_s;
  for (const StageSolution* coarse : queue) {
    // Refinement moves each cut by about a block; it cannot lift a candidate much slower than the best.
    if (coarse->estimate.iteration_s > best_time * (1 + kRefineSlack)) break;
    auto refined = refine_stage_cuts(atomic, blocks, *coarse, cluster, training);
    if (refined && refined->solution.estimate.iteration_s < best_time * (1 - 1e-12)) {
      best_time = refined->solution.estimate.iteration_s;
      winner = std::move(refined);
    }
  }
  return winner;
}

}  // namespace apart
