// `apart report` and `apart viz` end to end on plans that `apart partition` writes for models/gpt-tiny.onnx.
#include <gtest/gtest.h>

#include "tests/report/report_test_util.h"

namespace {

using apart::testing::CommandRun;
using apart::testing::count_of;
using apart::testing::gpt_tiny_plan;
using apart::testing::read_text;
using apart::testing::run_apart;
using nlohmann::json;
namespace fs = std::filesystem;

class AReportCommand : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = apart::testing::fresh_temp_dir("cli"); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(AReportCommand, WritesOnePageForATwoStagePlan) {
  const fs::path plan = gpt_tiny_plan(2);
  const fs::path out = dir_ / "report.html";
  const CommandRun r = run_apart("report " + plan.string() + " -o " + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string html = read_text(out);
  EXPECT_EQ(count_of(html, "class=\"stage-row\""), 2u);
  EXPECT_NE(html.find("blocks.0"), std::string::npos) << "gpt-tiny's layers are blocks.N";
  EXPECT_NE(html.find("wte"), std::string::npos);
  EXPECT_EQ(html.find("://"), std::string::npos) << "no URL: the page loads nothing";
  // baselines.json is optional: either compared or "not recorded".
  if (fs::exists(plan / "baselines.json")) EXPECT_NE(html.find("id=\"baselines-table\""), std::string::npos);
  else EXPECT_NE(html.find("id=\"baselines-missing\""), std::string::npos);
}

TEST_F(AReportCommand, DrawsEveryMicroBatchOfAFourStagePlan) {
  const fs::path plan = gpt_tiny_plan(4);
  const fs::path out = dir_ / "r4.html";
  ASSERT_EQ(run_apart("report " + plan.string() + " -o " + out.string()).code, 0);
  const json p = json::parse(read_text(plan / "plan.json"));
  const int64_t m = p["training"]["microbatches"].get<int64_t>();
  const std::string html = read_text(out);
  EXPECT_EQ(count_of(html, "class=\"stage-row\""), 4u);
  EXPECT_EQ(count_of(html, " forward, micro-batch "), static_cast<size_t>(4 * m));
  EXPECT_EQ(count_of(html, " backward, micro-batch "), static_cast<size_t>(4 * m));
}

TEST_F(AReportCommand, WritesIntoThePlanDirectoryByDefault) {
  const fs::path plan = dir_ / "plan";
  fs::copy(gpt_tiny_plan(2), plan);
  const CommandRun r = run_apart("report " + plan.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(plan / "report.html"));
}

TEST_F(AReportCommand, UsesBaselinesJsonWhenPresent) {
  const fs::path plan = dir_ / "plan";
  fs::copy(gpt_tiny_plan(2), plan);
  const json p = json::parse(read_text(plan / "plan.json"));
  const double t = p["predicted"]["iteration_s"].get<double>();
  apart::testing::write_json(plan / "baselines.json",
      {{"schema", "apart.baselines/1"},
       {"methods", {{{"method", "uniform"}, {"iteration_s", 2 * t}, {"samples_per_s", 16 / t}, {"feasible", true},
                     {"planning_s", 0.01}, {"peak_memory_bytes", 1e8}},
                    {{"method", "gpipe-balance"}, {"iteration_s", 1.5 * t}, {"samples_per_s", 21 / t}, {"feasible", true}},
                    {{"method", "apart"}, {"iteration_s", t}, {"samples_per_s", 32 / t}, {"feasible", true}}}}});
  ASSERT_EQ(run_apart("report " + plan.string() + " -o " + (dir_ / "r.html").string()).code, 0);
  const std::string html = read_text(dir_ / "r.html");
  EXPECT_EQ(count_of(html, "class=\"baseline-row"), 3u);
  EXPECT_NE(html.find("gpipe-balance"), std::string::npos);
  EXPECT_NE(html.find("2.00×"), std::string::npos);
}

TEST_F(AReportCommand, GivesTypedErrorsAndLeavesNoFile) {
  CommandRun r = run_apart("report " + dir_.string() + " -o " + (dir_ / "r.html").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("InvalidArgument"), std::string::npos);
  EXPECT_NE(r.out.find("no plan.json"), std::string::npos) << r.out;

  std::ofstream(dir_ / "plan.json") << R"({"schema": "apart.plan/1", "cluster": {"devices": 1}, "training": {"microbatches": 1},
    "stages": [{"id": 0, "replicas": 1, "devices": [0], "tasks": ["a"], "backward_s": 1}]})";
  r = run_apart("report " + dir_.string() + " -o " + (dir_ / "r.html").string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("stages[0].forward_s"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "r.html"));

  r = run_apart("report " + gpt_tiny_plan(2).string() + " -o " + (dir_ / "no" / "r.html").string());
  EXPECT_EQ(r.code, 6) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "no"));
}

class AVizCommand : public AReportCommand {};

TEST_F(AVizCommand, PrintsTheStageGraphAsDot) {
  const CommandRun r = run_apart("viz " + gpt_tiny_plan(4).string() + " --format dot", false);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("digraph \"apart_stages\""), std::string::npos);
  for (int s = 0; s < 3; ++s)
    EXPECT_NE(r.out.find("\"stage " + std::to_string(s) + "\" -> \"stage " + std::to_string(s + 1) + "\""), std::string::npos)
        << r.out;
}

TEST_F(AVizCommand, WritesDotThatGraphvizRenders) {
  if (apart::testing::run_command("command -v dot >/dev/null 2>&1").code != 0)
    GTEST_SKIP() << "Graphviz `dot` is not installed (scripts/deps.sh installs it)";
  const fs::path dot = dir_ / "stages.dot";
  ASSERT_EQ(run_apart("viz " + gpt_tiny_plan(4).string() + " --format dot -o " + dot.string()).code, 0);
  const CommandRun r = apart::testing::run_command("timeout 60 dot -Tsvg " + dot.string() + " -o " + (dir_ / "s.svg").string() + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(r.out.empty()) << "no Graphviz warnings: " << r.out;
  const std::string svg = read_text(dir_ / "s.svg");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("stage 3"), std::string::npos);
}

TEST_F(AVizCommand, PrintsStageGraphJson) {
  const fs::path plan = gpt_tiny_plan(4);
  const CommandRun r = run_apart("viz " + plan.string() + " --format json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["schema"], "apart.stagegraph/1");
  int stages = 0;
  for (const json& n : j["nodes"]) stages += n["kind"] == "stage";
  EXPECT_EQ(stages, 4);
  bool forward_edge = false;
  for (const json& e : j["edges"])
    forward_edge |= e["from"] == "stage 0" && e["to"] == "stage 1" && e["bytes"].get<double>() > 0;
  EXPECT_TRUE(forward_edge) << r.out;
  // And to a file, written atomically.
  ASSERT_EQ(run_apart("viz " + plan.string() + " --format json -o " + (dir_ / "g.json").string()).code, 0);
  EXPECT_EQ(json::parse(read_text(dir_ / "g.json")), j);
}

TEST_F(AVizCommand, RejectsAnUnknownFormat) {
  EXPECT_EQ(run_apart("viz " + gpt_tiny_plan(2).string() + " --format svg").code, 2);
  EXPECT_EQ(run_apart("viz " + dir_.string()).code, 2);
}

}  // namespace
