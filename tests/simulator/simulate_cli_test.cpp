// `apart simulate` end to end: table, --json, --trace, exit codes, and plans written by `apart partition`.
#include <gtest/gtest.h>

#include "tests/support/run_apart.h"
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

using apart::testing::CommandRun;

CommandRun run(const std::string& args, bool with_stderr = true) { return apart::testing::run_apart(args, with_stderr); }

class ASimulateCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("apart_sim_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "plan");
    json plan = {{"schema", "apart.plan/1"},
                 {"cluster", {{"devices", 4}, {"device", "a100-80gb"}, {"devices_per_node", 4}}},
                 {"training", {{"microbatches", 8}, {"schedule", "1f1b"}}},
                 {"stages", json::array()}};
    for (int s = 0; s < 4; ++s)
      plan["stages"].push_back({{"id", s}, {"replicas", 1}, {"devices", {s}}, {"forward_s", 0.001},
                                {"backward_s", 0.002}, {"memory_bytes", 1000000},
                                {"inputs", json::array({{{"value", "x"}, {"from_stage", s - 1}, {"bytes", 1e6}}})},
                                {"outputs", s < 3 ? json::array({{{"value", "y"}, {"to_stages", {s + 1}}, {"bytes", 1e6}}})
                                                  : json::array()}});
    std::ofstream(dir_ / "plan" / "plan.json") << plan.dump(1);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(ASimulateCommand, PrintsTheTableWithIterationBubbleAndCriticalPath) {
  const CommandRun r = run("simulate " + (dir_ / "plan").string());
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"iteration", "bubble fraction", "critical path", "0F0", "peak memory"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST_F(ASimulateCommand, PrintsJsonAndWritesATrace) {
  const fs::path trace = dir_ / "trace.json";
  const CommandRun r = run("simulate " + (dir_ / "plan").string() + " --schedule interleaved --virtual-stages 2 --json --trace " +
                        trace.string(), false);
  ASSERT_EQ(r.code, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["schema"], "apart.simulation/1");
  EXPECT_EQ(j["schedule"], "interleaved");
  EXPECT_EQ(j["virtual_stages"], 2);
  EXPECT_EQ(j["stages"].size(), 4u);
  EXPECT_GT(j["iteration_s"].get<double>(), 0.0);
  std::ifstream in(trace);
  const json t = json::parse(in);
  EXPECT_GT(t["traceEvents"].size(), 100u);
}

TEST_F(ASimulateCommand, GivesDocumentedExitCodesForBadInput) {
  std::ofstream(dir_ / "bad.json") << R"({"schema": "apart.plan/1", "cluster": {"devices": 1}, "training": {"microbatches": 2}, "stages": [{"id": 0, "replicas": 1, "devices": [0], "backward_s": 1}]})";
  CommandRun r = run("simulate " + (dir_ / "bad.json").string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("stages[0].forward_s"), std::string::npos) << r.out;
  EXPECT_EQ(run("simulate " + (dir_ / "none").string()).code, 2);  // not a plan: InvalidArgument (plan/plan.h)
  EXPECT_EQ(run("simulate " + (dir_ / "plan").string() + " --schedule zb").code, 2);
  EXPECT_EQ(run("simulate " + (dir_ / "plan").string() + " --virtual-stages 2").code, 2);
  EXPECT_EQ(run("simulate " + (dir_ / "plan").string() + " --schedule interleaved --virtual-stages 3 --json").code, 0);
  const fs::path trace = dir_ / "missing_dir" / "t.json";
  EXPECT_EQ(run("simulate " + (dir_ / "plan").string() + " --trace " + trace.string()).code, 6);
  EXPECT_FALSE(fs::exists(trace));
}

// A plan from `apart partition`: its prediction is this simulator's replay of the chosen candidate, so
// `apart simulate` of plan.json must give the same time (up to the byte counts plan.json rounds to integers).
// Partition's analytic estimate rides along; it serialises every transfer inside its stage step
// ((m − 1)·max step + Σ steps + max exposed all-reduce) while the simulator overlaps transfers with compute, so
// the simulation is not slower. It cannot be faster than any stage's own serial work, m·(F + B) + its exposed
// all-reduce (docs/simulator.md §"Against partition's estimate").
void expect_simulation_agrees(const fs::path& dir, const fs::path& model, const std::string& flags) {
  SCOPED_TRACE(model.filename().string() + flags);
  const fs::path out = dir / "real";
  fs::remove_all(out);
  const CommandRun p = run("partition " + model.string() + flags + " --no-stage-models --no-baselines -o " + out.string());
  ASSERT_EQ(p.code, 0) << p.out;
  const CommandRun r = run("simulate " + out.string() + " --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const json j = json::parse(r.out);
  const double simulated = j["iteration_s"], predicted = j["predicted_iteration_s"];
  std::ifstream plan_file(out / "plan.json");
  const json plan = json::parse(plan_file);
  EXPECT_EQ(plan["predicted"]["source"], "simulated");
  EXPECT_NEAR(simulated, predicted, 1e-9 * predicted) << "partition's prediction is the same replay";
  const double estimate = plan["predicted"]["estimate_iteration_s"];
  const double m = plan["training"]["microbatches"].get<double>();
  double serial = 0;
  for (const auto& stage : plan["stages"])  // backward_s includes the recomputed forward
    serial = std::max(serial, m * (stage["forward_s"].get<double>() + stage["backward_s"].get<double>()) +
                                  stage["allreduce_exposed_s"].get<double>());
  EXPECT_LE(simulated, estimate * (1 + 1e-9));
  EXPECT_GE(simulated, serial * (1 - 1e-9)) << simulated << " vs " << serial;
}

// Issue 11: --virtual-stages 1000000 grew to 5.3 GB; a plan of 1e9 micro-batches (with no global batch to compare
// against) would replay for ever. Both are refused before any work, saying what they would need.
TEST_F(ASimulateCommand, RefusesWorkPastTheDocumentedLimitsBeforeStarting) {
  auto chunks = run("simulate " + (dir_ / "plan").string() + " --schedule interleaved --virtual-stages 1000000");
  EXPECT_EQ(chunks.code, 2) << chunks.out;
  EXPECT_NE(chunks.out.find("--virtual-stages"), std::string::npos) << chunks.out;
  EXPECT_NE(chunks.out.find("[0, 64]"), std::string::npos) << chunks.out;
  // The plan's stages list no tasks here; listing two per stage caps the chunks at 2 (a chunk runs at least one).
  json plan;
  std::ifstream(dir_ / "plan" / "plan.json") >> plan;
  for (auto& st : plan["stages"]) st["tasks"] = json::array({"a", "b"});
  plan["training"]["microbatches"] = 8;
  std::ofstream(dir_ / "plan" / "plan.json", std::ios::trunc) << plan.dump();
  auto few_tasks = run("simulate " + (dir_ / "plan").string() + " --schedule interleaved --virtual-stages 4");
  EXPECT_EQ(few_tasks.code, 2) << few_tasks.out;
  EXPECT_NE(few_tasks.out.find("must be an integer in [1, 2] (got 4)"), std::string::npos) << few_tasks.out;

  plan["training"]["microbatches"] = 16000000;  // under the 2^24 cap, but 2 × 16M × 4 operations to replay
  std::ofstream(dir_ / "plan" / "plan.json", std::ios::trunc) << plan.dump();
  auto huge = run("simulate " + (dir_ / "plan").string());
  EXPECT_EQ(huge.code, 5) << huge.out;
  EXPECT_NE(huge.out.find("GB of memory"), std::string::npos) << huge.out;
  EXPECT_NE(huge.out.find("fewer micro-batches"), std::string::npos) << huge.out;

  auto nan_step = run("simulate " + (dir_ / "plan").string() + " --optimizer-step-ms nan");
  EXPECT_EQ(nan_step.code, 2) << nan_step.out;
  EXPECT_NE(nan_step.out.find("--optimizer-step-ms must be a finite number"), std::string::npos) << nan_step.out;
}

TEST_F(ASimulateCommand, AgreesWithPartitionsEstimateOnARealPlan) {
  const fs::path model = fs::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx";
  ASSERT_TRUE(fs::exists(model));
  for (const std::string extra : {"", " --stages 4 --microbatches 8", " --stages 2 --microbatches 4 --schedule gpipe"})
    expect_simulation_agrees(dir_, model, " --devices 4 --device a100-80gb --batch 32" + extra);
}

TEST_F(ASimulateCommand, ReplaysAnInterleavedPlanAsPartitionPlannedIt) {
  const fs::path model = fs::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx";
  ASSERT_TRUE(fs::exists(model));
  const std::string base = " --devices 4 --device a100-80gb --batch 32";
  expect_simulation_agrees(dir_, model, base + " --stages 4 --microbatches 8 --schedule interleaved --virtual-stages 2");
  std::ifstream plan_file(dir_ / "real" / "plan.json");
  const json plan = json::parse(plan_file);
  EXPECT_EQ(plan["training"]["schedule"], "interleaved");
  EXPECT_EQ(plan["training"]["virtual_stages"], 2);
  const CommandRun r = run("simulate " + (dir_ / "real").string() + " --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["schedule"], "interleaved");
  EXPECT_EQ(j["virtual_stages"], 2);
  // Megatron-LM's constraint, and the flag's range and schedule, refused with what to do.
  const std::string tail = " --no-stage-models --no-baselines -o " + (dir_ / "refused").string();
  const CommandRun uneven = run("partition " + model.string() + base + " --stages 3 --microbatches 8 --schedule interleaved" + tail);
  EXPECT_EQ(uneven.code, 5) << uneven.out;
  EXPECT_NE(uneven.out.find("multiple of --stages"), std::string::npos) << uneven.out;
  const CommandRun one = run("partition " + model.string() + base + " --schedule interleaved --virtual-stages 1" + tail);
  EXPECT_EQ(one.code, 2) << one.out;
  EXPECT_NE(one.out.find("--virtual-stages"), std::string::npos) << one.out;
  const CommandRun without = run("partition " + model.string() + base + " --virtual-stages 2" + tail);
  EXPECT_EQ(without.code, 2) << without.out;
  EXPECT_NE(without.out.find("needs --schedule interleaved"), std::string::npos) << without.out;
}

TEST_F(ASimulateCommand, ReplaysAZbH1PlanAsPartitionPlannedItAndFasterThan1F1B) {
  const fs::path model = fs::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx";
  ASSERT_TRUE(fs::exists(model));
  expect_simulation_agrees(dir_, model, " --devices 4 --device a100-80gb --batch 32 --stages 4 --microbatches 8 --schedule zb-h1");
  std::ifstream plan_file(dir_ / "real" / "plan.json");
  const json plan = json::parse(plan_file);
  EXPECT_EQ(plan["training"]["schedule"], "zb-h1");
  for (const auto& stage : plan["stages"]) {
    ASSERT_TRUE(stage.contains("backward_weight_s"));
    EXPECT_GT(stage["backward_weight_s"].get<double>(), 0);  // every stage of gpt-tiny holds linears
    EXPECT_LT(stage["backward_weight_s"].get<double>(), stage["backward_s"].get<double>());
  }
  const CommandRun zb = run("simulate " + (dir_ / "real").string() + " --json", false);
  const CommandRun one = run("simulate " + (dir_ / "real").string() + " --schedule 1f1b --json", false);
  ASSERT_EQ(zb.code, 0) << zb.out;
  ASSERT_EQ(one.code, 0) << one.out;
  EXPECT_LT(json::parse(zb.out)["iteration_s"].get<double>(), json::parse(one.out)["iteration_s"].get<double>());
}

TEST_F(ASimulateCommand, AgreesWithPartitionsEstimateOnPipelinedPlansOfTheSharedModels) {
  bool any = false;
  for (const char* name : {"resnet50.onnx", "gpt2_small.onnx"}) {
    const fs::path model = fs::path(APART_SHARED_MODELS_DIR) / name;
    if (!fs::exists(model)) continue;
    any = true;
    expect_simulation_agrees(dir_, model, " --devices 16 --device a100-80gb --batch 256 --stages 4 --microbatches 8");
  }
  if (!any) GTEST_SKIP() << "no models in " << APART_SHARED_MODELS_DIR;
}

}  // namespace
