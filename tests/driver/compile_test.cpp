// apart::compile: it plans what `apart partition` plans, the same twice, refuses bad options with typed errors, and
// writes nothing without an output folder.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "driver/compile.h"
#include "graph/error.h"
#include "plan/plan.h"
#include "tests/support/onnx_builder.h"
#include "tests/support/run_apart.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using testing::CommandRun;
using testing::OnnxBuilder;
using testing::read_file;
using testing::run_apart;
using testing::TempDir;

const fs::path kGptTiny = fs::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx";

// `apart partition models/gpt-tiny.onnx --devices N --devices-per-node 4 --batch B --device a100-80gb`: on 8 devices
// where the CLI is compared, on 4 (a shorter search) elsewhere.
CompileOptions gpt_tiny_options(int devices = 4, int64_t batch = 16) {
  CompileOptions o;
  o.model = kGptTiny;
  o.cluster.device = "a100-80gb";
  o.cluster.devices = devices;
  o.cluster.devices_per_node = 4;
  o.partition.training.global_batch = batch;
  return o;
}
const char* const kGptTinyFlags = " --devices 8 --devices-per-node 4 --batch 64 --device a100-80gb";

// Drops what differs between identical runs: the report's search line, plan.json's search.seconds and
// baselines.json's planning_s.
std::string without_timing(const std::string& text) {
  std::istringstream in(text);
  std::string line, out;
  while (std::getline(in, line))
    if (line.rfind("search ", 0) != 0) out += line + "\n";
  return out;
}
nlohmann::json plan_json_without_seconds(const fs::path& file) {
  auto j = nlohmann::json::parse(read_file(file));
  j["search"].erase("seconds");
  return j;
}
nlohmann::json baselines_without_seconds(const fs::path& file) {
  auto j = nlohmann::json::parse(read_file(file));
  for (auto& method : j["methods"]) method.erase("planning_s");
  return j;
}

TEST(ACompile, WritesThePlanFolderTheCliWrites) {
  TempDir dir;
  const auto cli = testing::run_apart("partition " + kGptTiny.string() + kGptTinyFlags + " -o " + (dir / "cli").string());
  ASSERT_EQ(cli.code, 0) << cli.out;

  CompileOptions o = gpt_tiny_options(8, 64);
  o.output = PlanFiles{.directory = dir / "compiled"};
  const CompileResult r = compile(o);
  EXPECT_EQ(r.baselines.size(), kAllMethods.size());

  EXPECT_EQ(plan_json_without_seconds(dir / "compiled" / "plan.json"), plan_json_without_seconds(dir / "cli" / "plan.json"));
  EXPECT_EQ(baselines_without_seconds(dir / "compiled" / "baselines.json"),
            baselines_without_seconds(dir / "cli" / "baselines.json"));
  EXPECT_EQ(without_timing(read_file(dir / "compiled" / "report.txt")), without_timing(read_file(dir / "cli" / "report.txt")));
  for (const std::string file : {"plan.dot", "costs.json", "stage_0.onnx"})
    EXPECT_EQ(read_file(dir / "compiled" / file), read_file(dir / "cli" / file)) << file;
}

TEST(ACompile, ReturnsThePlanItWrites) {
  TempDir dir;
  CompileOptions o = gpt_tiny_options();
  o.baselines = false;
  o.output = PlanFiles{.directory = dir / "plan", .stage_models = false};
  const CompileResult r = compile(o);
  auto returned = nlohmann::json::parse(plan_to_json(r.document).dump());
  returned["search"].erase("seconds");
  EXPECT_EQ(returned, plan_json_without_seconds(dir / "plan" / "plan.json"));
  EXPECT_FALSE(fs::exists(dir / "plan" / "baselines.json"));
  EXPECT_FALSE(fs::exists(dir / "plan" / "stage_0.onnx"));
  EXPECT_TRUE(r.baselines.empty());
  ASSERT_TRUE(r.costs.at_other_size.has_value());
  EXPECT_EQ(r.costs.at_other_size->microbatch_size, 4 * r.costs.table.microbatch_size);
  EXPECT_EQ(r.model.batch, 1) << "read at batch 1 by the importer's batch rule";
}

