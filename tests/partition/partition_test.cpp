// The whole partition path (atomic → block → stage DP) against brute force on small graphs, and its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "brute_force.h"
#include "graph/error.h"
#include "partition/block.h"
#include "partition/methods.h"
#include "partition/partition.h"
#include "partition/phases.h"
#include "random_models.h"
#include "test_cluster.h"

namespace apart {
namespace {

using testing::random_model;

// Least bottleneck over all contiguous splits of the batch tasks (in topological order) × replica vectors.
double brute_force(const StageEvaluator& ev, int stages, int64_t m, bool recompute) {
  return testing::brute_force_bottleneck(ev, stages, m, [&](int s, uint32_t first, uint32_t last, int replicas) {
    return testing::fitting_h(ev, ev.evaluate(first, last, replicas, m,
                                              stage_in_flight_microbatches(Schedule::k1F1B, s, stages, m),
                                              recompute ? RecomputeScope::kFull : RecomputeScope::kNone));
  });
}

PartitionOptions small_options(int devices, int64_t batch, int64_t memory) {
  PartitionOptions o;
  o.cluster = testing::test_cluster(devices, 2, memory);
  o.training.global_batch = batch;
  o.block.blocks = 64;  // no coarsening: the DP sees every atomic component
  return o;
}

TEST(ThePartitionPipeline, MatchesBruteForceOnRandomDagsAndChains) {
  int compared = 0;
  for (uint32_t seed = 1; seed <= 16; ++seed) {
    const bool chain = seed % 2 == 0;
    const int tasks = 4 + static_cast<int>(seed % 11);  // ≤ 14
    const auto model = random_model(seed, tasks, chain);
    const int devices = 1 + static_cast<int>(seed % 4);
    PartitionOptions o = small_options(devices, 8, 3'000'000 + 400'000 * (seed % 5));
    o.cluster.devices_per_node = 4;  // one node: placement changes no link, so the plan keeps the DP's bottleneck
    o.stage.spend_leftover_devices = false;
    o.stage.include_baselines = false;  // the DP alone: baseline splits may win on the estimate, not the bottleneck
    o.stage.recompute = Recompute::kOff;
    const AtomicGraph atomic = build_atomic_graph(model.graph, model.costs, o.atomic);
    BlockAssignment identity;
    identity.blocks = static_cast<uint32_t>(atomic.size());
    identity.block_of.resize(atomic.size());
    for (uint32_t c = 0; c < atomic.size(); ++c) identity.block_of[c] = BlockId(c);
    const StageEvaluator ev(make_block_sequence(atomic, identity), o.cluster, o.training);
    for (int stages = 1; stages <= std::min<int>(devices, atomic.size()); ++stages)
      for (int64_t m : {1, 2, 4, 8}) {
        o.stage.stages = stages;
        o.stage.microbatches = m;
        const double expected = brute_force(ev, stages, m, false);
        if (std::isinf(expected)) {
          EXPECT_THROW(partition_graph(model.graph, model.costs, o), Infeasible) << "seed " << seed;
          continue;
        }
        const Plan plan = partition_graph(model.graph, model.costs, o);
        double worst = 0;
        for (const PlanStage& s : plan.stages) worst = std::max(worst, s.cost.h);
        EXPECT_NEAR(worst, expected, 1e-12 * expected) << "seed " << seed << " S=" << stages << " m=" << m;
        ++compared;
      }
  }
  EXPECT_GT(compared, 40);
}

// With S and m free the candidates include every pinned run's, and the choice is by simulated time over them
// (select_test.cpp checks it equals simulating all): so no pinned plan may be faster than the free one.
TEST(ThePartitionPipeline, IsNeverSlowerInSimulationThanAnyPinnedStageAndMicrobatchCount) {
  for (uint32_t seed = 40; seed < 46; ++seed) {
    const auto model = random_model(seed, 10, seed % 2 == 0);
    PartitionOptions o = small_options(4, 8, 1'000'000'000);
    const Plan free = partition_graph(model.graph, model.costs, o);
    EXPECT_EQ(free.search.not_simulated, 0);
    EXPECT_GT(free.search.simulated, 0);
    for (int stages = 1; stages <= 4; ++stages)
      for (int64_t m : {1, 2, 4, 8}) {
        o.stage.stages = stages;
        o.stage.microbatches = m;
        try {
          const Plan pinned = partition_graph(model.graph, model.costs, o);
          EXPECT_LE(free.simulated.iteration_s, pinned.simulated.iteration_s * (1 + 1e-12))
              << "seed " << seed << " S=" << stages << " m=" << m;
        } catch (const Infeasible&) {
        }
      }
  }
}

// --schedule auto chooses among the 1F1B search's candidates and their schedule variants (phases.h): never slower
// in simulation than --schedule 1f1b, and on pipelines with a bubble it finds a ZB-H1 or interleaved plan.
TEST(ThePartitionPipeline, UnderScheduleAutoIsNeverSlowerThan1F1BAndFillsTheBubbleOfPinnedPipelines) {
  int other_schedule = 0;
  for (uint32_t seed = 50; seed < 56; ++seed) {
    const auto model = random_model(seed, 12, seed % 2 == 0);
    PartitionOptions o = small_options(4, 8, 1'000'000'000);
    for (std::optional<int> stages : {std::optional<int>(), std::optional<int>(4)}) {
      o.stage.stages = stages;
      o.stage.replicas = stages ? std::optional<int>(1) : std::nullopt;  // a pure pipeline: its bubble is exposed
      o.stage.schedule = Schedule::k1F1B;
      const Plan one = partition_graph(model.graph, model.costs, o);
      o.stage.schedule.reset();
      const Plan best = partition_graph(model.graph, model.costs, o);
      EXPECT_LE(best.simulated.iteration_s, one.simulated.iteration_s * (1 + 1e-12)) << "seed " << seed;
      EXPECT_GE(best.search.candidates_placed, one.search.candidates_placed);
      EXPECT_EQ(best.schedule == Schedule::kInterleaved, best.virtual_stages > 1);
      if (stages && best.schedule != Schedule::k1F1B) ++other_schedule;
      if (best.schedule == Schedule::kInterleaved) EXPECT_EQ(best.microbatches % static_cast<int64_t>(best.stages.size()), 0);
    }
  }
  EXPECT_GT(other_schedule, 3);
}

TEST(ThePartitionPipeline, UnderScheduleAutoProducesTheSamePlanTwice) {
  const auto model = random_model(7, 14, true);
  PartitionOptions o = small_options(4, 16, 1'000'000'000);
  o.stage.schedule.reset();
  const Plan a = partition_graph(model.graph, model.costs, o);
  const Plan b = partition_graph(model.graph, model.costs, o);
  EXPECT_EQ(a.schedule, b.schedule);
  EXPECT_EQ(a.virtual_stages, b.virtual_stages);
  EXPECT_EQ(a.simulated.iteration_s, b.simulated.iteration_s);
  EXPECT_EQ(a.search.chosen_split, b.search.chosen_split);
  EXPECT_EQ(a.search.candidates_placed, b.search.candidates_placed);
}

TEST(ThePartitionPipeline, ProducesTheSamePlanTwice) {
  const auto model = random_model(5, 14, false);
  PartitionOptions o = small_options(4, 16, 1'000'000'000);
  o.block.blocks = 4;
  const Plan a = partition_graph(model.graph, model.costs, o);
  const Plan b = partition_graph(model.graph, model.costs, o);
  ASSERT_EQ(a.stages.size(), b.stages.size());
  EXPECT_EQ(a.microbatches, b.microbatches);
  EXPECT_EQ(a.estimate.iteration_s, b.estimate.iteration_s);
  EXPECT_EQ(a.simulated.iteration_s, b.simulated.iteration_s);
  EXPECT_EQ(a.search.chosen_split, b.search.chosen_split);
  for (size_t s = 0; s < a.stages.size(); ++s) {
    EXPECT_EQ(a.stages[s].devices, b.stages[s].devices);
    EXPECT_EQ(a.stages[s].tasks, b.stages[s].tasks);
    EXPECT_EQ(a.stages[s].replicas, b.stages[s].replicas);
  }
}

TEST(ThePartitionPipeline, PutsEveryBatchTaskInExactlyOneStageAndKeepsEdgesForward) {
  for (uint32_t seed = 20; seed < 30; ++seed) {
    const auto model = random_model(seed, 14, false);
    PartitionOptions o = small_options(4, 16, 1'000'000'000);
    o.block.blocks = 3;
    const Plan plan = partition_graph(model.graph, model.costs, o);
    std::vector<int> stage_of(model.graph.num_tasks(), -1);
    for (const PlanStage& s : plan.stages)
      for (TaskId t : s.tasks)
        if (!model.graph.task(t).constant) {
          EXPECT_EQ(stage_of[t.value()], -1);
          stage_of[t.value()] = static_cast<int>(s.id.value());
        }
    for (uint32_t t = 0; t < model.graph.num_tasks(); ++t) {
      if (model.graph.task(TaskId(t)).constant) continue;
      ASSERT_GE(stage_of[t], 0);
      for (TaskId succ : model.graph.successors(TaskId(t)))
        if (!model.graph.task(succ).constant) EXPECT_LE(stage_of[t], stage_of[succ.value()]);
    }
    int devices = 0;
    for (const PlanStage& s : plan.stages) devices += s.replicas;
    EXPECT_LE(devices, 4);
  }
}

TEST(ThePartitionPipeline, NeverLosesToTheBaselinesOnRandomGraphs) {
  for (uint32_t seed = 40; seed < 48; ++seed) {
    const auto model = random_model(seed, 14, seed % 2 == 0);
    PartitionOptions o = small_options(4, 16, 1'000'000'000);
    const double apart = partition_graph(model.graph, model.costs, o).estimate.iteration_s;
    o.method = Method::kUniform;
    const double uniform = partition_by_method(model.graph, model.costs, o).estimate.iteration_s;
    o.method = Method::kParams;
    const double params = partition_by_method(model.graph, model.costs, o).estimate.iteration_s;
    EXPECT_LE(apart, uniform * (1 + 1e-9)) << "seed " << seed;
    EXPECT_LE(apart, params * (1 + 1e-9)) << "seed " << seed;
  }
}

TEST(ThePartitionPipeline, RejectsMoreStagesThanTasks) {
  const auto model = random_model(3, 5, true);
  PartitionOptions o = small_options(64, 64, 1'000'000'000);
  o.stage.stages = 40;
  EXPECT_THROW(partition_graph(model.graph, model.costs, o), Infeasible);
}

TEST(ThePartitionPipeline, RejectsABatchTheMicrobatchCountDoesNotDivide) {
  const auto model = random_model(3, 5, true);
  PartitionOptions o = small_options(4, 10, 1'000'000'000);
  o.stage.microbatches = 3;
  try {
    partition_graph(model.graph, model.costs, o);
    FAIL();
  } catch (const Infeasible& e) {
    EXPECT_NE(std::string(e.what()).find("divisible"), std::string::npos);
  }
}

TEST(ThePartitionPipeline, SaysHowManyDevicesItWouldNeedWhenMemoryIsShort) {
  const auto model = random_model(3, 8, true);
  PartitionOptions o = small_options(1, 8, 400'000);
  try {
    partition_graph(model.graph, model.costs, o);
    FAIL();
  } catch (const Infeasible& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("needs") != std::string::npos) << what;
  }
}

TEST(TheMicrobatchCandidates, AreEveryDivisorOfAnOrdinaryBatch) {
  EXPECT_EQ(microbatch_candidates(64, {}), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64}));
  EXPECT_EQ(microbatch_candidates(12, {}), (std::vector<int64_t>{1, 2, 3, 4, 6, 12}));
  EXPECT_EQ(microbatch_candidates(16777216, {}).size(), 25u);  // 2^24, the largest batch: all 25 divisors
}

// Issue 11: a batch of 2^40 ran > 30 s with no progress (trial division up to B, then every divisor searched).
// Now B is capped at 2^24, divisors come in O(√B), and a highly composite batch keeps them ~8 % apart.
TEST(TheMicrobatchCandidates, StayFewAndSortedForAHighlyCompositeBatch) {
  const int64_t batch = 14414400;  // 504 divisors
  const std::vector<int64_t> ms = microbatch_candidates(batch, {});
  EXPECT_LT(ms.size(), 250u);
  EXPECT_EQ(ms.front(), 1);
  EXPECT_EQ(ms.back(), batch);
  for (size_t i = 0; i < ms.size(); ++i) {
    EXPECT_EQ(batch % ms[i], 0) << ms[i];
    if (i > 0) EXPECT_LT(ms[i - 1], ms[i]);
  }
}

TEST(TheBlockLevel, ReachesTheRequestedBlockCountWithForwardEdgesOnly) {
  for (uint32_t seed = 60; seed < 70; ++seed) {
    const auto model = random_model(seed, 14, false);
    const AtomicGraph atomic = build_atomic_graph(model.graph, model.costs, {});
    for (int k = 1; k <= static_cast<int>(atomic.size()); ++k) {
      const BlockAssignment a = build_blocks(atomic, k, {}, {}, 4.0);
      EXPECT_EQ(a.blocks, static_cast<uint32_t>(k));
      for (const Transfer& t : atomic.transfers)
        for (uint32_t c : t.consumers) EXPECT_LE(a.block_of[t.producer], a.block_of[c]);
      EXPECT_NO_THROW(make_block_sequence(atomic, a));
    }
  }
}

TEST(TheAtomicLevel, ReplicatesConstantTasksIntoTheirConsumersComponents) {
  const auto model = random_model(1, 14, false);
  const AtomicGraph atomic = build_atomic_graph(model.graph, model.costs, {});
  EXPECT_EQ(atomic.size(), model.graph.num_batch_tasks());
  size_t checked = 0;
  for (const AtomicComponent& c : atomic.components)
    for (TaskId p : model.graph.predecessors(c.batch_task)) {
      if (!model.graph.task(p).constant) continue;
      EXPECT_NE(std::find(c.constant_tasks.begin(), c.constant_tasks.end(), p), c.constant_tasks.end())
          << "constant task " << model.graph.task(p).name << " is missing from its consumer's component";
      ++checked;
    }
  EXPECT_GT(checked, 0u) << "the fixture should feed some constant task into a batch task";
}

// A measured profile times the constant tasks that run every step (they read params): each costs the same at any
// micro-batch size, shared evenly by the components that use it, so all of them together pay it exactly once.
TEST(TheAtomicLevel, SharesAConstantTasksTimeEvenlyAmongItsUsersAsAFixedCost) {
  auto model = random_model(1, 14, false);
  double constant_forward = 0;
  for (uint32_t t = 0; t < model.graph.num_tasks(); ++t) {
    if (!model.graph.task(TaskId(t)).constant) continue;
    model.costs.tasks[t].forward_s = 1e-3 * (t + 1);
    model.costs.tasks[t].backward_s = 2e-3 * (t + 1);
    constant_forward += model.costs.tasks[t].forward_s;
  }
  ASSERT_GT(constant_forward, 0) << "the fixture should have a constant task";
  const AtomicGraph before = build_atomic_graph(random_model(1, 14, false).graph, random_model(1, 14, false).costs, {});
  const AtomicGraph after = build_atomic_graph(model.graph, model.costs, {});
  ASSERT_EQ(before.size(), after.size());
  double fixed_forward = 0, fixed_backward = 0;
  for (size_t c = 0; c < after.size(); ++c) {
    const BlockCost& a = after.components[c].cost;
    const BlockCost& b = before.components[c].cost;
    EXPECT_DOUBLE_EQ(a.forward.per_sample_s, b.forward.per_sample_s);  // the batch-scaled part is unchanged
    // Each component's share, recomputed from its constant tasks' user counts.
    double expect_forward = b.forward.fixed_s;
    for (TaskId t : after.components[c].constant_tasks) {
      int users = 0;
      for (const AtomicComponent& other : after.components)
        users += std::count(other.constant_tasks.begin(), other.constant_tasks.end(), t) > 0;
      expect_forward += model.costs.tasks[t.value()].forward_s / users;
    }
    EXPECT_NEAR(a.forward.fixed_s, expect_forward, 1e-15);
    fixed_forward += a.forward.fixed_s - b.forward.fixed_s;
    fixed_backward += a.backward.fixed_s - b.backward.fixed_s;
  }
  // A constant task that feeds some batch task is charged once in all; one that feeds none (an output computed
  // from weights alone) is charged nowhere.
  double used_forward = 0, used_backward = 0;
  for (uint32_t t = 0; t < model.graph.num_tasks(); ++t)
    if (std::any_of(after.components.begin(), after.components.end(), [&](const AtomicComponent& c) {
          return std::find(c.constant_tasks.begin(), c.constant_tasks.end(), TaskId(t)) != c.constant_tasks.end();
        })) {
      used_forward += model.costs.tasks[t].forward_s;
      used_backward += model.costs.tasks[t].backward_s;
    }
  EXPECT_GT(used_forward, 0);
  EXPECT_NEAR(fixed_forward, used_forward, 1e-12);
  EXPECT_NEAR(fixed_backward, used_backward, 1e-12);
}

TEST(TheAtomicLevel, CountsEachWeightOncePerComponentThatReadsIt) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const auto model = random_model(seed, 14, seed % 2 == 0);
    const AtomicGraph atomic = build_atomic_graph(model.graph, model.costs, {});
    int64_t total = 0;
    for (const Value& v : model.graph.values())
      if (v.kind == ValueKind::kParam) total += v.bytes;
    int64_t distinct = 0;
    for (const ParamUse& p : atomic.params) distinct += p.bytes;
    EXPECT_LE(distinct, total);
    for (const ParamUse& p : atomic.params) EXPECT_TRUE(std::is_sorted(p.readers.begin(), p.readers.end()));
  }
}

}  // namespace
}  // namespace apart
