// apart export: every flag and key an engine reads exists in that engine's release (tests/data/engines/), the
// exported layer splits reproduce the plan's stage boundaries (read independently from plan.json's task names), a
// plan made with --target E is exported with no field refused, and what an engine cannot express is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/onnx_builder.h"
#include "tests/support/run_apart.h"
#include "tests/support/temp_dir.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::run_apart;
using testing::TempDir;

const std::vector<std::string> kFormats = {"megatron", "torchtitan", "torch-pipelining", "deepspeed"};

// An engine's names as a tests/data/engines/ list holds them ('#' lines say where they come from).
std::set<std::string> engine_names(const std::string& file) {
  std::ifstream in(fs::path(APART_TEST_DATA_DIR) / "engines" / file);
  std::set<std::string> names;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') names.insert(line);
  EXPECT_GT(names.size(), 5u) << file;
  return names;
}

std::vector<std::string> matches(const std::string& text, const std::string& pattern, int group = 1) {
  std::vector<std::string> out;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[group].str());
  return out;
}

// A zoo model of `family` (gpt or llama) with `layers` layers, small enough to plan in a moment.
fs::path zoo_model(const fs::path& dir, const std::string& family, int layers) {
  const fs::path model = dir / (family + ".onnx");
  const std::string extra = family == "llama" ? " --kv-heads 2 --ffn 128" : "";
  const auto run = run_apart("zoo " + family + " --layers " + std::to_string(layers) +
                             " --hidden 64 --heads 4 --vocab 256 --seq 16" + extra + " -q -o " + model.string());
  EXPECT_EQ(run.code, 0) << run.out;
  return model;
}

fs::path partition(const fs::path& model, const fs::path& plan, const std::string& flags) {
  const auto run =
      run_apart("partition " + model.string() + " --device a100-80gb --devices 6 --batch 12 --no-stage-models -q " +
                flags + " -o " + plan.string());
  EXPECT_EQ(run.code, 0) << run.out;
  return plan;
}

// The oracle: per stage, in order, the layers its batch tasks belong to (read from the task names with a regex, the
// constants by costs.json), as first and count. Independent of graph/module_layers.
std::vector<std::pair<int, int>> stage_layers(const fs::path& plan, const std::string& layer_regex) {
  const auto doc = nlohmann::json::parse(read_file(plan / "plan.json"));
  const auto costs = nlohmann::json::parse(read_file(plan / "costs.json"));
  std::set<std::string> constant;
  for (const auto& t : costs["tasks"])
    if (t["constant"].get<bool>()) constant.insert(t["name"].get<std::string>());
  const bool chunks = doc.contains("virtual_stages");
  std::vector<std::pair<int, int>> out;
  const std::regex re(layer_regex);
  for (const auto& stage : doc[chunks ? "virtual_stages" : "stages"]) {
    std::set<int> layers;
    for (const auto& t : stage["tasks"]) {
      const std::string name = t.get<std::string>();
      std::smatch m;
      if (!constant.count(name) && std::regex_search(name, m, re)) layers.insert(std::stoi(m[1].str()));
    }
    out.push_back(layers.empty() ? std::pair<int, int>{0, 0}
                                 : std::pair<int, int>{*layers.begin(), static_cast<int>(layers.size())});
  }
  return out;
}

