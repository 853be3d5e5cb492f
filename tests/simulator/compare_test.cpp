// apart simulate --compare: a replay against its own timeline matches everywhere; a slower stage is named with the
// figure that misses; a trace of another plan is refused.
#include <gtest/gtest.h>

#include "graph/error.h"
#include "plan/trace.h"
#include "simulator/compare.h"
#include "simulator/sim_report.h"
#include "simulator/simulate.h"
#include "tests/simulator/sim_test_util.h"

namespace apart::sim {
namespace {

struct Replay {
  SimPlan plan;
  SimResult result;
};
Replay replay(int stages, int64_t microbatches) {
  Replay r{testing::chain_plan(stages, microbatches, 1.5e-3, 3.1e-3, 2e5), {}};
  r.result = simulate(r.plan);
  return r;
}

// The timeline read back from its trace, as --compare reads a file.
Timeline through_trace(const Timeline& t) { return timeline_from_chrome_trace(nlohmann::json::parse(timeline_to_chrome_trace(t).dump())); }

TEST(AComparison, OfAReplayWithItsOwnTimelineHasRatioOneAndNoMiss) {
  const Replay r = replay(3, 6);
  const Comparison c = compare_with_timeline(r.plan, r.result, through_trace(simulation_timeline(r.plan, r.result)), "t.json");
  ASSERT_EQ(c.stages.size(), 3u);
  EXPECT_NEAR(c.measured_iteration_s, c.predicted_iteration_s, 1e-8);
  for (const StageComparison& s : c.stages) {
    EXPECT_NEAR(s.measured.forward_s, s.predicted.forward_s, 1e-8) << s.stage;
    EXPECT_NEAR(s.measured.backward_s, s.predicted.backward_s, 1e-8) << s.stage;
    EXPECT_NEAR(s.measured.busy_s, s.predicted.busy_s, 1e-8) << s.stage;
    EXPECT_NEAR(s.measured.comm_s, s.predicted.comm_s, 1e-8) << s.stage;
    EXPECT_NEAR(s.measured.idle_s, s.predicted.idle_s, 1e-8) << s.stage;
    EXPECT_TRUE(s.misses.empty()) << s.misses.front();
  }
  EXPECT_NE(comparison_report(c).find("every stage's forward, backward and busy time is within 10 %"), std::string::npos);
}

TEST(AComparison, NamesTheStageAndTheFigureThatMissByMoreThanTenPercent) {
  const Replay r = replay(2, 4);
  Timeline t = simulation_timeline(r.plan, r.result);
  for (TimelineEvent& e : t.events)  // stage 1's backwards take 30 % longer (later events are not shifted: no matter)
    if (e.stage == 1 && e.kind == TimelineKind::kBackward) e.end_s = e.start_s + 1.3 * (e.end_s - e.start_s);
  const Comparison c = compare_with_timeline(r.plan, r.result, t, "t.json");
  EXPECT_TRUE(c.stages[0].misses.empty());
  ASSERT_FALSE(c.stages[1].misses.empty());
  EXPECT_NE(c.stages[1].misses.front().find("backward"), std::string::npos) << c.stages[1].misses.front();
  EXPECT_NE(c.stages[1].misses.front().find("+30.0 %"), std::string::npos) << c.stages[1].misses.front();
  const std::string report = comparison_report(c);
  EXPECT_NE(report.find("stage 1 misses by more than 10 %: backward"), std::string::npos) << report;
  EXPECT_EQ(report.find("stage 0 misses"), std::string::npos) << report;
}

// Steps 1..6 of a run, each the replay again; step 1 (warm-up, left out) and step 4 take three times as long.
TEST(AComparison, TakesTheMedianOverStepsSoThatOneStepTheMachineSlowedDoesNotMoveIt) {
  const Replay r = replay(2, 4);
  const Timeline once = simulation_timeline(r.plan, r.result);
  Timeline run;
  double at = 0;
  for (int64_t step = 1; step <= 6; ++step) {
    const double stretch = step == 1 || step == 4 ? 3.0 : 1.0;
    for (TimelineEvent e : once.events) {
      e.step = step;
      e.start_s = at + stretch * e.start_s;
      e.end_s = at + stretch * e.end_s;
      run.events.push_back(e);
    }
    at += stretch * r.result.iteration_s;
  }
  const Comparison c = compare_with_timeline(r.plan, r.result, through_trace(run), "t.json");
  EXPECT_EQ(c.steps, 5);
  EXPECT_TRUE(c.first_step_left_out);
  EXPECT_NEAR(c.measured_iteration_s, c.predicted_iteration_s, 1e-8);
  EXPECT_NEAR(c.mean_iteration_s, 1.4 * c.predicted_iteration_s, 1e-8);  // (1 + 1 + 3 + 1 + 1) / 5
  for (const StageComparison& s : c.stages) {
    EXPECT_NEAR(s.measured.forward_s, s.predicted.forward_s, 1e-8) << s.stage;
    EXPECT_NEAR(s.measured.busy_s, s.predicted.busy_s, 1e-8) << s.stage;
    EXPECT_TRUE(s.misses.empty()) << s.misses.front();
  }
  const std::string report = comparison_report(c);
  EXPECT_NE(report.find("median of 5 steps, step 1 left out"), std::string::npos) << report;
  EXPECT_NE(report.find("(mean of the steps "), std::string::npos) << report;
}

TEST(AComparison, PrintsOneRowPerStage) {
  const Replay r = replay(4, 8);
  const std::string report = comparison_report(compare_with_timeline(r.plan, r.result, simulation_timeline(r.plan, r.result), "t.json"));
  for (const char* col : {"forward", "backward", "busy", "comm", "all-reduce", "step", "idle", "predicted", "measured", "ratio"})
    EXPECT_NE(report.find(col), std::string::npos) << col;
  int rows = 0;
  std::istringstream lines(report);
  for (std::string line; std::getline(lines, line);)
    for (int s = 0; s < 4; ++s)
      if (line.rfind("    " + std::to_string(s) + "    1 |", 0) == 0) ++rows;
  EXPECT_EQ(rows, 4) << report;
}

TEST(AComparison, RefusesATraceOfAnotherPlan) {
  const Replay four = replay(4, 8), two = replay(2, 8);
  const Timeline of_four = simulation_timeline(four.plan, four.result);
  try {
    compare_with_timeline(two.plan, two.result, of_four, "t.json");
    FAIL() << "accepted a trace of 4 stages for a plan of 2";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("t.json has events of stage 2"), std::string::npos) << e.what();
  }
  const Timeline of_two = simulation_timeline(two.plan, two.result);
  EXPECT_THROW(compare_with_timeline(four.plan, four.result, of_two, "t.json"), InvalidArgument);  // stages 2, 3 lack events
}

}  // namespace
}  // namespace apart::sim
