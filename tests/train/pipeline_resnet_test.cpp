// apart run on a ResNet (BatchNormalization in training mode) against apart train: equal with one micro-batch per
// stage; with micro-batches or replicas each BatchNorm normalises its own slice, as one process does on that slice.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "importer/importer.h"
#include "models/zoo.h"
#include "train/data.h"
#include "train/pipeline.h"
#include "train/trainer.h"
#include "tests/train/pipeline_fixture.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using namespace apart::testing;

fs::path scratch(const std::string& name) { return testing::scratch("pipeline_resnet_test", name); }

// The smallest ResNet the zoo makes (depth 50, width 1, 32×32 images), 4 classes; written once per binary.
std::string small_resnet() {
  static const std::string path = [] {
    models::ZooOptions z = models::options_for("resnet");
    z.layers = 50;
    z.image = 32;
    z.classes = 4;
    const fs::path file = scratch("resnet_model") / "resnet.onnx";
    models::write_zoo_model(z, file.string());
    return file.string();
  }();
  return path;
}

constexpr int64_t kResnetBatch = 4;
constexpr double kResnetLr = 1e-3;  // its synthetic task starts with gradient norms ~4e4: lr 0.05 diverges

// One pipeline micro-batch holds the whole batch, so every BatchNorm normalises over the same samples as in one
// process: the run must equal apart train.
TEST(ASmallResnet, OnTwoStagesWithOneMicroBatchTrainsAsOneProcess) {
  const fs::path dir = scratch("resnet_two_stages");
  constexpr int64_t kSteps = 2;
  const Outcome reference = train_reference(small_resnet(), kResnetBatch, kSteps, dir, kResnetLr);
  const fs::path plan = make_plan(small_resnet(), {{1, 1}, 1, Schedule::k1F1B, {}}, kResnetBatch, dir / "plan");
  const Outcome run = run_threads(plan, kSteps, dir, Optimizer::kSgd, kResnetLr);
  expect_same_training(reference, run, read_weights(small_resnet()), "resnet, 2 stages, 1 micro-batch");
  expect_split(run, total_params(reference.weights));
}

// With several micro-batches or replicas each BatchNorm normalises over its own slice of the batch (as PyTorch
// DDP without SyncBatchNorm, and gradient accumulation, do). So step 1's loss is the mean of the losses one process
// gets on each slice alone, and its update the mean of their updates; the model's running statistics do not
// enter (training-mode BatchNorm uses batch statistics only). Oracle: apart train at the slice's batch, on that
// slice's samples (.npy files cut from the synthetic batch both runs draw).
struct SliceCase {
  const char* name;
  Shape shape;
};

class ASmallResnetWithSlices : public ::testing::TestWithParam<SliceCase> {};

TEST_P(ASmallResnetWithSlices, NormalisesEachSliceAloneAsOneProcessDoesOnIt) {
  const SliceCase& c = GetParam();
  const fs::path dir = scratch(std::string("resnet_") + c.name);
  constexpr int64_t kSlices = 2, kSlice = kResnetBatch / kSlices;
  // One step only, so a larger lr is safe, and needed: the BatchNorm scales start at 1, where float32 rounds a
  // weight to 6e-8, and at lr 1e-3 their updates are small enough for that to be 1 % of them.
  constexpr double kSliceLr = 0.05;

  // The batch of step 1, as apart train and apart run draw it (seed 3, synthetic), cut into its two slices.
  ImportOptions whole;
  whole.batch = kResnetBatch;
  whole.batch_explicit = true;
  const ImportedModel model = import_model(small_resnet(), whole);
  DataOptions data;
  data.seed = 3;
  const std::map<std::string, Tensor> batch = make_data_source(data, classify_inputs(model.graph))->batch(0);
  Outcome reference;
  const Weights initial = read_weights(small_resnet());
  for (const auto& [name, t] : initial.by_name) {  // a deep copy: Tensor copies share their bytes
    Tensor copy(t.dtype(), t.shape());
    std::memcpy(copy.raw(), t.raw(), static_cast<size_t>(t.bytes()));
    reference.weights.by_name[name] = copy;
  }
  double loss_sum = 0;
  for (int64_t k = 0; k < kSlices; ++k) {
    std::string spec;
    for (const auto& [name, t] : batch) {
      std::vector<int64_t> shape = t.shape();
      const int64_t row = t.bytes() / shape[0];
      shape[0] = kSlice;
      Tensor slice(t.dtype(), shape);
      std::memcpy(slice.raw(), t.raw() + k * kSlice * row, static_cast<size_t>(kSlice * row));
      const fs::path file = dir / (name + "_" + std::to_string(k) + ".npy");
      write_npy(file, slice);
      spec += (spec.empty() ? "" : ",") + name + "=" + file.string();
    }
    TrainOptions o;
    o.model = small_resnet();
    o.batch = kSlice;
    o.steps = 1;
    o.optimizer.kind = Optimizer::kSgd;
    o.optimizer.lr = kSliceLr;
    o.seed = 3;
    o.data.spec = spec;
    o.save_model = (dir / ("slice_" + std::to_string(k) + ".onnx")).string();
    loss_sum += train(o).steps.at(0).loss;
    // SGD: the update is −lr × the gradient, so the mean of the slices' updates is the update of their mean gradient.
    for (auto& [name, w] : read_weights(o.save_model).by_name) {
      if (w.dtype() != DType::kFloat32) continue;
      auto acc = reference.weights.by_name.at(name).span<float>();
      const auto w0 = initial.by_name.at(name).span<const float>();
      const auto wk = w.span<const float>();
      for (size_t i = 0; i < acc.size(); ++i) acc[i] += (wk[i] - w0[i]) / static_cast<float>(kSlices);
    }
  }
  reference.losses = {loss_sum / kSlices};

  const fs::path plan = make_plan(small_resnet(), c.shape, kResnetBatch, dir / "plan");
  const Outcome run = run_threads(plan, 1, dir, Optimizer::kSgd, kSliceLr);
  expect_same_training(reference, run, initial, c.name);
  // And not what one process computes on the whole batch: the slices' statistics really differ.
  const Outcome whole_batch = train_reference(small_resnet(), kResnetBatch, 1, dir, kSliceLr);
  ASSERT_EQ(run.losses.size(), 1u);
  EXPECT_GT(std::abs(run.losses[0] - whole_batch.losses[0]), 1e-3 * std::abs(whole_batch.losses[0]));
}

INSTANTIATE_TEST_SUITE_P(
    Slices, ASmallResnetWithSlices,
    ::testing::Values(SliceCase{"two_stages_two_microbatches", {{1, 1}, 2, Schedule::kGPipe, {}}},
                      SliceCase{"one_stage_two_replicas", {{2}, 1, Schedule::k1F1B, {}}}),
    [](const ::testing::TestParamInfo<SliceCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace apart
