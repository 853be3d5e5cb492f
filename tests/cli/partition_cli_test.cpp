// `apart partition` from the command line: goldens for report.txt and plan.dot, determinism, exit codes,
// and no half-written plan directory.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/support/onnx_builder.h"
#include "tests/support/printed_numbers.h"
#include "tests/support/run_apart.h"

namespace {

namespace fs = std::filesystem;
using apart::testing::run_apart;
using apart::testing::TempDir;
using apart::testing::read_file;

const fs::path kGoldenDir = fs::path(APART_TEST_DATA_DIR) / "golden" / "gpt_tiny_4dev_2stage";

// Drops the lines that carry wall-clock time (the search line of report.txt).
std::string without_timing(const std::string& text) {
  std::istringstream in(text);
  std::string line, out;
  while (std::getline(in, line))
    if (line.rfind("search ", 0) != 0) out += line + "\n";
  return out;
}

// Runs from the source tree with a relative model path, so the report (which names the model) is the
// same in every checkout.
std::string plan_gpt_tiny(const fs::path& out) {
  auto r = apart::testing::run_command("cd " + std::string(APART_SOURCE_DIR) + " && " + APART_BINARY +
                                       " partition models/gpt-tiny.onnx --devices 4 --device a100-80gb --devices-per-node 4"
                                       " --batch 32 --stages 2 --no-stage-models -o " + out.string() + " 2>&1");
  EXPECT_EQ(r.code, 0) << r.out;
  return r.out;
}

// Goldens: a reviewer reads what changed in the plan of a tiny model. Regenerate after an intended
// change with APART_UPDATE_GOLDENS=1 and read the diff.
TEST(ApartPartition, WritesTheGoldenReportAndDotForGptTiny) {
  TempDir dir;
  plan_gpt_tiny(dir / "plan");
  for (const char* file : {"report.txt", "plan.dot"}) {
    const std::string actual = without_timing(read_file(dir / "plan" / file));
    if (std::getenv("APART_UPDATE_GOLDENS")) {
      fs::create_directories(kGoldenDir);
      std::ofstream(kGoldenDir / file, std::ios::binary) << actual;
      continue;
    }
    ASSERT_TRUE(fs::exists(kGoldenDir / file)) << "missing golden " << (kGoldenDir / file);
    // Figures to 1e-9 relative (libm's last bit may differ by CPU), the rest byte for byte.
    EXPECT_EQ(apart::testing::first_difference_beyond(actual, read_file(kGoldenDir / file), 1e-9), "")
        << file << " differs from its golden; if intended, rerun with APART_UPDATE_GOLDENS=1";
  }
}

TEST(ApartPartition, PrintsTheReportItWrites) {
  TempDir dir;
  const std::string printed = plan_gpt_tiny(dir / "plan");
  const std::string report = read_file(dir / "plan" / "report.txt");
  const std::string first_line = report.substr(0, report.find('\n'));
  EXPECT_NE(printed.find(first_line), std::string::npos) << printed;
}

TEST(ApartPartition, WritesTheSamePlanJsonTwiceApartFromSearchTime) {
  TempDir dir;
  plan_gpt_tiny(dir / "a");
  plan_gpt_tiny(dir / "b");
  auto a = nlohmann::json::parse(read_file(dir / "a" / "plan.json"));
  auto b = nlohmann::json::parse(read_file(dir / "b" / "plan.json"));
  a["search"].erase("seconds");
  b["search"].erase("seconds");
  EXPECT_EQ(a, b);
  EXPECT_EQ(a["schema"], "apart.plan/1");
  EXPECT_EQ(a["stages"].size(), 2u);
}

TEST(ApartPartition, WritesTheSamePlanOnOneThreadAndOnTwoAndChecksTheThreadCount) {
  TempDir dir;
  const std::string model = (fs::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx").string();
  const std::string flags = " --devices 8 --devices-per-node 4 --batch 64 --no-stage-models -q";
  auto one = run_apart("partition " + model + flags + " --threads 1 -o " + (dir / "one").string());
  auto two = run_apart("partition " + model + flags + " --threads 2 -o " + (dir / "two").string());
  ASSERT_EQ(one.code, 0) << one.out;
  ASSERT_EQ(two.code, 0) << two.out;
  auto a = nlohmann::json::parse(read_file(dir / "one" / "plan.json"));
  auto b = nlohmann::json::parse(read_file(dir / "two" / "plan.json"));
  a["search"].erase("seconds");
  b["search"].erase("seconds");
  EXPECT_EQ(a, b);
  auto bad = run_apart("partition " + model + " --devices 4 --batch 32 --threads 5000 -o " + (dir / "p").string());
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--threads"), std::string::npos) << bad.out;
}

TEST(ApartPartition, PricesMaterializedAttentionWhenAskedAndSaysSoInThePlan) {
  TempDir dir;
  const std::string model = (fs::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx").string();
  const std::string flags = " --devices 4 --device a100-80gb --batch 32 --stages 1 --no-stage-models --no-baselines -q";
  auto flash = run_apart("partition " + model + flags + " -o " + (dir / "flash").string());
  auto kept = run_apart("partition " + model + flags + " --attention materialized -o " + (dir / "kept").string());
  ASSERT_EQ(flash.code, 0) << flash.out;
  ASSERT_EQ(kept.code, 0) << kept.out;
  const auto f = nlohmann::json::parse(read_file(dir / "flash" / "plan.json"));
  const auto k = nlohmann::json::parse(read_file(dir / "kept" / "plan.json"));
  EXPECT_FALSE(f["training"].contains("attention"));
  EXPECT_EQ(k["training"]["attention"], "materialized");
  // The scores and probabilities cost time and memory the flash kernel does not spend.
  EXPECT_GT(k["predicted"]["iteration_s"].get<double>(), f["predicted"]["iteration_s"].get<double>());
  EXPECT_GT(k["stages"][0]["memory_bytes"].get<double>(), f["stages"][0]["memory_bytes"].get<double>());
  EXPECT_NE(read_file(dir / "kept" / "report.txt").find("attention materialized"), std::string::npos);
  auto bad = run_apart("partition " + model + flags + " --attention fused -o " + (dir / "bad").string());
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--attention fused: expected flash or materialized"), std::string::npos) << bad.out;
  EXPECT_FALSE(fs::exists(dir / "bad"));
}

TEST(ApartPartition, ExitsInfeasibleWithAHintAndWritesNothingWhenTheModelCannotFit) {
  TempDir dir;
  const std::string model = (dir / "gpt3.onnx").string();
  ASSERT_EQ(run_apart("zoo gpt3-175b -q -o " + model).code, 0);
  auto r = run_apart("partition " + model + " --devices 2 --device a100-80gb --batch 8 -o " + (dir / "plan").string());
  EXPECT_EQ(r.code, 5) << r.out;
  EXPECT_NE(r.out.find("Infeasible"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("needs"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "plan"));
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find("plan"), std::string::npos) << "left behind: " << e.path();
}

// A 2.8B-parameter GPT on 8 × A100-40GB, mixed-precision Adam: 16 B/param is 45 GB of state, more than a device
// holds, so plain data parallelism cannot run it and --zero 0 must pipeline; --zero auto may shard instead.
TEST(ApartPartition, FindsAFasterPlanWithZeroAutoWhereDataParallelismDoesNotFit) {
  TempDir dir;
  const std::string model = (dir / "gpt.onnx").string();
  ASSERT_EQ(run_apart("zoo gpt --layers 8 --hidden 5120 --heads 40 --seq 1024 --vocab 50257 -q -o " + model).code, 0);
  const std::string flags = " --devices 8 --device a100-40gb --batch 64 --no-stage-models -q";
  auto data_parallel = run_apart("partition " + model + flags + " --zero 0 --stages 1 -o " + (dir / "dp").string());
  EXPECT_EQ(data_parallel.code, 5) << data_parallel.out;
  auto plain = run_apart("partition " + model + flags + " --zero 0 -o " + (dir / "z0").string());
  auto sharded = run_apart("partition " + model + flags + " --zero auto -o " + (dir / "auto").string());
  ASSERT_EQ(plain.code, 0) << plain.out;
  ASSERT_EQ(sharded.code, 0) << sharded.out;
  const auto z0 = nlohmann::json::parse(read_file(dir / "z0" / "plan.json"));
  const auto za = nlohmann::json::parse(read_file(dir / "auto" / "plan.json"));
  EXPECT_GT(z0["stages"].size(), 1u) << "without ZeRO the model must be pipelined to fit";
  for (const auto& st : z0["stages"]) EXPECT_FALSE(st.contains("zero"));
  int sharding = 0;
  for (const auto& st : za["stages"])
    if (st.value("zero", 0) > 0) {
      ++sharding;
      EXPECT_GT(st["replicas"].get<int>(), 1);
    }
  EXPECT_GT(sharding, 0) << za.dump(1);
  EXPECT_EQ(za["options"]["zero"], "auto");
  const double t0 = z0["predicted"]["iteration_s"], ta = za["predicted"]["iteration_s"];
  EXPECT_LT(ta, t0) << "--zero auto " << ta << " s vs --zero 0 " << t0 << " s";
  EXPECT_NE(read_file(dir / "auto" / "report.txt").find("ZeRO-"), std::string::npos);
  // The plan it wrote simulates as it predicted: the simulator reads stages[].zero and the costs carry it.
  auto simulated = run_apart("simulate " + (dir / "auto").string());
  EXPECT_EQ(simulated.code, 0) << simulated.out;
}

// A 2.8B-parameter GPT on 8 × A100-40GB (one node): its state does not fit one device, so without tensor
// parallelism it must pipeline; --tp auto may split stages across devices of the node instead, and --tp 8 --pp 1
// --dp 1 pins Megatron's configuration.
TEST(ApartPartition, SplitsStagesTensorParallelUnderTpAutoAndPinsTpPpDp) {
  TempDir dir;
  const std::string model = (dir / "gpt.onnx").string();
  ASSERT_EQ(run_apart("zoo gpt --layers 8 --hidden 5120 --heads 40 --seq 1024 --vocab 50257 -q -o " + model).code, 0);
  const std::string flags = " --devices 8 --device a100-40gb --batch 64 --precision mixed --no-stage-models -q";
  auto plain = run_apart("partition " + model + flags + " -o " + (dir / "tp1").string());
  auto searched = run_apart("partition " + model + flags + " --tp auto -o " + (dir / "auto").string());
  auto pinned = run_apart("partition " + model + flags + " --tp 8 --pp 1 --dp 1 -o " + (dir / "pinned").string());
  ASSERT_EQ(plain.code, 0) << plain.out;
  ASSERT_EQ(searched.code, 0) << searched.out;
  ASSERT_EQ(pinned.code, 0) << pinned.out;
  const auto p1 = nlohmann::json::parse(read_file(dir / "tp1" / "plan.json"));
  const auto pa = nlohmann::json::parse(read_file(dir / "auto" / "plan.json"));
  const auto pp = nlohmann::json::parse(read_file(dir / "pinned" / "plan.json"));
  for (const auto& st : p1["stages"]) EXPECT_FALSE(st.contains("tp"));
  int split = 0;
  for (const auto& st : pa["stages"]) {
    const int tp = st.value("tp", 1);
    split += tp > 1;
    EXPECT_EQ(st["devices"].size(), static_cast<size_t>(st["replicas"].get<int>() * tp));
  }
  EXPECT_GT(split, 0) << pa.dump(1);
  EXPECT_EQ(pa["options"]["tp"], "auto");
  const double t1 = p1["predicted"]["iteration_s"], ta = pa["predicted"]["iteration_s"];
  EXPECT_LT(ta, t1) << "--tp auto " << ta << " s vs --tp 1 " << t1 << " s";
  ASSERT_EQ(pp["stages"].size(), 1u);
  EXPECT_EQ(pp["stages"][0]["tp"], 8);
  EXPECT_EQ(pp["stages"][0]["replicas"], 1);
  EXPECT_EQ(pp["stages"][0]["devices"], nlohmann::json::array({0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_NE(read_file(dir / "pinned" / "report.txt").find("TP-8"), std::string::npos);
  EXPECT_LE(ta, pp["predicted"]["iteration_s"].get<double>() * (1 + 1e-9)) << "the search never loses to a pin";
  // The simulator reads the plan; the runtime (which executes its sequence-parallel TP 8 stage) refuses it because
  // --no-stage-models wrote no stage files, saying so.
  EXPECT_EQ(run_apart("simulate " + (dir / "auto").string()).code, 0);
  EXPECT_TRUE(pp["stages"][0].value("sequence_parallel", false));
  auto run = run_apart("run " + (dir / "pinned").string() + " --in-process --steps 1");
  EXPECT_EQ(run.code, 2) << run.out;
  EXPECT_NE(run.out.find("has no stage_0.onnx"), std::string::npos) << run.out;
}

TEST(ApartPartition, ChoosesAmong1F1BZbH1AndInterleavedUnderScheduleAutoAndDefaultsTo1F1B) {
  TempDir dir;
  const std::string model = (dir / "gpt.onnx").string();
  ASSERT_EQ(run_apart("zoo gpt --layers 8 --hidden 256 --heads 4 --seq 128 --vocab 1000 -q -o " + model).code, 0);
  // A pure pipeline of 4 stages, one replica each: the 1F1B bubble is (S − 1)/m of the pipeline.
  const std::string flags = " --devices 4 --device a100-40gb --batch 16 --pp 4 --dp 1 --no-stage-models -q";
  auto plain = run_apart("partition " + model + flags + " -o " + (dir / "default").string());
  auto searched = run_apart("partition " + model + flags + " --schedule auto -o " + (dir / "auto").string());
  ASSERT_EQ(plain.code, 0) << plain.out;
  ASSERT_EQ(searched.code, 0) << searched.out;
  const auto p1 = nlohmann::json::parse(read_file(dir / "default" / "plan.json"));
  const auto pa = nlohmann::json::parse(read_file(dir / "auto" / "plan.json"));
  EXPECT_EQ(p1["training"]["schedule"], "1f1b");
  EXPECT_NE(pa["training"]["schedule"], "1f1b") << pa["search"].dump();
  EXPECT_LT(pa["predicted"]["iteration_s"].get<double>(), p1["predicted"]["iteration_s"].get<double>());
  EXPECT_EQ(run_apart("simulate " + (dir / "auto").string()).code, 0);
  // --virtual-stages pins the interleaved candidates' chunks under auto, and needs interleaved or auto.
  auto three = run_apart("partition " + model + flags + " --schedule auto --virtual-stages 3 -o " + (dir / "v3").string());
  ASSERT_EQ(three.code, 0) << three.out;
  const auto p3 = nlohmann::json::parse(read_file(dir / "v3" / "plan.json"));
  if (p3["training"]["schedule"] == "interleaved") {
    EXPECT_EQ(p3["training"]["virtual_stages"], 3);
  }
  auto refused = run_apart("partition " + model + flags + " --virtual-stages 3 -o " + (dir / "no").string());
  EXPECT_EQ(refused.code, 2) << refused.out;
  EXPECT_NE(refused.out.find("needs --schedule interleaved or auto"), std::string::npos) << refused.out;
  EXPECT_FALSE(std::filesystem::exists(dir / "no"));
}

TEST(ApartPartition, RefusesATensorParallelDegreeThatDoesNotDivideTheNode) {
  TempDir dir;
  const std::string model = apart::testing::write_tiny_mlp(dir / "mlp.onnx");
  auto r = run_apart("partition " + model + " --devices 6 --devices-per-node 6 --batch 8 --tp 4 -o " + (dir / "p").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--tp 4"), std::string::npos) << r.out;
  r = run_apart("partition " + model + " --devices 8 --batch 8 --tp 3 -o " + (dir / "p").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("expected 1, 2, 4, 8 or auto"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "p"));
}

TEST(ApartPartition, RefusesZeroOnStagesPinnedToOneReplica) {
  TempDir dir;
  const std::string model = apart::testing::write_tiny_mlp(dir / "mlp.onnx");
  auto r = run_apart("partition " + model + " --devices 2 --batch 8 --replicas 1 --zero 2 -o " + (dir / "p").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--zero 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--replicas 1"), std::string::npos) << r.out;
  auto bad = run_apart("partition " + model + " --devices 2 --batch 8 --zero 4 -o " + (dir / "p").string());
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--zero 4"), std::string::npos) << bad.out;
  EXPECT_FALSE(fs::exists(dir / "p"));
}

TEST(ApartPartition, RejectsBadFlagsWithExitCode2) {
  TempDir dir;
  const std::string model = (fs::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx").string();
  const std::string out = " -o " + (dir / "p").string();
  EXPECT_EQ(run_apart("partition " + model + " --devices 4 --batch 32 --schedule zigzag" + out).code, 2);
  EXPECT_EQ(run_apart("partition " + model + " --devices 4 --batch 32 --stages many" + out).code, 2);
  EXPECT_EQ(run_apart("partition " + model + " --devices 0 --batch 32" + out).code, 2);
  EXPECT_EQ(run_apart("partition " + model + " --devices 4 --batch 32 --device tpu-v9" + out).code, 2);
  EXPECT_FALSE(fs::exists(dir / "p"));
}

}  // namespace
