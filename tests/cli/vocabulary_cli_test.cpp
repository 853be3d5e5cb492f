// `apart partition` in its users' vocabulary: the summary line, MFU by hand for GPT-3 175B on 1024 A100s, plan.json's
// layout against its stages, identical stages as one terminal row, --micro-batch-size, and the warnings.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/onnx_builder.h"
#include "tests/support/run_apart.h"
#include "tests/support/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using apart::testing::read_file;
using apart::testing::run_apart;
using apart::testing::TempDir;
using json = nlohmann::json;

const std::string kGptTiny = std::string(APART_SOURCE_DIR) + "/models/gpt-tiny.onnx";

// The table's rows: the lines after its header up to the blank line.
int table_rows(const std::string& text) {
  const size_t table = text.find("stage  tasks");
  if (table == std::string::npos) return -1;
  const size_t end = text.find("\n\n", table);
  int rows = 0;
  for (size_t at = text.find('\n', table); at < end; at = text.find('\n', at + 1)) ++rows;
  return rows;
}

// GPT-3 175B (apart zoo) on 1024 A100-80GB, batch 1536, the default command: planned once for the suite.
class AGpt3Plan : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    const std::string model = (*dir_ / "gpt3.onnx").string();
    ASSERT_EQ(run_apart("zoo gpt3-175b -q -o " + model).code, 0);
    const auto r = run_apart("partition " + model + " --devices 1024 --device a100-80gb --batch 1536 --no-stage-models "
                             "--no-baselines -q -o " + (*dir_ / "plan").string());
    ASSERT_EQ(r.code, 0) << r.out;
    printed_ = r.out;
    plan_ = json::parse(read_file(*dir_ / "plan" / "plan.json"));
    report_ = read_file(*dir_ / "plan" / "report.txt");
  }
  static void TearDownTestSuite() { delete dir_; }
  static TempDir* dir_;
  static std::string printed_, report_;
  static json plan_;
};
TempDir* AGpt3Plan::dir_ = nullptr;
std::string AGpt3Plan::printed_, AGpt3Plan::report_;
json AGpt3Plan::plan_;

TEST_F(AGpt3Plan, PredictsTheMfuAHandCalculationOfSixNTokensOverPeakGives) {
  ASSERT_TRUE(plan_.contains("predicted")) << printed_;
  const json& p = plan_["predicted"];
  // The zoo's GPT-3 reads sequences of 2,048 tokens; N is every parameter (embeddings too, as Megatron-LM counts).
  EXPECT_EQ(plan_["model"]["tokens_per_sample"], 2048);
  const double n = plan_["model"]["params"].get<double>();
  EXPECT_NEAR(n, 174.6e9, 0.1e9);
  const double samples_per_s = p["samples_per_s"].get<double>();
  EXPECT_NEAR(samples_per_s, 1536 / p["iteration_s"].get<double>(), 1e-9 * samples_per_s);
  // By hand: 6 N FLOPs per token, 2,048 tokens a sample, over 1,024 GPUs at the A100's 312 TFLOP/s (dense BF16:
  // --precision auto is mixed on a GPU).
  const double tokens_per_s = samples_per_s * 2048;
  const double mfu = 6 * n * tokens_per_s / (1024 * 312e12);
  EXPECT_EQ(p["mfu_flops"], "6N per token");
  EXPECT_NEAR(p["tokens_per_s"].get<double>(), tokens_per_s, 1e-9 * tokens_per_s);
  EXPECT_NEAR(p["mfu"].get<double>(), mfu, 1e-9);
  EXPECT_NEAR(p["tflops_per_device"].get<double>(), mfu * 312, 1e-6);
  EXPECT_GT(mfu, 0.1);
  EXPECT_LT(mfu, 0.7);
}

