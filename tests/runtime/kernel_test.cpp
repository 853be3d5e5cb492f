// Kernels through the executor on one-node models: semantics the ONNX corpus covers thinly.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "graph/error.h"
#include "importer/importer.h"
#include "runtime/executor.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {

using testing::Io;
using testing::OnnxBuilder;

Tensor iota(DType dtype, std::vector<int64_t> shape, float scale = 1.f) {
  Tensor t(dtype, std::move(shape));
  for (int64_t i = 0; i < t.elements(); ++i) t.data<float>()[i] = scale * static_cast<float>(i % 7) - 2.f;
  return t;
}

Tensor run_one(OnnxBuilder& b, const std::string& file, const std::map<std::string, Tensor>& inputs) {
  ImportedModel m = import_model(b.write(file));
  Executor exec(m);
  return exec.run(inputs).at(0).second;
}

TEST(TheExecutor, NamesTheNodeAndOpItHasNoKernelFor) {
  OnnxBuilder b;
  b.input({"x", DType::kFloat32, {2}}).output({"y", DType::kFloat32, {2}});
  b.node("Acosh", {"x"}, {"y"}, "my_node");
  ImportedModel m = import_model(b.write("unsupported.onnx"));
  try {
    Executor exec(m);
    FAIL() << "expected Unsupported";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("my_node"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Acosh"), std::string::npos) << e.what();
  }
}

TEST(TheExecutor, RefusesInputsOfTheWrongShape) {
  OnnxBuilder b;
  b.input({"x", DType::kFloat32, {2}}).output({"y", DType::kFloat32, {2}});
  b.node("Relu", {"x"}, {"y"});
  ImportedModel m = import_model(b.write("relu.onnx"));
  Executor exec(m);
  EXPECT_THROW(exec.run({{"x", Tensor(DType::kFloat32, {3})}}), InvalidArgument);
  EXPECT_THROW(exec.run({}), InvalidArgument);
}

TEST(Softmax, CoercesTo2DBeforeOpset13AndNormalisesOneAxisFrom13) {
  for (int64_t opset : {11, 13}) {
    OnnxBuilder b(opset);
    b.input({"x", DType::kFloat32, {2, 3, 4}}).output({"y", DType::kFloat32, {2, 3, 4}});
    OnnxBuilder::set_int(b.node("Softmax", {"x"}, {"y"}), "axis", 1);
    Tensor y = run_one(b, "softmax" + std::to_string(opset) + ".onnx", {{"x", iota(DType::kFloat32, {2, 3, 4})}});
    double first_block = 0, column = 0;
    for (int i = 0; i < 12; ++i) first_block += y.data<float>()[i];
    for (int i = 0; i < 3; ++i) column += y.data<float>()[i * 4];
    if (opset == 11) EXPECT_NEAR(first_block, 1.0, 1e-5);  // one softmax over 3×4
    else EXPECT_NEAR(column, 1.0, 1e-5);                    // one softmax per (batch, last-dim) column
  }
}

TEST(Softmax, AndLogSoftmaxOverAVocabularyRowMatchADoublePrecisionOracleToAFewUlps) {
  // A GPT-2 vocabulary row of logits in [-8, 8]: a float running sum of its 50,257 exponentials drifts by ~1e-5 of
  // the sum (the CUDA kernel's tree sum does not), so the CPU kernel sums in double.
  const int64_t n = 50257;
  Tensor x(DType::kFloat32, {1, n});
  std::mt19937 rng(71);
  std::uniform_real_distribution<float> logit(-8.f, 8.f);
  for (float& v : x.span<float>()) v = logit(rng);
  double mx = -INFINITY, sum = 0;
  for (float v : x.span<float>()) mx = std::max(mx, double(v));
  for (float v : x.span<float>()) sum += std::exp(double(v) - mx);
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    OnnxBuilder b(13);
    b.input({"x", DType::kFloat32, {1, n}}).output({"y", DType::kFloat32, {1, n}});
    b.node(op, {"x"}, {"y"});
    const Tensor y = run_one(b, std::string(op) + "_vocab.onnx", {{"x", x}});
    double diff = 0, scale = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double e = double(x.data<float>()[j]) - mx;
      const double want = std::string(op) == "Softmax" ? std::exp(e) / sum : e - std::log(sum);
      diff = std::max(diff, std::fabs(double(y.data<float>()[j]) - want));
      scale = std::max(scale, std::fabs(want));
    }
    EXPECT_LE(diff / scale, 1e-6) << op;
  }
}

