// Training graphs: every op's backward against central finite differences; a one-layer GPT; ONNX checker;
// determinism. The whole gpt-tiny and ResNet-50 checks are in autodiff_models_test.cpp (label slow).
#include <gtest/gtest.h>
#include <onnx/checker.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <functional>
#include <limits>
#include <random>

#include "codegen/autodiff.h"
#include "graph/error.h"
#include "models/zoo.h"
#include "runtime/executor.h"
#include "tests/support/onnx_builder.h"
#include "tests/codegen/finite_differences.h"
#include "tests/support/read_model.h"

namespace apart {
namespace {

using namespace apart::testing;  // Io, OnnxBuilder, finite_differences.h

// A model computing loss = ReduceSum(op(params…) · R) for a fixed random R per output.
struct OpCase {
  std::string op;
  std::vector<std::pair<std::string, Tensor>> params;  // differentiated inputs (initializers)
  std::vector<std::pair<std::string, Tensor>> fixed;   // other initializers (indices, labels, masks…)
  std::vector<std::string> inputs;                    // node inputs in order
  std::vector<std::vector<int64_t>> out_shapes;
  std::function<void(onnx::NodeProto&)> attrs;
  DType dtype = DType::kFloat64;
  Tolerance tol = kDouble;
  int64_t opset = 17;
};

void check_op(const OpCase& c) {
  SCOPED_TRACE(c.op);
  std::mt19937 rng(3);
  OnnxBuilder b(c.opset);
  for (const auto& [name, t] : c.params) b.initializer(t, name);
  for (const auto& [name, t] : c.fixed) b.initializer(t, name);
  std::vector<std::string> outs;
  for (size_t i = 0; i < c.out_shapes.size(); ++i) outs.push_back("y" + std::to_string(i));
  auto& node = b.node(c.op, c.inputs, outs, "op");
  if (c.attrs) c.attrs(node);
  std::vector<std::string> terms;
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::string r = "r" + std::to_string(i), t = "t" + std::to_string(i);
    b.initializer(random_tensor(c.dtype, c.out_shapes[i], rng), r);
    b.node("Mul", {outs[i], r}, {t + "m"});
    b.node("ReduceSum", {t + "m"}, {t}).add_attribute()->CopyFrom([] {
      onnx::AttributeProto a;
      a.set_name("keepdims");
      a.set_type(onnx::AttributeProto::INT);
      a.set_i(0);
      return a;
    }());
    terms.push_back(t);
  }
  if (terms.size() == 1) b.node("Identity", {terms[0]}, {"loss"});
  else b.node("Sum", terms, {"loss"});
  b.output({"loss", c.dtype, {}});
  TrainingGraphOptions options;
  for (const auto& [name, t] : c.params) options.params.push_back(name);
  const TrainingGraph tg = build_training_graph(b.model(), options);
  expect_gradients_match(tg, {}, c.tol, 8);
}

std::function<void(onnx::NodeProto&)> ints_attr(const std::string& name, std::vector<int64_t> v) {
  return [name, v](onnx::NodeProto& n) { OnnxBuilder::set_ints(n, name, v); };
}
std::function<void(onnx::NodeProto&)> int_attr(const std::string& name, int64_t v) {
  return [name, v](onnx::NodeProto& n) { OnnxBuilder::set_int(n, name, v); };
}
Tensor floats(std::vector<int64_t> shape, std::vector<double> values, DType dt = DType::kFloat32) {
  Tensor t(dt, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) set(t, static_cast<int64_t>(i), values[i]);
  return t;
}
std::function<void(onnx::NodeProto&)> string_attrs(std::vector<std::pair<std::string, std::string>> values) {
  return [values](onnx::NodeProto& n) {
    for (const auto& [name, v] : values) {
      auto* a = n.add_attribute();
      a->set_name(name), a->set_type(onnx::AttributeProto::STRING), a->set_s(v);
    }
  };
}

class AGradientRule : public ::testing::Test {
 protected:
  std::mt19937 rng{11};
  Tensor r(std::vector<int64_t> shape, double lo = -1, double hi = 1, DType dt = DType::kFloat64) {
    return random_tensor(dt, std::move(shape), rng, lo, hi);
  }
};

TEST_F(AGradientRule, OfBinaryArithmeticUndoesBroadcasting) {
  for (const char* op : {"Add", "Sub", "Mul", "Div"})
    check_op({op, {{"a", r({2, 3, 4}, 0.5, 1.5)}, {"b", r({3, 1}, 0.5, 1.5)}}, {}, {"a", "b"}, {{2, 3, 4}}});
  check_op({"Pow", {{"a", r({3, 4}, 0.5, 1.5)}, {"b", r({4}, 0.5, 2)}}, {}, {"a", "b"}, {{3, 4}}});
}

TEST_F(AGradientRule, OfUnaryMathAndActivations) {
  for (const char* op : {"Sqrt", "Exp", "Log", "Erf", "Tanh", "Sigmoid", "Relu", "Neg", "Reciprocal", "Softplus", "Identity"})
    check_op({op, {{"x", r({2, 5}, 0.2, 2)}}, {}, {"x"}, {{2, 5}}});
  check_op({"Relu", {{"x", r({3, 5})}}, {}, {"x"}, {{3, 5}}});
  check_op({"LeakyRelu", {{"x", r({3, 5})}}, {}, {"x"}, {{3, 5}}, [](onnx::NodeProto& n) {
              auto* a = n.add_attribute();
              a->set_name("alpha"), a->set_type(onnx::AttributeProto::FLOAT), a->set_f(0.2f);
            }});
}

TEST_F(AGradientRule, OfMatMulAndGemm) {
  check_op({"MatMul", {{"a", r({2, 3, 4})}, {"b", r({4, 5})}}, {}, {"a", "b"}, {{2, 3, 5}}});
  check_op({"MatMul", {{"a", r({2, 1, 3, 4})}, {"b", r({3, 4, 2})}}, {}, {"a", "b"}, {{2, 3, 3, 2}}});
  check_op({"MatMul", {{"a", r({4})}, {"b", r({4, 3})}}, {}, {"a", "b"}, {{3}}});
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      check_op({"Gemm",
                {{"a", r(ta ? std::vector<int64_t>{4, 3} : std::vector<int64_t>{3, 4})},
                 {"b", r(tb ? std::vector<int64_t>{5, 4} : std::vector<int64_t>{4, 5})},
                 {"c", r({5})}},
                {}, {"a", "b", "c"}, {{3, 5}}, [ta, tb](onnx::NodeProto& n) {
                  OnnxBuilder::set_int(n, "transA", ta);
                  OnnxBuilder::set_int(n, "transB", tb);
                  auto* a = n.add_attribute();
                  a->set_name("alpha"), a->set_type(onnx::AttributeProto::FLOAT), a->set_f(0.5f);
                }});
}

TEST_F(AGradientRule, OfReductionsSoftmaxAndLayerNorm) {
  check_op({"ReduceSum", {{"x", r({2, 3, 4})}}, {{"axes", ints({1}, {1})}}, {"x", "axes"}, {{2, 4}}, int_attr("keepdims", 0)});
  check_op({"ReduceMean", {{"x", r({2, 3, 4})}}, {}, {"x"}, {{2, 3, 1}}, ints_attr("axes", {-1})});
  check_op({"ReduceMean", {{"x", r({2, 3})}}, {}, {"x"}, {{1, 1}}});
  check_op({"Softmax", {{"x", r({2, 5})}}, {}, {"x"}, {{2, 5}}});
  check_op({"LogSoftmax", {{"x", r({2, 3, 4})}}, {}, {"x"}, {{2, 3, 4}}, int_attr("axis", 1)});
  check_op({"LayerNormalization", {{"x", r({2, 3, 4})}, {"s", r({4})}, {"b", r({4})}}, {}, {"x", "s", "b"}, {{2, 3, 4}}});
}

TEST_F(AGradientRule, OfShapeOps) {
  check_op({"Transpose", {{"x", r({2, 3, 4})}}, {}, {"x"}, {{4, 2, 3}}, ints_attr("perm", {2, 0, 1})});
  check_op({"Reshape", {{"x", r({2, 6})}}, {{"shape", ints({3}, {3, 2, 2})}}, {"x", "shape"}, {{3, 2, 2}}});
  check_op({"Flatten", {{"x", r({2, 3, 2})}}, {}, {"x"}, {{2, 6}}});
  check_op({"Unsqueeze", {{"x", r({2, 3})}}, {{"axes", ints({1}, {1})}}, {"x", "axes"}, {{2, 1, 3}}});
  check_op({"Squeeze", {{"x", r({2, 1, 3})}}, {{"axes", ints({1}, {1})}}, {"x", "axes"}, {{2, 3}}});
  check_op({"Expand", {{"x", r({3, 1})}}, {{"shape", ints({3}, {2, 3, 4})}}, {"x", "shape"}, {{2, 3, 4}}});
  check_op({"Concat", {{"a", r({2, 3})}, {"b", r({2, 2})}}, {}, {"a", "b"}, {{2, 5}}, int_attr("axis", 1)});
  check_op({"Split", {{"x", r({2, 5})}}, {{"split", ints({2}, {2, 3})}}, {"x", "split"}, {{2, 2}, {2, 3}}, int_attr("axis", 1)});
  check_op({"Slice", {{"x", r({4, 5})}},
            {{"starts", ints({2}, {1, -3})}, {"ends", ints({2}, {3, 100})}, {"axes", ints({2}, {0, 1})}},
            {"x", "starts", "ends", "axes"}, {{2, 3}}});
  check_op({"Gather", {{"w", r({5, 3})}}, {{"i", ints({2, 2}, {1, 4, 1, 0})}}, {"w", "i"}, {{2, 2, 3}}});
  check_op({"Gather", {{"w", r({2, 5})}}, {{"i", ints({3}, {4, 4, -1})}}, {"w", "i"}, {{2, 3}}, int_attr("axis", 1)});
  Tensor cond(DType::kBool, {2, 3});
  for (int64_t i = 0; i < 6; ++i) cond.data<bool>()[i] = i % 2 == 0;
  check_op({"Where", {{"a", r({2, 3})}, {"b", r({3})}}, {{"c", cond}}, {"c", "a", "b"}, {{2, 3}}});
  check_op({"Cast", {{"x", r({2, 3})}}, {}, {"x"}, {{2, 3}}, int_attr("to", static_cast<int64_t>(DType::kFloat64))});
}

TEST_F(AGradientRule, OfSoftmaxCrossEntropyLoss) {
  for (const char* reduction : {"mean", "sum"})
    check_op({"SoftmaxCrossEntropyLoss", {{"s", r({4, 5})}}, {{"l", ints({4}, {1, 0, -100, 4})}}, {"s", "l"}, {{}},
              [reduction](onnx::NodeProto& n) {
                auto* a = n.add_attribute();
                a->set_name("reduction"), a->set_type(onnx::AttributeProto::STRING), a->set_s(reduction);
                OnnxBuilder::set_int(n, "ignore_index", -100);
              }});
  check_op({"SoftmaxCrossEntropyLoss", {{"s", r({2, 3, 2})}}, {{"l", ints({2, 2}, {1, 0, 2, 2})}, {"w", r({3}, 0.5, 1.5)}},
            {"s", "l", "w"}, {{}}});
}

TEST_F(AGradientRule, OfAbsIsTheSignOfXTimesTheGradientAndZeroAtZero) {
  Tensor x = r({2, 4});
  set(x, 5, 0.0);  // |x| at 0: central differences give 0, as torch's sign(0) does
  check_op({"Abs", {{"x", x}}, {}, {"x"}, {{2, 4}}});
}

TEST_F(AGradientRule, OfVariadicMeanMaxAndMinUndoesBroadcasting) {
  check_op({"Mean", {{"a", r({2, 3})}, {"b", r({3})}, {"c", r({1})}}, {}, {"a", "b", "c"}, {{2, 3}}});
  for (const char* op : {"Max", "Min"}) {
    check_op({op, {{"a", r({2, 3})}, {"b", r({3})}, {"c", r({2, 1})}}, {}, {"a", "b", "c"}, {{2, 3}}});
    check_op({op, {{"a", r({2, 3})}}, {}, {"a"}, {{2, 3}}});
  }
}

TEST_F(AGradientRule, OfMaxAndMinSplitsATieEvenlyAsCentralDifferencesDo) {
  Tensor a = r({2, 2}), b = r({2});
  set(b, 1, get(a, 1));  // a[0][1] == b[1]: half the gradient each
  for (const char* op : {"Max", "Min"}) check_op({op, {{"a", a}, {"b", b}}, {}, {"a", "b"}, {{2, 2}}});
}

TEST_F(AGradientRule, OfReduceMaxAndReduceMinGoesToTheExtremesSplittingTiesEvenly) {
  check_op({"ReduceMax", {{"x", r({2, 2, 2})}}, {}, {"x"}, {{2, 2}}, [](onnx::NodeProto& n) {
              OnnxBuilder::set_ints(n, "axes", {1});
              OnnxBuilder::set_int(n, "keepdims", 0);
            }});
  check_op({"ReduceMin", {{"x", r({2, 2, 2})}}, {}, {"x"}, {{2, 2, 1}}, ints_attr("axes", {-1})});
  check_op({"ReduceMax", {{"x", r({2, 3})}}, {}, {"x"}, {{1, 1}}});
  Tensor x = r({2, 4});
  set(x, 0, 2.0), set(x, 2, 2.0);    // a tie for row 0's maximum
  set(x, 5, -2.0), set(x, 7, -2.0);  // and for row 1's minimum
  check_op({"ReduceMax", {{"x", x}}, {}, {"x"}, {{2, 1}}, ints_attr("axes", {1})});
  check_op({"ReduceMin", {{"x", x}}, {}, {"x"}, {{2, 1}}, ints_attr("axes", {1})});
}

TEST_F(AGradientRule, OfGlobalMaxPoolGoesToEachChannelsMaximumSplittingTiesEvenly) {
  Tensor x = r({1, 2, 2, 2});
  set(x, 1, 2.0), set(x, 3, 2.0);  // channel 0's maximum is tied
  check_op({"GlobalMaxPool", {{"x", x}}, {}, {"x"}, {{1, 2, 1, 1}}});
  check_op({"GlobalMaxPool", {{"x", r({2, 3, 2})}}, {}, {"x"}, {{2, 3, 1}}});
}

TEST_F(AGradientRule, OfReduceProdIsTheProductOfTheOthersAlsoWithZeros) {
  check_op({"ReduceProd", {{"x", r({2, 3}, 0.5, 1.5)}}, {}, {"x"}, {{1, 1}}});
  Tensor x = r({3, 2}, 0.5, 1.5);
  set(x, 2, 0.0);                // row 1 has one zero: its entry gets the other's value, the other 0
  set(x, 4, 0.0), set(x, 5, 0.0);  // row 2 has two: all 0
  check_op({"ReduceProd", {{"x", x}}, {}, {"x"}, {{3}}, [](onnx::NodeProto& n) {
              OnnxBuilder::set_ints(n, "axes", {1});
              OnnxBuilder::set_int(n, "keepdims", 0);
            }});
}

TEST_F(AGradientRule, OfNegativeLogLikelihoodLossScattersTheWeightsIntoTheTargetClasses) {
  for (const char* reduction : {"mean", "sum", "none"})
    check_op({"NegativeLogLikelihoodLoss", {{"p", r({4, 5})}}, {{"l", ints({4}, {1, 0, -100, 4})}}, {"p", "l"},
              {std::string(reduction) == "none" ? std::vector<int64_t>{4} : std::vector<int64_t>{}},
              [reduction](onnx::NodeProto& n) {
                auto* a = n.add_attribute();
                a->set_name("reduction"), a->set_type(onnx::AttributeProto::STRING), a->set_s(reduction);
                OnnxBuilder::set_int(n, "ignore_index", -100);
              }});
  check_op({"NegativeLogLikelihoodLoss", {{"p", r({2, 3, 2})}}, {{"l", ints({2, 2}, {1, 0, 2, 2})}, {"w", r({3}, 0.5, 1.5)}},
            {"p", "l", "w"}, {{}}});
  check_op({"NegativeLogLikelihoodLoss", {{"p", r({3, 3})}}, {{"l", ints({3}, {0, 2, 0})}, {"w", r({3}, 0.5, 1.5)}},
            {"p", "l", "w"}, {{}}, int_attr("ignore_index", 0)});  // an ignored index that is a class
}

TEST_F(AGradientRule, OfScatterNDGivesDataTheUnscatteredGradientAndUpdatesTheGatheredOne) {
  check_op({"ScatterND", {{"d", r({4, 2})}, {"u", r({2, 2})}}, {{"i", ints({2, 1}, {3, 1})}}, {"d", "i", "u"}, {{4, 2}}});
  check_op({"ScatterND", {{"d", r({2, 3})}, {"u", r({2})}}, {{"i", ints({2, 2}, {0, 2, 1, -1})}}, {"d", "i", "u"}, {{2, 3}}});
  check_op({"ScatterND", {{"d", r({3, 2})}, {"u", r({3, 2})}}, {{"i", ints({3, 1}, {2, 0, 2})}}, {"d", "i", "u"}, {{3, 2}},
            [](onnx::NodeProto& n) {
              auto* a = n.add_attribute();
              a->set_name("reduction"), a->set_type(onnx::AttributeProto::STRING), a->set_s("add");
            }});
}

TEST_F(AGradientRule, OfTriluKeepsTheSameTriangleOfTheGradient) {
  check_op({"Trilu", {{"x", r({2, 3})}}, {}, {"x"}, {{2, 3}}});
  check_op({"Trilu", {{"x", r({2, 2, 2})}}, {{"k", ints({}, {1})}}, {"x", "k"}, {{2, 2, 2}}, int_attr("upper", 0)});
  check_op({"Trilu", {{"x", r({3, 2})}}, {{"k", ints({}, {-1})}}, {"x", "k"}, {{3, 2}}});
}

TEST_F(AGradientRule, OfConvPoolsAndBatchNorm) {
  const DType f = DType::kFloat32;
  auto conv = [&](std::function<void(onnx::NodeProto&)> attrs, std::vector<int64_t> w, std::vector<int64_t> y) {
    check_op({"Conv", {{"x", r({2, 4, 5, 5}, -1, 1, f)}, {"w", r(w, -1, 1, f)}, {"b", r({w[0]}, -1, 1, f)}}, {},
              {"x", "w", "b"}, {y}, attrs, f, kFloat});
  };
  conv({}, {3, 4, 3, 3}, {2, 3, 3, 3});
  conv([](onnx::NodeProto& n) {
    OnnxBuilder::set_ints(n, "strides", {2, 2});
    OnnxBuilder::set_ints(n, "pads", {1, 1, 1, 1});
    OnnxBuilder::set_ints(n, "dilations", {1, 2});
    OnnxBuilder::set_int(n, "group", 2);
  }, {4, 2, 3, 2}, {2, 4, 3, 3});
  check_op({"MaxPool", {{"x", r({1, 2, 4, 4}, -1, 1, f)}}, {}, {"x"}, {{1, 2, 3, 3}}, ints_attr("kernel_shape", {2, 2}),
            f, kFloat});
  check_op({"AveragePool", {{"x", r({1, 2, 4, 4}, -1, 1, f)}}, {}, {"x"}, {{1, 2, 2, 2}}, [](onnx::NodeProto& n) {
              OnnxBuilder::set_ints(n, "kernel_shape", {3, 3});
              OnnxBuilder::set_ints(n, "strides", {2, 2});
              OnnxBuilder::set_ints(n, "pads", {1, 1, 0, 0});
            }, f, kFloat});
  check_op({"GlobalAveragePool", {{"x", r({2, 3, 2, 2})}}, {}, {"x"}, {{2, 3, 1, 1}}});
  check_op({"BatchNormalization", {{"x", r({3, 2, 2, 2})}, {"s", r({2})}, {"b", r({2})}},
            {{"m", r({2})}, {"v", r({2}, 0.5, 1.5)}}, {"x", "s", "b", "m", "v"}, {{3, 2, 2, 2}}});
  // Training mode over 2 values per channel (ResNet's layer4 at batch 2, 1×1 spatial): x̂ = ±d/√(d² + ε).
  check_op({"BatchNormalization", {{"x", r({2, 3, 1, 1})}, {"s", r({3})}, {"b", r({3})}},
            {{"m", r({3})}, {"v", r({3}, 0.5, 1.5)}}, {"x", "s", "b", "m", "v"}, {{2, 3, 1, 1}}});
}

TEST_F(AGradientRule, OfConvInFloat64MatchesTightly) {
  auto conv = [&](std::function<void(onnx::NodeProto&)> attrs, std::vector<int64_t> x, std::vector<int64_t> w,
                  std::vector<int64_t> y) {
    check_op({"Conv", {{"x", r(x)}, {"w", r(w)}, {"b", r({w[0]})}}, {}, {"x", "w", "b"}, {y}, attrs});
  };
  conv({}, {2, 4, 5, 5}, {3, 4, 3, 3}, {2, 3, 3, 3});
  conv([](onnx::NodeProto& n) {  // groups, strides, asymmetric pads, dilations
    OnnxBuilder::set_ints(n, "strides", {2, 1});
    OnnxBuilder::set_ints(n, "pads", {1, 0, 0, 2});
    OnnxBuilder::set_ints(n, "dilations", {1, 2});
    OnnxBuilder::set_int(n, "group", 2);
  }, {2, 4, 5, 5}, {4, 2, 3, 2}, {2, 4, 2, 5});
  conv(ints_attr("strides", {2, 2}), {2, 4, 5, 5}, {6, 4, 1, 1}, {2, 6, 3, 3});  // ResNet's downsample
  conv(ints_attr("pads", {1, 1}), {2, 3, 6}, {2, 3, 3}, {2, 2, 6});               // 1-D
}

TEST_F(AGradientRule, OfConvTransposeMatchesWithStridesPadsGroupsOutputPaddingAndAutoPad) {
  auto conv_t = [&](std::function<void(onnx::NodeProto&)> attrs, std::vector<int64_t> x, std::vector<int64_t> w,
                    int64_t group, std::vector<int64_t> y) {
    check_op({"ConvTranspose", {{"x", r(x)}, {"w", r(w)}, {"b", r({w[1] * group})}}, {}, {"x", "w", "b"}, {y}, attrs});
  };
  conv_t({}, {2, 4, 3, 3}, {4, 3, 3, 3}, 1, {2, 3, 5, 5});
  conv_t([](onnx::NodeProto& n) {  // out = stride·(in − 1) + output_padding + extent − pads: 7 × 4
    OnnxBuilder::set_ints(n, "strides", {2, 1});
    OnnxBuilder::set_ints(n, "pads", {1, 0, 0, 1});
    OnnxBuilder::set_ints(n, "dilations", {1, 2});
    OnnxBuilder::set_ints(n, "output_padding", {1, 0});
    OnnxBuilder::set_int(n, "group", 2);
  }, {2, 4, 3, 3}, {4, 2, 3, 2}, 2, {2, 4, 7, 4});
  for (const char* auto_pad : {"SAME_UPPER", "SAME_LOWER"})  // a total crop of 1: at the end, or at the begin
    conv_t([auto_pad](onnx::NodeProto& n) {
      OnnxBuilder::set_ints(n, "strides", {2, 2});
      auto* a = n.add_attribute();
      a->set_name("auto_pad"), a->set_type(onnx::AttributeProto::STRING), a->set_s(auto_pad);
    }, {1, 2, 3, 2}, {2, 2, 3, 3}, 1, {1, 2, 6, 4});
  conv_t([](onnx::NodeProto& n) {  // output_shape past the full 9 × 7 (zeros at the end), and below it (a crop)
    OnnxBuilder::set_ints(n, "strides", {3, 2});
    OnnxBuilder::set_ints(n, "output_shape", {10, 6});
  }, {1, 2, 3, 3}, {2, 2, 3, 3}, 1, {1, 2, 10, 6});
  conv_t([](onnx::NodeProto& n) {  // 1-D
    OnnxBuilder::set_ints(n, "strides", {2});
    OnnxBuilder::set_ints(n, "pads", {1, 1});
  }, {2, 3, 4}, {3, 2, 3}, 1, {2, 2, 7});
}

TEST_F(AGradientRule, OfResizeIsTheInterpolationTransposedInEveryMode) {
  const Tensor up = floats({4}, {1, 1, 2, 1.5});  // (1, 2, 3, 2) → (1, 2, 6, 3)
  const Tensor down = ints({4}, {1, 2, 2, 3});     // (1, 2, 5, 4) → sizes, a downsample
  using Modes = std::vector<std::pair<std::string, std::string>>;
  const std::vector<Modes> variants = {
      {{"mode", "nearest"}, {"coordinate_transformation_mode", "asymmetric"}, {"nearest_mode", "floor"}},
      {{"mode", "nearest"}, {"coordinate_transformation_mode", "half_pixel"}, {"nearest_mode", "round_prefer_floor"}},
      {{"mode", "nearest"}, {"coordinate_transformation_mode", "pytorch_half_pixel"}, {"nearest_mode", "round_prefer_floor"}},
      {{"mode", "nearest"}, {"coordinate_transformation_mode", "align_corners"}, {"nearest_mode", "round_prefer_ceil"}},
      {{"mode", "nearest"}, {"coordinate_transformation_mode", "tf_half_pixel_for_nn"}, {"nearest_mode", "ceil"}},
      {{"mode", "linear"}, {"coordinate_transformation_mode", "half_pixel"}},
      {{"mode", "linear"}, {"coordinate_transformation_mode", "pytorch_half_pixel"}},
      {{"mode", "linear"}, {"coordinate_transformation_mode", "align_corners"}},
      {{"mode", "linear"}, {"coordinate_transformation_mode", "asymmetric"}},
      {{"mode", "cubic"}, {"coordinate_transformation_mode", "half_pixel"}},
      {{"mode", "cubic"}, {"coordinate_transformation_mode", "align_corners"}}};
  for (const Modes& modes : variants) {
    SCOPED_TRACE(modes[0].second + " " + modes[1].second);
    check_op({"Resize", {{"x", r({1, 2, 3, 2})}}, {{"scales", up}}, {"x", "", "scales"}, {{1, 2, 6, 3}}, string_attrs(modes)});
    check_op({"Resize", {{"x", r({1, 2, 5, 4})}}, {{"sizes", down}}, {"x", "", "", "sizes"}, {{1, 2, 2, 3}}, string_attrs(modes)});
  }
  check_op({"Resize", {{"x", r({1, 1, 4, 5})}}, {{"sizes", ints({4}, {1, 1, 3, 7})}}, {"x", "", "", "sizes"}, {{1, 1, 3, 7}},
            [](onnx::NodeProto& n) {
              string_attrs({{"mode", "cubic"}})(n);
              OnnxBuilder::set_int(n, "exclude_outside", 1);
            }});
  // tf_crop_and_resize: outside the roi the output is the extrapolation value, a constant with no gradient.
  check_op({"Resize", {{"x", r({1, 1, 4, 5})}}, {{"roi", floats({8}, {0, 0, 0.2, -0.1, 1, 1, 0.9, 1.2})}, {"sizes", ints({4}, {1, 1, 3, 4})}},
            {"x", "roi", "", "sizes"}, {{1, 1, 3, 4}}, [](onnx::NodeProto& n) {
              string_attrs({{"mode", "linear"}, {"coordinate_transformation_mode", "tf_crop_and_resize"}})(n);
              auto* a = n.add_attribute();
              a->set_name("extrapolation_value"), a->set_type(onnx::AttributeProto::FLOAT), a->set_f(0.5f);
            }});
}

TEST_F(AGradientRule, OfUpsampleAtOpset9IsThatOfTheResizeTheVersionConverterMakesOfIt) {
  for (const char* mode : {"nearest", "linear"})
    check_op({"Upsample", {{"x", r({1, 2, 3, 2})}}, {{"scales", floats({4}, {1, 1, 2, 3})}}, {"x", "scales"}, {{1, 2, 6, 6}},
              string_attrs({{"mode", mode}}), DType::kFloat64, kDouble, 9});
}

TEST_F(AGradientRule, OfPadResizeAndConvTransposeHoldsAtTheOpsetsPaddleAndTfExportAt) {
  // Opset 9/10 forms (Pad's pads as an attribute, Resize-10's scales as input 1): the autodiff converts to opset 13.
  check_op({"Pad", {{"x", r({2, 3, 4})}}, {}, {"x"}, {{2, 5, 7}}, [](onnx::NodeProto& n) {
              OnnxBuilder::set_ints(n, "pads", {0, 1, 2, 0, 1, 1});
              string_attrs({{"mode", "reflect"}})(n);
            }, DType::kFloat64, kDouble, 9});
  check_op({"Resize", {{"x", r({1, 2, 3, 2})}}, {{"scales", floats({4}, {1, 1, 2, 2})}}, {"x", "scales"}, {{1, 2, 6, 4}},
            string_attrs({{"mode", "linear"}}), DType::kFloat64, kDouble, 10});
  check_op({"ConvTranspose", {{"x", r({1, 2, 3, 3})}, {"w", r({2, 3, 2, 2})}}, {}, {"x", "w"}, {{1, 3, 6, 6}},
            ints_attr("strides", {2, 2}), DType::kFloat64, kDouble, 9});
  check_op({"HardSigmoid", {{"x", r({3, 4}, -4, 4)}}, {}, {"x"}, {{3, 4}}, {}, DType::kFloat64, kDouble, 9});
}

TEST_F(AGradientRule, OfPadCropsInConstantModeAndFoldsTheCopiesBackInReflectAndEdgeMode) {
  const Tensor value = floats({}, {0.25}, DType::kFloat64);
  check_op({"Pad", {{"x", r({2, 3, 4})}}, {{"pads", ints({6}, {0, 1, 2, 1, 0, 1})}, {"v", value}}, {"x", "pads", "v"},
            {{3, 4, 7}}});
  check_op({"Pad", {{"x", r({3, 5})}}, {{"pads", ints({4}, {-1, 2, 1, -2})}}, {"x", "pads"}, {{3, 5}}});  // crops too
  for (const char* mode : {"reflect", "edge"}) {
    SCOPED_TRACE(mode);
    check_op({"Pad", {{"x", r({2, 3, 4})}}, {{"pads", ints({6}, {0, 2, 3, 1, 1, 2})}}, {"x", "pads"}, {{3, 6, 9}},
              string_attrs({{"mode", mode}})});
    check_op({"Pad", {{"x", r({3, 5})}}, {{"pads", ints({4}, {2, -1, 0, 3})}}, {"x", "pads"}, {{5, 7}},
              string_attrs({{"mode", mode}})});
  }
}

TEST_F(AGradientRule, OfSliceWithStepsPutsTheGradientBackWhereTheSliceRead) {
  const int64_t lowest = std::numeric_limits<int64_t>::min();
  check_op({"Slice", {{"x", r({5, 7})}},  // rows 0, 2, 4; columns 6, 3, 0
            {{"starts", ints({2}, {0, -1})}, {"ends", ints({2}, {5, lowest})}, {"axes", ints({2}, {0, 1})},
             {"steps", ints({2}, {2, -3})}},
            {"x", "starts", "ends", "axes", "steps"}, {{3, 3}}});
  check_op({"Slice", {{"x", r({4, 7})}},  // columns 1, 3, 5
            {{"starts", ints({1}, {1})}, {"ends", ints({1}, {6})}, {"axes", ints({1}, {-1})}, {"steps", ints({1}, {2})}},
            {"x", "starts", "ends", "axes", "steps"}, {{4, 3}}});
  check_op({"Slice", {{"x", r({5, 2})}},  // rows 3, 2, 1
            {{"starts", ints({1}, {3})}, {"ends", ints({1}, {0})}, {"axes", ints({1}, {0})}, {"steps", ints({1}, {-1})}},
            {"x", "starts", "ends", "axes", "steps"}, {{3, 2}}});
}

TEST_F(AGradientRule, OfHardSigmoidHardSwishAndClipPassesTheGradientWhereTheyAreNotFlat) {
  check_op({"HardSigmoid", {{"x", r({3, 5}, -4, 4)}}, {}, {"x"}, {{3, 5}}});
  check_op({"HardSigmoid", {{"x", r({3, 5}, -3, 3)}}, {}, {"x"}, {{3, 5}}, [](onnx::NodeProto& n) {
              for (auto [name, v] : {std::pair{"alpha", 0.3f}, std::pair{"beta", 0.4f}}) {
                auto* a = n.add_attribute();
                a->set_name(name), a->set_type(onnx::AttributeProto::FLOAT), a->set_f(v);
              }
            }});
  check_op({"HardSwish", {{"x", r({4, 5}, -5, 5)}}, {}, {"x"}, {{4, 5}}});
  const Tensor lo = floats({}, {-0.4}, DType::kFloat64), hi = floats({}, {0.3}, DType::kFloat64);
  check_op({"Clip", {{"x", r({3, 4})}}, {{"lo", lo}, {"hi", hi}}, {"x", "lo", "hi"}, {{3, 4}}});
  check_op({"Clip", {{"x", r({3, 4})}}, {{"hi", hi}}, {"x", "", "hi"}, {{3, 4}}});
}

std::function<void(onnx::NodeProto&)> attrs_of(std::vector<std::pair<std::string, int64_t>> ints_,
                                                std::vector<std::pair<std::string, float>> floats_ = {}) {
  return [ints_, floats_](onnx::NodeProto& n) {
    for (const auto& [name, v] : ints_) OnnxBuilder::set_int(n, name, v);
    for (const auto& [name, v] : floats_) {
      auto* a = n.add_attribute();
      a->set_name(name), a->set_type(onnx::AttributeProto::FLOAT), a->set_f(v);
    }
  };
}

TEST_F(AGradientRule, OfGeluInBothApproximationsMatchesCentralDifferences) {
  check_op({"Gelu", {{"x", r({3, 5}, -3, 3)}}, {}, {"x"}, {{3, 5}}, nullptr, DType::kFloat64, kDouble, 20});
  check_op({"Gelu", {{"x", r({3, 5}, -3, 3)}}, {}, {"x"}, {{3, 5}}, string_attrs({{"approximate", "tanh"}}),
            DType::kFloat64, kDouble, 20});
}

TEST_F(AGradientRule, OfRmsNormalizationReachesTheInputAndTheScale) {
  check_op({"RMSNormalization", {{"x", r({2, 3, 4})}, {"s", r({4})}}, {}, {"x", "s"}, {{2, 3, 4}}, nullptr,
            DType::kFloat64, kDouble, 23});
  check_op({"RMSNormalization", {{"x", r({2, 3, 4})}, {"s", r({3, 4})}}, {}, {"x", "s"}, {{2, 3, 4}},
            attrs_of({{"axis", 1}}, {{"epsilon", 1e-3f}}), DType::kFloat64, kDouble, 23});
}

TEST_F(AGradientRule, OfRotaryEmbeddingReachesTheInputAndBothCachesInEveryLayout) {
  // 4-D [B, H, S, D] with [B, S, D/2] caches; 3-D with num_heads, interleaved, partial rotation, position_ids.
  check_op({"RotaryEmbedding", {{"x", r({2, 2, 3, 4})}, {"c", r({2, 3, 2})}, {"s", r({2, 3, 2})}}, {}, {"x", "c", "s"},
            {{2, 2, 3, 4}}, nullptr, DType::kFloat64, kDouble, 23});
  check_op({"RotaryEmbedding", {{"x", r({2, 3, 12})}, {"c", r({5, 2})}, {"s", r({5, 2})}},
            {{"pos", ints({2, 3}, {0, 1, 2, 4, 4, 1})}}, {"x", "c", "s", "pos"}, {{2, 3, 12}},
            attrs_of({{"num_heads", 2}, {"interleaved", 1}, {"rotary_embedding_dim", 4}}), DType::kFloat64, kDouble, 23});
}

TEST_F(AGradientRule, OfAttentionReachesQueriesKeysAndValuesWithGqaCausalMasksAndSoftcap) {
  // GQA (4 query heads on 2 KV heads), causal; then an additive float mask with softcap and a scale; then 3-D
  // inputs with a boolean mask shorter than the keys.
  check_op({"Attention", {{"q", r({2, 4, 3, 4})}, {"k", r({2, 2, 3, 4})}, {"v", r({2, 2, 3, 5})}}, {}, {"q", "k", "v"},
            {{2, 4, 3, 5}}, attrs_of({{"is_causal", 1}}), DType::kFloat64, kDouble, 23});
  check_op({"Attention", {{"q", r({1, 2, 3, 4}, -2, 2)}, {"k", r({1, 2, 5, 4}, -2, 2)}, {"v", r({1, 2, 5, 4})}},
            {{"m", r({3, 5})}}, {"q", "k", "v", "m"}, {{1, 2, 3, 4}}, attrs_of({}, {{"softcap", 2.f}, {"scale", 0.7f}}),
            DType::kFloat64, kDouble, 23});
  Tensor mask(DType::kBool, {1, 3, 4});
  for (int64_t i = 0; i < mask.elements(); ++i) mask.data<bool>()[i] = i % 3 != 1;
  check_op({"Attention", {{"q", r({2, 3, 8})}, {"k", r({2, 5, 4})}, {"v", r({2, 5, 6})}}, {{"m", mask}},
            {"q", "k", "v", "m"}, {{2, 3, 12}}, attrs_of({{"q_num_heads", 4}, {"kv_num_heads", 2}}), DType::kFloat64,
            kDouble, 23});
}

TEST(ATrainingGraph, TreatsArgMaxAndArgMinAsIndicesWithoutAGradient) {
  // loss = Σ Gather(w, ArgMax(w, axis 0)) · R + Σ Gather(w, ArgMin(w, axis 0)) · R: w gets its gradient through
  // the Gathers only.
  std::mt19937 rng(5);
  OnnxBuilder b;
  b.initializer(random_tensor(DType::kFloat64, {4, 3}, rng), "w");
  b.initializer(random_tensor(DType::kFloat64, {3, 3}, rng), "r");
  for (const char* op : {"ArgMax", "ArgMin"}) {
    const std::string o = op;
    OnnxBuilder::set_int(b.node(op, {"w"}, {o + "_i"}), "keepdims", 0);
    b.node("Gather", {"w", o + "_i"}, {o + "_g"});
    b.node("Mul", {o + "_g", "r"}, {o + "_m"});
  }
  b.node("Add", {"ArgMax_m", "ArgMin_m"}, {"s"});
  OnnxBuilder::set_int(b.node("ReduceSum", {"s"}, {"loss"}), "keepdims", 0);
  b.output({"loss", DType::kFloat64, {}});
  TrainingGraphOptions options;
  options.params = {"w"};
  expect_gradients_match(build_training_graph(b.model(), options), {}, kDouble, 12);
}

TEST(ATrainingGraph, RefusesAnOpWithoutAGradientRule) {
  OnnxBuilder b;
  Tensor x(DType::kFloat32, {2});
  b.initializer(x, "x").output({"y", DType::kFloat32, {}});
  b.node("Sin", {"x"}, {"p"});
  b.node("ReduceSum", {"p"}, {"y"});
  try {
    build_training_graph(b.model());
    ADD_FAILURE() << "no error";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("Sin has no gradient rule"), std::string::npos) << e.what();
  }
}