TEST(ACompile, ListsTheTensorParallelRegionsOfATransformer) {
  CompileOptions o = gpt_tiny_options();
  o.baselines = false;
  const CompileResult r = compile(o);
  ASSERT_TRUE(r.document.tensor_parallel.has_value());
  // gpt-tiny: 2 layers, 2 heads, the embedding and the LM head tied to it.
  EXPECT_EQ(r.document.tensor_parallel->summary, "2 attention, 2 MLP, embedding, LM head (tied)");
  ASSERT_EQ(r.document.tensor_parallel->regions.size(), 6u);
  const PlanTpRegion& attention = r.document.tensor_parallel->regions[1];
  EXPECT_EQ(attention.kind, TpRegionKind::kAttention);
  EXPECT_EQ(attention.bounded_by, "2 heads");
  EXPECT_EQ(attention.degrees, (std::vector<int>{1, 2}));
  EXPECT_DOUBLE_EQ(attention.end_bytes_per_sample, 32.0 * 64 * 4);  // [seq, hidden] fp32, per sample
}

// A --tp plan is one apart run can cut: the shifted next-token loss slices the LM head's logits along the sequence,
// which the planner split and the shard pass refused (apart check failed 'tp shards'); the shard pass now cuts it
// and the planner asks that pass before it splits any region (tp_refused_regions; a region it refuses stays whole
// with a note: tests/codegen/llama_block_test.cpp). Every region splits and apart check passes.
TEST(ACompile, PlansOnlyTensorParallelRegionsApartRunCuts) {
  TempDir dir("tp_refused");
  const std::string model = (dir / "llama.onnx").string(), plan = (dir / "plan").string();
  ASSERT_EQ(
      run_apart("zoo llama --layers 2 --hidden 64 --heads 4 --ffn 128 --seq 16 --vocab 128 --loss none -q -o " + model)
          .code,
      0);
  const CommandRun planned = run_apart("partition " + model +
                                       " --loss cross_entropy_shifted --labels labels "
                                       "--devices 2 --device h100 --tp 2 --batch 4 -o " +
                                       plan);
  ASSERT_EQ(planned.code, 0) << planned.out;
  EXPECT_EQ(planned.out.find("stays whole on every TP rank"), std::string::npos) << planned.out;
  EXPECT_NE(planned.out.find("regions: 2 attention, 2 MLP, embedding, LM head; split in 1 of 1 stages"),
            std::string::npos)
      << planned.out;
  const CommandRun checked = run_apart("check " + plan);
  EXPECT_EQ(checked.code, 0) << checked.out;
  EXPECT_NE(checked.out.find("ok   tp shards"), std::string::npos) << checked.out;
}

// `--dim seq=5` binds a symbolic dim for the planner, and plan.json keeps it (model.dims, the batch's left out) so
// apart check and apart run bind the same (they refused the model: "dynamic dim 'seq' … is not bound").
TEST(ACompile, KeepsItsDimBindingsForCheckAndRun) {
  TempDir dir("dim_kept");
  OnnxBuilder b;
  b.input("x", {"batch", "seq", 8}).input("target", {"batch", "seq", 8}).output("loss");
  b.weight("w", {8, 8});
  b.node("MatMul", {"x", "w"}, {"y"});
  b.node("Sub", {"y", "target"}, {"d"});
  b.node("Mul", {"d", "d"}, {"sq"});
  OnnxBuilder::set_int(b.node("ReduceMean", {"sq"}, {"loss"}), "keepdims", 0);
  const std::string model = (dir / "m.onnx").string(), plan = (dir / "plan").string();
  b.save(model);
  const CommandRun planned =
      run_apart("partition " + model + " --dim seq=5 --device cpu --devices 1 --batch 2 --no-baselines -o " + plan);
  ASSERT_EQ(planned.code, 0) << planned.out;
  const auto json = nlohmann::json::parse(read_file(fs::path(plan) / "plan.json"));
  EXPECT_EQ(json["model"]["dims"], nlohmann::json({{"seq", 5}})) << json["model"].dump();
  EXPECT_EQ(read_plan(plan).model->dims, (std::map<std::string, int64_t>{{"seq", 5}}));
  const CommandRun checked = run_apart("check " + plan);
  EXPECT_EQ(checked.code, 0) << checked.out;
  const CommandRun ran = run_apart("run " + plan + " --in-process --steps 2");
  EXPECT_EQ(ran.code, 0) << ran.out;
  EXPECT_NE(ran.out.find("step=2 loss="), std::string::npos) << ran.out;
}

TEST(ACompile, PlansTheSameTwiceApartFromSearchTime) {
  CompileOptions o = gpt_tiny_options();
  o.baselines = false;
  auto plan = [&] {
    const CompileResult r = compile(o);
    auto j = plan_to_json(r.document);
    j["search"]["seconds"] = 0;
    return j.dump(2);
  };
  EXPECT_EQ(plan(), plan());
}