TEST_F(AGpt3Plan, WritesALayoutThatMatchesItsStages) {
  const json& layout = plan_["layout"];
  const json& stages = plan_["stages"];
  ASSERT_EQ(layout["pp"], stages.size());
  EXPECT_EQ(layout["accumulation_steps"], plan_["training"]["microbatches"]);
  for (size_t k = 0; k < stages.size(); ++k) {
    EXPECT_EQ(layout["tp"][k], stages[k].value("tp", 1)) << k;
    EXPECT_EQ(layout["dp"][k], stages[k]["replicas"]) << k;
    EXPECT_EQ(layout["micro_batch_size"][k], stages[k]["microbatch_size"]) << k;
    EXPECT_EQ(layout["dp"][k].get<int>() * layout["tp"][k].get<int>(), static_cast<int>(stages[k]["devices"].size()));
  }
}

TEST_F(AGpt3Plan, PrintsTheSummaryLineOnTheTerminalAndInReportTxt) {
  const std::string pp = "PP " + std::to_string(plan_["stages"].size()) + " · ";
  for (const std::string* text : {&printed_, &report_}) {
    EXPECT_NE(text->find("TP 1 · " + pp), std::string::npos) << *text;
    EXPECT_NE(text->find("accumulation steps · 1F1B"), std::string::npos) << *text;
    EXPECT_NE(text->find("% MFU · "), std::string::npos) << *text;
    EXPECT_NE(text->find("tokens/s · "), std::string::npos) << *text;
    EXPECT_NE(text->find(" TFLOP/s per GPU\n"), std::string::npos) << *text;
  }
}