// Layers per pipeline part as each format writes them.
std::vector<int> megatron_parts(const std::string& args, int stages) {
  const auto num = [&](const std::string& flag) {
    const auto m = matches(args, flag + " ([0-9]+)");
    return m.empty() ? -1 : std::stoi(m.front());
  };
  const int layers = num("--num-layers");
  const auto layout = matches(args, "--pipeline-model-parallel-layout \"([^\"]+)\"");
  std::vector<int> parts;
  if (!layout.empty()) {
    std::stringstream s(layout.front());
    for (std::string part; std::getline(s, part, '|');) {
      const auto t = matches(part, "t\\*([0-9]+)");
      parts.push_back(t.empty() ? 0 : std::stoi(t.front()));
    }
  } else if (num("--decoder-first-pipeline-num-layers") >= 0) {
    const int first = num("--decoder-first-pipeline-num-layers"), last = num("--decoder-last-pipeline-num-layers");
    parts.push_back(first);
    for (int k = 1; k + 1 < stages; ++k) parts.push_back((layers - first - last) / (stages - 2));
    parts.push_back(last);
  } else if (num("--num-layers-per-virtual-pipeline-stage") >= 0) {
    parts.assign(layers / num("--num-layers-per-virtual-pipeline-stage"),
                 num("--num-layers-per-virtual-pipeline-stage"));
  } else {
    parts.assign(stages, layers / stages);
  }
  return parts;
}

std::vector<int> torchtitan_parts(const std::string& toml, const std::string& layer_fqn) {
  std::vector<int> parts;
  for (const std::string& line : matches(toml, "\\n  (\\[.*\\]),", 1))
    parts.push_back(static_cast<int>(matches(line, layer_fqn, 0).size()));
  return parts;
}

std::vector<int> first_layers_of_split_spec(const std::string& py, const std::string& layer_fqn) {
  std::vector<int> firsts{0};
  for (const std::string& s : matches(py, "\"" + layer_fqn + "\": SplitPoint.BEGINNING", 1))
    firsts.push_back(std::stoi(s));
  return firsts;
}

struct Model {
  std::string family;
  std::string task_regex;  // a layer's index in a task name
  std::string fqn;         // a layer's FQN, the index as group 1
};
const Model kGpt{"gpt", "^/blocks\\.([0-9]+)/", "blocks\\.([0-9]+)"};
const Model kLlama{"llama", "^/model/layers\\.([0-9]+)/", "model\\.layers\\.([0-9]+)"};

// Exports `plan` in `format` to DIR; returns the run.
testing::CommandRun export_to(const fs::path& plan, const std::string& format, const fs::path& out) {
  return run_apart("export " + plan.string() + " --format " + format + " -o " + out.string());
}

void expect_splits_reproduced(const fs::path& plan, const fs::path& out, const std::string& format, const Model& m) {
  const std::vector<std::pair<int, int>> oracle = stage_layers(plan, m.task_regex);
  std::vector<int> counts;
  for (const auto& [first, count] : oracle) counts.push_back(count);
  const int stages = static_cast<int>(nlohmann::json::parse(read_file(plan / "plan.json"))["stages"].size());
  if (format == "megatron") EXPECT_EQ(megatron_parts(read_file(out / "megatron_args.sh"), stages), counts);
  if (format == "torchtitan") EXPECT_EQ(torchtitan_parts(read_file(out / "torchtitan.toml"), m.fqn), counts);
  if (format == "torch-pipelining") {
    std::vector<int> firsts;
    for (const auto& [first, count] : oracle) firsts.push_back(first);
    EXPECT_EQ(first_layers_of_split_spec(read_file(out / "pipeline.py"), m.fqn), firsts);
  }
  if (format == "deepspeed") {
    // APART_PARTS in layer specs: one spec per module before the layers (in the first stage) and after them (in the
    // last), as export.json lists them ("(unscoped)" tasks have no module of their own).
    const auto summary = nlohmann::json::parse(read_file(out / "export.json"));
    auto specs = [](const nlohmann::json& list) {
      return static_cast<int>(std::count_if(list.begin(), list.end(), [](const auto& m) { return m != "(unscoped)"; }));
    };
    std::vector<int> expected{0};
    for (size_t k = 0; k < counts.size(); ++k)
      expected.push_back(expected.back() + counts[k] + (k == 0 ? specs(summary["layers"]["before"]) : 0) +
                         (k + 1 == counts.size() ? specs(summary["layers"]["after"]) : 0));
    const auto parts = matches(read_file(out / "deepspeed_pipeline.py"), "APART_PARTS = \\[([0-9, ]+)\\]");
    ASSERT_EQ(parts.size(), 1u);
    std::vector<int> bounds;
    for (const std::string& n : matches(parts.front(), "([0-9]+)")) bounds.push_back(std::stoi(n));
    EXPECT_EQ(bounds, expected);
  }
}

