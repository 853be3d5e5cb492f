// The stage DP against brute force over every contiguous split × replica assignment (paper §IV-C).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "brute_force.h"
#include "partition/stage_dp.h"
#include "random_models.h"
#include "test_cluster.h"

namespace apart {
namespace {

// Least max_i h over all splits into `stages` stages and all replica vectors with Σ ≤ devices that fit memory;
// `per_stage`: each stage also free to recompute or not (the faster variant that fits).
double brute_force_bottleneck(const StageEvaluator& ev, int stages, int64_t m, Schedule schedule, bool recompute,
                              bool per_stage = false) {
  return testing::brute_force_bottleneck(ev, stages, m, [&](int s, uint32_t first, uint32_t last, int replicas) {
    double h = std::numeric_limits<double>::infinity();
    for (bool rc : {false, true})
      if (per_stage || rc == recompute)
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
  const StageCost first = ev.evaluate(0, 1, 1, m, 1, false);
  const StageCost second = ev.evaluate(1, 2, 1, m, 1, false);
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
      EXPECT_EQ(ev.evaluate(first, last, 1, 1, 1, false).param_bytes, expected) << first << ".." << last;
    }
  EXPECT_EQ(ev.evaluate(0, 3, 1, 1, 1, false).param_bytes, 107);
}

}  // namespace
}  // namespace apart
