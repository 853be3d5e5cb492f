// Round trip: the stage_K.onnx files of a plan, run one after another on the runtime, compute what the
// whole model computes (issue 5's check, now that a reference executor exists), at the plan's batch and another.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <cmath>
#include <map>
#include <random>

#include "codegen/plan_writer.h"
#include "driver/compile.h"
#include "importer/importer.h"
#include "models/zoo.h"
#include "runtime/executor.h"
#include "tests/support/onnx_builder.h"
#include "tests/support/read_model.h"

namespace apart {
namespace {

namespace fs = std::filesystem;

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

// gpt-tiny planned for a global batch of 2 into GetParam() stages, as `apart partition` plans and writes it: the
// stage files keep the batch symbolic, so they run at any batch size.
class AStagedModel : public ::testing::TestWithParam<int> {
 protected:
  static constexpr int64_t kPlanBatch = 2;

  void SetUp() override {
    CompileOptions o;
    o.model = model_path_;
    o.cluster.device = "a100-80gb";
    o.cluster.devices = GetParam();
    o.partition.training.global_batch = kPlanBatch;
    o.partition.stage.stages = GetParam();
    o.partition.stage.replicas = 1;
    o.partition.stage.microbatches = 1;
    o.baselines = false;
    o.output = PlanFiles{.directory = dir_.path()};
    const CompileResult r = compile(o);
    ASSERT_EQ(r.plan.stages.size(), static_cast<size_t>(GetParam()));
  }

  // The whole model's loss at `batch`.
  float whole_loss(const std::map<std::string, Tensor>& inputs, int64_t batch) const {
    ImportOptions import;
    import.dims["batch"] = batch;
    const ImportedModel model = import_model(model_path_, import);
    Executor whole(model);
    const NamedTensors out = whole.run(inputs);
    EXPECT_EQ(out.size(), 1u);
    EXPECT_EQ(out.at(0).first, "loss");
    return out.at(0).second.data<float>()[0];
  }

  // The stage files run one after another, each imported with the batch bound to `batch`.
  float staged_loss(const std::map<std::string, Tensor>& inputs, int64_t batch) const {
    ImportOptions import;
    import.dims["batch"] = batch;
    // Every value any stage has produced so far, by name; stage K reads its inputs from here.
    std::map<std::string, Tensor> available = inputs;
    for (int k = 0; k < GetParam(); ++k) {
      const onnx::ModelProto stage = testing::read_proto(dir_ / ("stage_" + std::to_string(k) + ".onnx"));
      std::map<std::string, Tensor> stage_inputs;
      for (const auto& in : stage.graph().input()) {
        auto it = available.find(in.name());
        if (it == available.end()) {
          ADD_FAILURE() << "stage " << k << " reads " << in.name() << ", which no earlier stage sent";
          return NAN;
        }
        stage_inputs.emplace(in.name(), it->second);
      }
      Executor exec(stage, model_path_.parent_path(), {}, import);
      for (auto& [name, tensor] : exec.run(stage_inputs)) available[name] = tensor.clone();
    }
    auto loss = available.find("loss");
    if (loss == available.end()) {
      ADD_FAILURE() << "no stage produced the loss";
      return NAN;
    }
    return loss->second.data<float>()[0];
  }

  const fs::path model_path_ = fs::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx";
  testing::TempDir dir_;
};

TEST_P(AStagedModel, ComputesTheWholeModelsLossStageByStage) {
  const auto inputs = token_inputs(kPlanBatch, 32, 7);
  EXPECT_NEAR(staged_loss(inputs, kPlanBatch), whole_loss(inputs, kPlanBatch), 1e-5);
}

// The symbolic batch dims of the stage files are right: they run at a batch size the plan was not imported at.
TEST_P(AStagedModel, ComputesTheWholeModelsLossAtAnotherBatchSize) {
  const auto inputs = token_inputs(3, 32, 11);
  EXPECT_NEAR(staged_loss(inputs, 3), whole_loss(inputs, 3), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(GptTiny, AStagedModel, ::testing::Values(2, 3, 5),
                         [](const auto& info) { return std::to_string(info.param) + "Stages"; });

// A zoo GPT whose causal mask ([1024, 1024] bool, 1 MiB: a Constant node every stage computes) is written once, to
// weights/stage_constants.bin, and read from there by every stage file, as `apart run` reads them (base folder:
// the plan's).
TEST(AStagedModelWithALargeMask, ReadsTheMaskFromOneFileAndComputesTheWholeModelsLoss) {
  testing::TempDir dir;
  models::ZooOptions zoo = models::options_for("gpt");
  zoo.seq = 1024;
  zoo.hidden = 16;
  zoo.vocab = 64;
  const fs::path model = dir / "gpt.onnx";
  models::write_zoo_model(zoo, model.string());

  constexpr int kStages = 3;
  CompileOptions o;
  o.model = model;
  o.cluster.device = "a100-80gb";
  o.cluster.devices = kStages;
  o.partition.training.global_batch = 1;
  o.partition.stage.stages = kStages;
  o.partition.stage.replicas = 1;
  o.partition.stage.microbatches = 1;
  o.baselines = false;
  const fs::path plan = dir / "plan";
  o.output = PlanFiles{.directory = plan};
  compile(o);

  const uintmax_t mask_bytes = 1024 * 1024;
  EXPECT_EQ(fs::file_size(plan / "weights" / kStageConstantsFile), mask_bytes) << "one copy of the mask";
  std::map<std::string, Tensor> available = token_inputs(1, zoo.seq, 5);
  for (auto& [name, tensor] : available)
    for (int64_t& x : tensor.span<int64_t>()) x %= zoo.vocab;
  const std::map<std::string, Tensor> inputs = available;
  ImportOptions import;
  import.dims["batch"] = 1;
  for (int k = 0; k < kStages; ++k) {
    const fs::path file = plan / ("stage_" + std::to_string(k) + ".onnx");
    EXPECT_LT(fs::file_size(file), mask_bytes) << file;
    const onnx::ModelProto stage = testing::read_proto(file);
    std::map<std::string, Tensor> stage_inputs;
    for (const auto& in : stage.graph().input()) stage_inputs.emplace(in.name(), available.at(in.name()));
    Executor exec(stage, plan, {}, import);
    for (auto& [name, tensor] : exec.run(stage_inputs)) available[name] = tensor.clone();
  }
  const ImportedModel imported = import_model(model, import);
  Executor whole(imported);
  const NamedTensors out = whole.run(inputs);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NEAR(available.at("loss").data<float>()[0], out.at(0).second.data<float>()[0], 1e-5);
}

}  // namespace
}  // namespace apart
