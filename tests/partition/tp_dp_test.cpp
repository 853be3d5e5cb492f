// The stage DP choosing a tensor-parallel degree per stage, against brute force over every split × replicas ×
// degree (× recomputation), and the placement that keeps every tensor-parallel group inside one node.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <optional>
#include <set>
#include <string>

#include "brute_force.h"
#include "partition/placement.h"
#include "partition/stage_dp.h"
#include "random_models.h"
#include "test_cluster.h"

namespace apart {
namespace {

// random_sequence with a random share of each block split by tensor parallelism (some blocks none), its regions'
// collectives, and some degrees refused.
BlockSequence tp_sequence(std::mt19937& rng, int k) {
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  BlockSequence seq = testing::random_sequence(rng, k);
  for (BlockCost& b : seq.blocks) {
    b.param_bytes *= 6;  // weights heavy enough that splitting them decides what fits
    if (uniform(0, 1) < 0.25) {  // a block with no splittable region, so no attention core either
      b.tp = {};
      continue;
    }
    const double share = uniform(0.3, 0.95);
    b.tp.forward = {b.forward.fixed_s * share, b.forward.per_sample_s * share};
    b.tp.backward = {b.backward.fixed_s * share, b.backward.per_sample_s * share};
    b.tp.saved_per_sample = b.saved_per_sample * share;
    // The attention core inside the split share; the replicated rest partly between regions (sequence parallel).
    const double core = uniform(0.1, 0.4), between = uniform(0, 1);
    b.tp.core_forward = {b.tp.forward.fixed_s * core, b.tp.forward.per_sample_s * core};
    b.tp.core_saved_per_sample = b.tp.saved_per_sample * uniform(0.3, 0.8);
    b.tp.sp_forward = {(b.forward.fixed_s - b.tp.forward.fixed_s) * between,
                       (b.forward.per_sample_s - b.tp.forward.per_sample_s) * between};
    b.tp.sp_backward = {(b.backward.fixed_s - b.tp.backward.fixed_s) * between,
                        (b.backward.per_sample_s - b.tp.backward.per_sample_s) * between};
    b.tp.sp_saved_per_sample = (b.saved_per_sample - b.tp.saved_per_sample) * between;
    b.tp.param_bytes = static_cast<int64_t>(static_cast<double>(b.param_bytes) * share);
    b.tp.forward_collectives = 1 + static_cast<int64_t>(uniform(0, 2));
    b.tp.backward_collectives = b.tp.forward_collectives;
    b.tp.forward_collective_per_sample = uniform(1e4, 1e6);
    b.tp.backward_collective_per_sample = uniform(1e4, 1e6);
    for (int bit = 0; bit < 3; ++bit)
      if (uniform(0, 1) < 0.15) b.tp.refused |= static_cast<uint8_t>(1u << bit);
  }
  return seq;
}

// Least max h over every split × (replicas, degree) × per-stage recomputation where `per_stage_recompute`.
double brute_force_tp(const StageEvaluator& ev, int stages, int64_t m, const std::vector<int>& degrees,
                      bool per_stage_recompute) {
  return testing::brute_force_bottleneck(ev, stages, m, degrees, [&](int s, uint32_t first, uint32_t last, int sd, int tp) {
    if (!ev.allows_tp(first, last, tp)) return std::numeric_limits<double>::infinity();
    double h = std::numeric_limits<double>::infinity();
    for (RecomputeScope rc : {RecomputeScope::kNone, RecomputeScope::kSelective, RecomputeScope::kFull})
      if (per_stage_recompute || rc == RecomputeScope::kNone)
        h = std::min(h, testing::fitting_h(ev, ev.evaluate(first, last, sd, m,
                                                            stage_in_flight_microbatches(Schedule::k1F1B, s, stages, m),
                                                            rc, nullptr, 0, tp)));
    return h;
  });
}

TEST(AStageDpWithTensorParallelDegrees, FindsTheBruteForceBottleneckOverEverySplitReplicaCountAndDegree) {
  std::mt19937 rng(41);
  int compared = 0, split = 0, mixed = 0, only_with_tp = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const int k = 2 + trial % 3;
    const int devices = 2 + trial % 7;  // 2..8
    const Cluster cluster = testing::test_cluster(devices, trial % 2 ? 4 : 8,
                                                  static_cast<int64_t>(std::uniform_real_distribution<double>(4e9, 16e9)(rng)));
    TrainingSpec training;
    training.global_batch = 8;
    training.precision = trial % 3 ? Precision::kMixed : Precision::kFp32;
    const BlockSequence seq = tp_sequence(rng, k);
    const StageEvaluator ev(seq, cluster, training);
    const std::vector<int> degrees = tp_degrees(std::nullopt, cluster);
    for (StageRecompute recompute : {StageRecompute::kOff, StageRecompute::kWhereNeeded})
      for (int64_t m : {1, 2, 4}) {
        const StageDp dp(ev, {.microbatches = m, .recompute = recompute, .tp_degrees = degrees});
        const StageDp untensored(ev, {.microbatches = m, .recompute = recompute});
        for (int stages = 1; stages <= std::min(k, devices); ++stages) {
          const double expected = brute_force_tp(ev, stages, m, degrees, recompute == StageRecompute::kWhereNeeded);
          const auto got = dp.solve(stages);
          ASSERT_EQ(got.has_value(), !std::isinf(expected)) << "trial " << trial << " S=" << stages << " m=" << m;
          if (!got) continue;
          EXPECT_NEAR(got->bottleneck_h, expected, 1e-12 * expected) << "trial " << trial << " S=" << stages;
          EXPECT_LE(got->devices_used(), devices);
          bool any = false, all = true;
          for (int s = 0; s < stages; ++s) {
            const int tp = got->tp_of(s);
            EXPECT_TRUE(ev.allows_tp(got->boundaries[s], got->boundaries[s + 1], tp)) << "a refused degree";
            EXPECT_EQ(cluster.devices_per_node % tp, 0);
            EXPECT_EQ(got->costs[s].tp, tp);
            EXPECT_LE(got->costs[s].memory_bytes, cluster.usable_memory_bytes());
            any |= tp > 1;
            all &= tp > 1;
          }
          split += any;
          mixed += any && !all;
          only_with_tp += !untensored.solve(stages).has_value();
          ++compared;
        }
      }
  }
  EXPECT_GT(compared, 150);
  EXPECT_GT(split, 0) << "some optimum splits a stage";
  EXPECT_GT(mixed, 0) << "some optimum splits some stages only";
  EXPECT_GT(only_with_tp, 0) << "some instance fits only with tensor parallelism";
}

TEST(AStageDpWithTensorParallelDegrees, GivesEveryStageThePinnedDegreeAndMatchesBruteForceThere) {
  std::mt19937 rng(43);
  int compared = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const int k = 2 + trial % 3;
    const Cluster cluster = testing::test_cluster(8, 8, 12'000'000'000);
    TrainingSpec training;
    training.global_batch = 8;
    training.precision = Precision::kMixed;
    const BlockSequence seq = tp_sequence(rng, k);
    const StageEvaluator ev(seq, cluster, training);
    for (int pinned : {2, 4}) {
      const std::vector<int> degrees = tp_degrees(pinned, cluster);
      ASSERT_EQ(degrees, std::vector<int>{pinned});
      const StageDp dp(ev, {.microbatches = 2, .tp_degrees = degrees});
      for (int stages = 1; stages <= std::min(k, 8 / pinned); ++stages) {
        const double expected = brute_force_tp(ev, stages, 2, degrees, false);
        const auto got = dp.solve(stages);
        ASSERT_EQ(got.has_value(), !std::isinf(expected)) << "trial " << trial << " S=" << stages;
        if (!got) continue;
        EXPECT_NEAR(got->bottleneck_h, expected, 1e-12 * expected);
        for (int s = 0; s < stages; ++s) EXPECT_EQ(got->tp_of(s), pinned);
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 10);
}

TEST(AStageDpWithTensorParallelDegrees, ChoosesTheSameSplitReplicasAndDegreesEveryRun) {
  std::mt19937 rng(47);
  const BlockSequence seq = tp_sequence(rng, 6);
  const Cluster cluster = testing::test_cluster(16, 8, 10'000'000'000);
  TrainingSpec training;
  training.global_batch = 32;
  training.precision = Precision::kMixed;
  const StageEvaluator ev(seq, cluster, training);
  auto solve = [&] {
    const StageDp dp(ev, {.microbatches = 4, .recompute = StageRecompute::kWhereNeeded,
                          .tp_degrees = tp_degrees(std::nullopt, cluster)});
    std::optional<StageSolution> s = dp.solve(3);
    if (s) dp.spend_leftover_devices(*s);
    return s;
  };
  const auto a = solve(), b = solve();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->boundaries, b->boundaries);
  EXPECT_EQ(a->replicas, b->replicas);
  EXPECT_EQ(a->stage_tp, b->stage_tp);
  EXPECT_EQ(a->stage_recompute, b->stage_recompute);
  EXPECT_EQ(a->estimate.iteration_s, b->estimate.iteration_s);
  EXPECT_LE(a->devices_used(), 16);
}

// A fixed split (every block a stage: the baselines') builds no tables and finds its bottleneck greedily
// (solve_fixed_split). Oracle: the tabled DP asked for k stages of k blocks solves the same problem exactly (itself
// checked against brute force above), so both give the same plan — bottleneck, replicas, degrees, recomputation,
// ZeRO stages, and after spending leftover devices the same estimate — over degrees, recomputation, ZeRO, schedules,
// pinned replicas and 1–64 devices; brute force too where it is small.
TEST(AFixedSplitStageDp, ChoosesWhatTheTabledDpChoosesForOneBlockPerStage) {
  std::mt19937 rng(53);
  int compared = 0, infeasible = 0, brute = 0, with_tp = 0;
  for (int trial = 0; trial < 48; ++trial) {
    const int k = 2 + trial % 6;
    const int devices = std::vector<int>{2, 3, 4, 6, 8, 16, 24, 64}[static_cast<size_t>(trial % 8)];
    const Cluster cluster = testing::test_cluster(devices, trial % 3 ? 8 : 4,
                                                  static_cast<int64_t>(std::uniform_real_distribution<double>(3e9, 16e9)(rng)));
    TrainingSpec training;
    training.global_batch = 64;
    training.precision = trial % 3 ? Precision::kMixed : Precision::kFp32;
    const BlockSequence seq = tp_sequence(rng, k);
    const StageEvaluator ev(seq, cluster, training);
    const std::vector<std::vector<int>> degree_sets{{1}, tp_degrees(std::nullopt, cluster)};
    for (const std::vector<int>& degrees : degree_sets)
      for (StageRecompute recompute : {StageRecompute::kOff, StageRecompute::kAll, StageRecompute::kWhereNeeded})
        for (StageZero zero : {StageZero{}, StageZero{.stage = 1}, StageZero{.stage = 0, .automatic = true}})
          for (Schedule schedule : {Schedule::k1F1B, Schedule::kGPipe})
            for (int64_t m : {1, 4, 16})
              for (std::optional<int> pinned : {std::optional<int>{}, std::optional<int>{2}}) {
                if (pinned && (trial % 4 != 0 || *pinned * k > devices)) continue;
                const StageDpOptions o{.microbatches = m, .schedule = schedule, .recompute = recompute, .zero = zero,
                                       .tp_degrees = degrees, .pinned_replicas = pinned};
                StageDpOptions fixed_options = o;
                fixed_options.fixed_split = true;
                const StageDp tabled(ev, o), fixed(ev, fixed_options);
                std::optional<StageSolution> want = tabled.solve(k), got = fixed.solve(k);
                const std::string where = "trial " + std::to_string(trial) + " m=" + std::to_string(m) +
                                          " degrees " + std::to_string(degrees.size());
                ASSERT_EQ(got.has_value(), want.has_value()) << where;
                EXPECT_FALSE(fixed.solve(k - 1).has_value()) << where << ": a fixed split has k stages only";
                if (!got) {
                  ++infeasible;
                  continue;
                }
                EXPECT_EQ(got->bottleneck_h, want->bottleneck_h) << where;
                EXPECT_EQ(got->replicas, want->replicas) << where;
                EXPECT_EQ(got->stage_tp, want->stage_tp) << where;
                EXPECT_EQ(got->stage_recompute, want->stage_recompute) << where;
                EXPECT_EQ(got->stage_zero, want->stage_zero) << where;
                fixed.spend_leftover_devices(*got);
                tabled.spend_leftover_devices(*want);
                EXPECT_EQ(got->replicas, want->replicas) << where << ", leftover devices spent";
                EXPECT_EQ(got->estimate.iteration_s, want->estimate.iteration_s) << where;
                if (degrees.size() == 1 && !pinned && zero.stage == 0 && !zero.automatic && devices <= 4 && k <= 4 &&
                    recompute == StageRecompute::kOff && schedule == Schedule::k1F1B) {
                  std::optional<StageSolution> again = fixed.solve(k);
                  EXPECT_NEAR(again->bottleneck_h, brute_force_tp(ev, k, m, degrees, false), 1e-12 * again->bottleneck_h);
                  ++brute;
                }
                for (int s = 0; s < k; ++s) with_tp += got->tp_of(s) > 1;
                ++compared;
              }
  }
  EXPECT_GT(compared, 1000);
  EXPECT_GT(infeasible, 0);
  EXPECT_GT(brute, 10);
  EXPECT_GT(with_tp, 0);
}

TEST(AFixedSplitStageDp, ChoosesTheSamePlanEveryRun) {
  std::mt19937 rng(59);
  const BlockSequence seq = tp_sequence(rng, 7);
  const Cluster cluster = testing::test_cluster(64, 8, 10'000'000'000);
  TrainingSpec training;
  training.global_batch = 256;
  training.precision = Precision::kMixed;
  const StageEvaluator ev(seq, cluster, training);
  auto solve = [&] {
    const StageDp dp(ev, {.microbatches = 8, .recompute = StageRecompute::kWhereNeeded,
                          .zero = {.stage = 0, .automatic = true}, .tp_degrees = tp_degrees(std::nullopt, cluster),
                          .fixed_split = true});
    std::optional<StageSolution> s = dp.solve(7);
    if (s) dp.spend_leftover_devices(*s);
    return s;
  };
  const auto a = solve(), b = solve();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->replicas, b->replicas);
  EXPECT_EQ(a->stage_tp, b->stage_tp);
  EXPECT_EQ(a->stage_recompute, b->stage_recompute);
  EXPECT_EQ(a->stage_zero, b->stage_zero);
  EXPECT_EQ(a->estimate.iteration_s, b->estimate.iteration_s);
}

TEST(TensorParallelDegrees, AreThoseDividingTheNodeUpToTheClusterOrThePinnedOne) {
  EXPECT_EQ(tp_degrees(std::nullopt, testing::test_cluster(64, 8)), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(tp_degrees(std::nullopt, testing::test_cluster(64, 6)), (std::vector<int>{1, 2}));
  EXPECT_EQ(tp_degrees(std::nullopt, testing::test_cluster(2, 8)), (std::vector<int>{1, 2}));
  EXPECT_EQ(tp_degrees(std::nullopt, testing::test_cluster(4, 1)), (std::vector<int>{1}));
  EXPECT_EQ(tp_degrees(4, testing::test_cluster(64, 8)), (std::vector<int>{4}));
}

TEST(APlacementWithTensorParallelStages, KeepsEveryGroupInsideOneNodeAndUsesEachDeviceOnce) {
  std::mt19937 rng(53);
  int fell_back = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int per_node = trial % 3 == 0 ? 4 : 8;
    const int devices = per_node * (1 + trial % 4);
    const Cluster cluster = testing::test_cluster(devices, per_node);
    std::vector<int> replicas, tp;
    int used = 0;
    for (int s = 0; s < 6; ++s) {
      const int t = std::vector<int>{1, 1, 2, 4, 8}[std::uniform_int_distribution<int>(0, 4)(rng)];
      if (t > per_node) continue;
      const int r = std::uniform_int_distribution<int>(1, 3)(rng);
      if (used + r * t > devices) break;
      replicas.push_back(r);
      tp.push_back(t);
      used += r * t;
    }
    if (replicas.empty()) continue;
    const Placement p = place_stages(replicas, cluster, Layout::kStageMajor, tp);
    std::set<int> seen;
    bool in_order = true;
    int previous_end = -1;
    for (size_t s = 0; s < replicas.size(); ++s) {
      ASSERT_EQ(p.devices[s].size(), static_cast<size_t>(replicas[s] * tp[s]));
      EXPECT_EQ(p.tp[s], tp[s]);
      for (size_t g = 0; g < p.devices[s].size(); g += static_cast<size_t>(tp[s]))
        for (size_t d = g; d < g + static_cast<size_t>(tp[s]); ++d) {
          EXPECT_TRUE(cluster.same_node(p.devices[s][g], p.devices[s][d])) << "trial " << trial << " stage " << s;
          EXPECT_EQ(p.devices[s][d], p.devices[s][g] + static_cast<int>(d - g)) << "a group is consecutive devices";
        }
      for (int d : p.devices[s]) {
        EXPECT_TRUE(seen.insert(d).second) << "device " << d << " used twice";
        EXPECT_LT(d, devices);
      }
      in_order &= p.devices[s].front() > previous_end;
      previous_end = p.devices[s].back();
    }
    fell_back += !in_order;
    const std::vector<StageLinks> links = placed_links(p, cluster);
    for (const StageLinks& l : links) EXPECT_EQ(l.tensor.bandwidth, cluster.intra_node.bandwidth);
  }
  EXPECT_GT(fell_back, 0) << "some layout needs the by-degree order";
}

TEST(APlacementWithTensorParallelStages, RunsEachMembersAllReduceRingInsideANodeOnlyWhenTheGroupsShareOne) {
  const Cluster cluster = testing::test_cluster(16, 8);
  // Two replicas of degree 4 fill one node: the rings of same-rank members stay inside it.
  const Placement one_node = place_stages(std::vector<int>{2}, cluster, Layout::kStageMajor, std::vector<int>{4});
  EXPECT_EQ(placed_links(one_node, cluster)[0].replicas.bandwidth, cluster.intra_node.bandwidth);
  // Two replicas of degree 8: one node each, so each member's ring crosses nodes.
  const Placement two_nodes = place_stages(std::vector<int>{2}, cluster, Layout::kStageMajor, std::vector<int>{8});
  EXPECT_EQ(placed_links(two_nodes, cluster)[0].replicas.bandwidth, cluster.inter_node.bandwidth);
}

}  // namespace
}  // namespace apart
