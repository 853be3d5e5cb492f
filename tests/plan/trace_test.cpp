// The timeline's Chrome trace: what the writer writes the reader reads back, flows pair sends with receives, and a
// malformed trace is refused naming the file and the field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "graph/error.h"
#include "plan/trace.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Two ranks of a 2-stage run: rank 0 forwards and sends, rank 1 receives, forwards, backwards and sends back.
Timeline two_rank_timeline() {
  Timeline t;
  t.generator = "apart run";
  t.plan = "out/plan";
  t.schedule = "1f1b";
  t.iteration_s = 0.010;
  t.processes = {{0, "stage 0 replica 0 (rank 0)", 0}, {1, "stage 1 replica 0 (rank 1)", 1}};
  auto ev = [](TimelineKind k, int rank, int stage, int64_t mb, double a, double b) {
    TimelineEvent e;
    e.kind = k;
    e.process = rank;
    e.stage = stage;
    e.replica = 0;
    e.virtual_stage = stage;
    e.microbatch = mb;
    e.step = 3;
    e.start_s = a;
    e.end_s = b;
    return e;
  };
  auto p2p = [&](TimelineKind k, int rank, int stage, int peer_stage, bool grad, double a, double b) {
    TimelineEvent e = ev(k, rank, stage, 0, a, b);
    e.peer_stage = peer_stage;
    e.peer_virtual_stage = peer_stage;
    e.peer_process = 1 - rank;
    e.gradient = grad;
    e.bytes = 4096;
    return e;
  };
  t.events = {ev(TimelineKind::kForward, 0, 0, 0, 0.000, 0.002),
              p2p(TimelineKind::kSend, 0, 0, 1, false, 0.002, 0.0021),
              p2p(TimelineKind::kRecv, 0, 0, 1, true, 0.0021, 0.007),
              ev(TimelineKind::kBackward, 0, 0, 0, 0.007, 0.009),
              ev(TimelineKind::kStep, 0, 0, -1, 0.009, 0.010),
              p2p(TimelineKind::kRecv, 1, 1, 0, false, 0.000, 0.0021),
              ev(TimelineKind::kForward, 1, 1, 0, 0.0021, 0.004),
              ev(TimelineKind::kBackward, 1, 1, 0, 0.004, 0.0069),
              p2p(TimelineKind::kSend, 1, 1, 0, true, 0.0069, 0.007),
              ev(TimelineKind::kStep, 1, 1, -1, 0.009, 0.010)};
  return t;
}

class ATraceFile : public ::testing::Test {
 public:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("apart_trace_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path write(const std::string& text) {
    const fs::path p = dir_ / "trace.json";
    std::ofstream(p) << text;
    return p;
  }
  fs::path dir_;
};

TEST_F(ATraceFile, ReadsBackWhatTheWriterWrote) {
  const Timeline t = two_rank_timeline();
  write_timeline(dir_ / "t.json", t);
  Timeline back = read_timeline(dir_ / "t.json");
  ASSERT_EQ(back.events.size(), t.events.size());
  // Times go through whole nanoseconds: compare them to 1 ns, then everything else exactly.
  for (size_t i = 0; i < t.events.size(); ++i) {
    EXPECT_NEAR(back.events[i].start_s, t.events[i].start_s, 1e-9) << i;
    EXPECT_NEAR(back.events[i].end_s, t.events[i].end_s, 1e-9) << i;
    back.events[i].start_s = t.events[i].start_s;
    back.events[i].end_s = t.events[i].end_s;
  }
  EXPECT_EQ(back, t);
}

TEST_F(ATraceFile, LinksEachSendToTheReceiveThatMatchesIt) {
  const json trace = json::parse(timeline_to_chrome_trace(two_rank_timeline()).dump());
  int starts = 0, finishes = 0;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "s") {
      ++starts;
      EXPECT_EQ(e["tid"], 1);
    }
    if (e["ph"] == "f") {
      ++finishes;
      EXPECT_EQ(e["tid"], 2);
    }
  }
  EXPECT_EQ(starts, 2);  // the activation 0 → 1 and the gradient 1 → 0
  EXPECT_EQ(finishes, 2);
}

