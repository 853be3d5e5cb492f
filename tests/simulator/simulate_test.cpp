// The event simulator against closed forms and the schedules' known properties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "graph/error.h"
#include "profiler/memory_model.h"
#include "simulator/simulate.h"
#include "tests/simulator/sim_test_util.h"

namespace apart::sim {
namespace {

using testing::chain_plan;

constexpr double kF = 1.5e-3, kB = 3.1e-3;

void expect_rel(double actual, double expected) {
  EXPECT_LE(std::abs(actual - expected), 1e-9 * std::abs(expected)) << actual << " vs " << expected;
}

SimOptions with(Schedule s, int v = 0) {
  SimOptions o;
  o.schedule = s;
  o.virtual_stages = v;
  return o;
}

TEST(ASimulatedPipeline, MatchesTheClosedFormForEqualStagesWithoutCommunication) {
  for (Schedule s : {Schedule::kGPipe, Schedule::k1F1B})
    for (int stages : {1, 2, 3, 4, 8})
      for (int64_t m : {1, 2, 4, 7, 16}) {
        SCOPED_TRACE(std::string(schedule_name(s)) + " S=" + std::to_string(stages) + " m=" + std::to_string(m));
        const SimResult r = simulate(chain_plan(stages, m, kF, kB), with(s));
        expect_rel(r.iteration_s, static_cast<double>(m + stages - 1) * (kF + kB));
        EXPECT_NEAR(r.bubble_fraction, static_cast<double>(stages - 1) / static_cast<double>(m + stages - 1), 1e-12);
      }
}

TEST(ASimulatedPipeline, MatchesMegatronsInterleavedBubbleForEqualStages) {
  // Narayanan et al. (SC'21) §2.2: bubble time (P − 1)(F + B)/v on top of m(F + B).
  for (int stages : {2, 4})
    for (int v : {2, 3})
      for (int64_t m : {4, 8, 16}) {
        SCOPED_TRACE("P=" + std::to_string(stages) + " v=" + std::to_string(v) + " m=" + std::to_string(m));
        const SimResult r = simulate(chain_plan(stages, m, kF, kB), with(Schedule::kInterleaved, v));
        expect_rel(r.iteration_s, static_cast<double>(m) * (kF + kB) + (stages - 1) * (kF + kB) / v);
      }
}

// A chain whose backwards spend `weight_s` of their time on weight gradients (ZB-H1's W).
SimPlan with_weight_passes(SimPlan plan, double weight_s) {
  for (SimStage& st : plan.stages) st.backward_weight_s = weight_s;
  return plan;
}

TEST(ASimulatedPipeline, MatchesZeroBubblesClosedFormForEqualStages) {
  // Qi et al., ICLR 2024 §3.1: ZB-H1's bubble is (p − 1)(T_F + T_B − T_W) where 1F1B's is (p − 1)(T_F + T_B + T_W),
  // T_B the input-gradient pass, when W is the shortest; a longer W fills only a drain gap's shorter pass:
  // (p − 1)(T_F + T_B − min(T_W, T_F, T_B)). The cost model's W is half the backward of weight-reading tasks.
  for (double weight : {0.0, kB / 4, kB / 2})
    for (int stages : {1, 2, 3, 4, 6})
      for (int64_t m : {1, 2, 4, 7, 16}) {
        SCOPED_TRACE("W=" + std::to_string(weight) + " S=" + std::to_string(stages) + " m=" + std::to_string(m));
        const SimResult r = simulate(with_weight_passes(chain_plan(stages, m, kF, kB), weight), with(Schedule::kZbH1));
        const double input_gradient = kB - weight;
        if (m >= stages)  // fewer micro-batches than stages leave too few W passes to fill the drain
          expect_rel(r.iteration_s,
                     static_cast<double>(m) * (kF + kB) + (stages - 1) * (kF + input_gradient - std::min({weight, kF, input_gradient})));
        EXPECT_LE(r.iteration_s, simulate(chain_plan(stages, m, kF, kB), with(Schedule::k1F1B)).iteration_s * (1 + 1e-12));
      }
}

TEST(ASimulatedPipeline, RunsZbH1As1F1BWithoutWeightPasses) {
  for (int stages : {1, 3, 4})
    for (int64_t m : {2, 5, 8})
      expect_rel(simulate(chain_plan(stages, m, kF, kB, 2e5), with(Schedule::kZbH1)).iteration_s,
                 simulate(chain_plan(stages, m, kF, kB, 2e5), with(Schedule::k1F1B)).iteration_s);
}

TEST(ASimulatedPipeline, IsNeverSlowerUnderZbH1ThanUnder1F1BOnRandomSmallPlans) {
  std::mt19937 rng(31);
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  int compared = 0, faster = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int stages = 1 + trial % 5;
    const int64_t m = 1 + static_cast<int64_t>(uniform(0, 12));
    SimPlan plan = chain_plan(stages, m, kF, kB, trial % 3 == 0 ? 0.0 : uniform(0, 4e5));
    for (SimStage& st : plan.stages) {
      st.forward_s = uniform(0.2e-3, 3e-3);
      st.backward_s = uniform(1.0, 2.5) * st.forward_s;
      st.backward_weight_s = uniform(0, 0.6) * st.backward_s;
      st.recompute = trial % 4 == 1;
    }
    const double zb = simulate(plan, with(Schedule::kZbH1)).iteration_s;
    const double one = simulate(plan, with(Schedule::k1F1B)).iteration_s;
    EXPECT_LE(zb, one * (1 + 1e-12)) << "trial " << trial << " S=" << stages << " m=" << m;
    faster += zb < one * (1 - 1e-9) ? 1 : 0;
    ++compared;
  }
  EXPECT_EQ(compared, 200);
  EXPECT_GT(faster, 100);  // the deferred W passes shorten most pipelines of two or more stages
}

TEST(ASimulatedPipeline, HoldsZbH1sInFlightMicrobatchesUntilTheirWeightPasses) {
  for (int64_t m : {2, 3, 8}) {
    const int stages = 4;
    const SimResult r = simulate(with_weight_passes(chain_plan(stages, m, kF, kB), kB / 2), with(Schedule::kZbH1));
    for (int s = 0; s < stages; ++s)
      EXPECT_EQ(r.stages[static_cast<size_t>(s)].peak_in_flight,
                stage_in_flight_microbatches(Schedule::kZbH1, s, stages, m)) << "stage " << s;
    int weight_passes = 0;
    for (const SimEvent& e : r.events)
      if (e.kind == EventKind::kBackwardWeight) {
        ++weight_passes;
        EXPECT_EQ(e.name(), std::to_string(e.stage) + "W" + std::to_string(e.microbatch));
      }
    EXPECT_EQ(weight_passes, stages * m);
  }
}

TEST(ASimulatedPipeline, HasASmallerBubbleWithMoreMicrobatches) {
  double previous = 1.0;
  for (int64_t m : {1, 2, 4, 8, 16, 32}) {
    const SimResult r = simulate(chain_plan(4, m, kF, kB), with(Schedule::k1F1B));
    EXPECT_LT(r.bubble_fraction, previous) << "m=" << m;
    previous = r.bubble_fraction;
  }
}

TEST(ASimulatedPipeline, HasASmallerBubbleInterleavedThanWith1F1B) {
  const SimResult one = simulate(chain_plan(4, 8, kF, kB), with(Schedule::k1F1B));
  const SimResult two = simulate(chain_plan(4, 8, kF, kB), with(Schedule::kInterleaved, 2));
  EXPECT_LT(two.bubble_fraction, one.bubble_fraction);
  EXPECT_LT(two.iteration_s, one.iteration_s);
}

TEST(ASimulatedPipeline, TakesLongerWhenTransfersTakeTime) {
  for (Schedule s : {Schedule::kGPipe, Schedule::k1F1B, Schedule::kInterleaved}) {
    const SimResult free = simulate(chain_plan(4, 8, kF, kB), with(s));
    const SimResult costly = simulate(chain_plan(4, 8, kF, kB, /*bytes=*/2e5), with(s));  // 0.2 ms per hop
    EXPECT_GT(costly.iteration_s, free.iteration_s * (1 + 1e-6)) << schedule_name(s);
    SimOptions off = with(s);
    off.communication = false;
    expect_rel(simulate(chain_plan(4, 8, kF, kB, 2e5), off).iteration_s, free.iteration_s);
  }
}

TEST(ASimulatedPipeline, UsesTheSlowerLinkBetweenNodes) {
  SimPlan same = chain_plan(2, 4, kF, kB, 2e5);
  SimPlan split = same;
  split.cluster.devices_per_node = 1;  // the two stages on different nodes: 1e8 B/s instead of 1e9
  EXPECT_GT(simulate(split).iteration_s, simulate(same).iteration_s);
}

TEST(ASimulatedPipeline, Holds1F1BsAndGPipesInFlightMicrobatches) {
  for (int64_t m : {2, 3, 8}) {
    const int stages = 4;
    const SimResult one = simulate(chain_plan(stages, m, kF, kB), with(Schedule::k1F1B));
    const SimResult gpipe = simulate(chain_plan(stages, m, kF, kB), with(Schedule::kGPipe));
    for (int s = 0; s < stages; ++s) {
      EXPECT_EQ(one.stages[static_cast<size_t>(s)].peak_in_flight, std::min<int64_t>(stages - s, m)) << "stage " << s;
      EXPECT_EQ(gpipe.stages[static_cast<size_t>(s)].peak_in_flight, m) << "stage " << s;
      // Test plans give 1000 static bytes + 100 per micro-batch.
      EXPECT_DOUBLE_EQ(one.stages[static_cast<size_t>(s)].peak_memory_bytes, 1000.0 + 100.0 * std::min<int64_t>(stages - s, m));
    }
  }
}

TEST(ASimulatedPipeline, ShardsAZeroStagesStateWhenThePlanHasNoFinerMemoryFields) {
  // A plan with only memory_bytes and param_bytes: the static part is the stage's state, sharded by its ZeRO stage.
  for (int zero = 0; zero <= kMaxZeroStage; ++zero) {
    SimPlan plan = chain_plan(1, 2, kF, kB);
    SimStage& st = plan.stages[0];
    st.memory_static_bytes.reset();
    st.activation_bytes_per_microbatch.reset();
    st.param_bytes = 4'000'000;  // 1M params
    st.memory_bytes = 100'000'000;
    st.replicas = 4;
    st.devices = {0, 1, 2, 3};
    plan.cluster.devices = 4;
    plan.cluster.devices_per_node = 4;
    st.zero = zero;
    const SimResult r = simulate(plan, with(Schedule::k1F1B));
    EXPECT_DOUBLE_EQ(r.stages[0].memory_static_bytes,
                     4e6 * state_bytes_per_param_byte(plan.training.optimizer, plan.training.precision, zero, 4))
        << "ZeRO-" << zero;
  }
}

TEST(ASimulatedPipeline, AddsTheForwardToEachBackwardWhenRecomputing) {
  SimOptions o = with(Schedule::k1F1B);
  o.recompute = true;
  const SimResult r = simulate(chain_plan(3, 5, kF, kB), o);
  expect_rel(r.iteration_s, 7 * (2 * kF + kB));
  EXPECT_TRUE(r.recompute);
}

TEST(ASimulatedPipeline, EndsWithTheAllReduceAndTheOptimizerStep) {
  SimPlan p = chain_plan(3, 4, kF, kB);
  for (SimStage& s : p.stages) s.allreduce_s = 2e-3;
  SimOptions o = with(Schedule::k1F1B);
  o.optimizer_step_s = 0.5e-3;
  const SimResult r = simulate(p, o);
  // Stage 0 finishes its last backward last; its all-reduce and step follow.
  expect_rel(r.pipeline_s, 6 * (kF + kB));
  expect_rel(r.iteration_s, 6 * (kF + kB) + 2e-3 + 0.5e-3);
}

TEST(ASimulatedPipeline, StepsEachStageForItsOwnOptimizerTimeUnlessOneIsGivenForAll) {
  SimPlan p = chain_plan(3, 4, kF, kB);
  p.stages[0].optimizer_s = 9e-3;  // stage 0 finishes its last backward last, at 6 (F + B)
  p.stages[2].optimizer_s = 1e-3;
  const SimResult own = simulate(p, with(Schedule::k1F1B));
  expect_rel(own.iteration_s, 6 * (kF + kB) + 9e-3);
  expect_rel(own.stages[0].step_s, 9e-3);
  EXPECT_EQ(own.stages[1].step_s, 0);
  expect_rel(own.stages[2].step_s, 1e-3);
  SimOptions o = with(Schedule::k1F1B);
  o.optimizer_step_s = 0.5e-3;
  const SimResult given = simulate(p, o);
  expect_rel(given.iteration_s, 6 * (kF + kB) + 0.5e-3);
  expect_rel(given.stages[2].step_s, 0.5e-3);
}

TEST(ASimulatedPipeline, ReportsACriticalPathOfTouchingEventsFromZeroToTheEnd) {
  for (Schedule s : {Schedule::kGPipe, Schedule::k1F1B, Schedule::kInterleaved}) {
    const SimResult r = simulate(chain_plan(4, 8, kF, kB, 1e5), with(s));
    ASSERT_FALSE(r.critical_path.empty());
    EXPECT_EQ(r.events[static_cast<size_t>(r.critical_path.front())].start_s, 0.0);
    EXPECT_EQ(r.events[static_cast<size_t>(r.critical_path.back())].end_s, r.iteration_s);
    for (size_t i = 1; i < r.critical_path.size(); ++i)
      EXPECT_EQ(r.events[static_cast<size_t>(r.critical_path[i])].start_s,
                r.events[static_cast<size_t>(r.critical_path[i - 1])].end_s);
  }
}

TEST(ASimulatedPipeline, NeverRunsTwoThingsAtOnceOnADeviceOrAChannel) {
  const SimResult r = simulate(chain_plan(4, 8, kF, kB, 3e5), with(Schedule::kInterleaved, 2));
  std::map<std::pair<int, int>, double> busy_until;  // (stage, 0 compute | 1 send | 2 recv)
  for (const SimEvent& e : r.events) {
    std::vector<std::pair<int, int>> resources;
    if (e.kind == EventKind::kTransfer) resources = {{e.stage, 1}, {e.peer_stage, 2}};
    else resources = {{e.stage, 0}};
    for (const auto& key : resources) {
      EXPECT_GE(e.start_s, busy_until[key]) << e.name();
      busy_until[key] = e.end_s;
    }
  }
}

TEST(ASimulatedPipeline, IsDeterministic) {
  const SimPlan p = chain_plan(4, 8, kF, kB, 1e5);
  const SimResult a = simulate(p, with(Schedule::kInterleaved, 2));
  const SimResult b = simulate(p, with(Schedule::kInterleaved, 2));
  ASSERT_EQ(a.events.size(), b.events.size());
  for (size_t i = 0; i < a.events.size(); ++i) {
    EXPECT_EQ(a.events[i].name(), b.events[i].name());
    EXPECT_EQ(a.events[i].start_s, b.events[i].start_s);
    EXPECT_EQ(a.events[i].end_s, b.events[i].end_s);
  }
  EXPECT_EQ(a.critical_path, b.critical_path);
}

TEST(ASimulatedPipeline, FollowsAStageDagWithSkipConnections) {
  SimPlan p = chain_plan(3, 4, kF, kB, 1e5);
  p.stages[2].inputs.push_back({"skip", 0, 1e5});  // stage 0 also feeds stage 2
  p.stages[0].outputs.push_back({"skip", {2}, 1e5});
  const SimResult r = simulate(p, with(Schedule::k1F1B));
  int skip_transfers = 0;
  for (const SimEvent& e : r.events)
    if (e.kind == EventKind::kTransfer && e.stage == 0 && e.peer_stage == 2) ++skip_transfers;
  EXPECT_EQ(skip_transfers, 4);  // activations only; gradients go 2 → 0
  EXPECT_GT(r.iteration_s, simulate(chain_plan(3, 4, kF, kB, 1e5), with(Schedule::k1F1B)).iteration_s);
}

TEST(ASimulatedPipeline, RejectsVirtualStagesWithoutTheInterleavedSchedule) {
  EXPECT_THROW(simulate(chain_plan(2, 4, kF, kB), with(Schedule::k1F1B, 2)), InvalidArgument);
  EXPECT_THROW(simulate(chain_plan(4, 6, kF, kB), with(Schedule::kInterleaved, 2)), Unsupported);
}

}  // namespace
}  // namespace apart::sim