TEST(Pad, ReflectsWrapsAndRepeatsPastTheAxisLengthAsNumpyDoes) {
  const std::map<std::string, std::vector<float>> expected = {  // np.pad([0, 1, 2], (4, 5), mode)
      {"reflect", {0, 1, 2, 1, 0, 1, 2, 1, 0, 1, 2, 1}},
      {"wrap", {2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1}},
      {"edge", {0, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2}}};
  for (const auto& [mode, want] : expected) {
    OnnxBuilder b(13);
    b.input({"x", DType::kFloat32, {3}}).output({"y", DType::kFloat32, {12}}).int_initializer("pads", {4, 5});
    auto* a = b.node("Pad", {"x", "pads"}, {"y"}).add_attribute();
    a->set_name("mode"), a->set_type(onnx::AttributeProto::STRING), a->set_s(mode);
    Tensor x(DType::kFloat32, {3});
    for (int i = 0; i < 3; ++i) x.data<float>()[i] = static_cast<float>(i);
    const Tensor y = run_one(b, "pad_" + mode + ".onnx", {{"x", x}});
    EXPECT_EQ(std::vector<float>(y.data<float>(), y.data<float>() + y.elements()), want) << mode;
  }
}

TEST(Upsample, AtOpset7ReadsItsScalesAttributeAndSamplesAsymmetrically) {
  const std::map<std::string, std::vector<float>> expected = {  // x = [0, 1, 2], × 2: x_original = o / 2
      {"nearest", {0, 0, 1, 1, 2, 2}},                          // rounded down
      {"linear", {0, 0.5f, 1, 1.5f, 2, 2}}};                    // the last one clamped to the edge
  for (const auto& [mode, want] : expected) {
    OnnxBuilder b(7);
    b.input({"x", DType::kFloat32, {1, 3}}).output({"y", DType::kFloat32, {1, 6}});
    auto& n = b.node("Upsample", {"x"}, {"y"});
    auto* m = n.add_attribute();
    m->set_name("mode"), m->set_type(onnx::AttributeProto::STRING), m->set_s(mode);
    auto* scales = n.add_attribute();
    scales->set_name("scales"), scales->set_type(onnx::AttributeProto::FLOATS);
    scales->add_floats(1), scales->add_floats(2);
    Tensor x(DType::kFloat32, {1, 3});
    for (int i = 0; i < 3; ++i) x.data<float>()[i] = static_cast<float>(i);
    const Tensor y = run_one(b, "upsample_" + mode + ".onnx", {{"x", x}});
    EXPECT_EQ(std::vector<float>(y.data<float>(), y.data<float>() + y.elements()), want) << mode;
  }
}

TEST(ResizeAndPad, RefuseScalesAndPadsFromTheInputsThatWouldOverflowTheirOutput) {
  OnnxBuilder b(13);
  b.input({"x", DType::kFloat32, {1, 2}}).input({"scales", DType::kFloat32, {2}}).input({"pads", DType::kInt64, {4}});
  b.output({"r", DType::kFloat32, {}}).output({"p", DType::kFloat32, {}});
  b.node("Resize", {"x", "", "scales"}, {"r"});
  b.node("Pad", {"x", "pads"}, {"p"});
  ImportedModel m = import_model(b.write("hostile_resize_pad.onnx"));
  Executor exec(m);
  Tensor x(DType::kFloat32, {1, 2}), scales(DType::kFloat32, {2}), pads(DType::kInt64, {4});
  scales.data<float>()[0] = 1, pads.data<int64_t>()[0] = 0;
  for (const auto& [scale, pad] : {std::pair{1e30f, int64_t{1}}, std::pair{std::nanf(""), int64_t{1}},
                                   std::pair{1.0f, std::numeric_limits<int64_t>::max()},
                                   std::pair{1.0f, std::numeric_limits<int64_t>::min()}}) {
    scales.data<float>()[1] = scale;
    for (int i = 1; i < 4; ++i) pads.data<int64_t>()[i] = pad;
    EXPECT_THROW(exec.run({{"x", x}, {"scales", scales}, {"pads", pads}}), InvalidModel) << scale << " " << pad;
  }
}

TEST(MatMul, BroadcastsBatchDimsLikeNumpy) {
  OnnxBuilder b;
  b.input({"a", DType::kFloat32, {2, 1, 3, 4}}).input({"b", DType::kFloat32, {3, 4, 5}}).output({"y", DType::kFloat32, {2, 3, 3, 5}});
  b.node("MatMul", {"a", "b"}, {"y"});
  Tensor a = iota(DType::kFloat32, {2, 1, 3, 4}), bt = iota(DType::kFloat32, {3, 4, 5}, 0.5f);
  Tensor y = run_one(b, "matmul.onnx", {{"a", a}, {"b", bt}});
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{2, 3, 3, 5}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t r = 0; r < 3; ++r)
        for (int64_t c = 0; c < 5; ++c) {
          double acc = 0;
          for (int64_t k = 0; k < 4; ++k) acc += a.data<float>()[(i * 3 + r) * 4 + k] * bt.data<float>()[(j * 4 + k) * 5 + c];
          EXPECT_NEAR(y.data<float>()[((i * 3 + j) * 3 + r) * 5 + c], acc, 1e-4);
        }
}

