// Defaults that give the right first plan (issue 11): precision, memory reserve, one --batch rule, costs from
// another device, progress and rates, output that agrees with itself, stage files that reach their weights.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "tests/support/onnx_builder.h"
#include "tests/support/run_apart.h"

namespace {

namespace fs = std::filesystem;
using apart::testing::OnnxBuilder;
using apart::testing::read_file;
using apart::testing::run_apart;
using apart::testing::TempDir;

const std::string kGptTiny = (fs::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx").string();
const fs::path kResnet50 = fs::path(APART_SOURCE_DIR) / ".." / "shared" / "models" / "resnet50.onnx";

nlohmann::json plan_json(const fs::path& dir) { return nlohmann::json::parse(read_file(dir / "plan.json")); }

std::string partition(const std::string& model, const std::string& flags, const fs::path& out, int expect = 0) {
  auto r = run_apart("partition " + model + " " + flags + " --no-baselines -o " + out.string());
  EXPECT_EQ(r.code, expect) << r.out;
  return r.out;
}

// --- precision ---------------------------------------------------------------------------------------------

TEST(DefaultPrecision, IsMixedOnAGpuClusterAndPrintedInTheHeader) {
  TempDir dir;
  const std::string out = partition(kGptTiny, "--devices 2 --batch 8 --no-stage-models", dir / "p");
  EXPECT_EQ(plan_json(dir / "p")["training"]["precision"], "mixed");
  EXPECT_NE(read_file(dir / "p" / "report.txt").find("precision mixed"), std::string::npos) << out;
  EXPECT_NE(run_apart("partition --help").out.find("mixed on GPU devices, fp32 on cpu"), std::string::npos);
}

TEST(DefaultPrecision, IsFp32OnTheCpuAndForCostsOnTheCpu) {
  TempDir dir;
  partition(kGptTiny, "--devices 2 --device cpu --batch 8 --no-stage-models", dir / "p");
  EXPECT_EQ(plan_json(dir / "p")["training"]["precision"], "fp32");
  auto gpu = run_apart("costs " + kGptTiny, /*with_stderr=*/false);
  ASSERT_EQ(gpu.code, 0) << gpu.out;
  EXPECT_EQ(nlohmann::json::parse(gpu.out)["precision"], "mixed");
}

// --- memory reserve ----------------------------------------------------------------------------------------

TEST(MemoryReserve, IsKeptByDefaultAndWrittenIntoPlanJson) {
  TempDir dir;
  partition(kGptTiny, "--devices 2 --batch 8 --no-stage-models", dir / "p");
  const auto cluster = plan_json(dir / "p")["cluster"];
  const int64_t device = int64_t{80} << 30;
  EXPECT_EQ(cluster["device_memory_bytes"], device);
  EXPECT_EQ(cluster["memory_reserve"], "2GiB+5%");
  EXPECT_EQ(cluster["memory_reserve_bytes"].get<int64_t>(), (int64_t{2} << 30) + (int64_t{4} << 30));
  EXPECT_EQ(cluster["memory_bytes"].get<int64_t>(), device - cluster["memory_reserve_bytes"].get<int64_t>());
  const std::string report = read_file(dir / "p" / "report.txt");
  EXPECT_NE(report.find("80.00 GiB each"), std::string::npos) << report;
  EXPECT_EQ(report.find(" 86 "), std::string::npos) << report;
}

TEST(MemoryReserve, CanBeChangedAndIsRangeChecked) {
  TempDir dir;
  partition(kGptTiny, "--devices 2 --batch 8 --no-stage-models --memory-reserve 0", dir / "zero");
  EXPECT_EQ(plan_json(dir / "zero")["cluster"]["memory_bytes"].get<int64_t>(), int64_t{80} << 30);
  partition(kGptTiny, "--devices 2 --batch 8 --no-stage-models --memory-reserve 10%", dir / "ten");
  EXPECT_EQ(plan_json(dir / "ten")["cluster"]["memory_reserve_bytes"].get<int64_t>(), (int64_t{8} << 30));
  for (const char* bad : {"80GiB", "100%", "lots", "-1GiB"}) {
    const std::string out = partition(kGptTiny, std::string("--devices 2 --batch 8 --memory-reserve ") + bad, dir / "bad", 2);
    EXPECT_NE(out.find("--memory-reserve"), std::string::npos) << out;
  }
  EXPECT_FALSE(fs::exists(dir / "bad"));
}

// --- one batch rule ----------------------------------------------------------------------------------------

TEST(TheBatchFlag, LetsInspectCostsAndProfileReadBundledModelsWithoutDim) {
  std::vector<std::string> models = {kGptTiny};
  if (fs::exists(kResnet50)) models.push_back(kResnet50.string());
  for (const std::string& m : models) {
    auto inspect = run_apart("inspect " + m + " --json", /*with_stderr=*/false);
    ASSERT_EQ(inspect.code, 0) << m << inspect.out;
    EXPECT_EQ(nlohmann::json::parse(inspect.out)["batch"], 1) << m;
    EXPECT_EQ(nlohmann::json::parse(run_apart("inspect " + m + " --batch 3 --json", false).out)["batch"], 3) << m;
    auto costs = run_apart("costs " + m + " --batch 2", /*with_stderr=*/false);
    ASSERT_EQ(costs.code, 0) << m << costs.out;
    EXPECT_EQ(nlohmann::json::parse(costs.out)["microbatch_size"], 2) << m;
  }
  auto profile = run_apart("profile " + kGptTiny + " --warmup 0 --repeats 1 -q", /*with_stderr=*/false);
  ASSERT_EQ(profile.code, 0) << profile.out;
  EXPECT_EQ(nlohmann::json::parse(profile.out)["microbatch_size"], 1);
}

TEST(TheBatchFlag, ConflictingWithDimIsAnError) {
  auto r = run_apart("inspect " + kGptTiny + " --batch 4 --dim batch=8");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--batch 4 and --dim batch=8 disagree"), std::string::npos) << r.out;
  EXPECT_EQ(run_apart("inspect " + kGptTiny + " --dim batch=8 --json", false).code, 0);
}

TEST(PartitionImport, BindsTheBatchEvenWithAnUnrelatedDim) {
  TempDir dir;
  OnnxBuilder b;
  b.input("x", {"batch", "seq", 3}).output("y");
  b.weight("w", {3, 4});
  b.node("MatMul", {"x", "w"}, {"h"});
  b.node("Relu", {"h"}, {"y"});
  b.save(dir / "m.onnx");
  partition((dir / "m.onnx").string(), "--devices 1 --batch 4 --dim seq=5", dir / "p");
  EXPECT_TRUE(fs::exists(dir / "p" / "plan.json"));
}

// --- costs from another device -----------------------------------------------------------------------------

TEST(PartitionProfile, RefusesCostsMeasuredOnAnotherDeviceUnlessToldOk) {
  TempDir dir;
  const fs::path costs = dir / "costs.json";
  ASSERT_EQ(run_apart("costs " + kGptTiny + " --device v100-32gb -o " + costs.string()).code, 0);
  const std::string flags = "--devices 2 --device a100-80gb --batch 8 --no-stage-models --profile " + costs.string();
  const std::string out = partition(kGptTiny, flags, dir / "p", 2);
  EXPECT_NE(out.find("'v100-32gb'"), std::string::npos) << out;
  EXPECT_NE(out.find("'a100-80gb'"), std::string::npos) << out;
  EXPECT_NE(out.find("--profile-device-mismatch ok"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "p"));
  // A file claiming a device nobody has.
  auto j = nlohmann::json::parse(read_file(costs));
  j["device"] = "tpu-v9";
  std::ofstream(dir / "tpu.json") << j.dump();
  EXPECT_NE(partition(kGptTiny, "--devices 2 --batch 8 --profile " + (dir / "tpu.json").string(), dir / "p", 2).find("tpu-v9"),
            std::string::npos);
  const std::string ok = partition(kGptTiny, flags + " --profile-device-mismatch ok", dir / "p");
  EXPECT_NE(ok.find("warning"), std::string::npos) << ok;
}

// --- progress ----------------------------------------------------------------------------------------------

TEST(ApartProfile, WarnsAboutAMissingLossBeforeTheRunsAndShowsProgress) {
  TempDir dir;
  OnnxBuilder b;
  b.input("x", {"batch", 3}).output("y");
  b.weight("w", {3, 4});
  b.node("MatMul", {"x", "w"}, {"y"});
  b.save(dir / "m.onnx");
  auto r = run_apart("profile " + (dir / "m.onnx").string() + " --warmup 1 --repeats 1 -q -o " + (dir / "p.json").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const size_t warning = r.out.find("warning: backward_s not measured");
  const size_t first_run = r.out.find("apart profile: run 1 of 1 (warmup)");
  ASSERT_NE(warning, std::string::npos) << r.out;
  ASSERT_NE(first_run, std::string::npos) << r.out;
  EXPECT_LT(warning, first_run) << r.out;
}

// --- output that agrees with itself ------------------------------------------------------------------------

TEST(PlanOutputs, DotHasRealLineBreaksAndLabelsTimesPerMicroBatch) {
  TempDir dir;
  partition(kGptTiny, "--devices 2 --batch 8 --stages 2 --no-stage-models", dir / "p");
  const std::string dot = read_file(dir / "p" / "plan.dot");
  EXPECT_EQ(dot.find("\\\\n"), std::string::npos) << dot;  // no literal backslash-n
  EXPECT_NE(dot.find("\\n"), std::string::npos) << dot;
  EXPECT_NE(dot.find("per micro-batch"), std::string::npos) << dot;
  EXPECT_EQ(dot.find("ms/step"), std::string::npos) << dot;
}

TEST(PlanOutputs, CountTasksTheSameWayInReportAndViz) {
  TempDir dir;
  partition(kGptTiny, "--devices 2 --batch 8 --stages 2 --no-stage-models", dir / "p");
  const std::string report = read_file(dir / "p" / "report.txt");
  EXPECT_NE(report.find("145 tasks ("), std::string::npos) << report;
  EXPECT_NE(report.find(" batch, "), std::string::npos) << report;
  auto viz = run_apart("viz " + (dir / "p").string(), false);
  ASSERT_EQ(viz.code, 0) << viz.out;
  EXPECT_NE(viz.out.find(" batch, "), std::string::npos) << viz.out;
  EXPECT_NE(viz.out.find(" constant)"), std::string::npos) << viz.out;
}

TEST(PlanOutputs, SimulateCallsPartitionsPredictionSimulated) {
  TempDir dir;
  partition(kGptTiny, "--devices 2 --batch 8 --no-stage-models", dir / "p");
  auto r = run_apart("simulate " + (dir / "p").string(), false);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("analytic estimate"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("partition's simulated prediction"), std::string::npos) << r.out;
}

// --- stage files with external data ------------------------------------------------------------------------

TEST(StageFiles, ReachTheModelsExternalWeights) {
  TempDir dir;
  const fs::path model_dir = dir / "model";
  fs::create_directories(model_dir);
  OnnxBuilder b;
  b.input("x", {"batch", 4}).output("y");
  b.external_weight("w1", {4, 4}, "m.weights", 0);
  b.external_weight("w2", {4, 4}, "m.weights", 64);
  b.node("MatMul", {"x", "w1"}, {"h"}, "mm1");
  b.node("Relu", {"h"}, {"r"}, "relu");
  b.node("MatMul", {"r", "w2"}, {"y"}, "mm2");
  b.save(model_dir / "m.onnx");
  {
    std::ofstream w(model_dir / "m.weights", std::ios::binary);
    std::vector<float> values(32, 0.5f);
    w.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(float)));
  }
  const fs::path plan = dir / "plan";
  partition((model_dir / "m.onnx").string(), "--devices 2 --batch 4 --stages 2 --device cpu", plan);
  ASSERT_TRUE(fs::exists(plan / "stage_0.onnx"));
  EXPECT_TRUE(fs::is_regular_file(plan / "weights" / "m.weights"));
  // The runtime reads the stage's weights: train needs them (--init model) and refuses missing ones.
  for (const char* stage : {"stage_0.onnx", "stage_1.onnx"}) {
    auto r = run_apart("profile " + (plan / stage).string() + " --warmup 0 --repeats 1 -q", false);
    EXPECT_EQ(r.code, 0) << stage << r.out;
  }
  // The plan folder with its weights/ links is apart's own: partition replaces it again without --force, and
  // the model's weights survive the old links being removed.
  partition((model_dir / "m.onnx").string(), "--devices 2 --batch 4 --stages 2 --device cpu", plan);
  EXPECT_TRUE(fs::is_regular_file(plan / "weights" / "m.weights"));
  EXPECT_EQ(fs::file_size(model_dir / "m.weights"), 32 * sizeof(float));
}

}  // namespace
