// Issue 11, "bounded work and memory on every input": absurd numbers in flags and files are refused before any
// work with a typed error naming the flag or field and its range; work that cannot fit is refused up front.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/support/onnx_builder.h"
#include "tests/support/run_apart.h"

namespace {

namespace fs = std::filesystem;
using apart::testing::CommandRun;
using apart::testing::OnnxBuilder;
using apart::testing::TempDir;
using json = nlohmann::json;

CommandRun run_bounded(const std::string& args) { return apart::testing::run_apart_bounded(args); }

std::string bounds_mlp(const TempDir& dir) { return apart::testing::write_tiny_mlp(dir / "m.onnx"); }

void expect_refused_with_code(const CommandRun& r, int code, const std::string& message) {
  EXPECT_EQ(r.code, code) << r.out;
  EXPECT_NE(r.out.find(message), std::string::npos) << "expected '" << message << "' in: " << r.out;
}

TEST(BoundedWork, PartitionRefusesAbsurdFlagsNamingTheFlagAndItsRange) {
  TempDir dir;
  const std::string model = bounds_mlp(dir);
  const std::string out = " -o " + (dir / "plan").string();
  const auto start = std::chrono::steady_clock::now();
  // Was > 30 s with no progress.
  expect_refused_with_code(run_bounded("partition " + model + " --batch 1099511627776" + out), 2,
                           "--batch must be an integer in [1, 16777216] (got 1099511627776)");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30);
  expect_refused_with_code(run_bounded("partition " + model + " --batch 8 --time-limit nan" + out), 2, "--time-limit");
  // Was "got -2147483648".
  expect_refused_with_code(run_bounded("partition " + model + " --batch 8 --devices 99999999999" + out), 2,
                           "--devices must be an integer in [1, 1048576] (got 99999999999)");
  expect_refused_with_code(run_bounded("partition " + model + " --batch 8 --microbatches 64" + out), 2,
                           "--microbatches");
  expect_refused_with_code(run_bounded("partition " + model + " --batch 8 --stages 99999999999" + out), 2, "--stages");
  expect_refused_with_code(run_bounded("partition " + model + " --batch 8 --dim batch=0" + out), 2, "--dim 'batch=0'");
  EXPECT_FALSE(fs::exists(dir / "plan"));
}

TEST(BoundedWork, PartitionRefusesAbsurdCostsAndClusterFilesNamingTheField) {
  TempDir dir;
  const std::string model = bounds_mlp(dir);
  const std::string out = " -o " + (dir / "plan").string();
  ASSERT_EQ(run_bounded("costs " + model + " --dim batch=1 -o " + (dir / "c.json").string()).code, 0);
  json costs;
  std::ifstream(dir / "c.json") >> costs;
  costs["tasks"][0]["forward_s"] = 1e308;
  std::ofstream(dir / "huge.json") << costs.dump();
  expect_refused_with_code(
      run_bounded("partition " + model + " --batch 8 --profile " + (dir / "huge.json").string() + out), 2,
      "forward_s must be a finite number in [0, 32000000] (got 1e+308)");
  costs["tasks"][0]["forward_s"] = 0.001;
  costs["tasks"][0]["saved_bytes"] = 1e300;  // was a negative stage memory that "fit"
  std::ofstream(dir / "saved.json") << costs.dump();
  expect_refused_with_code(
      run_bounded("partition " + model + " --batch 8 --profile " + (dir / "saved.json").string() + out), 2,
      "saved_bytes must be a finite number in [0, 1152921504606846976]");
  std::ofstream(dir / "k.json") << R"({"device": "a100-80gb", "devices": 7.5})";
  expect_refused_with_code(
      run_bounded("partition " + model + " --batch 8 --cluster " + (dir / "k.json").string() + out), 2,
      "devices must be an integer in [1, 1048576] (got 7.5)");
  std::ofstream(dir / "k.json", std::ios::trunc) << R"({"device": {"base": "a100-80gb", "kernel_overhead_s": -1}})";
  expect_refused_with_code(
      run_bounded("partition " + model + " --batch 8 --cluster " + (dir / "k.json").string() + out), 2,
      "device.kernel_overhead_s");
  EXPECT_FALSE(fs::exists(dir / "plan"));
}

