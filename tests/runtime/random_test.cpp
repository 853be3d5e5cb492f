// Dropout's masks are counter-based: a function of (seed, step, micro-batch, node name), nothing else.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "importer/importer.h"
#include "tests/support/onnx_builder.h"
#include "runtime/executor.h"
#include "runtime/random.h"

namespace apart {
namespace {

using testing::OnnxBuilder;

constexpr int64_t kRows = 64, kCols = 64;

// y = Dropout(x · prefix, ratio 0.25, training), its mask an output; `extra_nodes` Identity nodes run before it,
// so the Dropout node sits at another index (as in a stage file cut from a bigger model).
std::filesystem::path dropout_model(const std::string& file, int extra_nodes, int64_t seed_attr = -1) {
  OnnxBuilder b;
  b.input({"x", DType::kFloat32, {kRows, kCols}});
  Tensor ratio(DType::kFloat32, {});
  ratio.data<float>()[0] = 0.25f;
  Tensor training(DType::kBool, {});
  training.data<bool>()[0] = true;
  b.initializer(ratio, "ratio").initializer(training, "training");
  std::string in = "x";
  for (int i = 0; i < extra_nodes; ++i) {
    const std::string out = "id" + std::to_string(i);
    b.node("Identity", {in}, {out}, "identity_" + std::to_string(i));
    in = out;
  }
  onnx::NodeProto& d = b.node("Dropout", {in, "ratio", "training"}, {"y", "mask"}, "/drop/Dropout");
  if (seed_attr >= 0) OnnxBuilder::set_int(d, "seed", seed_attr);
  b.output({"y", DType::kFloat32, {kRows, kCols}}).output({"mask", DType::kBool, {kRows, kCols}});
  return b.write(file);
}

std::vector<bool> mask_of(const std::filesystem::path& path, const RandomKey& key) {
  ImportedModel m = import_model(path);
  Executor exec(m);
  Tensor x(DType::kFloat32, {kRows, kCols});
  for (auto& v : x.span<float>()) v = 1.f;
  const NamedTensors out = exec.run({{"x", x}}, key);
  std::vector<bool> mask;
  for (bool keep : out.at(1).second.span<const bool>()) mask.push_back(keep);
  return mask;
}

TEST(ADropoutMask, IsTheSameForTheSameSeedStepAndMicroBatch) {
  const auto path = dropout_model("dropout_same.onnx", 0);
  EXPECT_EQ(mask_of(path, {7, 3, 1}), mask_of(path, {7, 3, 1}));
}

TEST(ADropoutMask, IsTheSameInAnotherExecutorAsWhenARunResumesOrAReplicaRecomputes) {
  const auto path = dropout_model("dropout_resume.onnx", 0);
  const std::vector<bool> first = mask_of(path, {7, 3, 1});
  ImportedModel m = import_model(path);
  Executor other(m);
  Tensor x(DType::kFloat32, {kRows, kCols});
  other.run({{"x", x}}, {7, 0, 0});  // other draws first, as a process that ran earlier steps
  EXPECT_EQ(mask_of(path, {7, 3, 1}), first);
}

TEST(ADropoutMask, DependsOnTheNodesNameNotOnItsPositionInTheGraph) {
  EXPECT_EQ(mask_of(dropout_model("dropout_at0.onnx", 0), {7, 3, 1}),
            mask_of(dropout_model("dropout_at3.onnx", 3), {7, 3, 1}));
}

TEST(ADropoutMask, DiffersBetweenSeedsStepsMicroBatchesAndSeedAttributes) {
  const auto path = dropout_model("dropout_differs.onnx", 0);
  const std::vector<bool> base = mask_of(path, {7, 3, 1});
  EXPECT_NE(mask_of(path, {8, 3, 1}), base);
  EXPECT_NE(mask_of(path, {7, 4, 1}), base);
  EXPECT_NE(mask_of(path, {7, 3, 2}), base);
  EXPECT_NE(mask_of(dropout_model("dropout_seeded.onnx", 0, 5), {7, 3, 1}), base);
}

TEST(ADropoutMask, KeepsAboutOneMinusTheRatioOfTheElements) {
  const std::vector<bool> mask = mask_of(dropout_model("dropout_rate.onnx", 0), {1, 0, 0});
  int64_t kept = 0;
  for (bool keep : mask) kept += keep;
  // 4096 Bernoulli(0.75) draws: mean 3072, standard deviation 27.7; ±5σ.
  EXPECT_NEAR(static_cast<double>(kept), 3072.0, 140.0);
}

TEST(TheRandomStream, IsAPureFunctionOfItsKeyAndNode) {
  static_assert(random_stream({1, 2, 3}, 4) == random_stream({1, 2, 3}, 4));
  static_assert(random_stream({1, 2, 3}, 4) != random_stream({1, 3, 2}, 4));
  static_assert(random_uniform(~0ull) < 1.0);
  EXPECT_NE(random_bits(random_stream({1, 2, 3}, 4), 0), random_bits(random_stream({1, 2, 3}, 4), 1));
}

}  // namespace
}  // namespace apart