class AnExportOfATargetPlan : public ::testing::TestWithParam<std::string> {};

TEST_P(AnExportOfATargetPlan, IsRefusedForNoFieldAndReproducesTheStageBoundariesOnGptAndLlama) {
  const std::string format = GetParam();
  TempDir dir("export");
  for (const Model& m : {kGpt, kLlama}) {
    const fs::path model = zoo_model(dir.path(), m.family, 6);
    const fs::path plan = partition(model, dir.path() / (m.family + "_" + format), "--stages 3 --target " + format);
    const fs::path out = dir.path() / (m.family + "_" + format + "_export");
    const auto run = export_to(plan, format, out);
    ASSERT_EQ(run.code, 0) << run.out;
    const auto summary = nlohmann::json::parse(read_file(out / "export.json"));
    EXPECT_EQ(summary["snapping"]["moved_tasks"], 0) << "a --target plan cuts between layers";
    EXPECT_EQ(summary["snapping"]["snapped_iteration_s"], summary["snapping"]["plan_iteration_s"]);
    EXPECT_EQ(summary["layers"]["count"], 6);
    expect_splits_reproduced(plan, out, format, m);
    // What the restriction costs, in report.txt, the figures plan.json's.
    const auto doc = nlohmann::json::parse(read_file(plan / "plan.json"));
    ASSERT_TRUE(doc.contains("target"));
    EXPECT_EQ(doc["target"]["engine"], format);
    EXPECT_GT(doc["target"]["unrestricted_iteration_s"].get<double>(), 0);
    EXPECT_NE(read_file(plan / "report.txt").find("target " + format), std::string::npos);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryFormat, AnExportOfATargetPlan, ::testing::ValuesIn(kFormats), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

TEST(AnInterleavedTargetPlan, ReproducesItsVirtualStagesInEveryFormatThatInterleaves) {
  TempDir dir("export_interleaved");
  const fs::path model = zoo_model(dir.path(), "gpt", 6);
  for (const std::string format : {"megatron", "torchtitan", "torch-pipelining"}) {
    const fs::path plan = partition(model, dir.path() / ("plan_" + format),
                                    "--stages 2 --schedule interleaved --virtual-stages 3 --target " + format);
    ASSERT_TRUE(nlohmann::json::parse(read_file(plan / "plan.json")).contains("virtual_stages"));
    const fs::path out = dir.path() / ("out_" + format);
    const auto run = export_to(plan, format, out);
    ASSERT_EQ(run.code, 0) << run.out;
    EXPECT_EQ(nlohmann::json::parse(read_file(out / "export.json"))["parts"].size(), 6u);
    expect_splits_reproduced(plan, out, format, kGpt);
  }
}

TEST(AnExport, WritesOnlyNamesTheEnginesReleasesHave) {
  TempDir dir("export_names");
  const fs::path model = zoo_model(dir.path(), "gpt", 6);
  // Recomputation, ZeRO and TP on, so that their flags are written too.
  const fs::path plan =
      partition(model, dir.path() / "plan", "--stages 3 --target megatron --recompute on --zero 1 --replicas 2 --tp 1");
  ASSERT_EQ(export_to(plan, "megatron", dir.path() / "m").code, 0);
  const auto megatron = engine_names("megatron_core_v0.19.0_flags.txt");
  const std::string args = read_file(dir.path() / "m" / "megatron_args.sh");
  const auto flags = matches(args, "\\n  (--[a-z0-9-]+)");
  EXPECT_GE(flags.size(), 8u) << args;
  for (const std::string& f : flags) EXPECT_TRUE(megatron.count(f)) << f << " is not a Megatron-LM core_v0.19.0 flag";
  EXPECT_NE(args.find("--use-distributed-optimizer"), std::string::npos) << args;
  EXPECT_NE(args.find("--recompute-granularity full"), std::string::npos) << args;

  const fs::path titan_plan = partition(model, dir.path() / "plan_t", "--stages 3 --target torchtitan --recompute on");
  ASSERT_EQ(export_to(titan_plan, "torchtitan", dir.path() / "t").code, 0);
  const auto titan = engine_names("torchtitan_v0.2.2_keys.txt");
  std::string section;
  for (std::istringstream in(read_file(dir.path() / "t" / "torchtitan.toml")); !in.eof();) {
    std::string line;
    std::getline(in, line);
    std::smatch m;
    if (std::regex_match(line, m, std::regex("\\[([a-z_]+)\\]")))
      section = m[1];
    else if (std::regex_match(line, m, std::regex("([a-z_]+) = .*")))
      EXPECT_TRUE(titan.count(section + "." + m[1].str()))
          << section << "." << m[1] << " is not a torchtitan v0.2.2 key";
  }

  ASSERT_EQ(export_to(plan, "deepspeed", dir.path() / "d").code, 0);
  const auto deepspeed = engine_names("deepspeed_0.16.5_names.txt");
  const auto config = nlohmann::json::parse(read_file(dir.path() / "d" / "ds_config.json"));
  for (const auto& [key, value] : config.items()) {
    EXPECT_TRUE(deepspeed.count(key)) << key;
    if (value.is_object())
      for (const auto& [inner, v] : value.items())
        EXPECT_TRUE(deepspeed.count(key + "." + inner)) << key << "." << inner;
  }
  EXPECT_EQ(config["train_batch_size"],
            config["train_micro_batch_size_per_gpu"].get<int>() * 2 * config["gradient_accumulation_steps"].get<int>());
  const std::string partition_py = read_file(dir.path() / "d" / "deepspeed_pipeline.py");
  for (const std::string& name : {"PipelineModule", "_partition_layers", "_set_bounds",
                                  "activation_checkpoint_interval", "partition_method", "num_stages"}) {
    EXPECT_TRUE(deepspeed.count(name)) << name;
    EXPECT_NE(partition_py.find(name), std::string::npos) << name;
  }

  const fs::path pipe_plan = partition(model, dir.path() / "plan_p", "--stages 3 --target torch-pipelining");
  ASSERT_EQ(export_to(pipe_plan, "torch-pipelining", dir.path() / "p").code, 0);
  const auto torch = engine_names("torch_pipelining_2.9_names.txt");
  const std::string py = read_file(dir.path() / "p" / "pipeline.py");
  const auto imported = matches(py, "from torch\\.distributed\\.pipelining import ([A-Za-z0-9_, ]+)");
  ASSERT_EQ(imported.size(), 1u);
  for (const std::string& name : matches(imported.front(), "([A-Za-z0-9_]+)")) EXPECT_TRUE(torch.count(name)) << name;
  for (const std::string& name : matches(py, "(SplitPoint\\.[A-Z]+|build_stage|n_microbatches|mb_args|split_spec)", 1))
    EXPECT_TRUE(torch.count(name)) << name;
}

TEST(AnExport, IsRefusedNamingTheFieldAndTargetWhenTheEngineCannotExpressThePlan) {
  TempDir dir("export_refused");
  const fs::path model = zoo_model(dir.path(), "gpt", 6);
  const fs::path plan = partition(model, dir.path() / "plan", "--stages 3 --schedule gpipe");
  const auto run = export_to(plan, "megatron", dir.path() / "out");
  EXPECT_EQ(run.code, 4) << run.out;
  EXPECT_NE(run.out.find("training.schedule"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("--target megatron"), std::string::npos) << run.out;
  EXPECT_FALSE(fs::exists(dir.path() / "out")) << "nothing is written for a refused plan";
  // DeepSpeed's pipeline engine runs neither GPipe nor ZeRO-2.
  const fs::path zero2 = partition(model, dir.path() / "plan2", "--stages 3 --zero 2 --replicas 2");
  const auto ds = export_to(zero2, "deepspeed", dir.path() / "out2");
  EXPECT_EQ(ds.code, 4) << ds.out;
  EXPECT_NE(ds.out.find("ZeRO-2"), std::string::npos) << ds.out;
}

TEST(AnExport, IsRefusedForAModelWithoutModuleNames) {
  TempDir dir("export_unnamed");
  const std::string model = testing::write_tiny_mlp(dir.path() / "mlp.onnx");
  const auto made =
      run_apart("partition " + model + " --device cpu --devices 2 --batch 4 --stages 2 --no-stage-models -q -o " +
                (dir.path() / "plan").string());
  ASSERT_EQ(made.code, 0) << made.out;
  const auto run = export_to(dir.path() / "plan", "torchtitan", dir.path() / "out");
  EXPECT_EQ(run.code, 4) << run.out;
  EXPECT_NE(run.out.find("module"), std::string::npos) << run.out;
  const auto target = run_apart("partition " + model + " --device cpu --devices 2 --batch 4 --target megatron -q -o " +
                                (dir.path() / "plan2").string());
  EXPECT_EQ(target.code, 4) << target.out;
}

// The snapping rule against its oracle: each layer goes whole to the stage holding most of its time (costs.json),
// never before the previous layer's; export.json's parts are those runs, and its cost is the two simulations' ratio.
TEST(AnExportOfAnUnrestrictedPlan, SnapsEachLayerToTheStageHoldingMostOfItsTime) {
  TempDir dir("export_snap");
  const fs::path model = zoo_model(dir.path(), "gpt", 6);
  const fs::path plan = partition(model, dir.path() / "plan", "--stages 4 --replicas 1");
  ASSERT_EQ(export_to(plan, "torchtitan", dir.path() / "out").code, 0);
  const auto doc = nlohmann::json::parse(read_file(plan / "plan.json"));
  const auto costs = nlohmann::json::parse(read_file(plan / "costs.json"));
  std::map<std::string, double> seconds;
  for (const auto& t : costs["tasks"])
    if (!t["constant"].get<bool>()) seconds[t["name"]] = t["forward_s"].get<double>() + t["backward_s"].get<double>();
  std::vector<std::vector<double>> weight(6, std::vector<double>(doc["stages"].size(), 0.0));
  const std::regex layer("^/blocks\\.([0-9]+)/");
  for (size_t k = 0; k < doc["stages"].size(); ++k)
    for (const auto& t : doc["stages"][k]["tasks"]) {
      std::smatch m;
      const std::string name = t.get<std::string>();
      if (seconds.count(name) && std::regex_search(name, m, layer))
        weight[std::stoi(m[1].str())][k] += seconds[name] + 1e-30;
    }
  std::vector<int> expected_counts(doc["stages"].size(), 0);
  int previous = 0;
  for (const auto& w : weight) {
    int best = 0;
    for (size_t k = 1; k < w.size(); ++k)
      if (w[k] > w[best]) best = static_cast<int>(k);
    previous = std::max(previous, best);
    ++expected_counts[previous];
  }
  const auto summary = nlohmann::json::parse(read_file(dir.path() / "out" / "export.json"));
  std::vector<int> counts;
  for (const auto& part : summary["parts"]) counts.push_back(part["layers"]);
  EXPECT_EQ(counts, expected_counts);
  const auto& snap = summary["snapping"];
  EXPECT_NEAR(snap["cost_fraction"].get<double>(),
              snap["snapped_iteration_s"].get<double>() / snap["plan_iteration_s"].get<double>() - 1, 1e-12);
  EXPECT_NEAR(snap["plan_iteration_s"].get<double>(), doc["predicted"]["iteration_s"].get<double>(),
              1e-9 * doc["predicted"]["iteration_s"].get<double>());
}

}  // namespace
}  // namespace apart