json chain_plan(int stages) {
  json plan = {{"schema", "apart.plan/1"},
               {"cluster", {{"devices", stages}, {"device", "a100-80gb"}, {"devices_per_node", 8}}},
               {"training", {{"global_batch", 64}, {"microbatches", 1}, {"schedule", "1f1b"}}},
               {"stages", json::array()}};
  for (int s = 0; s < stages; ++s)
    plan["stages"].push_back({{"id", s}, {"replicas", 1}, {"devices", {s}}, {"tasks", {"t" + std::to_string(s)}},
                              {"forward_s", 0.001}, {"backward_s", 0.002}, {"memory_bytes", 1000}});
  return plan;
}

TEST(BoundedWork, ReportAndSimulateRefuseAbsurdPlansBeforeAnyWork) {
  TempDir dir;
  fs::create_directories(dir / "p");
  json plan = chain_plan(2);
  plan["stages"][0]["forward_s"] = 1e308;  // report grew ~100 MB/s; simulate printed inf/-nan, exit 0
  std::ofstream(dir / "p" / "plan.json") << plan.dump();
  expect_refused_with_code(run_bounded("report " + (dir / "p").string()), 3,
                           "stages[0].forward_s must be a finite number in [0, 32000000]");
  expect_refused_with_code(run_bounded("simulate " + (dir / "p").string()), 3, "stages[0].forward_s");
  plan = chain_plan(2);
  plan["training"]["microbatches"] = 1e9;  // reached 12.6 GB in 16 s
  std::ofstream(dir / "p" / "plan.json", std::ios::trunc) << plan.dump();
  expect_refused_with_code(run_bounded("simulate " + (dir / "p").string()), 3, "training.microbatches");
  plan["training"]["microbatches"] = 65;
  std::ofstream(dir / "p" / "plan.json", std::ios::trunc) << plan.dump();
  expect_refused_with_code(run_bounded("report " + (dir / "p").string()), 3, "more than training.global_batch 64");
  // 100k stages wrote 490 MB of HTML silently; past 1024 the report says why and writes nothing.
  std::ofstream(dir / "p" / "plan.json", std::ios::trunc) << chain_plan(1025).dump();
  expect_refused_with_code(run_bounded("report " + (dir / "p").string()), 4, "apart report draws at most 1024");
  EXPECT_FALSE(fs::exists(dir / "p" / "report.html"));
}

TEST(BoundedWork, TrainRefusesAModelThatCannotFitInMemoryUpFront) {
  TempDir dir;
  const std::string model = (dir / "gpt3.onnx").string();
  ASSERT_EQ(run_bounded("zoo gpt3-175b --weights none -q -o " + model).code, 0);
  const auto start = std::chrono::steady_clock::now();
  // Ran silently to 16.7 GB before; it needs terabytes.
  const CommandRun r = run_bounded("train " + model + " --init random --steps 1 --batch 1");
  expect_refused_with_code(r, 5, "needs about");
  EXPECT_NE(r.out.find("MemAvailable"), std::string::npos) << r.out;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 100);
}

TEST(BoundedWork, ExternalDataThatIsNotARegularFileIsRefusedWithoutOpeningIt) {
  TempDir dir;
  OnnxBuilder b;
  b.input("x", {"batch", 3}).output("y");
  b.external_weight("w", {3, 4}, "w.bin");
  b.node("MatMul", {"x", "w"}, {"y"});
  b.save(dir / "m.onnx");
  ASSERT_EQ(::mkfifo((dir / "w.bin").c_str(), 0600), 0);
  const std::string model = (dir / "m.onnx").string();
  // Accepted by inspect/partition, and `train` hung for ever reading the FIFO.
  expect_refused_with_code(run_bounded("inspect " + model + " --dim batch=2"), 3, "'w.bin' is not a regular file");
  expect_refused_with_code(run_bounded("partition " + model + " --batch 4 -o " + (dir / "plan").string()), 3,
                           "is not a regular file");
  expect_refused_with_code(run_bounded("train " + model + " --steps 1 --batch 2"), 3, "is not a regular file");
}

}  // namespace
