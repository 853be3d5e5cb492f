// The schedules the planner plans beyond GPipe and 1F1B: the closed form against Megatron's bubble and the
// simulator, the stage DP against brute force under their in-flight rules.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "brute_force.h"
#include "partition/stage_dp.h"
#include "profiler/memory_model.h"
#include "random_models.h"
#include "simulator/simulate.h"
#include "test_cluster.h"
#include "tests/simulator/sim_test_util.h"

namespace apart {
namespace {

// P equal stages: `step_s` of compute a micro-batch, `comm_s` of boundary transfers (none on the ends' outer sides).
std::vector<StageCost> equal_stages(int stages, double compute_s, double transfer_s) {
  std::vector<StageCost> costs(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    StageCost& c = costs[static_cast<size_t>(s)];
    c.compute_s = compute_s;
    c.comm_s = (s > 0 ? 2 * transfer_s : 0.0) + (s + 1 < stages ? 2 * transfer_s : 0.0);
    c.step_s = c.compute_s + c.comm_s;
  }
  return costs;
}

TEST(AStageReplacementEstimate, EqualsTheFullEstimateWithThatStageReplacedUnderEverySchedule) {
  // The oracle: estimate_iteration_time over a copy with the stage replaced. Random costs with ties (values from a
  // small set), so the top-two maxima meet equal values at several stages.
  std::mt19937 rng(11);
  auto value = [&] { return static_cast<double>(rng() % 5) * 1e-3; };
  auto random_cost = [&] {
    StageCost c;
    c.forward_s = value();
    c.backward_weight_s = value();
    c.backward_s = c.backward_weight_s + value();
    c.compute_s = c.forward_s + c.backward_s;
    c.comm_s = value() / 4;
    c.step_s = c.compute_s + c.comm_s;
    c.allreduce_exposed_s = value();
    c.optimizer_s = value() / 2;
    return c;
  };
  int compared = 0;
  for (int round = 0; round < 200; ++round) {
    const int stages = 1 + static_cast<int>(rng() % 6);
    std::vector<StageCost> costs;
    for (int s = 0; s < stages; ++s) costs.push_back(random_cost());
    const int64_t m = 1 + static_cast<int64_t>(rng() % 8);
    for (Schedule schedule : {Schedule::kGPipe, Schedule::k1F1B, Schedule::kZbH1, Schedule::kInterleaved}) {
      const int chunks = schedule == Schedule::kInterleaved ? 2 : 1;
      StageReplacementEstimate replaced(costs, m, schedule, chunks);
      for (int s = 0; s < stages; ++s) {
        const StageCost replacement = random_cost();
        std::vector<StageCost> oracle = costs;
        oracle[static_cast<size_t>(s)] = replacement;
        const double expected = estimate_iteration_time(oracle, m, schedule, chunks).iteration_s;
        EXPECT_NEAR(replaced.iteration_s(static_cast<size_t>(s), replacement), expected, 1e-12 * (1 + expected))
            << schedule_name(schedule) << " stage " << s << " of " << stages << ", m " << m;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 1000);
}

TEST(AStageReplacementEstimate, KeepsTheFullEstimatesBitsAcrossReplacedStagesUnderGPipeAnd1F1B) {
  // spend_leftover_devices compares each round with the current time from the kept figures instead of the full
  // formula: the two must agree to the bit (a last-bit difference could flip a choice), and replace() must leave
  // what reset() over the replaced costs leaves. Random costs with ties, a replaced stage at a time.
  std::mt19937 rng(5);
  // Ties are common (two values in three are multiples of one step), so the kept maxima meet equal values.
  auto value = [&] {
    return static_cast<double>(rng() % 7) * 1.37e-3 + (rng() % 3 == 0 ? static_cast<double>(rng() % 1000) * 1e-9 : 0);
  };
  auto random_cost = [&] {
    StageCost c;
    c.step_s = value();
    c.allreduce_exposed_s = value();
    c.optimizer_s = value() / 3;
    return c;
  };
  int compared = 0;
  for (int round = 0; round < 100; ++round) {
    const int stages = 1 + static_cast<int>(rng() % 9);
    std::vector<StageCost> costs;
    for (int s = 0; s < stages; ++s) costs.push_back(random_cost());
    const int64_t m = 1 + static_cast<int64_t>(rng() % 16);
    for (Schedule schedule : {Schedule::kGPipe, Schedule::k1F1B}) {
      StageReplacementEstimate kept(costs, m, schedule, 1);
      std::vector<StageCost> current = costs;
      for (int step = 0; step < 12; ++step) {
        const size_t s = rng() % static_cast<size_t>(stages);
        const StageCost replacement = random_cost();
        const StageCost probe = random_cost();
        current[s] = replacement;
        kept.replace(s, replacement);
        StageReplacementEstimate fresh(current, m, schedule, 1);
        ASSERT_TRUE(kept.current_iteration_s().has_value());
        EXPECT_EQ(*kept.current_iteration_s(), estimate_iteration_time(current, m, schedule).iteration_s)
            << schedule_name(schedule) << " round " << round << " step " << step;
        for (size_t t = 0; t < current.size(); ++t)  // every stage's "all but this one" maxima
          EXPECT_EQ(kept.iteration_s(t, probe), fresh.iteration_s(t, probe)) << "stage " << t;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 2000);
  // The other schedules have no closed form: the caller runs the full formula.
  const std::vector<StageCost> two(2, random_cost());
  EXPECT_FALSE(StageReplacementEstimate(two, 4, Schedule::kZbH1, 1).current_iteration_s().has_value());
  EXPECT_FALSE(StageReplacementEstimate(two, 4, Schedule::kInterleaved, 2).current_iteration_s().has_value());
}

TEST(AnInterleavedEstimate, HasMegatronsBubbleOnEqualStagesWithoutCommunication) {
  // Narayanan et al., SC'21 §2.2: the bubble is (p − 1)/(v · m) of the ideal m · T.
  const double t = 7e-3;
  for (int p : {1, 2, 3, 4, 8})
    for (int v : {1, 2, 3, 4})
      for (int64_t m : {1, 4, 8, 32}) {
        const std::vector<StageCost> costs = equal_stages(p, t, 0.0);
        const PipelineEstimate e = estimate_iteration_time(costs, m, Schedule::kInterleaved, v);
        const double ideal = static_cast<double>(m) * t;
        EXPECT_NEAR((e.pipeline_s - ideal) / ideal, static_cast<double>(p - 1) / static_cast<double>(v * m), 1e-12)
            << "p " << p << " v " << v << " m " << m;
      }
}

TEST(AnInterleavedEstimate, IsThe1F1BEstimateWithOneChunkAndNoTransfers) {
  const std::vector<StageCost> costs = equal_stages(4, 3e-3, 0.0);
  EXPECT_NEAR(estimate_iteration_time(costs, 8, Schedule::kInterleaved, 1).iteration_s,
              estimate_iteration_time(costs, 8, Schedule::k1F1B).iteration_s, 1e-15);
}

TEST(AnInterleavedEstimate, ChargesEachDeviceTheTransfersItsChunksAdd) {
  // Inner devices: v times their own; the first and the last also v − 1 wraps of the last boundary, both ways.
  const double t = 5e-3, d = 1e-4;
  const int p = 3, v = 2;
  const int64_t m = 6;
  const std::vector<StageCost> costs = equal_stages(p, t, d);
  const PipelineEstimate e = estimate_iteration_time(costs, m, Schedule::kInterleaved, v);
  const double ends = t + v * 2 * d + (v - 1) * 2 * d, middle = t + v * 4 * d;
  const double slowest = std::max(ends, middle);
  EXPECT_NEAR(e.pipeline_s, static_cast<double>(m) * slowest + (2 * ends + middle - slowest) / v, 1e-15);
}

// The simulator's chain of equal stages next to the closed form's stage costs for it.
std::vector<StageCost> costs_of(const sim::SimPlan& plan) {
  std::vector<StageCost> costs;
  for (const sim::SimStage& st : plan.stages) {
    StageCost c;
    c.forward_s = st.forward_s;
    c.backward_s = st.backward_s;
    c.backward_weight_s = st.backward_weight_s;
    c.compute_s = c.forward_s + c.backward_s;
    c.step_s = c.compute_s;
    costs.push_back(c);
  }
  return costs;
}

TEST(TheClosedForm, EqualsTheSimulatedIterationOnEqualStagesWithoutCommunication) {
  int compared = 0;
  for (Schedule schedule : {Schedule::kGPipe, Schedule::k1F1B, Schedule::kInterleaved})
    for (int p : {1, 2, 3, 4})
      for (int v : {1, 2, 3})
        for (int64_t rounds : {1, 2, 5}) {
          if (schedule != Schedule::kInterleaved && v > 1) continue;
          const int64_t m = rounds * p;
          const sim::SimPlan plan = sim::testing::chain_plan(p, m, 1.25e-3, 2.5e-3);
          sim::SimOptions options;
          options.schedule = schedule;
          options.virtual_stages = schedule == Schedule::kInterleaved ? v : 0;
          const sim::SimResult simulated = sim::simulate(plan, options);
          const PipelineEstimate e = estimate_iteration_time(costs_of(plan), m, schedule, options.virtual_stages > 0 ? v : 1);
          EXPECT_NEAR(simulated.iteration_s, e.iteration_s, 1e-12 * e.iteration_s)
              << schedule_name(schedule) << " p " << p << " v " << v << " m " << m;
          ++compared;
        }
  EXPECT_EQ(compared, 2 * 4 * 3 + 4 * 3 * 3);
}

TEST(TheClosedForm, EqualsTheSimulatedZbH1IterationOnEqualStagesWithoutCommunication) {
  int compared = 0;
  for (double weight : {0.0, 0.6e-3, 1.25e-3, 1.8e-3})
    for (int p : {1, 2, 3, 4, 6})
      for (int64_t rounds : {1, 2, 5}) {
        const int64_t m = rounds * p;
        sim::SimPlan plan = sim::testing::chain_plan(p, m, 1.25e-3, 2.5e-3);
        for (sim::SimStage& st : plan.stages) st.backward_weight_s = weight;
        sim::SimOptions options;
        options.schedule = Schedule::kZbH1;
        const double simulated = sim::simulate(plan, options).iteration_s;
        const double closed = estimate_iteration_time(costs_of(plan), m, Schedule::kZbH1).iteration_s;
        EXPECT_NEAR(simulated, closed, 1e-12 * closed) << "W " << weight << " p " << p << " m " << m;
        ++compared;
      }
  EXPECT_EQ(compared, 4 * 5 * 3);
}

TEST(AZbH1Estimate, IsThe1F1BEstimateWithoutWeightPassesAndShorterWithThem) {
  std::vector<StageCost> costs = equal_stages(4, 6e-3, 1e-4);
  EXPECT_NEAR(estimate_iteration_time(costs, 8, Schedule::kZbH1).iteration_s,
              estimate_iteration_time(costs, 8, Schedule::k1F1B).iteration_s, 1e-15);
  for (StageCost& c : costs) c.backward_weight_s = 2e-3;
  EXPECT_LT(estimate_iteration_time(costs, 8, Schedule::kZbH1).iteration_s,
            estimate_iteration_time(costs, 8, Schedule::k1F1B).iteration_s);
}

TEST(AStageEvaluator, CountsHalfTheBackwardOfWeightReadingBlocksAsWeightGradients) {
  BlockSequence seq;
  seq.blocks.resize(2);
  seq.blocks[0].backward = {1e-3, 2e-4};
  seq.blocks[0].backward_weight = {5e-4, 1e-4};  // what the atomic level gives a weight-reading block
  seq.blocks[1].backward = {3e-3, 0};             // reads no weights: no W
  TrainingSpec training;
  training.global_batch = 8;
  const StageEvaluator ev(seq, testing::test_cluster(1), training);
  const StageCost c = ev.evaluate(0, 2, 1, 2, 1, RecomputeScope::kNone);  // 4 samples per micro-batch
  EXPECT_DOUBLE_EQ(c.backward_weight_s, 5e-4 + 4 * 1e-4);
  EXPECT_DOUBLE_EQ(ev.evaluate(0, 2, 1, 2, 1, RecomputeScope::kFull).backward_weight_s, c.backward_weight_s);  // not the recomputation
}

// Least bottleneck over every split and replica vector, each stage's memory at the schedule's in-flight rule.
double brute_force_schedule_bottleneck(const StageEvaluator& ev, int stages, int64_t m, Schedule schedule, int chunks,
                                       bool recompute) {
  return testing::brute_force_bottleneck(ev, stages, m, [&](int s, uint32_t first, uint32_t last, int replicas) {
    const double flight = stage_in_flight_activations(schedule, s, stages, m, chunks);
    return testing::fitting_h(
        ev, ev.evaluate(first, last, replicas, m, flight, recompute ? RecomputeScope::kFull : RecomputeScope::kNone));
  });
}

// Trial `trial`'s random blocks on 1–4 devices, two per node, with memory drawn so that some requests do not fit.
StageEvaluator random_evaluator(std::mt19937& rng, int trial) {
  const Cluster cluster = testing::test_cluster(1 + trial % 4, 2,
      static_cast<int64_t>(std::uniform_real_distribution<double>(2e9, 12e9)(rng)));
  TrainingSpec training;
  training.global_batch = 12;
  return StageEvaluator(testing::random_sequence(rng, 2 + trial % 5), cluster, training);
}

TEST(AStageDp, FindsTheBruteForceBottleneckUnderTheInterleavedSchedule) {
  std::mt19937 rng(23);
  int compared = 0, infeasible = 0, refused = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const StageEvaluator ev = random_evaluator(rng, trial);
    const int k = static_cast<int>(ev.blocks());
    for (int64_t m : {2, 3, 4, 6, 12})
      for (int v : {2, 3})
        for (bool recompute : {false, true}) {
          const StageDp dp(ev, {.microbatches = m,
                                .schedule = Schedule::kInterleaved,
                                .virtual_stages = v,
                                .recompute = recompute ? StageRecompute::kAll : StageRecompute::kOff});
          std::vector<int> counts;
          for (int stages = 1; stages <= std::min(k, ev.cluster().devices); ++stages) counts.push_back(stages);
          const std::vector<std::optional<StageSolution>> many = dp.solve_many(counts);
          for (int stages : counts) {
            const std::optional<StageSolution>& got = many[static_cast<size_t>(stages - 1)];
            if (m % stages != 0) {  // Megatron-LM's order has no plan there
              EXPECT_FALSE(got.has_value());
              ++refused;
              continue;
            }
            const double expected =
                brute_force_schedule_bottleneck(ev, stages, m, Schedule::kInterleaved, v, recompute);
            if (std::isinf(expected)) {
              EXPECT_FALSE(got.has_value()) << "trial " << trial << " S=" << stages << " m=" << m;
              ++infeasible;
              continue;
            }
            ASSERT_TRUE(got.has_value()) << "trial " << trial << " S=" << stages << " m=" << m;
            EXPECT_NEAR(got->bottleneck_h, expected, 1e-12 * expected);
            EXPECT_EQ(got->virtual_stages, v);
            ++compared;
          }
        }
  }
  EXPECT_GT(compared, 100);
  EXPECT_GT(infeasible, 0);
  EXPECT_GT(refused, 0);
}

TEST(AnInterleavedStage, HoldsMegatronsChunkMicrobatchesEachAVthOfItsActivations) {
  std::mt19937 rng(5);
  const BlockSequence seq = testing::random_sequence(rng, 3);
  TrainingSpec training;
  training.global_batch = 8;
  const StageEvaluator ev(seq, testing::test_cluster(2), training);
  const int p = 2, v = 2;
  const int64_t m = 4;
  for (int s = 0; s < p; ++s) {
    const double flight = stage_in_flight_activations(Schedule::kInterleaved, s, p, m, v);
    const StageCost c = ev.evaluate(0, 3, 1, m, flight, RecomputeScope::kNone);
    // Device 0: (2 − 0 − 1)·2 + (2 − 1)·2 + 1 = 5 chunk micro-batches; device 1: 3; each half the stage's.
    const double chunks = s == 0 ? 5 : 3;
    EXPECT_EQ(c.memory_bytes, static_cast<int64_t>(std::ceil(c.memory_static + chunks / v * c.memory_per_in_flight)));
  }
}

TEST(AStageDp, FindsTheBruteForceBottleneckUnderZbH1sInFlightRule) {
  std::mt19937 rng(29);
  int compared = 0, infeasible = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const StageEvaluator ev = random_evaluator(rng, trial);
    const int k = static_cast<int>(ev.blocks());
    for (int64_t m : {1, 2, 3, 6, 12}) {
      const StageDp dp(ev, {.microbatches = m, .schedule = Schedule::kZbH1});
      std::vector<int> counts;
      for (int stages = 1; stages <= std::min(k, ev.cluster().devices); ++stages) counts.push_back(stages);
      const std::vector<std::optional<StageSolution>> many = dp.solve_many(counts);
      for (int stages : counts) {
        const double expected = brute_force_schedule_bottleneck(ev, stages, m, Schedule::kZbH1, 1, false);
        const std::optional<StageSolution>& got = many[static_cast<size_t>(stages - 1)];
        if (std::isinf(expected)) {
          EXPECT_FALSE(got.has_value());
          ++infeasible;
          continue;
        }
        ASSERT_TRUE(got.has_value()) << "trial " << trial << " S=" << stages << " m=" << m;
        EXPECT_NEAR(got->bottleneck_h, expected, 1e-12 * expected);
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 50);
  EXPECT_GT(infeasible, 0);
}

}  // namespace
}  // namespace apart