TEST(ATrainingGraph, OfGptTinyIsByteIdenticalAcrossBuilds) {
  const auto forward = testing::read_proto(std::filesystem::path(APART_SOURCE_DIR) / "models/gpt-tiny.onnx");
  TrainingGraphOptions options;
  options.import.dims["batch"] = 1;
  EXPECT_EQ(build_training_graph(forward, options).model.SerializeAsString(),
            build_training_graph(forward, options).model.SerializeAsString());
}

TEST(ATrainingGraph, OfFusedLayerNormGptMatchesFiniteDifferences) {
  models::ZooOptions z = models::options_for("gpt-tiny");
  z.layernorm = models::LayerNormStyle::kFused;
  z.layers = 1;
  z.seq = 8;
  z.batch = 2;
  const TrainingGraph tg = build_training_graph(models::build_zoo_model(z));
  EXPECT_NO_THROW(onnx::checker::check_model(tg.model));
  expect_gradients_match(tg, gpt_inputs(2, 8, 512), kFloat, 2);
}

// The one loss rule build_training_graph, apart train and apart run share.
TEST(TheLossRule, TakesTheRequestedOutputElseTheOnlyScalarFloatOneAndNamesTheChoicesOtherwise) {
  const std::vector<LossCandidate> one = {{"logits", false}, {"loss", true}};
  EXPECT_EQ(choose_loss(one, ""), "loss");
  EXPECT_EQ(choose_loss(one, "logits"), "logits");  // what the caller asked for; it checks the value itself
  auto message = [](const std::vector<LossCandidate>& outputs, const std::string& model) {
    try {
      choose_loss(outputs, "", model);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string several = message({{"a", true}, {"b", true}}, "m.onnx");
  EXPECT_EQ(several.rfind("m.onnx has several scalar float outputs ('a', 'b')", 0), 0u) << several;
  EXPECT_NE(several.find("--loss NAME"), std::string::npos) << several;
  const std::string none = message({{"logits", false}}, "the model");
  EXPECT_EQ(none.rfind("the model has no scalar float output to minimise (its outputs: 'logits')", 0), 0u) << none;
}

}  // namespace
}  // namespace apart

