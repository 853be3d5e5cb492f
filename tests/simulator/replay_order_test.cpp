// The simulator replays what the runtime runs: each stage's compute order in a replay equals the compute actions
// of rank_actions (schedule/) for every rank of that stage.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "schedule/schedule.h"
#include "simulator/sim_plan.h"
#include "simulator/simulate.h"
#include "tests/schedule/schedule_test_util.h"

namespace apart::sim {
namespace {

using ComputeStep = std::pair<bool, int64_t>;  // (backward, micro-batch)

std::vector<ComputeStep> replayed_order(const SimResult& result, int stage) {
  std::vector<ComputeStep> order;
  for (const SimEvent& e : result.events)  // in start order: a stage's ops appear as it ran them
    if (e.stage == stage && (e.kind == EventKind::kForward || e.kind == EventKind::kBackward))
      order.push_back({e.kind == EventKind::kBackward, e.microbatch});
  return order;
}

std::vector<ComputeStep> executed_order(const PlanDocument& plan, int rank) {
  std::vector<ComputeStep> order;
  for (const Action& a : rank_actions(plan, rank))
    if (a.kind == ActionKind::kForward || a.kind == ActionKind::kBackward)
      order.push_back({a.kind == ActionKind::kBackward, a.microbatch});
  return order;
}

TEST(AReplay, RunsEachStageInTheOrderItsRanksExecute) {
  struct Case {
    std::vector<int> replicas;
    int64_t microbatches;
    Schedule schedule;
    std::vector<std::pair<int, int>> edges;
  };
  const std::vector<Case> cases = {
      {{1, 1}, 3, Schedule::k1F1B, {}},
      {{2, 1, 1}, 4, Schedule::kGPipe, {}},
      {{1, 2, 1, 1}, 5, Schedule::k1F1B, {}},
      {{1, 3, 2, 1}, 6, Schedule::kGPipe, {}},
      {{1, 1, 1}, 4, Schedule::k1F1B, {{0, 1}, {0, 2}, {1, 2}}},
  };
  for (const Case& c : cases) {
    const PlanDocument plan = apart::testing::pipeline_plan(c.replicas, c.microbatches, c.schedule, 6, c.edges);
    const SimResult result = simulate(sim_plan(plan, "test plan"));
    for (size_t s = 0; s < plan.stages.size(); ++s) {
      const std::vector<ComputeStep> replayed = replayed_order(result, static_cast<int>(s));
      ASSERT_EQ(replayed.size(), static_cast<size_t>(2 * c.microbatches));
      for (int rank : plan.stages[s].devices)
        EXPECT_EQ(replayed, executed_order(plan, rank))
            << schedule_name(c.schedule) << ", " << c.replicas.size() << " stages, stage " << s << ", rank " << rank;
    }
  }
}

}  // namespace
}  // namespace apart::sim
