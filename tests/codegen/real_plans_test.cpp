// Plans of the bundled and shared real models: invariants, stage ONNX files that chain, determinism.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <onnx/onnx_pb.h>
#include <set>

#include "driver/compile.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using testing::read_file;

std::vector<fs::path> real_models() {
  std::vector<fs::path> out;
  for (const fs::path& dir : {fs::path(APART_SOURCE_DIR) / "models", fs::path(APART_SHARED_MODELS_DIR)}) {
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".onnx") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// What `apart partition <model> --devices N --batch B --device a100-80gb --no-baselines [-o output]` plans.
CompileResult plan_model(const fs::path& path, int devices, int64_t batch, std::optional<fs::path> output = {}) {
  CompileOptions o;
  o.model = path;
  o.cluster.device = "a100-80gb";
  o.cluster.devices = devices;
  o.partition.training.global_batch = batch;
  o.baselines = false;
  if (output) o.output = PlanFiles{.directory = *output};
  return compile(o);
}

TEST(PlansOfRealModels, KeepEveryInvariant) {
  const auto models = real_models();
  if (models.empty()) GTEST_SKIP() << "no models in models/ or shared/models";
  for (const fs::path& path : models) {
    SCOPED_TRACE(path.string());
    for (int devices : {1, 4, 16}) {
      const CompileResult p = plan_model(path, devices, 64);
      const TaskGraph& g = p.model.graph;
      std::vector<int> stage_of(g.num_tasks(), -1);
      int replicas = 0;
      for (const PlanStage& s : p.plan.stages) {
        replicas += s.replicas;
        EXPECT_LE(s.cost.memory_bytes, p.plan.options.cluster.usable_memory_bytes());
        for (TaskId t : s.tasks)
          if (!g.task(t).constant) {
            EXPECT_EQ(stage_of[t.value()], -1) << g.task(t).name << " in two stages";
            stage_of[t.value()] = static_cast<int>(s.id.value());
          }
      }
      EXPECT_LE(replicas, devices);
      for (uint32_t t = 0; t < g.num_tasks(); ++t) {
        if (g.task(TaskId(t)).constant) continue;
        ASSERT_GE(stage_of[t], 0) << g.task(TaskId(t)).name << " in no stage";
        for (TaskId s : g.successors(TaskId(t)))
          if (!g.task(s).constant) {
            EXPECT_LE(stage_of[t], stage_of[s.value()]) << "backward edge";
          }
      }
      // Every cut value: once as its sender's output, once as each receiver's input.
      std::map<std::pair<uint32_t, int>, int> sent, received;
      for (const PlanStage& s : p.plan.stages) {
        for (const StageOutput& o : s.outputs)
          for (StageId to : o.to_stages) ++sent[{o.value.value(), static_cast<int>(to.value())}];
        for (const StageInput& in : s.inputs)
          if (in.from_stage.valid()) ++received[{in.value.value(), static_cast<int>(s.id.value())}];
      }
      EXPECT_EQ(sent, received);
      for (auto& [key, count] : sent) EXPECT_EQ(count, 1);
      for (uint32_t v = 0; v < g.num_values(); ++v) {
        const Value& value = g.value(ValueId(v));
        if (!value.producer.valid() || stage_of[value.producer.value()] < 0) continue;
        for (TaskId c : g.consumers(ValueId(v)))
          if (stage_of[c.value()] >= 0 && stage_of[c.value()] != stage_of[value.producer.value()]) {
            EXPECT_EQ(sent.count({v, stage_of[c.value()]}), 1u) << value.name;
          }
      }
    }
  }
}

TEST(StageModels, ChainFromModelInputsToModelOutputs) {
  const auto models = real_models();
  if (models.empty()) GTEST_SKIP() << "no models";
  for (const fs::path& path : models) {
    SCOPED_TRACE(path.string());
    const testing::TempDir scratch("codegen_test_" + path.stem().string());
    const fs::path dir = scratch / "plan";
    const CompileResult p = plan_model(path, 16, 64, dir);
    std::set<std::string> available;
    for (ValueId v : p.model.graph.graph_inputs()) available.insert(p.model.graph.value(v).name);
    std::set<std::string> outputs_seen;
    for (size_t k = 0; k < p.plan.stages.size(); ++k) {
      onnx::ModelProto stage;
      ASSERT_TRUE(stage.ParseFromString(read_file(dir / ("stage_" + std::to_string(k) + ".onnx"))));
      EXPECT_GT(stage.graph().node_size(), 0);
      for (const auto& in : stage.graph().input())
        EXPECT_TRUE(available.count(in.name())) << "stage " << k << " input " << in.name() << " comes from nowhere";
      for (const auto& out : stage.graph().output()) {
        available.insert(out.name());
        outputs_seen.insert(out.name());
      }
    }
    for (ValueId v : p.model.graph.graph_outputs()) EXPECT_TRUE(outputs_seen.count(p.model.graph.value(v).name));
    EXPECT_TRUE(fs::exists(dir / "plan.json"));
    EXPECT_TRUE(fs::exists(dir / "plan.dot"));
    EXPECT_TRUE(fs::exists(dir / "report.txt"));
  }
}

TEST(PlanJson, IsByteIdenticalForTheSameInputsApartFromSearchTime) {
  const auto models = real_models();
  if (models.empty()) GTEST_SKIP() << "no models";
  const fs::path path = models.front();
  auto dump = [&] {
    const CompileResult p = plan_model(path, 8, 32);
    auto j = plan_to_json(p.document);
    j["search"]["seconds"] = 0;
    return j.dump(2);
  };
  EXPECT_EQ(dump(), dump());
}

TEST(PlanJson, FollowsTheApartPlanSchema) {
  const auto models = real_models();
  if (models.empty()) GTEST_SKIP() << "no models";
  const CompileResult p = plan_model(models.front(), 4, 16);
  const auto j = plan_to_json(p.document);
  EXPECT_EQ(j["schema"], "apart.plan/1");
  for (const char* key : {"model", "cluster", "training", "stages", "predicted", "search"}) EXPECT_TRUE(j.contains(key)) << key;
  for (const auto& s : j["stages"])
    for (const char* key : {"id", "replicas", "devices", "tasks", "forward_s", "backward_s", "recompute", "allreduce_s",
                            "memory_bytes", "inputs", "outputs"})
      EXPECT_TRUE(s.contains(key)) << key;
}

}  // namespace
}  // namespace apart