// The search and the files run on PartitionOptions::threads; the plan folder is the same bytes on any count.
TEST(ACompile, WritesTheSamePlanFolderOnOneThreadAndOnSeveral) {
  TempDir dir;
  auto folder = [&](int threads) {
    CompileOptions o = gpt_tiny_options(8, 64);  // two nodes: pipeline-major too
    o.partition.threads = threads;
    o.output = PlanFiles{.directory = dir / ("plan" + std::to_string(threads))};
    compile(o);
    return o.output->directory;
  };
  const fs::path one = folder(1);
  for (int threads : {2, 3}) {
    const fs::path several = folder(threads);
    auto plan_bytes = [](const fs::path& file) {
      auto j = nlohmann::json::parse(read_file(file));
      j["search"]["seconds"] = 0;
      return j.dump(2);
    };
    EXPECT_EQ(plan_bytes(several / "plan.json"), plan_bytes(one / "plan.json"));
    EXPECT_EQ(baselines_without_seconds(several / "baselines.json"), baselines_without_seconds(one / "baselines.json"));
    size_t files = 0;
    for (const auto& entry : fs::directory_iterator(one)) {
      const std::string name = entry.path().filename().string();
      if (name == "plan.json" || name == "baselines.json" || name == "report.txt" || entry.is_directory()) continue;
      ++files;
      EXPECT_EQ(read_file(several / name), read_file(entry.path())) << name << " on " << threads << " threads";
    }
    EXPECT_GE(files, 3u) << "plan.dot, costs.json and the stage files";
    EXPECT_EQ(without_timing(read_file(several / "report.txt")), without_timing(read_file(one / "report.txt")));
  }
}

TEST(ACompile, WritesNothingWithoutAnOutputFolder) {
  TempDir dir;
  const fs::path before = fs::current_path();
  fs::current_path(dir.path());  // a plan written to a relative default would land here
  CompileOptions o = gpt_tiny_options();
  const CompileResult r = compile(o);
  fs::current_path(before);
  EXPECT_FALSE(r.plan.stages.empty());
  EXPECT_FALSE(r.baselines.empty()) << "the comparison is computed even when not written";
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(ACompile, RefusesBadOptionsWithTypedErrorsNamingThem) {
  auto message = [](const CompileOptions& o) -> std::string {
    try {
      compile(o);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "no InvalidArgument";
  };
  CompileOptions no_batch = gpt_tiny_options();
  no_batch.partition.training.global_batch = 0;
  EXPECT_NE(message(no_batch).find("--batch"), std::string::npos) << message(no_batch);

  CompileOptions no_devices = gpt_tiny_options();
  no_devices.cluster.devices = 0;
  EXPECT_NE(message(no_devices).find("--devices"), std::string::npos) << message(no_devices);

  CompileOptions unknown_device = gpt_tiny_options();
  unknown_device.cluster.device = "tpu-v9";
  EXPECT_NE(message(unknown_device).find("tpu-v9"), std::string::npos) << message(unknown_device);

  CompileOptions missing_model = gpt_tiny_options();
  missing_model.model = fs::path(APART_TEST_DATA_DIR) / "no-such-model.onnx";
  EXPECT_THROW(compile(missing_model), Error);
}

TEST(ACompile, RefusesAProfileFromAnotherDeviceUnlessToldToWarn) {
  TempDir dir;
  const auto costs = testing::run_apart("costs " + kGptTiny.string() + " --device h100-80gb -o " + (dir / "costs.json").string());
  ASSERT_EQ(costs.code, 0) << costs.out;
  CompileOptions o = gpt_tiny_options();
  o.profile = dir / "costs.json";
  o.baselines = false;
  try {
    compile(o);
    ADD_FAILURE() << "a profile from h100-80gb was used on a100-80gb";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--profile-device-mismatch ok"), std::string::npos) << e.what();
  }
  o.profile_device_mismatch = ProfileDeviceMismatch::kWarn;
  std::vector<std::string> warnings;
  o.on_message = [&](CompileMessage kind, const std::string& text) {
    if (kind == CompileMessage::kWarning) warnings.push_back(text);
  };
  const CompileResult r = compile(o);
  EXPECT_FALSE(r.costs.at_other_size.has_value()) << "a measured profile is used as given";
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("h100-80gb"), std::string::npos) << warnings[0];
}

}  // namespace
}  // namespace apart
