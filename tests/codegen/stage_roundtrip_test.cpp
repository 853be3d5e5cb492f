// Round trip: the stage_K.onnx files of a plan, run one after another on the runtime, compute what the
// whole model computes (issue 5's check, now that a reference executor exists).
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "codegen/plan_writer.h"
#include "importer/importer.h"
#include "partition/partition.h"
#include "profiler/cost_model.h"
#include "profiler/device.h"
#include "runtime/executor.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {

namespace fs = std::filesystem;

onnx::ModelProto read_proto(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromIstream(&in)) << path;
  return m;
}

// gpt-tiny's inputs at batch `batch`: token ids and labels below its vocabulary of 512.
std::map<std::string, Tensor> token_inputs(int64_t batch, int64_t seq, uint32_t seed) {
  std::mt19937 rng(seed);
  std::map<std::string, Tensor> inputs;
  for (const char* name : {"input_ids", "labels"}) {
    Tensor t(DType::kInt64, {batch, seq});
    for (int64_t& x : t.span<int64_t>()) x = static_cast<int64_t>(rng() % 512);
    inputs.emplace(name, std::move(t));
  }
  return inputs;
}

class AStagedModel : public ::testing::TestWithParam<int> {};

TEST_P(AStagedModel, ComputesTheWholeModelsLossStageByStage) {
  const fs::path model_path = fs::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx";
  const int64_t batch = 2;
  ImportOptions import;
  import.dims["batch"] = batch;
  const ImportedModel model = import_model(model_path, import);

  const Device device = device_preset("a100-80gb");
  CostOptions co;
  co.microbatch_size = batch;
  const CostTable costs = estimate_costs(model.graph, device, co);
  PartitionOptions o;
  o.cluster.devices = GetParam();
  o.cluster.memory_bytes = device.memory_bytes;
  o.training.global_batch = batch;
  o.atomic.graph_batch = batch;
  o.stage.stages = GetParam();
  o.stage.replicas = 1;
  o.stage.microbatches = 1;
  const Plan plan = partition_graph(model.graph, costs, o);
  ASSERT_EQ(plan.stages.size(), static_cast<size_t>(GetParam()));

  testing::TempDir dir;
  write_stage_models(plan, model.graph, model_path, dir.path());

  const auto inputs = token_inputs(batch, 32, 7);
  Executor whole(model);
  const NamedTensors expected = whole.run(inputs);
  ASSERT_EQ(expected.size(), 1u);
  ASSERT_EQ(expected[0].first, "loss");

  // Every value any stage has produced so far, by name; stage K reads its inputs from here.
  std::map<std::string, Tensor> available = inputs;
  for (size_t k = 0; k < plan.stages.size(); ++k) {
    const fs::path stage_path = dir / ("stage_" + std::to_string(k) + ".onnx");
    const onnx::ModelProto stage = read_proto(stage_path);
    std::map<std::string, Tensor> stage_inputs;
    for (const auto& in : stage.graph().input()) {
      auto it = available.find(in.name());
      ASSERT_NE(it, available.end()) << "stage " << k << " reads " << in.name() << ", which no earlier stage sent";
      stage_inputs.emplace(in.name(), it->second);
    }
    Executor exec(stage, model_path.parent_path());
    for (auto& [name, tensor] : exec.run(stage_inputs)) available[name] = tensor.clone();
  }
  auto loss = available.find("loss");
  ASSERT_NE(loss, available.end()) << "no stage produced the loss";
  EXPECT_NEAR(loss->second.data<float>()[0], expected[0].second.data<float>()[0], 1e-5);
}

INSTANTIATE_TEST_SUITE_P(GptTiny, AStagedModel, ::testing::Values(2, 3, 5),
                         [](const auto& info) { return std::to_string(info.param) + "Stages"; });

}  // namespace
}  // namespace apart
