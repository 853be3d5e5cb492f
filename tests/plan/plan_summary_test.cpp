// The plan in Megatron-LM's vocabulary: MFU by hand, the layout against the stages, the summary line's ranges and
// the warnings, each on a plan that needs it and on one that does not.
#include "plan/plan_summary.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace apart {
namespace {

// Stages with these TP degrees and replicas on consecutive devices, each replica taking `per_gpu` samples of every
// micro-batch, on a cluster of `devices` (80 GB usable).
PlanDocument plan_of(const std::vector<int>& tp, const std::vector<int>& replicas, int64_t per_gpu, int64_t microbatches,
                     int devices) {
  PlanDocument plan;
  plan.cluster.devices = devices;
  plan.cluster.memory_bytes = 80'000'000'000;
  plan.training.microbatches = microbatches;
  plan.training.global_batch = microbatches * per_gpu * replicas.front();
  plan.training.microbatch_size = per_gpu * replicas.front();
  int next = 0;
  for (size_t k = 0; k < tp.size(); ++k) {
    PlanStageRecord s;
    s.id = static_cast<int>(k);
    s.tp = tp[k];
    s.replicas = replicas[k];
    s.microbatch_size = per_gpu;
    for (int d = 0; d < tp[k] * replicas[k]; ++d) s.devices.push_back(next++);
    s.memory_bytes = 40'000'000'000;
    plan.stages.push_back(s);
  }
  PlanPrediction p;
  p.bubble_fraction = 0.05;
  plan.predicted = p;
  return plan;
}

bool mentions(const std::vector<std::string>& warnings, const std::string& text) {
  for (const std::string& w : warnings)
    if (w.find(text) != std::string::npos) return true;
  return false;
}

TEST(AUtilization, CountsSixNFlopsPerTokenOverEveryDevicesPeak) {
  // GPT-3 175B at sequence 2048, 80 samples/s on 1024 A100s (312 TFLOP/s BF16 dense), by hand:
  // 80 × 2048 = 163,840 tokens/s; 6 × 175e9 × 163,840 = 1.72032e17 FLOP/s; / 1024 = 1.68e14 per GPU;
  // / 3.12e14 = 0.538461… MFU.
  const auto u = utilization({175'000'000'000, 2048, std::nullopt, 80.0, 1024, 312e12});
  ASSERT_TRUE(u);
  EXPECT_EQ(u->flops, kSixNPerToken);
  ASSERT_TRUE(u->tokens_per_s);
  EXPECT_DOUBLE_EQ(*u->tokens_per_s, 163'840.0);
  EXPECT_NEAR(u->tflops_per_device, 168.0, 1e-9);
  EXPECT_NEAR(u->mfu, 168.0 / 312.0, 1e-12);
}

TEST(AUtilization, CountsTheCostModelsFlopsForAModelWithoutTokens) {
  // A CNN: 12 GFLOP forward + backward per sample, 1000 samples/s on 8 devices of 100 TFLOP/s: 1.5 TFLOP/s each.
  const auto u = utilization({25'000'000, std::nullopt, 12e9, 1000.0, 8, 100e12});
  ASSERT_TRUE(u);
  EXPECT_EQ(u->flops, kModelFlops);
  EXPECT_FALSE(u->tokens_per_s);
  EXPECT_NEAR(u->tflops_per_device, 1.5, 1e-12);
  EXPECT_NEAR(u->mfu, 0.015, 1e-15);
}

TEST(AUtilization, IsNotSaidWithoutAPeakAThroughputOrSomethingToCount) {
  EXPECT_FALSE(utilization({175'000'000'000, 2048, std::nullopt, 80.0, 1024, 0}));
  EXPECT_FALSE(utilization({175'000'000'000, 2048, std::nullopt, 0.0, 1024, 312e12}));
  EXPECT_FALSE(utilization({175'000'000'000, std::nullopt, std::nullopt, 80.0, 1024, 312e12}));
}

TEST(ALayout, ListsEachStagesDegreesAndTheAccumulationSteps) {
  const PlanDocument plan = plan_of({8, 8, 4}, {8, 8, 16}, 1, 192, 192);
  const PlanLayout l = plan_layout(plan);
  EXPECT_EQ(l.pp, 3);
  EXPECT_EQ(l.tp, (std::vector<int>{8, 8, 4}));
  EXPECT_EQ(l.dp, (std::vector<int>{8, 8, 16}));
  EXPECT_EQ(l.micro_batch_size, (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(l.accumulation_steps, 192);
  EXPECT_FALSE(l.virtual_stages);
  const auto j = layout_json(l);
  EXPECT_EQ(j["pp"], 3);
  EXPECT_EQ(j["tp"], nlohmann::json({8, 8, 4}));
  EXPECT_EQ(j["accumulation_steps"], 192);
}

TEST(ALayout, IsWrittenIntoPlanJsonFromTheStages) {
  PlanDocument plan = plan_of({2, 2}, {4, 4}, 2, 16, 16);
  plan.predicted->mfu = 0.5;
  plan.predicted->mfu_flops = kSixNPerToken;
  const auto j = plan_to_json(plan);
  ASSERT_TRUE(j.contains("layout"));
  EXPECT_EQ(j["layout"]["dp"], nlohmann::json({4, 4}));
  EXPECT_EQ(j["layout"]["micro_batch_size"], nlohmann::json({2, 2}));
  const PlanDocument back = plan_from_json(nlohmann::json::parse(j.dump()));
  ASSERT_TRUE(back.predicted && back.predicted->mfu);
  EXPECT_DOUBLE_EQ(*back.predicted->mfu, 0.5);
  EXPECT_EQ(back.predicted->mfu_flops, kSixNPerToken);
}

TEST(ASummaryLine, SaysTheDegreesAsRangesWhereStagesDiffer) {
  PlanDocument plan = plan_of({8, 8, 4}, {8, 8, 16}, 1, 192, 192);
  plan.predicted->mfu = 0.534;
  plan.predicted->tokens_per_s = 158'000;
  plan.predicted->tflops_per_device = 166.4;
  const std::string line = plan_summary_line(plan);
  EXPECT_EQ(line, "TP 4–8 · PP 3 · DP 8–16 · micro-batch 1 per GPU · 192 accumulation steps · 1F1B · 53.4 % MFU · "
                  "158k tokens/s · 166 TFLOP/s per GPU");
}

TEST(ASummaryLine, SaysOneDegreeWhereStagesAgreeAndNamesZeroAndTheChunks) {
  PlanDocument plan = plan_of({8, 8}, {8, 8}, 2, 96, 128);
  for (PlanStageRecord& s : plan.stages) s.zero = 1;
  plan.training.schedule = Schedule::kInterleaved;
  plan.training.virtual_stages = 4;
  const std::string line = plan_summary_line(plan);
  EXPECT_EQ(line, "TP 8 · PP 2 · DP 8 · micro-batch 2 per GPU · 96 accumulation steps · interleaved 1F1B (4 chunks) · "
                  "ZeRO-1");
}

TEST(AWarning, NamesDevicesLeftIdleOnlyWhenThereAreSome) {
  PlanDocument idle = plan_of({1}, {1}, 8, 1, 1024);
  const auto warnings = plan_warnings(idle);
  EXPECT_TRUE(mentions(warnings, "1,023 of 1,024 devices left idle")) << ::testing::PrintToString(warnings);
  EXPECT_TRUE(mentions(warnings, "batch 8")) << ::testing::PrintToString(warnings);
  EXPECT_TRUE(plan_warnings(plan_of({1}, {8}, 1, 1, 8)).empty());
}

TEST(AWarning, NamesABubbleOverThirtyPercentWithFixesNotAlreadyInEffect) {
  PlanDocument plan = plan_of({1, 1, 1, 1}, {1, 1, 1, 1}, 4, 4, 4);
  plan.predicted->bubble_fraction = 0.43;
  auto warnings = plan_warnings(plan);
  EXPECT_TRUE(mentions(warnings, "bubble is 43 %")) << ::testing::PrintToString(warnings);
  EXPECT_TRUE(mentions(warnings, "--schedule interleaved"));
  EXPECT_TRUE(mentions(warnings, "smaller micro-batches"));
  plan.training.schedule = Schedule::kInterleaved;
  for (PlanStageRecord& s : plan.stages) s.microbatch_size = 1;
  warnings = plan_warnings(plan);
  EXPECT_TRUE(mentions(warnings, "bubble is 43 %"));
  EXPECT_FALSE(mentions(warnings, "--schedule interleaved")) << "already interleaved";
  EXPECT_FALSE(mentions(warnings, "smaller micro-batches")) << "already one sample per GPU";
  plan.predicted->bubble_fraction = 0.29;
  EXPECT_TRUE(plan_warnings(plan).empty()) << ::testing::PrintToString(plan_warnings(plan));
}

TEST(AWarning, NamesAStageAboveNinetyFivePercentOfUsableMemory) {
  PlanDocument plan = plan_of({1, 1}, {1, 1}, 1, 2, 2);
  plan.stages[1].memory_bytes = 77'200'000'000;  // 96.5 % of 80 GB
  const auto warnings = plan_warnings(plan);
  EXPECT_TRUE(mentions(warnings, "stage 1 fills 96.5 %")) << ::testing::PrintToString(warnings);
  EXPECT_TRUE(mentions(warnings, "--recompute on"));
  plan.stages[1].memory_bytes = 75'000'000'000;  // 93.75 %
  EXPECT_TRUE(plan_warnings(plan).empty()) << ::testing::PrintToString(plan_warnings(plan));
}

}  // namespace
}  // namespace apart
