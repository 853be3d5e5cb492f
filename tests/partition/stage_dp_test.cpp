// The stage DP against brute force over every contiguous split × replica assignment (paper §IV-C).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "brute_force.h"
#include "graph/error.h"
#include "partition/stage_dp.h"
#include "profiler/collectives.h"
#include "random_models.h"
#include "test_cluster.h"

namespace apart {
namespace {

// Least max_i h over all splits into `stages` stages and all replica vectors with Σ ≤ devices that fit memory;
// `per_stage`: each stage also free to recompute nothing, its attention cores or everything (the fastest that fits).
// `selective`: whether the per-stage choice includes the attention cores.
double brute_force_bottleneck(const StageEvaluator& ev, int stages, int64_t m, Schedule schedule, bool recompute,
                              bool per_stage = false, bool selective = true) {
  return testing::brute_force_bottleneck(ev, stages, m, [&](int s, uint32_t first, uint32_t last, int replicas) {
    double h = std::numeric_limits<double>::infinity();
    for (RecomputeScope rc : {RecomputeScope::kNone, RecomputeScope::kSelective, RecomputeScope::kFull})
      if ((per_stage && (selective || rc != RecomputeScope::kSelective)) ||
          rc == (recompute ? RecomputeScope::kFull : RecomputeScope::kNone))
        h = std::min(h, testing::fitting_h(ev, ev.evaluate(first, last, replicas, m,
                                                            stage_in_flight_microbatches(schedule, s, stages, m), rc)));
    return h;
  });
}

// 1–4 devices, two per node, memory drawn from [lo, hi) bytes.
Cluster small_cluster(int devices, std::mt19937& rng, double lo, double hi) {
  return testing::test_cluster(devices, 2, static_cast<int64_t>(std::uniform_real_distribution<double>(lo, hi)(rng)));
}

TEST(AStageDp, FindsTheBruteForceBottleneckForEveryStageAndMicrobatchCount) {
  std::mt19937 rng(7);
  int compared = 0, infeasible = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int k = 2 + trial % 6;
    const Cluster cluster = small_cluster(1 + trial % 4, rng, 2e9, 12e9);
    TrainingSpec training;
    training.global_batch = 12;
    training.precision = trial % 2 ? Precision::kMixed : Precision::kFp32;
    const BlockSequence seq = testing::random_sequence(rng, k);
    const StageEvaluator ev(seq, cluster, training);
    for (int64_t m : {1, 2, 3, 4, 6, 12})
      for (Schedule schedule : {Schedule::k1F1B, Schedule::kGPipe})
        for (bool recompute : {false, true}) {
          const StageDp dp(ev, {.microbatches = m,
                                .schedule = schedule,
                                .recompute = recompute ? StageRecompute::kAll : StageRecompute::kOff});
          for (int stages = 1; stages <= std::min(k, cluster.devices); ++stages) {
            const double expected = brute_force_bottleneck(ev, stages, m, schedule, recompute);
            const auto got = dp.solve(stages);
            if (std::isinf(expected)) {
              EXPECT_FALSE(got.has_value()) << "trial " << trial << " S=" << stages << " m=" << m;
              ++infeasible;
              continue;
            }
            ASSERT_TRUE(got.has_value()) << "trial " << trial << " S=" << stages << " m=" << m;
            EXPECT_NEAR(got->bottleneck_h, expected, 1e-12 * expected)
                << "trial " << trial << " S=" << stages << " m=" << m;
            EXPECT_LE(got->devices_used(), cluster.devices);
            ++compared;
          }
        }
  }
  EXPECT_GT(compared, 500);
  EXPECT_GT(infeasible, 0);  // the memory limits above make some requests infeasible
}

TEST(AStageDp, FindsTheBruteForceBottleneckWhenEachStageMayRecomputeItsWholeForwardOnItsOwn) {
  std::mt19937 rng(19);
  int compared = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const int k = 2 + trial % 5;
    const Cluster cluster = small_cluster(1 + trial % 4, rng, 3e9, 12e9);
    TrainingSpec training;
    training.global_batch = 48;
    const BlockSequence seq = testing::random_sequence(rng, k);
    const StageEvaluator ev(seq, cluster, training);
    for (int64_t m : {1, 2, 4, 12}) {
      const StageDp dp(ev, {.microbatches = m, .recompute = StageRecompute::kWholeWhereNeeded});
      for (int stages = 1; stages <= std::min(k, cluster.devices); ++stages) {
        const double expected = brute_force_bottleneck(ev, stages, m, Schedule::k1F1B, false, true, false);
        const auto got = dp.solve(stages);
        ASSERT_EQ(got.has_value(), !std::isinf(expected)) << "trial " << trial << " S=" << stages << " m=" << m;
        if (!got) continue;
        EXPECT_NEAR(got->bottleneck_h, expected, 1e-12 * expected) << "trial " << trial << " S=" << stages;
        for (int s = 0; s < stages; ++s) EXPECT_NE(got->recompute_of(s), RecomputeScope::kSelective);
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 60);
}

TEST(AStageDp, FindsTheBruteForceBottleneckWhenEachStageMayRecomputeOnItsOwn) {
  std::mt19937 rng(17);
  int compared = 0, mixed = 0;
  for (int trial = 0; trial < 30; ++trial) {
    const int k = 2 + trial % 5;
    const Cluster cluster = small_cluster(1 + trial % 4, rng, 3e9, 12e9);
    TrainingSpec training;
    training.global_batch = 48;  // large micro-batches: activations, not weights, decide what fits
    const BlockSequence seq = testing::random_sequence(rng, k);
    const StageEvaluator ev(seq, cluster, training);
    for (int64_t m : {1, 2, 4, 12}) {
      const StageDp dp(ev, {.microbatches = m, .recompute = StageRecompute::kWhereNeeded});
      for (int stages = 1; stages <= std::min(k, cluster.devices); ++stages) {
        const double expected = brute_force_bottleneck(ev, stages, m, Schedule::k1F1B, false, true);
        const auto got = dp.solve(stages);
        ASSERT_EQ(got.has_value(), !std::isinf(expected)) << "trial " << trial << " S=" << stages << " m=" << m;
        if (!got) continue;
        EXPECT_NEAR(got->bottleneck_h, expected, 1e-12 * expected) << "trial " << trial << " S=" << stages;
        ASSERT_EQ(got->stage_recompute.size(), static_cast<size_t>(stages));
        bool any = false, all = true;
        for (int s = 0; s < stages; ++s) {
          any |= got->recomputes(s);
          all &= got->recomputes(s);
          EXPECT_LE(got->costs[s].memory_bytes, cluster.usable_memory_bytes());
        }
        mixed += any && !all;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 100);
  EXPECT_GT(mixed, 0) << "some optimum recomputes in some stages only";
}

// Weights large enough that ZeRO decides what fits; each block's largest task reads a third of its weights.
BlockSequence weight_heavy_sequence(std::mt19937& rng, int k) {
  BlockSequence seq = testing::random_sequence(rng, k);
  for (BlockCost& b : seq.blocks) {
    b.param_bytes *= 8;
    b.largest_task_param_bytes = b.param_bytes / 3;
  }
  return seq;
}

// Least max h over every split × replica vector × per-stage (recompute, ZeRO stage) among `variants`.
double brute_force_variants(const StageEvaluator& ev, int stages, int64_t m, const std::vector<StageVariant>& variants) {
  return testing::brute_force_bottleneck(ev, stages, m, [&](int s, uint32_t first, uint32_t last, int replicas) {
    double h = std::numeric_limits<double>::infinity();
    for (const StageVariant& v : variants)
      h = std::min(h, testing::fitting_h(ev, ev.evaluate(first, last, replicas, m,
                                                          stage_in_flight_microbatches(Schedule::k1F1B, s, stages, m),
                                                          v.recompute, nullptr, v.zero)));
    return h;
  });
}

TEST(AStageDp, FindsTheBruteForceBottleneckWhenEachStageMayChooseItsZeroStage) {
  std::mt19937 rng(23);
  int compared = 0, mixed = 0, only_with_zero = 0;
  for (int trial = 0; trial < 30; ++trial) {
    const int k = 2 + trial % 4;
    const Cluster cluster = small_cluster(2 + trial % 3, rng, 3e9, 14e9);
    TrainingSpec training;
    training.global_batch = 12;
    training.precision = trial % 2 ? Precision::kMixed : Precision::kFp32;
    const BlockSequence seq = weight_heavy_sequence(rng, k);
    const StageEvaluator ev(seq, cluster, training);
    for (StageRecompute recompute : {StageRecompute::kOff, StageRecompute::kWhereNeeded})
      for (int64_t m : {1, 2, 4}) {
        const StageZero automatic{.stage = 0, .automatic = true};
        const StageDp dp(ev, {.microbatches = m, .recompute = recompute, .zero = automatic});
        const StageDp plain(ev, {.microbatches = m, .recompute = recompute});
        for (int stages = 1; stages <= std::min(k, cluster.devices); ++stages) {
          const double expected = brute_force_variants(ev, stages, m, stage_variants(recompute, automatic));
          const auto got = dp.solve(stages);
          ASSERT_EQ(got.has_value(), !std::isinf(expected)) << "trial " << trial << " S=" << stages << " m=" << m;
          if (!got) continue;
          EXPECT_NEAR(got->bottleneck_h, expected, 1e-12 * expected) << "trial " << trial << " S=" << stages;
          ASSERT_EQ(got->stage_zero.size(), static_cast<size_t>(stages));
          bool any = false, all = true;
          for (int s = 0; s < stages; ++s) {
            any |= got->zero_of(s) > 0;
            all &= got->zero_of(s) > 0;
            EXPECT_TRUE(got->replicas[s] > 1 || got->zero_of(s) == 0) << "ZeRO on one replica";
            EXPECT_EQ(got->costs[s].zero, got->zero_of(s));
            EXPECT_LE(got->costs[s].memory_bytes, cluster.usable_memory_bytes());
          }
          mixed += any && !all;
          only_with_zero += !plain.solve(stages).has_value();
          ++compared;
        }
      }
  }
  EXPECT_GT(compared, 100);
  EXPECT_GT(mixed, 0) << "some optimum shards in some stages only";
  EXPECT_GT(only_with_zero, 0) << "some instance fits only with ZeRO";
}

TEST(AStageDp, FindsTheBruteForceBottleneckUnderAFixedZeroStage) {
  std::mt19937 rng(29);
  int compared = 0;
  for (int trial = 0; trial < 16; ++trial) {
    const int k = 2 + trial % 4;
    const Cluster cluster = small_cluster(2 + trial % 3, rng, 3e9, 14e9);
    TrainingSpec training;
    training.global_batch = 12;
    training.precision = Precision::kMixed;
    const BlockSequence seq = weight_heavy_sequence(rng, k);
    const StageEvaluator ev(seq, cluster, training);
    for (int zero = 1; zero <= kMaxZeroStage; ++zero)
      for (int64_t m : {1, 3}) {
        const StageZero fixed{.stage = zero};
        const StageDp dp(ev, {.microbatches = m, .zero = fixed});
        for (int stages = 1; stages <= std::min(k, cluster.devices); ++stages) {
          const double expected = brute_force_variants(ev, stages, m, stage_variants(StageRecompute::kOff, fixed));
          const auto got = dp.solve(stages);
          ASSERT_EQ(got.has_value(), !std::isinf(expected)) << "trial " << trial << " S=" << stages << " ZeRO-" << zero;
          if (!got) continue;
          EXPECT_NEAR(got->bottleneck_h, expected, 1e-12 * expected) << "trial " << trial << " S=" << stages;
          EXPECT_TRUE(got->stage_zero.empty());
          for (int s = 0; s < stages; ++s) EXPECT_EQ(got->zero_of(s), got->replicas[s] > 1 ? zero : 0);
          ++compared;
        }
      }
  }
  EXPECT_GT(compared, 30);
}

TEST(AStageDp, ChoosesTheSameZeroStagesEveryRun) {
  std::mt19937 rng(31);
  const Cluster cluster = testing::test_cluster(4, 2, 6'000'000'000);
  TrainingSpec training;
  training.global_batch = 12;
  training.precision = Precision::kMixed;
  const BlockSequence seq = weight_heavy_sequence(rng, 5);
  const StageEvaluator ev(seq, cluster, training);
  const StageDpOptions options{.microbatches = 2, .recompute = StageRecompute::kWhereNeeded,
                               .zero = {.stage = 0, .automatic = true}};
  const StageDp first(ev, options), second(ev, options);
  for (int stages = 1; stages <= 4; ++stages) {
    auto a = first.solve(stages), b = second.solve(stages);
    ASSERT_EQ(a.has_value(), b.has_value());
    if (!a) continue;
    first.spend_leftover_devices(*a);
    second.spend_leftover_devices(*b);
    EXPECT_EQ(a->boundaries, b->boundaries);
    EXPECT_EQ(a->replicas, b->replicas);
    EXPECT_EQ(a->stage_zero, b->stage_zero);
    EXPECT_EQ(a->stage_recompute, b->stage_recompute);
    EXPECT_EQ(a->estimate.iteration_s, b->estimate.iteration_s);
  }
}

TEST(AStageEvaluator, CostsZeroCollectivesAsTheirRingVolumes) {
  // One block of 400 MB fp32-stored weights on 4 replicas, mixed precision (16-bit gradients and working weights:
  // 200 MB each), nothing overlapped, one micro-batch: ZeRO-1/2 move an all-reduce's volume, ZeRO-3 1.5 times it.
  BlockSequence seq;
  BlockCost b;
  b.forward = {1e-3, 0};
  b.backward = {2e-3, 0};
  b.param_bytes = 400'000'000;
  b.largest_task_param_bytes = 100'000'000;
  seq.blocks.push_back(b);
  TrainingSpec training;
  training.global_batch = 4;
  training.precision = Precision::kMixed;
  training.overlap_allreduce = false;
  const Cluster cluster = testing::test_cluster(4, 4, 1'000'000'000'000);
  const StageEvaluator ev(seq, cluster, training);
  const Link ring = ev.assumed_links(4).replicas;
  const double allreduce = ring_allreduce_time(4, 200e6, ring), half = ring_reduce_scatter_time(4, 200e6, ring);
  const StageCost z0 = ev.evaluate(0, 1, 4, 1, 1, RecomputeScope::kNone);
  const StageCost z1 = ev.evaluate(0, 1, 4, 1, 1, RecomputeScope::kNone, nullptr, 1);
  const StageCost z2 = ev.evaluate(0, 1, 4, 1, 1, RecomputeScope::kNone, nullptr, 2);
  const StageCost z3 = ev.evaluate(0, 1, 4, 1, 1, RecomputeScope::kNone, nullptr, 3);
  EXPECT_DOUBLE_EQ(z0.allreduce_s, allreduce);
  EXPECT_DOUBLE_EQ(z1.allreduce_s, allreduce);            // reduce-scatter + all-gather
  EXPECT_DOUBLE_EQ(z1.compute_s, z0.compute_s);
  EXPECT_DOUBLE_EQ(z2.allreduce_s, half);                 // the all-gather after the step
  EXPECT_DOUBLE_EQ(z2.backward_s, z0.backward_s + half);  // the reduce-scatter with the micro-batch's backward
  EXPECT_DOUBLE_EQ(z3.allreduce_s, 0);
  EXPECT_DOUBLE_EQ(z3.zero_collective_s, 3 * half);       // gather for forward, gather for backward, reduce-scatter
  EXPECT_DOUBLE_EQ(z3.forward_s, z0.forward_s + half);
  EXPECT_DOUBLE_EQ(z3.backward_s, z0.backward_s + 2 * half);
  for (const StageCost* z : {&z1, &z2, &z3}) EXPECT_DOUBLE_EQ(z->optimizer_s, z0.optimizer_s / 4);
  // Memory: 1e8 params × 16 B → 2 + 2 + 12/4, 2 + 14/4, 16/4 bytes each; ZeRO-3 adds the largest task's 16-bit copy.
  EXPECT_NEAR(z0.memory_static, 1e8 * 16, 1);
  EXPECT_NEAR(z1.memory_static, 1e8 * 7, 1);
  EXPECT_NEAR(z2.memory_static, 1e8 * 5.5, 1);
  EXPECT_NEAR(z3.memory_static, 1e8 * 4 + 25e6 * 2, 1);
  // One replica: nothing to shard, plain data parallelism whatever was asked.
  const StageCost alone = ev.evaluate(0, 1, 1, 1, 1, RecomputeScope::kNone, nullptr, 3);
  EXPECT_EQ(alone.zero, 0);
  EXPECT_DOUBLE_EQ(alone.memory_static, ev.evaluate(0, 1, 1, 1, 1, RecomputeScope::kNone).memory_static);
}

TEST(AStageDp, GivesLeftoverDevicesOnlyWhenTheEstimateImproves) {
  std::mt19937 rng(11);
  const Cluster cluster = testing::test_cluster(7, 8, 1'000'000'000'000);
  TrainingSpec training;
  training.global_batch = 64;
  const BlockSequence seq = testing::random_sequence(rng, 5);
  const StageEvaluator ev(seq, cluster, training);
  const StageDp dp(ev, {.microbatches = 4});
  auto solution = dp.solve(3);
  ASSERT_TRUE(solution);
  const double before = solution->estimate.iteration_s;
  dp.spend_leftover_devices(*solution);
  EXPECT_LE(solution->estimate.iteration_s, before);
  EXPECT_LE(solution->devices_used(), 7);
}

TEST(AStageDp, BuiltWhereNeededAnswersEachNarrowerRecomputationAsItsOwnDpWould) {
  // solve_many(counts, narrower) over a where-needed DP's tables must be exactly what a DP built with the narrower
  // setting returns: same splits, replicas, per-stage choices and figures, before and after leftover devices.
  std::mt19937 rng(23);
  int compared = 0, differed_from_host = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const int k = 2 + trial % 6;
    const Cluster cluster = small_cluster(1 + trial % 4, rng, 3e9, 12e9);
    TrainingSpec training;
    training.global_batch = 48;
    training.precision = trial % 2 ? Precision::kMixed : Precision::kFp32;
    const BlockSequence seq = testing::random_sequence(rng, k);
    const StageEvaluator ev(seq, cluster, training);
    std::vector<int> counts;
    for (int s = 1; s <= std::min(k, cluster.devices); ++s) counts.push_back(s);
    for (int64_t m : {1, 2, 4, 12})
      for (Schedule schedule : {Schedule::k1F1B, Schedule::kGPipe, Schedule::kZbH1})
        for (StageRecompute host : {StageRecompute::kWhereNeeded, StageRecompute::kWholeWhereNeeded}) {
          const StageDp wide(ev, {.microbatches = m, .schedule = schedule, .recompute = host});
          std::vector<StageRecompute> parts = {StageRecompute::kOff, StageRecompute::kAll, host};
          if (host == StageRecompute::kWhereNeeded) parts.push_back(StageRecompute::kSelective);
          for (StageRecompute part : parts) {
            const StageDp own(ev, {.microbatches = m, .schedule = schedule, .recompute = part});
            auto expected = own.solve_many(counts);
            auto got = wide.solve_many(counts, part);
            const auto hosts = wide.solve_many(counts);
            ASSERT_EQ(got.size(), expected.size());
            for (size_t q = 0; q < counts.size(); ++q) {
              const std::string where = "trial " + std::to_string(trial) + " m=" + std::to_string(m) + " S=" +
                                        std::to_string(counts[q]) + " " + std::string(stage_recompute_name(part));
              ASSERT_EQ(got[q].has_value(), expected[q].has_value()) << where;
              if (!got[q]) continue;
              for (int spend = 0; spend < 2; ++spend) {
                if (spend) {
                  own.spend_leftover_devices(*expected[q]);
                  wide.spend_leftover_devices(*got[q], part);
                }
                testing::expect_same_solution(*got[q], *expected[q], where);
              }
              if (hosts[q] && hosts[q]->bottleneck_h != got[q]->bottleneck_h) ++differed_from_host;
              ++compared;
            }
          }
        }
  }
  EXPECT_GT(compared, 1000);
  EXPECT_GT(differed_from_host, 0);  // the narrower answers are not just the host's own
}

TEST(AStageDp, RescheduledAnswersAsADpBuiltForThatSchedule) {
  // The tables hold no in-flight count but the least (one micro-batch for every schedule but GPipe): a DP built for
  // 1F1B and rescheduled must return exactly what a DP built for the other order returns, leftover devices included.
  std::mt19937 rng(31);
  int compared = 0, found = 0;
  for (int trial = 0; trial < 16; ++trial) {
    const int k = 2 + trial % 5;
    const Cluster cluster = small_cluster(2 + trial % 3, rng, 2e9, 10e9);
    TrainingSpec training;
    training.global_batch = 24;
    training.precision = trial % 2 ? Precision::kMixed : Precision::kFp32;
    const BlockSequence seq = testing::random_sequence(rng, k);
    const StageEvaluator ev(seq, cluster, training);
    for (int64_t m : {1, 2, 4, 6, 12})
      for (StageZero zero : {StageZero{}, StageZero{.stage = 0, .automatic = true}}) {
        StageDp shared(ev, {.microbatches = m, .recompute = StageRecompute::kWhereNeeded, .zero = zero});
        for (auto [schedule, chunks] : std::vector<std::pair<Schedule, int>>{{Schedule::kZbH1, 1},
                                                                             {Schedule::kInterleaved, 2},
                                                                             {Schedule::kInterleaved, 3},
                                                                             {Schedule::k1F1B, 1}}) {
          shared.reschedule(schedule, chunks);
          const StageDp own(ev, {.microbatches = m,
                                 .schedule = schedule,
                                 .virtual_stages = chunks,
                                 .recompute = StageRecompute::kWhereNeeded,
                                 .zero = zero});
          for (int stages = 1; stages <= std::min(k, cluster.devices); ++stages)
            for (StageRecompute part : {StageRecompute::kOff, StageRecompute::kWhereNeeded}) {
              auto expected = own.solve_many({stages}, part);
              auto got = shared.solve_many({stages}, part);
              const std::string where = "trial " + std::to_string(trial) + " m=" + std::to_string(m) +
                                        " S=" + std::to_string(stages) + " " + std::string(schedule_name(schedule));
              ASSERT_EQ(got[0].has_value(), expected[0].has_value()) << where;
              ++compared;
              if (!got[0]) continue;
              own.spend_leftover_devices(*expected[0], part);
              shared.spend_leftover_devices(*got[0], part);
              EXPECT_EQ(got[0]->schedule, schedule) << where;
              EXPECT_EQ(got[0]->virtual_stages, chunks) << where;
              testing::expect_same_solution(*got[0], *expected[0], where);
              ++found;
            }
        }
      }
  }
  EXPECT_GT(compared, 1000);
  EXPECT_GT(found, 300);
}

TEST(AStageDp, RefusesToRescheduleBetweenGPipeAndAnotherOrder) {
  std::mt19937 rng(37);
  const BlockSequence seq = testing::random_sequence(rng, 4);
  TrainingSpec training;
  training.global_batch = 8;
  const StageEvaluator ev(seq, testing::test_cluster(4, 2), training);
  StageDp dp(ev, {.microbatches = 4});
  EXPECT_THROW(dp.reschedule(Schedule::kGPipe, 1), InvalidArgument);  // GPipe keeps all 4 in flight, not 1
  StageDp gpipe(ev, {.microbatches = 4, .schedule = Schedule::kGPipe});
  EXPECT_THROW(gpipe.reschedule(Schedule::kZbH1, 1), InvalidArgument);
  EXPECT_NO_THROW(dp.reschedule(Schedule::kInterleaved, 2));
}

TEST(AStageDp, FindsNothingExactlyWhenNoSplitFitsEvenWhereItBuildsNoTables) {
  // A grid point whose micro-batch is too large for any split builds no tables (any_split_fits, from each range's
  // first fitting candidate): the answers must still be brute force's, feasible and not, at every stage count.
  std::mt19937 rng(41);
  int feasible = 0, infeasible = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int k = 2 + trial % 5;
    const Cluster cluster = small_cluster(1 + trial % 4, rng, 2e9, 16e9);
    TrainingSpec training;
    training.global_batch = 24;
    training.precision = trial % 2 ? Precision::kMixed : Precision::kFp32;
    const BlockSequence seq = weight_heavy_sequence(rng, k);
    const StageEvaluator ev(seq, cluster, training);
    for (StageRecompute recompute : {StageRecompute::kOff, StageRecompute::kWhereNeeded})
      for (int64_t m : {1, 2, 3, 8, 24}) {
        const StageZero automatic{.stage = 0, .automatic = true};
        const StageDp dp(ev, {.microbatches = m, .recompute = recompute, .zero = automatic});
        std::vector<int> counts;
        for (int stages = 1; stages <= std::min(k, cluster.devices); ++stages) counts.push_back(stages);
        const auto got = dp.solve_many(counts);
        for (size_t q = 0; q < counts.size(); ++q) {
          const double expected = brute_force_variants(ev, counts[q], m, stage_variants(recompute, automatic));
          ASSERT_EQ(got[q].has_value(), !std::isinf(expected)) << "trial " << trial << " S=" << counts[q] << " m=" << m;
          if (got[q]) EXPECT_NEAR(got[q]->bottleneck_h, expected, 1e-12 * expected);
          (got[q] ? feasible : infeasible) += 1;
        }
      }
  }
  EXPECT_GT(feasible, 100) << infeasible;
  EXPECT_GT(infeasible, 100) << feasible;
}

TEST(AFirstAtMost, FindsTheFirstIndexFromLoAtOrBelowTheLimitAsAScanDoesOnShortAndLongRows) {
  std::mt19937 rng(5);
  int found = 0, none = 0;
  for (size_t row_length : {1, 2, 7, 64, 65, 130, 300}) {
    const size_t rows = 3;
    std::vector<double> values(rows * row_length);
    for (double& v : values) v = std::uniform_int_distribution<int>(0, 50)(rng);  // ties and repeats
    values[row_length / 2] = std::numeric_limits<double>::infinity();
    const FirstAtMost first(&values, row_length);
    for (size_t row = 0; row < rows; ++row)
      for (size_t lo = 0; lo <= row_length; ++lo)
        for (double limit : {-1.0, 0.0, 3.0, 10.0, 25.0, 50.0}) {
          int expected = -1;
          for (size_t i = lo; i < row_length && expected < 0; ++i)
            if (values[row * row_length + i] <= limit) expected = static_cast<int>(i);
          ASSERT_EQ(first.find(row * row_length, lo, limit), expected)
              << "length " << row_length << " row " << row << " lo " << lo << " limit " << limit;
          ++(expected < 0 ? none : found);
        }
  }
  EXPECT_GT(found, 1000);
  EXPECT_GT(none, 100);
}

TEST(AStageDp, UsesReplicaCountsThatAreNotPowersOfTwo) {
  std::mt19937 rng(3);
  const Cluster cluster = testing::test_cluster(12, 8, 1'000'000'000'000);
  TrainingSpec training;
  training.global_batch = 120;
  const BlockSequence seq = testing::random_sequence(rng, 4);
  const StageEvaluator ev(seq, cluster, training);
  const StageDp dp(ev, {.microbatches = 1});
  bool has_three = false;
  for (int c : dp.replica_candidates()) has_three |= c == 3;
  EXPECT_TRUE(has_three);
}

TEST(AStageEvaluator, ChargesCommunicationOnlyForValuesCrossingTheStage) {
  BlockSequence seq;
  seq.blocks.resize(3);
  seq.transfers.push_back({0, {1, 2}, 100});
  seq.transfers.push_back({1, {2}, 10});
  const Cluster cluster = testing::test_cluster(1);
  TrainingSpec training;
  const StageEvaluator ev(seq, cluster, training);
  EXPECT_DOUBLE_EQ(ev.in_bytes_per_sample(1, 3), 100);   // value 0→{1,2} received once
  EXPECT_DOUBLE_EQ(ev.in_bytes_per_sample(2, 3), 110);
  EXPECT_DOUBLE_EQ(ev.out_bytes_per_sample(0, 1), 100);
  EXPECT_DOUBLE_EQ(ev.out_bytes_per_sample(0, 2), 110);  // 0→2 still leaves, and 1→2
  EXPECT_DOUBLE_EQ(ev.out_bytes_per_sample(0, 3), 0);
  EXPECT_DOUBLE_EQ(ev.in_bytes_per_sample(0, 3), 0);
}

TEST(AStageEvaluator, ChargesTheOptimizerStepOncePerIterationAndTheEstimateWaitsForTheSlowest) {
  BlockSequence seq;
  seq.blocks.resize(2);
  seq.params.push_back({4'000'000, {0}});
  seq.params.push_back({400'000, {1}});
  for (const ParamUse& p : seq.params)
    for (uint32_t b : p.readers) seq.blocks[b].param_bytes += p.bytes;
  Cluster cluster = testing::test_cluster(2);
  cluster.device.memory_bandwidth = 1e9;
  TrainingSpec training;  // Adam, fp32: 32 bytes of traffic per 4-byte param
  const StageEvaluator ev(seq, cluster, training);
  const int64_t m = 4;
  const StageCost first = ev.evaluate(0, 1, 1, m, 1, RecomputeScope::kNone);
  const StageCost second = ev.evaluate(1, 2, 1, m, 1, RecomputeScope::kNone);
  EXPECT_DOUBLE_EQ(first.optimizer_s, 4e6 * 8 / 1e9);
  EXPECT_DOUBLE_EQ(second.optimizer_s, 4e5 * 8 / 1e9);
  EXPECT_DOUBLE_EQ(first.h, first.step_s + first.optimizer_s / static_cast<double>(m));
  const std::vector<StageCost> both = {first, second};
  const PipelineEstimate e = estimate_iteration_time(both, m, Schedule::k1F1B);
  EXPECT_DOUBLE_EQ(e.iteration_s, e.pipeline_s + first.optimizer_s);
}

TEST(AStageEvaluator, CountsAWeightSharedByBlocksOfOneStageOnce) {
  BlockSequence seq;
  seq.blocks.resize(3);
  seq.params.push_back({100, {0, 2}});  // tied embedding: read by the first and the last block
  seq.params.push_back({7, {1}});
  for (const ParamUse& p : seq.params)
    for (uint32_t b : p.readers) seq.blocks[b].param_bytes += p.bytes;
  const Cluster cluster = testing::test_cluster(1);
  TrainingSpec training;
  const StageEvaluator ev(seq, cluster, training);
  // Brute force: a range holds a weight when any of its readers lies inside it.
  for (uint32_t first = 0; first < 3; ++first)
    for (uint32_t last = first + 1; last <= 3; ++last) {
      int64_t expected = 0;
      for (const ParamUse& p : seq.params)
        for (uint32_t r : p.readers)
          if (r >= first && r < last) {
            expected += p.bytes;
            break;
          }
      EXPECT_EQ(ev.evaluate(first, last, 1, 1, 1, RecomputeScope::kNone).param_bytes, expected) << first << ".." << last;
    }
  EXPECT_EQ(ev.evaluate(0, 3, 1, 1, 1, RecomputeScope::kNone).param_bytes, 107);
}

}  // namespace
}  // namespace apart
