// Training graphs of whole models against finite differences: gpt-tiny (float32, sampled entries of every param)
// and ResNet-50 from `apart zoo` (float64, one direction over all params). Label slow: ~2 min under ASan+UBSan.
#include <gtest/gtest.h>
#include <onnx/checker.h>

#include <filesystem>
#include <map>
#include <random>
#include <string>

#include "codegen/autodiff.h"
#include "models/zoo.h"
#include "tests/codegen/finite_differences.h"
#include "tests/support/onnx_builder.h"
#include "tests/support/read_model.h"

namespace apart {
namespace {

using namespace apart::testing;  // OnnxBuilder, finite_differences.h

TEST(ATrainingGraph, OfGptTinyIsValidOnnxAndMatchesFiniteDifferences) {
  const auto forward = testing::read_proto(std::filesystem::path(APART_SOURCE_DIR) / "models/gpt-tiny.onnx");
  TrainingGraphOptions options;
  options.import.dims["batch"] = 2;
  const TrainingGraph tg = build_training_graph(forward, options);
  EXPECT_EQ(tg.loss_output, "loss");
  EXPECT_EQ(tg.model.graph().output(0).name(), "loss");
  EXPECT_EQ(tg.gradients.size(), static_cast<size_t>(forward.graph().initializer_size()));
  EXPECT_NO_THROW(onnx::checker::check_model(tg.model));
  expect_gradients_match(tg, gpt_inputs(2, 32, 512), kFloat, 3);
}

// ResNet-50 from `apart zoo`, BatchNormalization in training mode, every param: float64 and a direction
// over all params (docs/autodiff.md, "Checks"). Why this config: training-mode BN makes this network's loss
// vary over tiny parameter steps. At batch 2 / image 32 the layer4 BNs normalise 2 values per channel;
// hundreds of channels have a batch variance below ε = 1e-5, each such BN amplifies by up to 1/√ε ≈ 316,
// gradients reach 1e6–1e8, and float32 forwards differ from float64 ones in the loss's first digit. Batch 8
// keeps every BN at ≥ 8 values per channel (min variance 0.008), yet float32 differences along one tensor
// still do not converge (steps of 1e-2…1e-4 relative); in float64 they do, to ~1e-6 relative, from
// h ≤ 1e-8 (at 1e-6 a difference gives 2.8 for 7.9, at 1e-7 8.6). Eval-mode BN is well conditioned in float32.
TEST(ATrainingGraph, OfResNet50MatchesADirectionalFiniteDifferenceInFloat64) {
  models::ZooOptions z = models::options_for("resnet50");
  z.image = 32;
  z.classes = 10;
  z.batch = 8;
  const onnx::ModelProto forward = to_float64(models::build_zoo_model(z));
  const TrainingGraph tg = build_training_graph(forward);
  EXPECT_EQ(tg.gradients.size(), static_cast<size_t>(forward.graph().initializer_size()));
  onnx::ModelProto training_forward = forward;  // the loss as the training graph computes it
  for (auto& n : *training_forward.mutable_graph()->mutable_node())
    if (n.op_type() == "BatchNormalization") OnnxBuilder::set_int(n, "training_mode", 1);
  std::mt19937 rng(9);
  std::map<std::string, Tensor> inputs{{"input", random_tensor(DType::kFloat64, {8, 3, 32, 32}, rng)},
                                       {"labels", ints({8}, {3, 7, 0, 9, 1, 1, 4, 6})}};
  expect_directional_derivative_matches(tg, training_forward, inputs, 1e-8, 1e-4);
}

}  // namespace
}  // namespace apart
