// apart train through the ops decoders and detectors export (ConvTranspose, Resize, Pad, HardSwish): a tiny model
// with each of them on the path from every weight to the loss trains, and its loss falls.
#include <gtest/gtest.h>

#include <random>

#include "runtime/tensor.h"
#include "train/trainer.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {

using testing::OnnxBuilder;

Tensor random_weights(std::vector<int64_t> shape, std::mt19937& rng, double scale) {
  Tensor t(DType::kFloat32, std::move(shape));
  std::normal_distribution<double> n(0, scale);
  for (int64_t i = 0; i < t.elements(); ++i) t.data<float>()[i] = static_cast<float>(n(rng));
  return t;
}

// x [batch, 2, 5, 5] → ConvTranspose (stride 2, pads 1, output_padding 1) [batch, 3, 10, 10] → HardSwish →
// Resize (linear, half_pixel, scales ½) [batch, 3, 5, 5] → Pad (reflect, 1) [batch, 3, 7, 7] → Conv 3×3 →
// Resize (nearest, asymmetric, floor, ×2) [batch, 1, 10, 10] → Pad (constant, 1 at the end) → loss = mean(y²).
OnnxBuilder resample_model() {
  std::mt19937 rng(17);
  OnnxBuilder b(14);
  b.input("x", {"batch", 2, 5, 5});
  b.initializer(random_weights({2, 3, 3, 3}, rng, 0.5), "up_w").initializer(random_weights({3}, rng, 0.5), "up_b");
  auto& up = b.node("ConvTranspose", {"x", "up_w", "up_b"}, {"up"});
  OnnxBuilder::set_ints(up, "strides", {2, 2});
  OnnxBuilder::set_ints(up, "pads", {1, 1, 1, 1});
  OnnxBuilder::set_ints(up, "output_padding", {1, 1});
  b.node("HardSwish", {"up"}, {"act"});
  Tensor half(DType::kFloat32, {4}), twice(DType::kFloat32, {4});
  for (int i = 0; i < 4; ++i) half.data<float>()[i] = i < 2 ? 1.0f : 0.5f, twice.data<float>()[i] = i < 2 ? 1.0f : 2.0f;
  b.initializer(half, "half").initializer(twice, "twice");
  auto string_attr = [](onnx::NodeProto& n, const char* name, const char* value) {
    auto* a = n.add_attribute();
    a->set_name(name), a->set_type(onnx::AttributeProto::STRING), a->set_s(value);
  };
  string_attr(b.node("Resize", {"act", "", "half"}, {"down"}), "mode", "linear");
  b.int_initializer("reflect_pads", {0, 0, 1, 1, 0, 0, 1, 1});
  string_attr(b.node("Pad", {"down", "reflect_pads"}, {"padded"}), "mode", "reflect");
  b.initializer(random_weights({1, 3, 3, 3}, rng, 0.5), "conv_w");
  b.node("Conv", {"padded", "conv_w"}, {"conv"});
  auto& nearest = b.node("Resize", {"conv", "", "twice"}, {"big"});
  string_attr(nearest, "coordinate_transformation_mode", "asymmetric");
  string_attr(nearest, "nearest_mode", "floor");
  b.int_initializer("end_pads", {0, 0, 0, 0, 0, 0, 1, 1});
  b.node("Pad", {"big", "end_pads"}, {"y"});
  b.node("Mul", {"y", "y"}, {"sq"});
  OnnxBuilder::set_int(b.node("ReduceMean", {"sq"}, {"loss"}), "keepdims", 0);
  b.output({"loss", DType::kFloat32, {}});
  return b;
}

// The Resize scales are float initializers, as torch's constant folding leaves them: they set a shape, so they are
// not trained (weight decay would change the shape they give).
TEST(AModelWithConvTransposeResizePadAndHardSwish, TrainsItsWeightsButNotItsResizeScalesAndItsLossFalls) {
  testing::TempDir dir;
  const auto path = dir.file("resample.onnx");
  resample_model().save(path);
  TrainOptions o;
  o.model = path.string();
  o.batch = 4;
  o.steps = 10;
  o.optimizer.kind = Optimizer::kAdam;
  o.optimizer.lr = 2e-2;
  const TrainResult r = train(o);
  EXPECT_EQ(r.param_tensors, 3);
  EXPECT_EQ(r.params, 54 + 3 + 27);
  ASSERT_EQ(r.steps.size(), 10u);
  EXPECT_LT(r.steps.back().loss, 0.5 * r.steps.front().loss)
      << "first " << r.steps.front().loss << ", last " << r.steps.back().loss;
}

}  // namespace
}  // namespace apart