TEST_F(AGpt3Plan, CollapsesIdenticalConsecutiveStagesIntoOneTerminalRow) {
  // Megatron-LM's layout of GPT-3 pinned: 16 stages of 6 layers, the first with the embedding, the last with the head.
  const auto r = run_apart("partition " + (*dir_ / "gpt3.onnx").string() + " --devices 1024 --batch 1536 --tp 8 "
                           "--stages 16 --no-stage-models --no-baselines -q -o " + (*dir_ / "pinned").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("TP 8 · PP 16 · DP 8 · micro-batch 1 per GPU · 192 accumulation steps · 1F1B · "),
            std::string::npos) << r.out;
  const std::string report = read_file(*dir_ / "pinned" / "report.txt");
  // report.txt keeps a row per stage; the terminal shows each run of identical ones once, as "first–last", with
  // their memory (which 1F1B's in-flight micro-batches make differ) as a range and their devices as one.
  EXPECT_EQ(table_rows(report), 16) << report;
  const int rows = table_rows(r.out);
  EXPECT_GT(rows, 0) << r.out;
  EXPECT_LE(rows, 6) << r.out;
  EXPECT_NE(r.out.find(" 1–13  367 tasks (282 batch, 85 constant)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" 8 64-895  TP-8\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("← bottleneck"), std::string::npos) << r.out;
}

TEST(ASimulation, SaysThePlanItReplaysInTheSummaryLine) {
  TempDir dir;
  ASSERT_EQ(run_apart("partition " + kGptTiny + " --devices 4 --devices-per-node 4 --batch 32 --stages 2 --dp 2 "
                      "--no-stage-models -q -o " + (dir / "p").string()).code, 0);
  const auto r = run_apart("simulate " + (dir / "p").string(), /*with_stderr=*/false);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.rfind("plan: TP 1 · PP 2 · DP 2 · micro-batch ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("\napart simulate: "), std::string::npos) << r.out;
}

TEST_F(AGpt3Plan, IsRefusedOnTooFewDevicesNamingTheMemoryBoundAndNoOptionThatCannotHelp) {
  // By hand: 174.6 B parameters × 16 bytes (mixed-precision Adam: bf16 weights and gradients, fp32 master weights
  // and two moments) = 2.79 TB, over 74 GiB (79.5 GB) usable per device = 35.2: at least 36 devices, whatever ZeRO,
  // TP or recomputation (which default to what would help or cannot shrink it) do.
  const auto r = run_apart("partition " + (*dir_ / "gpt3.onnx").string() + " --devices 2 --batch 8 -q -o " +
                           (*dir_ / "two").string());
  EXPECT_EQ(r.code, 5) << r.out;
  EXPECT_NE(r.out.find("it needs ≥ 36 devices of 79 GB\n"), std::string::npos) << r.out;
  for (const char* not_a_fix : {"--recompute", "--microbatches", "--zero", "--tp", "--precision"})
    EXPECT_EQ(r.out.find(not_a_fix), std::string::npos) << not_a_fix << ": " << r.out;
}

json plan_without_timing(const fs::path& dir) {
  json j = json::parse(read_file(dir / "plan.json"));
  j["search"].erase("seconds");
  return j;
}

TEST(AMicroBatchSize, GivesTheSamePlanAsTheEquivalentMicrobatchCount) {
  TempDir dir;
  const std::string flags = "partition " + kGptTiny + " --devices 4 --batch 32 --dp 2 --no-stage-models -q -o ";
  // batch 32 over 2 replicas is 16 samples each; 4 per GPU per micro-batch is 4 micro-batches.
  const auto by_size = run_apart(flags + (dir / "size").string() + " --micro-batch-size 4");
  const auto by_count = run_apart(flags + (dir / "count").string() + " --microbatches 4");
  ASSERT_EQ(by_size.code, 0) << by_size.out;
  ASSERT_EQ(by_count.code, 0) << by_count.out;
  const json a = plan_without_timing(dir / "size");
  EXPECT_EQ(a, plan_without_timing(dir / "count"));
  EXPECT_EQ(a["training"]["microbatches"], 4);
  for (const json& u : a["layout"]["micro_batch_size"]) EXPECT_EQ(u, 4);
}

TEST(AMicroBatchSize, IsRefusedWhereItDoesNotDivideTheReplicasBatchOrMeetsMicrobatches) {
  TempDir dir;
  const std::string flags = "partition " + kGptTiny + " --devices 4 --batch 32 --no-stage-models -q -o " +
                            (dir / "p").string();
  auto r = run_apart(flags + " --dp 2 --micro-batch-size 3");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--micro-batch-size 3 does not divide the per-replica batch 16"), std::string::npos) << r.out;
  r = run_apart(flags + " --dp 2 --micro-batch-size 4 --microbatches 8");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("give one"), std::string::npos) << r.out;
  r = run_apart(flags + " --micro-batch-size 4");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("needs --dp N"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "p"));
}

TEST(APartitionWarning, NamesIdleDevicesWhenTheBatchCannotFeedThem) {
  TempDir dir;
  const auto r = run_apart("partition " + kGptTiny + " --devices 64 --batch 2 --no-stage-models -o " +
                           (dir / "p").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("apart: warning: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" of 64 devices left idle"), std::string::npos) << r.out;
  EXPECT_NE(read_file(dir / "p" / "report.txt").find("devices left idle"), std::string::npos);
}

TEST(APartitionWarning, NamesABubbleOverThirtyPercentAndNothingOnAPlanWithoutOne) {
  TempDir dir;
  const std::string flags = "partition " + kGptTiny + " --devices 4 --devices-per-node 4 --no-stage-models -o ";
  const auto deep = run_apart(flags + (dir / "deep").string() + " --batch 4 --stages 4 --microbatches 1");
  ASSERT_EQ(deep.code, 0) << deep.out;
  EXPECT_NE(deep.out.find("pipeline bubble is"), std::string::npos) << deep.out;
  const auto flat = run_apart(flags + (dir / "flat").string() + " --batch 32 --stages 1 --dp 4");
  ASSERT_EQ(flat.code, 0) << flat.out;
  EXPECT_EQ(flat.out.find("warning"), std::string::npos) << flat.out;
}

}  // namespace
