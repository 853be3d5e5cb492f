// The block level (two balance constraints: time and memory) and stage-cut refinement, against brute force on
// small graphs: every acyclic blocking, every cut position.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

#include "partition/block.h"
#include "partition/stage_cost.h"
#include "partition/stage_refine.h"
#include "random_models.h"
#include "test_cluster.h"

namespace apart {
namespace {

using testing::random_model;

constexpr double kReferenceMicrobatch = 4.0;

// A block's two weights, computed here from the definitions (docs/partitioning.md) rather than by the code
// under test: time = Σ forward + backward at u; memory = Σ saved bytes × u + distinct weights × state factor.
struct Weights {
  const AtomicGraph& atomic;
  TrainingSpec training;
  double u = kReferenceMicrobatch;

  BlockWeight of(const std::vector<uint32_t>& members) const {
    BlockWeight w;
    for (uint32_t c : members) {
      const BlockCost& cost = atomic.components[c].cost;
      w.time_s += cost.forward.at(u) + cost.backward.at(u);
      w.memory_bytes += cost.saved_per_sample * u;
    }
    const double state = state_bytes_per_param_byte(training.optimizer, training.precision);
    for (const ParamUse& p : atomic.params)
      if (std::any_of(p.readers.begin(), p.readers.end(), [&](uint32_t r) {
            return std::find(members.begin(), members.end(), r) != members.end();
          }))
        w.memory_bytes += static_cast<double>(p.bytes) * state;
    return w;
  }
  BlockCaps caps(int k, double balance_cap) const {
    std::vector<uint32_t> all(atomic.size());
    std::iota(all.begin(), all.end(), 0u);
    const BlockWeight total = of(all);
    return {balance_cap * total.time_s / k, balance_cap * total.memory_bytes / k};
  }
  // Within both caps, up to rounding (the code sums in another order).
  bool within(const BlockWeight& w, const BlockCaps& caps) const {
    return w.time_s <= caps.time_s * (1 + 1e-9) && w.memory_bytes <= caps.memory_bytes * (1 + 1e-9);
  }
};

std::vector<std::vector<uint32_t>> members_of(const BlockAssignment& a) {
  std::vector<std::vector<uint32_t>> m(a.blocks);
  for (uint32_t c = 0; c < a.block_of.size(); ++c) m[a.block_of[c].value()].push_back(c);
  return m;
}

// Every transfer goes from a block to the same or a later one: the quotient graph is acyclic and the blocks are
// numbered in a topological order of it.
void expect_topological(const AtomicGraph& atomic, const BlockAssignment& a) {
  ASSERT_EQ(a.block_of.size(), atomic.size());
  for (const Transfer& t : atomic.transfers)
    for (uint32_t c : t.consumers) EXPECT_LE(a.block_of[t.producer], a.block_of[c]);
  for (const auto& m : members_of(a)) EXPECT_FALSE(m.empty()) << "an empty block";
}

// Brute force over every labelling of the components with k non-empty blocks in which every transfer goes
// forward (= every acyclic blocking, in every topological numbering): does one keep all blocks within both
// caps, and does one whose blocks are contiguous runs of the component order?
struct Feasibility {
  bool any = false;
  bool contiguous = false;
};
Feasibility brute_force_blockings(const Weights& weights, int k, const BlockCaps& caps) {
  const AtomicGraph& atomic = weights.atomic;
  const uint32_t n = static_cast<uint32_t>(atomic.size());
  std::vector<std::vector<uint32_t>> preds(n);
  for (const Transfer& t : atomic.transfers)
    for (uint32_t c : t.consumers) preds[c].push_back(t.producer);
  std::vector<uint32_t> label(n);
  std::vector<std::vector<uint32_t>> blocks(k);
  Feasibility found;
  std::function<void(uint32_t, int)> assign = [&](uint32_t c, int empty) {
    if (found.any && found.contiguous) return;
    if (c == n) {
      if (empty > 0) return;
      found.any = true;
      found.contiguous |= std::is_sorted(label.begin(), label.end());
      return;
    }
    uint32_t lowest = 0;
    for (uint32_t p : preds[c]) lowest = std::max(lowest, label[p]);
    for (uint32_t b = lowest; b < static_cast<uint32_t>(k); ++b) {
      const int now_empty = empty - (blocks[b].empty() ? 1 : 0);
      if (static_cast<int>(n - c - 1) < now_empty) continue;  // too few components left to fill the rest
      blocks[b].push_back(c);
      if (weights.within(weights.of(blocks[b]), caps)) {  // weights only grow: prune here
        label[c] = b;
        assign(c + 1, now_empty);
      }
      blocks[b].pop_back();
    }
  };
  assign(0, k);
  return found;
}

TEST(TheBlockLevel, KeepsEveryBlockWithinBothCapsWheneverAContiguousSplitFits) {
  int checked = 0, feasible = 0, held = 0;
  for (uint32_t seed = 0; seed < 24; ++seed) {
    const bool chain = seed % 2 == 0;
    const auto model = random_model(100 + seed, 13, chain);
    const AtomicGraph atomic = build_atomic_graph(model.graph, model.costs, {});
    if (atomic.size() > 12) continue;
    const Weights weights{atomic, TrainingSpec{}};
    for (int k = 2; k <= std::min<int>(6, static_cast<int>(atomic.size())); ++k)
      for (double balance_cap : {1.2, 1.5, 2.5}) {
        BlockOptions options;
        options.balance_cap = balance_cap;
        const BlockCaps caps = weights.caps(k, balance_cap);
        const Feasibility oracle = brute_force_blockings(weights, k, caps);
        // In a chain every acyclic blocking is contiguous; in a DAG the code promises contiguous ones only.
        if (chain) EXPECT_EQ(oracle.any, oracle.contiguous);
        BlockStatistics stats;
        const BlockAssignment a = build_blocks(atomic, k, options, TrainingSpec{}, kReferenceMicrobatch, &stats);
        ++checked;
        expect_topological(atomic, a);
        EXPECT_EQ(a.blocks, static_cast<uint32_t>(k));
        bool all_within = true;
        for (const auto& m : members_of(a)) all_within &= weights.within(weights.of(m), caps);
        EXPECT_EQ(all_within, stats.max_load <= 1 + 1e-9) << "statistics disagree with the blocks";
        if (!oracle.contiguous) continue;
        ++feasible;
        held += all_within;
        EXPECT_TRUE(all_within) << "seed " << seed << " k " << k << " cap " << balance_cap
                                << ": a contiguous split within both caps exists, the blocks break one";
      }
  }
  EXPECT_GT(checked, 100);
  EXPECT_GT(feasible, checked / 3) << "too few feasible cases to mean anything";
  EXPECT_LT(feasible, checked) << "no infeasible case: the caps are never tight";
  EXPECT_EQ(held, feasible);
}

TEST(TheBlockLevel, BalancesMemoryAsWellAsTime) {
  // Eight components in a chain, equal times; the first four hold every weight. Two blocks of four would be
  // perfectly even in time but put all the memory in block 0 (cap: 1.5 × half of it).
  AtomicGraph atomic;
  for (uint32_t c = 0; c < 8; ++c) {
    AtomicComponent component;
    component.batch_task = TaskId(c);
    component.cost.forward.per_sample_s = 1;
    component.cost.backward.per_sample_s = 2;
    component.cost.saved_per_sample = 1;
    component.cost.param_bytes = c < 4 ? 1000 : 0;
    atomic.components.push_back(component);
    if (c < 4) atomic.params.push_back(ParamUse{1000, {c}});
    if (c > 0) atomic.transfers.push_back(Transfer{c - 1, {c}, 10});
  }
  const Weights weights{atomic, TrainingSpec{}, 1.0};
  const BlockCaps caps = weights.caps(2, 1.5);
  BlockStatistics stats;
  const BlockAssignment a = build_blocks(atomic, 2, {}, TrainingSpec{}, 1.0, &stats);
  expect_topological(atomic, a);
  for (const auto& m : members_of(a)) {
    EXPECT_TRUE(weights.within(weights.of(m), caps));
    EXPECT_LE(std::count_if(m.begin(), m.end(), [](uint32_t c) { return c < 4; }), 3);
  }
  EXPECT_NEAR(stats.caps.memory_bytes, caps.memory_bytes, 1e-6 * caps.memory_bytes);
  EXPECT_NEAR(stats.caps.time_s, caps.time_s, 1e-9 * caps.time_s);
}

TEST(TheBlockLevel, CountsAWeightReadBySeveralComponentsOnceInABlock) {
  AtomicGraph atomic;
  for (uint32_t c = 0; c < 3; ++c) {
    AtomicComponent component;
    component.batch_task = TaskId(c);
    component.cost.saved_per_sample = 10;
    atomic.components.push_back(component);
  }
  atomic.params.push_back(ParamUse{100, {0, 2}});  // tied: read by components 0 and 2
  atomic.params.push_back(ParamUse{7, {1}});
  TrainingSpec adam;  // Adam, fp32: 4 bytes of state per stored byte
  const double u = 2;
  EXPECT_DOUBLE_EQ(block_weight_of(atomic, {0, 1, 2}, adam, u).memory_bytes, 3 * 10 * u + (100 + 7) * 4.0);
  EXPECT_DOUBLE_EQ(block_weight_of(atomic, {0, 2}, adam, u).memory_bytes, 2 * 10 * u + 100 * 4.0);
  TrainingSpec sgd;
  sgd.optimizer = Optimizer::kSgd;  // weights + gradients: 2 per stored byte
  EXPECT_DOUBLE_EQ(block_weight_of(atomic, {1}, sgd, u).memory_bytes, 10 * u + 7 * 2.0);
}

TEST(TheBlockLevel, ReachesTheRequestedCountWithBlocksNumberedTopologically) {
  for (uint32_t seed = 0; seed < 12; ++seed) {
    const auto model = random_model(200 + seed, 40, seed % 3 == 0);
    const AtomicGraph atomic = build_atomic_graph(model.graph, model.costs, {});
    for (int k : {1, 2, 3, 5, 8, 13, static_cast<int>(atomic.size())}) {
      if (k > static_cast<int>(atomic.size())) continue;
      const BlockAssignment a = build_blocks(atomic, k, {}, TrainingSpec{}, kReferenceMicrobatch);
      EXPECT_EQ(a.blocks, static_cast<uint32_t>(k));
      expect_topological(atomic, a);
      EXPECT_NO_THROW(make_block_sequence(atomic, a));
    }
  }
}

TEST(TheBlockLevel, GivesTheSameBlocksOnEveryRun) {
  const auto model = random_model(7, 300, false);
  const AtomicGraph atomic = build_atomic_graph(model.graph, model.costs, {});
  TrainingSpec mixed;
  mixed.precision = Precision::kMixed;
  for (int k : {4, 16, 64}) {
    BlockStatistics first_stats, second_stats;
    const BlockAssignment first = build_blocks(atomic, k, {}, mixed, 16, &first_stats);
    const BlockAssignment second = build_blocks(atomic, k, {}, mixed, 16, &second_stats);
    EXPECT_EQ(first.block_of, second.block_of);
    EXPECT_EQ(first_stats.moves, second_stats.moves);
    EXPECT_EQ(first_stats.max_load, second_stats.max_load);
  }
}

// ---------------- Stage-cut refinement ----------------

Cluster small_cluster(int devices, int64_t memory) { return testing::test_cluster(devices, 2, memory); }

// Least bottleneck over every split of `order` (a topological order of the components) into S contiguous
// stages whose cuts lie in the given ranges of positions, with the replica counts fixed.
double brute_force_cuts(const AtomicGraph& atomic, const std::vector<uint32_t>& order, const StageSolution& base,
                        const std::vector<std::pair<size_t, size_t>>& ranges, const Cluster& cluster,
                        const TrainingSpec& training) {
  const size_t n = order.size();
  // Every component its own block, in `order`.
  BlockAssignment singles;
  singles.blocks = static_cast<uint32_t>(n);
  singles.block_of.resize(n);
  for (size_t p = 0; p < n; ++p) singles.block_of[order[p]] = BlockId(static_cast<uint32_t>(p));
  const StageEvaluator ev(make_block_sequence(atomic, singles), cluster, training);
  const int stages = base.stages;
  double best = std::numeric_limits<double>::infinity();
  std::vector<uint32_t> cuts{0};
  std::function<void(int)> place = [&](int s) {
    if (s == stages) {
      cuts.push_back(static_cast<uint32_t>(n));
      double worst = 0;
      bool fits = true;
      for (int i = 0; i < stages && fits; ++i) {
        const StageCost c = ev.evaluate(cuts[i], cuts[i + 1], base.replicas[i], base.microbatches,
                                        stage_in_flight_microbatches(base.schedule, i, stages, base.microbatches),
                                        base.recompute);
        fits = c.memory_bytes <= cluster.usable_memory_bytes() && cuts[i] < cuts[i + 1];
        worst = std::max(worst, c.h);
      }
      if (fits) best = std::min(best, worst);
      cuts.pop_back();
      return;
    }
    for (size_t p = std::max<size_t>(ranges[s].first, cuts.back() + 1); p <= ranges[s].second && p < n; ++p) {
      cuts.push_back(static_cast<uint32_t>(p));
      place(s + 1);
      cuts.pop_back();
    }
  };
  place(1);
  return best;
}

TEST(TheStageCutRefinement, FindsTheBestCutsNearTheBlockEdgesAndNeverRaisesTheBottleneck) {
  int refined_cases = 0, sparse_cases = 0;
  for (uint32_t seed = 0; seed < 16; ++seed) {
    const auto model = random_model(300 + seed, 26, seed % 2 == 0);
    const AtomicGraph atomic = build_atomic_graph(model.graph, model.costs, {});
    const int k = 6;
    const BlockAssignment blocks = build_blocks(atomic, k, {}, TrainingSpec{}, kReferenceMicrobatch);
    const Cluster cluster = small_cluster(6, 4'000'000);
    TrainingSpec training;
    training.global_batch = 12;
    const StageEvaluator coarse_ev(make_block_sequence(atomic, blocks), cluster, training);
    for (int stages : {2, 3}) {
      const StageDp dp(coarse_ev, {.microbatches = 2});
      const auto coarse = dp.solve(stages);
      if (!coarse) continue;
      // The component order refinement works in: by block, then by index.
      std::vector<uint32_t> order(atomic.size());
      std::iota(order.begin(), order.end(), 0u);
      std::stable_sort(order.begin(), order.end(),
                       [&](uint32_t a, uint32_t b) { return blocks.block_of[a] < blocks.block_of[b]; });
      std::vector<size_t> start(k + 1, atomic.size());
      for (size_t p = atomic.size(); p-- > 0;) start[blocks.block_of[order[p]].value()] = p;
      // Oracle 1: every cut anywhere (the best any refinement could reach with these replicas).
      std::vector<std::pair<size_t, size_t>> anywhere(stages, {1, atomic.size() - 1});
      const double global = brute_force_cuts(atomic, order, *coarse, anywhere, cluster, training);
      // Oracle 2: every cut within the blocks on either side of its coarse position (the first round's windows).
      std::vector<std::pair<size_t, size_t>> windows(stages);
      for (int s = 1; s < stages; ++s)
        windows[s] = {start[coarse->boundaries[s] - 1], start[coarse->boundaries[s] + 1]};
      const double local = brute_force_cuts(atomic, order, *coarse, windows, cluster, training);

      const auto refined = refine_stage_cuts(atomic, blocks, *coarse, cluster, training);
      const double result = refined ? refined->solution.bottleneck_h : coarse->bottleneck_h;
      EXPECT_LE(result, coarse->bottleneck_h * (1 + 1e-12));
      EXPECT_LE(result, local * (1 + 1e-12)) << "seed " << seed << " S " << stages;
      EXPECT_GE(result, global * (1 - 1e-12));
      // With few runs allowed the windows get geometrically spaced positions: still never worse.
      const auto sparse = refine_stage_cuts(atomic, blocks, *coarse, cluster, training, 4 * stages);
      if (sparse) {
        ++sparse_cases;
        EXPECT_LE(sparse->solution.bottleneck_h, coarse->bottleneck_h * (1 + 1e-12));
        EXPECT_GE(sparse->solution.bottleneck_h, global * (1 - 1e-12));
        expect_topological(atomic, sparse->assignment);
      }
      if (!refined) continue;
      ++refined_cases;
      const StageSolution& s = refined->solution;
      EXPECT_EQ(s.stages, coarse->stages);
      EXPECT_EQ(s.microbatches, coarse->microbatches);
      EXPECT_EQ(s.replicas, coarse->replicas);
      EXPECT_EQ(s.recompute, coarse->recompute);
      EXPECT_EQ(s.boundaries.back(), refined->assignment.blocks);
      expect_topological(atomic, refined->assignment);
      StageSolution again = s;
      EXPECT_TRUE(evaluate_solution(*refined->evaluator, again)) << "the refined split must fit memory";
      EXPECT_DOUBLE_EQ(again.estimate.iteration_s, s.estimate.iteration_s);
    }
  }
  EXPECT_GT(refined_cases, 4) << "refinement should move some cut on these graphs";
  EXPECT_GT(sparse_cases, 0) << "the geometric windows were never exercised";
}

TEST(TheStageCutRefinement, GivesTheSameCandidatesTwiceFastestFirstEachKeepingItsStageCountAndReplicas) {
  int returned = 0;
  for (uint32_t seed = 0; seed < 8; ++seed) {
    const auto model = random_model(400 + seed, 30, false);
    const AtomicGraph atomic = build_atomic_graph(model.graph, model.costs, {});
    const BlockAssignment blocks = build_blocks(atomic, 8, {}, TrainingSpec{}, kReferenceMicrobatch);
    const Cluster cluster = small_cluster(8, 8'000'000);
    TrainingSpec training;
    training.global_batch = 16;
    const StageEvaluator ev(make_block_sequence(atomic, blocks), cluster, training);
    std::vector<StageSolution> found;
    for (int64_t m : {1, 2, 4})
      for (int stages = 1; stages <= 4; ++stages)
        if (auto s = StageDp(ev, {.microbatches = m}).solve(stages)) found.push_back(*s);
    if (found.empty()) continue;
    const auto first = refine_best_candidates(atomic, blocks, found, cluster, training);
    const auto second = refine_best_candidates(atomic, blocks, found, cluster, training);
    ASSERT_EQ(first.size(), second.size());
    returned += static_cast<int>(first.size());
    for (size_t c = 0; c < first.size(); ++c) {
      EXPECT_EQ(first[c].solution.boundaries, second[c].solution.boundaries) << "not deterministic";
      EXPECT_EQ(first[c].assignment.block_of, second[c].assignment.block_of);
      EXPECT_EQ(first[c].kind, second[c].kind);
      if (c > 0) EXPECT_LE(first[c - 1].solution.estimate.iteration_s, first[c].solution.estimate.iteration_s);
      // Some given candidate has its stage count, micro-batches and replicas.
      bool pinned = false;
      for (const StageSolution& s : found)
        pinned |= s.stages == first[c].solution.stages && s.microbatches == first[c].solution.microbatches &&
                  s.replicas == first[c].solution.replicas;
      EXPECT_TRUE(pinned) << first[c].kind;
      expect_topological(atomic, first[c].assignment);
    }
  }
  EXPECT_GT(returned, 0);
}

}  // namespace
}  // namespace apart
