// apart run --trace: the measured timeline of a 2-stage plan run as threads holds every action of the last step on
// every rank (forwards = backwards = micro-batches, each send with its receive), and apart simulate --compare reads it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "plan/plan.h"
#include "plan/trace.h"
#include "schedule/schedule.h"
#include "tests/support/run_apart.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using testing::run_apart;

constexpr int64_t kMicrobatches = 4;

class ARunTrace : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("apart_run_trace_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const auto r = run_apart("partition " + std::string(APART_SOURCE_DIR) + "/models/gpt-tiny.onnx --device cpu --devices 2 "
                             "--stages 2 --replicas 1 --microbatches " + std::to_string(kMicrobatches) +
                             " --batch 8 --schedule 1f1b --no-baselines -o " + (dir_ / "plan").string());
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static fs::path plan() { return dir_ / "plan"; }
  static fs::path dir_;
};
fs::path ARunTrace::dir_;

TEST_F(ARunTrace, HoldsEveryActionOfTheLastStepOnEveryRank) {
  const fs::path trace = dir_ / "last.json";
  const auto r = run_apart("run " + plan().string() + " --in-process --steps 3 -q --trace " + trace.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const Timeline t = read_timeline(trace);
  EXPECT_EQ(t.generator, "apart run");
  EXPECT_GT(t.iteration_s, 0);
  ASSERT_EQ(t.processes.size(), 2u);
  EXPECT_EQ(t.processes[0].name, "stage 0 replica 0 (rank 0)");
  EXPECT_EQ(t.processes[1].name, "stage 1 replica 0 (rank 1)");
  const PlanDocument doc = read_plan(plan());
  std::map<int, std::vector<TimelineEvent>> by_rank;
  for (const TimelineEvent& e : t.events) {
    EXPECT_EQ(e.step, 3) << action_name(e);
    EXPECT_LE(e.start_s, e.end_s);
    by_rank[e.process].push_back(e);
  }
  // Sends and receives as (sender, receiver, micro-batch, direction): each send has its receive.
  std::multiset<std::tuple<int, int, int64_t, bool>> sends, recvs;
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<Action> actions = rank_actions(doc, rank);
    const std::vector<TimelineEvent>& events = by_rank[rank];
    ASSERT_EQ(events.size(), actions.size()) << "rank " << rank;
    std::set<int64_t> forwards, backwards;
    for (size_t i = 0; i < events.size(); ++i) {
      const TimelineEvent& e = events[i];
      EXPECT_EQ(e.stage, rank);
      EXPECT_EQ(e.replica, 0);
      if (i > 0) {
        EXPECT_GE(e.start_s, events[i - 1].end_s) << "rank " << rank << " event " << i;  // in the actions' order
      }
      if (e.kind == TimelineKind::kForward) {
        EXPECT_TRUE(forwards.insert(e.microbatch).second);
      }
      if (e.kind == TimelineKind::kBackward) {
        EXPECT_TRUE(backwards.insert(e.microbatch).second);
      }
      if (e.kind == TimelineKind::kSend) sends.insert({e.process, e.peer_process, e.microbatch, e.gradient});
      if (e.kind == TimelineKind::kRecv) recvs.insert({e.peer_process, e.process, e.microbatch, e.gradient});
      if (e.kind == TimelineKind::kSend || e.kind == TimelineKind::kRecv) {
        EXPECT_GT(e.bytes, 0);
        EXPECT_EQ(e.peer_stage, 1 - rank);
      }
    }
    EXPECT_EQ(forwards.size(), static_cast<size_t>(kMicrobatches)) << "rank " << rank;
    EXPECT_EQ(backwards.size(), static_cast<size_t>(kMicrobatches)) << "rank " << rank;
    EXPECT_EQ(events.back().kind, TimelineKind::kStep);
  }
  EXPECT_EQ(sends.size(), static_cast<size_t>(2 * kMicrobatches));  // activations forward, gradients back
  EXPECT_EQ(sends, recvs);
}

TEST_F(ARunTrace, HoldsEveryStepWhenAsked) {
  const fs::path trace = dir_ / "all.json";
  ASSERT_EQ(run_apart("run " + plan().string() + " --in-process --steps 2 -q --trace-all-steps --trace " + trace.string()).code, 0);
  std::map<int64_t, int> forwards;
  for (const TimelineEvent& e : read_timeline(trace).events)
    if (e.kind == TimelineKind::kForward) ++forwards[e.step];
  EXPECT_EQ(forwards, (std::map<int64_t, int>{{1, 2 * kMicrobatches}, {2, 2 * kMicrobatches}}));
}

TEST_F(ARunTrace, IsWhatSimulateCompareReadsWithARowPerStage) {
  const fs::path trace = dir_ / "compare.json";
  ASSERT_EQ(run_apart("run " + plan().string() + " --in-process --steps 2 -q --trace " + trace.string()).code, 0);
  const auto r = run_apart("simulate " + plan().string() + " --compare " + trace.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("measured (" + trace.string() + ", apart run, 1 step)"), std::string::npos) << r.out;
  for (const char* row : {"\n    0    1 |", "\n    1    1 |", "\niteration "}) EXPECT_NE(r.out.find(row), std::string::npos) << row << r.out;
}

TEST_F(ARunTrace, ChecksItsPathBeforeTheFirstStep) {
  const auto missing = run_apart("run " + plan().string() + " --in-process --steps 1 --trace " + (dir_ / "no" / "t.json").string());
  EXPECT_EQ(missing.code, 6) << missing.out;
  EXPECT_EQ(missing.out.find("step="), std::string::npos) << missing.out;
  EXPECT_NE(missing.out.find("--trace"), std::string::npos) << missing.out;
  const auto onto_plan = run_apart("run " + plan().string() + " --in-process --steps 1 --trace " + (plan() / "plan.json").string());
  EXPECT_EQ(onto_plan.code, 2) << onto_plan.out;
  EXPECT_TRUE(fs::exists(plan() / "plan.json"));
  EXPECT_EQ(run_apart("run " + plan().string() + " --in-process --steps 1 --trace-all-steps").code, 2);
}

}  // namespace
}  // namespace apart
