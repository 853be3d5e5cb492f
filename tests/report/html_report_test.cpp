// The HTML page: self-contained, escaped, every section present, baselines "not recorded" or compared, atomic write.
#include <gtest/gtest.h>

#include "graph/error.h"
#include "report/html_report.h"
#include "tests/report/report_test_util.h"

namespace {

using namespace apart::report;
using apart::testing::count_of;
namespace fs = std::filesystem;

class AnHtmlReport : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = apart::testing::fresh_temp_dir("html");
    plan_ = apart::testing::three_stage_plan();
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string render() {
    apart::testing::write_json(dir_ / "plan.json", plan_);
    const ReportPlan p = load_report_plan(dir_);
    return html_report(p, apart::sim::simulate(p.sim));
  }
  fs::path dir_;
  nlohmann::json plan_;
};

TEST_F(AnHtmlReport, NeedsNoNetwork) {
  const std::string html = render();
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(html.find("://"), std::string::npos) << "no URL of any kind";
  EXPECT_EQ(html.find("url(") , html.find("url(#ar)")) << "CSS/SVG urls only to the page's own patterns";
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("<script src"), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  EXPECT_NE(html.find("Content-Security-Policy"), std::string::npos);
}

TEST_F(AnHtmlReport, ShowsEverySection) {
  const std::string html = render();
  for (const char* id : {"id=\"summary\"", "id=\"layout\"", "id=\"layer-strip\"", "id=\"stage-table\"",
                         "id=\"timeline-svg\"", "id=\"baselines\"", "id=\"apart-data\"", "data-rendered=\"pending\""})
    EXPECT_NE(html.find(id), std::string::npos) << id;
  EXPECT_EQ(count_of(html, "class=\"stage-row\""), 3u);
  EXPECT_NE(html.find("lm_head"), std::string::npos);
  EXPECT_NE(html.find("20.00 ms"), std::string::npos) << "the predicted iteration";
  EXPECT_NE(html.find("400.0"), std::string::npos) << "samples/s";
  EXPECT_NE(html.find("12.00 ms"), std::string::npos) << "the compute lower bound";
}

TEST_F(AnHtmlReport, HeadsItsCardsWithTheSummaryLineAndTheMfu) {
  plan_["predicted"]["mfu"] = 0.534;
  plan_["predicted"]["mfu_flops"] = "6N per token";
  plan_["predicted"]["tokens_per_s"] = 158000.0;
  plan_["predicted"]["tflops_per_device"] = 166.4;
  const std::string html = render();
  const size_t line = html.find("<p id=\"sum-line\">TP ");
  ASSERT_NE(line, std::string::npos);
  EXPECT_NE(html.find(" · PP 3 · ", line), std::string::npos);
  EXPECT_NE(html.find("53.4 % MFU · 158k tokens/s · 166 TFLOP/s per GPU</p>", line), std::string::npos);
  EXPECT_NE(html.find("id=\"sum-mfu\""), std::string::npos);
  EXPECT_NE(html.find("6N per token; 166 TFLOP/s per device; 158k tokens/s"), std::string::npos);
}

TEST_F(AnHtmlReport, SaysMfuIsNotRecordedForAPlanWithoutIt) {
  EXPECT_NE(render().find("plans before it, or no FLOPs to count"), std::string::npos);
}

TEST_F(AnHtmlReport, DrawsEveryForwardAndBackwardOfTheIteration) {
  const std::string html = render();
  // 3 stages × 4 micro-batches × (F + B), each a box with its micro-batch.
  EXPECT_EQ(count_of(html, " forward, micro-batch "), 12u);
  EXPECT_EQ(count_of(html, " backward, micro-batch "), 12u);
  EXPECT_EQ(count_of(html, " forward, micro-batch 3"), 3u);
  EXPECT_GE(count_of(html, "class=\"ev xfer"), 3u * 4u * 2u) << "activations and gradients";
  EXPECT_NE(html.find("gradient all-reduce"), std::string::npos);
}

TEST_F(AnHtmlReport, SaysBaselinesAreNotRecordedWithoutBaselinesJson) {
  const std::string html = render();
  EXPECT_NE(html.find("id=\"baselines-missing\""), std::string::npos);
  EXPECT_NE(html.find("not recorded"), std::string::npos);
  EXPECT_EQ(html.find("id=\"baselines-table\""), std::string::npos);
}

TEST_F(AnHtmlReport, ComparesWithTheRecordedBaselines) {
  apart::testing::write_json(dir_ / "baselines.json",
      {{"schema", "apart.baselines/1"},
       {"methods", {{{"method", "uniform"}, {"iteration_s", 0.03}, {"samples_per_s", 266.7}, {"feasible", true},
                     {"planning_s", 0.01}, {"peak_memory_bytes", 2e9}},
                    {{"method", "pipedream"}, {"feasible", false}}}}});
  const std::string html = render();
  EXPECT_NE(html.find("id=\"baselines-table\""), std::string::npos);
  EXPECT_NE(html.find("id=\"baselines-bars\""), std::string::npos);
  EXPECT_EQ(count_of(html, "class=\"baseline-row"), 3u) << "this plan is added when the file lacks it";
  EXPECT_NE(html.find("apart (this plan)"), std::string::npos);
  EXPECT_NE(html.find("1.50×"), std::string::npos) << "uniform is 1.5 × this plan";
  EXPECT_NE(html.find("infeasible"), std::string::npos);
}

TEST_F(AnHtmlReport, EscapesNamesFromThePlan) {
  plan_["stages"][0]["tasks"][0] = "/x<script>alert(1)</script>/Gather";
  plan_["model"]["path"] = "a&b<c>.onnx";
  const std::string html = render();
  EXPECT_EQ(html.find("<script>alert"), std::string::npos);
  EXPECT_EQ(html.find("</script>/Gather"), std::string::npos) << "nor inside the JSON data block";
  EXPECT_NE(html.find("a&amp;b&lt;c&gt;.onnx"), std::string::npos);
}

TEST_F(AnHtmlReport, IsTheSameForTheSamePlan) { EXPECT_EQ(render(), render()); }

TEST_F(AnHtmlReport, DrawsOnlyComputeWhenThereAreTooManyEvents) {
  apart::testing::write_json(dir_ / "plan.json", plan_);
  const ReportPlan p = load_report_plan(dir_);
  HtmlOptions options;
  options.max_timeline_events = 10;
  const std::string html = html_report(p, apart::sim::simulate(p.sim), options);
  EXPECT_EQ(count_of(html, "class=\"ev xfer"), 0u);
  EXPECT_NE(html.find("Transfers are not drawn"), std::string::npos);
}

TEST_F(AnHtmlReport, IsWrittenAtomically) {
  apart::testing::write_json(dir_ / "plan.json", plan_);
  write_html_report(dir_, dir_ / "report.html");
  EXPECT_GT(fs::file_size(dir_ / "report.html"), 10000u);
  EXPECT_THROW(write_html_report(dir_, dir_ / "missing" / "report.html"), apart::SystemError);
  EXPECT_FALSE(fs::exists(dir_ / "missing"));
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++files;
  EXPECT_EQ(files, 2u) << "plan.json and report.html, no temporary left behind";
}

}  // namespace
