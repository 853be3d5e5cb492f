// The block level (two balance constraints: time and memory) against brute force on small graphs: every acyclic
// blocking.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

#include "partition/block.h"
#include "partition/stage_cost.h"
#include "random_models.h"

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
  for (uint32_t c = 0; c < a.block_of.size(); ++c) m[a.block_of[c]].push_back(c);
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

}  // namespace
}  // namespace apart