TEST_F(ATraceFile, NamesActionsAsTorchPipeliningDoes) {
  EXPECT_EQ(action_name(TimelineKind::kForward, 2, 2, 0, false), "2F0");
  EXPECT_EQ(action_name(TimelineKind::kBackward, 3, 3, 1, false), "3B1");
  EXPECT_EQ(action_name(TimelineKind::kSend, 1, 1, 0, false), "1SEND_F0");
  EXPECT_EQ(action_name(TimelineKind::kRecv, 2, 2, 0, true), "2RECV_B0");
  EXPECT_EQ(action_name(TimelineKind::kAllReduce, 2, 2, -1, false), "2REDUCE_GRAD");
  EXPECT_EQ(action_name(TimelineKind::kStep, 2, 2, -1, false), "2STEP");
}

// The message of reading `text`, which must fail with InvalidArgument.
std::string refusal(ATraceFile& t, const std::string& text) {
  try {
    read_timeline(t.write(text));
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << text;
  return "";
}

TEST_F(ATraceFile, RefusesMalformedTracesNamingTheFileAndTheField) {
  const std::string ok_event = R"({"ph":"X","name":"0F0","cat":"forward","pid":0,"tid":0,"ts":0,"dur":5,"args":{"stage":0,"microbatch":0}})";
  struct Case {
    std::string text;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"[1,2]", "the document"},
      {R"({"events":[]})", "traceEvents is missing"},
      {R"({"traceEvents":[]})", "holds no forward"},
      {R"({"traceEvents":[{"ph":"X","cat":"forward","pid":-1,"ts":0,"dur":1,"args":{"stage":0,"microbatch":0}}]})",
       "traceEvents[0].pid"},
      {R"({"traceEvents":[)" + ok_event + R"(,{"ph":"X","cat":"backward","pid":0,"ts":0,"dur":-3,"args":{"stage":0,"microbatch":0}}]})",
       "traceEvents[1].dur"},
      {R"({"traceEvents":[{"ph":"X","cat":"forward","pid":0,"ts":1e300,"dur":1,"args":{"stage":0,"microbatch":0}}]})",
       "traceEvents[0].ts"},
      {R"({"traceEvents":[{"ph":"X","cat":"forward","pid":0,"ts":0,"dur":1,"args":{"stage":"one","microbatch":0}}]})",
       "traceEvents[0].args.stage"},
      {R"({"traceEvents":[{"ph":"X","cat":"forward","pid":0,"ts":0,"dur":1,"args":{"stage":0}}]})",
       "traceEvents[0].args.microbatch"},
      {R"({"traceEvents":[{"ph":"X","cat":"forward","pid":0,"ts":0,"dur":1,"args":{"stage":0,"microbatch":99999999}}]})",
       "traceEvents[0].args.microbatch"},
      {R"({"traceEvents":[{"ph":"X","name":"0SEND_F0","cat":"p2p","pid":0,"tid":1,"ts":0,"dur":1,"args":{"stage":0,"microbatch":0}}]})",
       "traceEvents[0].args.to_stage"},
      {R"({"traceEvents":[{"ph":"X","name":"0SEND_F0","cat":"p2p","pid":0,"tid":7,"ts":0,"dur":1,"args":{"stage":0,"microbatch":0,"to_stage":1}}]})",
       "traceEvents[0].tid"},
      {R"({"traceEvents":[)" + ok_event + R"(],"otherData":{"iteration_s":-1}})", "otherData.iteration_s"},
  };
  for (const Case& c : cases) {
    const std::string m = refusal(*this, c.text);
    EXPECT_NE(m.find("trace.json"), std::string::npos) << m;
    EXPECT_NE(m.find(c.field), std::string::npos) << c.text << "\n" << m;
  }
  EXPECT_NE(refusal(*this, "{not json").find("is not JSON"), std::string::npos);
  EXPECT_THROW(read_timeline(dir_ / "missing.json"), SystemError);
}

TEST_F(ATraceFile, SkipsWhatAViewerAddsAroundItsEvents) {
  const Timeline t = read_timeline(write(
      R"({"traceEvents":[{"ph":"i","name":"mark","pid":0,"ts":1},{"ph":"X","cat":"user","name":"mine","pid":0,"ts":0,"dur":1},)"
      R"({"ph":"X","name":"0F0","cat":"forward","pid":0,"tid":0,"ts":0,"dur":5,"args":{"stage":0,"microbatch":0}}]})"));
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_EQ(t.events[0].kind, TimelineKind::kForward);
  EXPECT_DOUBLE_EQ(t.events[0].end_s, 5e-6);
}

TEST_F(ATraceFile, IsWrittenWholeOrNotAtAll) {
  EXPECT_THROW(write_timeline(dir_ / "no" / "such" / "t.json", two_rank_timeline()), SystemError);
  EXPECT_FALSE(fs::exists(dir_ / "no"));
}

}  // namespace
}  // namespace apart