TEST(Conv, MatchesADirectConvolutionWithGroupsStridesPadsAndDilation) {
  OnnxBuilder b;
  b.input({"x", DType::kFloat32, {1, 4, 7, 6}}).input({"w", DType::kFloat32, {6, 2, 3, 2}}).output({"y", DType::kFloat32, {}});
  b.model().mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  auto& n = b.node("Conv", {"x", "w"}, {"y"});
  OnnxBuilder::set_int(n, "group", 2);
  OnnxBuilder::set_ints(n, "strides", {2, 1});
  OnnxBuilder::set_ints(n, "pads", {1, 0, 2, 1});
  OnnxBuilder::set_ints(n, "dilations", {1, 2});
  Tensor x = iota(DType::kFloat32, {1, 4, 7, 6}), w = iota(DType::kFloat32, {6, 2, 3, 2}, 0.25f);
  Tensor y = run_one(b, "conv.onnx", {{"x", x}, {"w", w}});
  const int64_t oh = (7 + 3 - 3) / 2 + 1, ow = (6 + 1 - 3) / 1 + 1;
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{1, 6, oh, ow}));
  for (int64_t m = 0; m < 6; ++m)
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox) {
        double acc = 0;
        const int64_t g = m / 3;
        for (int64_t c = 0; c < 2; ++c)
          for (int64_t ky = 0; ky < 3; ++ky)
            for (int64_t kx = 0; kx < 2; ++kx) {
              const int64_t iy = oy * 2 - 1 + ky, ix = ox - 0 + kx * 2;
              if (iy < 0 || iy >= 7 || ix < 0 || ix >= 6) continue;
              acc += x.data<float>()[((g * 2 + c) * 7 + iy) * 6 + ix] * w.data<float>()[((m * 2 + c) * 3 + ky) * 2 + kx];
            }
        EXPECT_NEAR(y.data<float>()[(m * oh + oy) * ow + ox], acc, 1e-4);
      }
}

// Large views swapping the last two axes take the tiled copy, the rest the row-by-row one: both against the index
// formula, on odd sizes (tiles cut at the edges) and with a batch dim in front.
TEST(Transpose, MovesEveryElementWhereItsPermutationSaysOnTheTiledAndThePlainPath) {
  struct Case {
    std::vector<int64_t> shape, perm;
  };
  const Case cases[] = {{{77, 129}, {1, 0}},         {{3, 65, 70}, {0, 2, 1}}, {{5, 6}, {1, 0}},
                        {{2, 33, 3, 40}, {0, 3, 2, 1}}, {{2, 3, 50, 41}, {0, 1, 3, 2}}, {{64, 2, 96}, {2, 1, 0}}};
  int index = 0;
  for (const Case& c : cases) {
    std::vector<int64_t> out_shape;
    for (int64_t p : c.perm) out_shape.push_back(c.shape[static_cast<size_t>(p)]);
    OnnxBuilder b;
    b.input({"x", DType::kFloat32, c.shape}).output({"y", DType::kFloat32, out_shape});
    OnnxBuilder::set_ints(b.node("Transpose", {"x"}, {"y"}), "perm", c.perm);
    Tensor x(DType::kFloat32, c.shape);
    for (int64_t i = 0; i < x.elements(); ++i) x.data<float>()[i] = static_cast<float>(i);
    const Tensor y = run_one(b, "transpose" + std::to_string(index++) + ".onnx", {{"x", x}});
    ASSERT_EQ(y.shape(), out_shape);
    const size_t r = c.shape.size();
    std::vector<int64_t> in_strides(r, 1);
    for (size_t d = r - 1; d > 0; --d) in_strides[d - 1] = in_strides[d] * c.shape[d];
    for (int64_t o = 0; o < y.elements(); ++o) {
      int64_t rest = o, at = 0;  // output index digits → input offset
      for (size_t d = r; d-- > 0;) {
        at += (rest % out_shape[d]) * in_strides[static_cast<size_t>(c.perm[d])];
        rest /= out_shape[d];
      }
      ASSERT_EQ(y.data<float>()[o], static_cast<float>(at)) << "shape case " << index - 1 << " element " << o;
    }
  }
}

TEST(Reshape, CopiesZeroDimsAndInfersMinusOne) {
  OnnxBuilder b;
  b.input({"x", DType::kFloat32, {2, 3, 4}}).output({"y", DType::kFloat32, {2, 4, 3}});
  Tensor shape(DType::kInt64, {3});
  shape.data<int64_t>()[0] = 0;
  shape.data<int64_t>()[1] = -1;
  shape.data<int64_t>()[2] = 3;
  b.initializer(shape, "s");
  b.node("Reshape", {"x", "s"}, {"y"});
  Tensor y = run_one(b, "reshape.onnx", {{"x", iota(DType::kFloat32, {2, 3, 4})}});
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{2, 4, 3}));
}

}  // namespace
}  // namespace apart
