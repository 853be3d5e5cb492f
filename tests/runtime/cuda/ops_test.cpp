// The CUDA kernels against the CPU kernels (the reference), on random inputs of odd sizes, broadcasts and negative
// axes: one table of cases that any op family adds to. Each case runs the op's CPU kernel on host tensors and its
// CUDA kernel on device copies (a KernelContext built directly, outputs poisoned), then compares every output by
// normalised error max|gpu − cpu| / max|cpu|, or bitwise where the case's tolerance is 0. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <sstream>

#include "graph/error.h"
#include "runtime/backend.h"
#include "runtime/kernel.h"

namespace apart {
namespace {

// --- The table ------------------------------------------------------------------------

struct OpCase {
  std::string name;  // the test's name: op and what the case exercises
  std::string op;
  std::vector<Tensor> inputs;  // an undefined Tensor: an optional input left out
  std::vector<Attribute> attributes;
  size_t outputs = 1;
  double tolerance = 0;  // normalised error allowed; 0: bitwise
  int64_t opset = 17;
  uint64_t random_stream = 0;
};

constexpr double kExact = 1e-6;          // arithmetic: one rounding apart at most
constexpr double kTranscendental = 1e-5;  // exp, log, erf, tanh, pow; reductions in another order

Attribute int_attr(const std::string& name, int64_t v) {
  Attribute a;
  a.name = name, a.type = Attribute::Type::kInt, a.i = v;
  return a;
}
Attribute float_attr(const std::string& name, double v) {
  Attribute a;
  a.name = name, a.type = Attribute::Type::kFloat, a.f = v;
  return a;
}
Attribute ints_attr(const std::string& name, std::vector<int64_t> v) {
  Attribute a;
  a.name = name, a.type = Attribute::Type::kInts, a.ints = std::move(v);
  return a;
}
Attribute string_attr(const std::string& name, const std::string& v) {
  Attribute a;
  a.name = name, a.type = Attribute::Type::kString, a.s = v;
  return a;
}

// Random inputs, each from its own seed, so a case's data do not depend on the cases before it.
Tensor floats(std::vector<int64_t> shape, uint64_t seed, float lo = -3.f, float hi = 3.f) {
  Tensor t(DType::kFloat32, std::move(shape));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (float& v : t.span<float>()) v = u(rng);
  return t;
}
Tensor int64s(std::vector<int64_t> shape, uint64_t seed, int64_t lo, int64_t hi) {
  Tensor t(DType::kInt64, std::move(shape));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> u(lo, hi);
  for (int64_t& v : t.span<int64_t>()) v = u(rng);
  return t;
}
Tensor int32s(std::vector<int64_t> shape, uint64_t seed, int32_t lo, int32_t hi) {
  Tensor t(DType::kInt32, std::move(shape));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> u(lo, hi);
  for (int32_t& v : t.span<int32_t>()) v = u(rng);
  return t;
}
Tensor bools(std::vector<int64_t> shape, uint64_t seed) {
  Tensor t(DType::kBool, std::move(shape));
  std::mt19937_64 rng(seed);
  for (bool& v : t.span<bool>()) v = (rng() & 1) != 0;
  return t;
}
Tensor ints(std::vector<int64_t> values) {
  Tensor t(DType::kInt64, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.data<int64_t>());
  return t;
}
Tensor scalar(float v) {
  Tensor t(DType::kFloat32, {});
  t.data<float>()[0] = v;
  return t;
}
Tensor scalar_bool(bool v) {
  Tensor t(DType::kBool, {});
  t.data<bool>()[0] = v;
  return t;
}

std::vector<OpCase> elementwise_cases() {
  std::vector<OpCase> cases;
  for (const char* op : {"Exp", "Erf", "Tanh", "Sigmoid", "Softplus"})
    cases.push_back({std::string(op) + "OfOddSizes", op, {floats({3, 257}, 1)}, {}, 1, kTranscendental});
  for (const char* op : {"Sqrt", "Log"})
    cases.push_back({std::string(op) + "OfPositives", op, {floats({5, 129}, 2, 0.01f, 9.f)}, {}, 1, kTranscendental});
  for (const char* op : {"Relu", "Neg", "Abs", "Floor", "Ceil"})
    cases.push_back({std::string(op) + "OfFloats", op, {floats({7, 33}, 3)}, {}, 1, 0});
  cases.push_back({"ReciprocalOfFloats", "Reciprocal", {floats({7, 33}, 4, 0.1f, 5.f)}, {}, 1, kExact});
  cases.push_back({"LeakyReluWithAlpha", "LeakyRelu", {floats({9, 10}, 5)}, {float_attr("alpha", 0.2)}, 1, kExact});
  for (const char* op : {"Relu", "Neg", "Abs"})
    cases.push_back({std::string(op) + "OfInt64", op, {int64s({4, 9}, 6, -50, 50)}, {}, 1, 0});
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    cases.push_back({std::string(op) + "OfSameShapes", op, {floats({5, 77}, 7), floats({5, 77}, 8, 0.5f, 2.f)}, {}, 1, kExact});
    cases.push_back({std::string(op) + "BroadcastingABias", op, {floats({2, 3, 65}, 9), floats({65}, 10, 0.5f, 2.f)}, {}, 1,
                     kExact});
    cases.push_back({std::string(op) + "BroadcastingBothWays", op, {floats({4, 1, 6}, 11), floats({1, 3, 1}, 12, 0.5f, 2.f)},
                     {}, 1, kExact});
    cases.push_back({std::string(op) + "ByAScalar", op, {floats({3, 11}, 13), scalar(1.75f)}, {}, 1, kExact});
    cases.push_back({std::string(op) + "OfInt64Broadcast", op, {int64s({3, 4}, 14, -9, 9), int64s({4}, 15, -3, 3)}, {}, 1, 0});
  }
  cases.push_back({"PowSquares", "Pow", {floats({6, 31}, 16), scalar(2.f)}, {}, 1, kExact});
  cases.push_back({"PowOfFloatExponents", "Pow", {floats({6, 31}, 17, 0.1f, 3.f), floats({31}, 18)}, {}, 1, kTranscendental});
  cases.push_back({"PowOfInt64Exponents", "Pow", {floats({6, 5}, 19), int64s({5}, 20, 0, 3)}, {}, 1, kTranscendental});
  for (const char* op : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}) {
    cases.push_back({std::string(op) + "OfInt64Broadcast", op, {int64s({3, 1, 5}, 21, 0, 3), int64s({4, 1}, 22, 0, 3)}, {}, 1,
                     0});
    cases.push_back({std::string(op) + "OfFloats", op, {floats({3, 5}, 23), floats({5}, 24)}, {}, 1, 0});
  }
  for (const char* op : {"And", "Or", "Xor"})
    cases.push_back({std::string(op) + "Broadcasting", op, {bools({2, 3, 4}, 25), bools({3, 1}, 26)}, {}, 1, 0});
  cases.push_back({"NotOfBools", "Not", {bools({3, 7}, 27)}, {}, 1, 0});
  cases.push_back({"WhereBroadcastingAllThree", "Where", {bools({2, 1, 5}, 28), floats({1, 4, 5}, 29), floats({5}, 30)}, {},
                   1, 0});
  cases.push_back({"WhereOfInt64", "Where", {bools({6}, 31), int64s({6}, 32, -5, 5), int64s({}, 33, 7, 7)}, {}, 1, 0});
  {
    Tensor wild = floats({4, 8}, 34, -1e20f, 1e20f);
    wild.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
    wild.data<float>()[5] = 2.75f;
    cases.push_back({"CastSaturatesFloatsToInt64", "Cast", {wild}, {int_attr("to", 7)}, 1, 0});
    cases.push_back({"CastSaturatesFloatsToInt32", "Cast", {wild}, {int_attr("to", 6)}, 1, 0});
  }
  cases.push_back({"CastInt64ToFloat", "Cast", {int64s({3, 5}, 35, -1000, 1000)}, {int_attr("to", 1)}, 1, 0});
  cases.push_back({"CastFloatToBool", "Cast", {floats({3, 5}, 36, -1.f, 1.f)}, {int_attr("to", 9)}, 1, 0});
  cases.push_back({"CastBoolToFloat", "Cast", {bools({3, 5}, 37)}, {int_attr("to", 1)}, 1, 0});
  cases.push_back({"CastInt32ToInt64", "Cast", {int32s({9}, 38, -7, 7)}, {int_attr("to", 7)}, 1, 0});
  cases.push_back({"CastFloatToFloat", "Cast", {floats({9}, 39)}, {int_attr("to", 1)}, 1, 0});
  cases.push_back({"ClipWithBoundInputs", "Clip", {floats({5, 13}, 40), scalar(-0.5f), scalar(1.25f)}, {}, 1, 0, 13});
  cases.push_back({"ClipWithOnlyAnUpperBound", "Clip", {floats({5, 13}, 41), Tensor(), scalar(0.f)}, {}, 1, 0, 13});
  cases.push_back({"ClipWithAttributesBeforeOpset11", "Clip", {floats({5, 13}, 42)},
                   {float_attr("min", -1.0), float_attr("max", 0.5)}, 1, 0, 6});
  cases.push_back({"IdentityOfInt64", "Identity", {int64s({3, 3}, 43, -9, 9)}, {}, 1, 0});
  cases.push_back({"SumOfThreeBroadcastingInputs", "Sum", {floats({3, 1, 4}, 44), floats({4}, 45), floats({2, 1}, 46)}, {},
                   1, kExact});
  cases.push_back({"SumOfOneInput", "Sum", {floats({3, 4}, 47)}, {}, 1, 0});
  cases.push_back({"MeanOfTwo", "Mean", {floats({6, 7}, 48), floats({6, 7}, 49)}, {}, 1, kExact});
  cases.push_back({"MaxOfTwoBroadcasting", "Max", {floats({6, 7}, 50), floats({7}, 51)}, {}, 1, 0});
  cases.push_back({"MinOfInt64", "Min", {int64s({6, 7}, 52, -9, 9), int64s({6, 7}, 53, -9, 9)}, {}, 1, 0});
  cases.push_back({"DropoutInTrainingDrawsTheCpusMask", "Dropout", {floats({7, 301}, 54), scalar(0.3f), scalar_bool(true)},
                   {int_attr("seed", 5)}, 2, 0, 13, 0x1234567890abcdefull});
  cases.push_back({"DropoutInTrainingWithoutTheMask", "Dropout", {floats({1001}, 55), scalar(0.5f), scalar_bool(true)}, {},
                   1, 0, 13, 99});
  cases.push_back({"DropoutInInferenceCopiesAndMasksAllOnes", "Dropout", {floats({5, 5}, 56)}, {}, 2, 0, 13, 7});
  return cases;
}

std::vector<OpCase> reduce_cases() {
  std::vector<OpCase> cases;
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"}) {
    const std::string o = op;
    cases.push_back({o + "OverTheLastAxis", op, {floats({6, 1030}, 60), ints({-1})}, {}, 1, kTranscendental, 18});
    cases.push_back({o + "OverAMiddleAxisKeepingDims", op, {floats({4, 37, 9}, 61), ints({1})}, {}, 1, kTranscendental, 18});
    cases.push_back({o + "OverTheFirstAxis", op, {floats({513, 33}, 62), ints({0})}, {int_attr("keepdims", 0)}, 1,
                     kTranscendental, 18});
    cases.push_back({o + "OverOuterAndInnerAxes", op, {floats({3, 5, 7}, 63), ints({0, 2})}, {int_attr("keepdims", 0)}, 1,
                     kTranscendental, 18});
    cases.push_back({o + "OverEverything", op, {floats({17, 19, 3}, 64)}, {}, 1, kTranscendental, 18});
    cases.push_back({o + "WithAxesAttributeBeforeOpset18", op, {floats({4, 6, 5}, 65)}, {ints_attr("axes", {-2})}, 1,
                     kTranscendental, 13});
  }
  cases.push_back({"ReduceSumOfInt64", "ReduceSum", {int64s({5, 9}, 66, -100, 100), ints({1})}, {}, 1, 0, 18});
  cases.push_back({"ReduceMaxOfInt64", "ReduceMax", {int64s({5, 9}, 67, -100, 100), ints({0})}, {}, 1, 0, 18});
  cases.push_back({"ReduceProdOfSmallFloats", "ReduceProd", {floats({4, 10}, 68, 0.5f, 1.5f), ints({1})}, {}, 1,
                   kTranscendental, 18});
  cases.push_back({"ReduceSumNoopWithEmptyAxes", "ReduceSum", {floats({4, 3}, 69)}, {int_attr("noop_with_empty_axes", 1)}, 1,
                   0, 18});
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    const std::string o = op;
    cases.push_back({o + "OverTheLastAxis", op, {floats({8, 1000}, 70, -8.f, 8.f)}, {}, 1, kTranscendental, 13});
    cases.push_back({o + "OverAVocabularyRow", op, {floats({3, 50257}, 71, -8.f, 8.f)}, {}, 1, kTranscendental, 13});
    cases.push_back({o + "OverAMiddleAxis", op, {floats({2, 3, 5}, 72)}, {int_attr("axis", 1)}, 1, kTranscendental, 13});
    cases.push_back({o + "OverTheFirstAxis", op, {floats({7, 129}, 73)}, {int_attr("axis", -2)}, 1, kTranscendental, 13});
    cases.push_back({o + "CoercedTo2DBeforeOpset13", op, {floats({2, 3, 4}, 74)}, {int_attr("axis", 1)}, 1, kTranscendental,
                     11});
  }
  cases.push_back({"LayerNormalizationWithStatistics", "LayerNormalization",
                   {floats({6, 129}, 75), floats({129}, 76), floats({129}, 77)}, {float_attr("epsilon", 1e-5)}, 3,
                   kTranscendental});
  cases.push_back({"LayerNormalizationOfLongRowsWithoutBias", "LayerNormalization",
                   {floats({3, 5000}, 78, 2.f, 4.f), floats({5000}, 79)}, {}, 1, kTranscendental});
  cases.push_back({"LayerNormalizationOverTwoAxesWithABroadcastScale", "LayerNormalization",
                   {floats({3, 4, 33}, 80), floats({33}, 81), floats({4, 1}, 82)}, {int_attr("axis", -2)}, 3,
                   kTranscendental});
  return cases;
}

std::vector<OpCase> shape_cases() {
  std::vector<OpCase> cases;
  cases.push_back({"ReshapeCopyingAndInferringDims", "Reshape", {floats({2, 3, 10}, 90), ints({2, -1, 0})}, {}, 1, 0});
  cases.push_back({"FlattenAtAxis2", "Flatten", {floats({2, 3, 4, 5}, 91)}, {int_attr("axis", 2)}, 1, 0});
  cases.push_back({"SqueezeWithAxesInput", "Squeeze", {floats({3, 1, 4, 1}, 92), ints({-1, 1})}, {}, 1, 0, 13});
  cases.push_back({"UnsqueezeAtNegativeAxes", "Unsqueeze", {int64s({3, 4}, 93, 0, 9), ints({-1, 0})}, {}, 1, 0, 13});
  cases.push_back({"TransposeWithAPermutation", "Transpose", {floats({3, 5, 7}, 94)}, {ints_attr("perm", {2, 0, 1})}, 1, 0});
  cases.push_back({"TransposeReversedByDefault", "Transpose", {int64s({3, 5, 2}, 95, -9, 9)}, {}, 1, 0});
  cases.push_back({"TransposeOfFiveDimsOfBools", "Transpose", {bools({2, 3, 1, 4, 5}, 96)},
                   {ints_attr("perm", {4, 1, 3, 0, 2})}, 1, 0});
  cases.push_back({"TransposeOfHeads", "Transpose", {floats({2, 64, 4, 33}, 97)}, {ints_attr("perm", {0, 2, 1, 3})}, 1, 0});
  cases.push_back({"ConcatOnTheLastAxis", "Concat", {floats({2, 3, 5}, 98), floats({2, 3, 1}, 99), floats({2, 3, 7}, 100)},
                   {int_attr("axis", -1)}, 1, 0});
  cases.push_back({"ConcatOfInt64OnAxis0", "Concat", {int64s({2, 3}, 101, 0, 9), int64s({1, 3}, 102, 0, 9)},
                   {int_attr("axis", 0)}, 1, 0});
  cases.push_back({"ConcatOfBoolsByTheByte", "Concat", {bools({3, 5}, 103), bools({3, 2}, 104)}, {int_attr("axis", 1)}, 1, 0});
  cases.push_back({"SplitWithSizesInput", "Split", {floats({4, 10}, 105), ints({3, 7})}, {int_attr("axis", 1)}, 2, 0, 13});
  cases.push_back({"SplitIntoEqualPartsWithASmallerLast", "Split", {floats({8, 3}, 106)}, {int_attr("num_outputs", 3)}, 3, 0,
                   18});
  cases.push_back({"SliceWithStepsAndNegativeStarts", "Slice",
                   {floats({7, 9, 4}, 107), ints({-1, 1}), ints({-8, 9}), ints({0, 1}), ints({-2, 3})}, {}, 1, 0});
  cases.push_back({"SliceClampingEnds", "Slice", {int64s({5, 6}, 108, 0, 99), ints({1}), ints({1000}), ints({-1})}, {}, 1, 0});
  cases.push_back({"GatherRowsWithNegativeIndices", "Gather", {floats({50, 16}, 109), int64s({3, 7}, 110, -50, 49)}, {}, 1,
                   0});
  cases.push_back({"GatherOnAxis1WithInt32Indices", "Gather", {floats({4, 9, 3}, 111), int32s({5}, 112, 0, 8)},
                   {int_attr("axis", 1)}, 1, 0});
  cases.push_back({"GatherWithAScalarIndex", "Gather", {int64s({6, 4}, 113, 0, 9), int64s({}, 114, 2, 2)}, {}, 1, 0});
  cases.push_back({"TriluUpperOfABatch", "Trilu", {floats({2, 5, 7}, 124)}, {}, 1, 0});
  cases.push_back({"TriluLowerBelowTheDiagonal", "Trilu", {int64s({6, 4}, 125, -9, 9), ints({-1})}, {int_attr("upper", 0)}, 1,
                   0});
  cases.push_back({"ExpandToMoreDims", "Expand", {floats({3, 1}, 115), ints({2, 3, 4})}, {}, 1, 0});
  {
    // Unique rows for reduction none (ONNX leaves duplicates open); repeated rows for add (the embedding gradient).
    Tensor unique(DType::kInt64, {4, 1});
    for (int64_t i = 0; i < 4; ++i) unique.data<int64_t>()[i] = (i * 3) % 10 - (i == 2 ? 10 : 0);
    cases.push_back({"ScatterNDOfUniqueRows", "ScatterND", {floats({10, 4}, 116), unique, floats({4, 4}, 117)}, {}, 1, 0});
    cases.push_back({"ScatterNDAddingRepeatedRows", "ScatterND",
                     {floats({10, 33}, 118), int64s({64, 1}, 119, 0, 9), floats({64, 33}, 120)},
                     {string_attr("reduction", "add")}, 1, kExact});
    cases.push_back({"ScatterNDAddingElements", "ScatterND",
                     {floats({4, 5}, 121), int64s({7, 2}, 122, 0, 3), floats({7}, 123)},
                     {string_attr("reduction", "add")}, 1, kExact});
  }
  return cases;
}

std::vector<OpCase> loss_cases() {
  std::vector<OpCase> cases;
  const std::string sce = "SoftmaxCrossEntropyLoss";
  cases.push_back({sce + "MeanWithLogProb", sce, {floats({8, 11}, 130), int64s({8}, 131, 0, 10)}, {}, 2, kTranscendental});
  cases.push_back({sce + "OverAVocabulary", sce, {floats({5, 50257}, 132), int64s({5}, 133, 0, 50256)}, {}, 2,
                   kTranscendental});
  cases.push_back({sce + "SumOverExtraDims", sce, {floats({3, 7, 5}, 134), int64s({3, 5}, 135, 0, 6)},
                   {string_attr("reduction", "sum")}, 2, kTranscendental});
  cases.push_back({sce + "NoneWithIgnoreIndex", sce, {floats({9, 6}, 136), int64s({9}, 137, 0, 5)},
                   {string_attr("reduction", "none"), int_attr("ignore_index", 2)}, 1, kTranscendental});
  cases.push_back({sce + "MeanWithWeightsAndIgnoreIndex", sce,
                   {floats({12, 5}, 138), int32s({12}, 139, 0, 4), floats({5}, 140, 0.1f, 2.f)},
                   {int_attr("ignore_index", 0)}, 2, kTranscendental});
  cases.push_back({"NegativeLogLikelihoodLossMean", "NegativeLogLikelihoodLoss",
                   {floats({6, 4, 3}, 141, -5.f, 0.f), int64s({6, 3}, 142, 0, 3)}, {}, 1, kTranscendental});
  return cases;
}

std::vector<OpCase> all_cases() {
  std::vector<OpCase> cases;
  for (auto family : {elementwise_cases, reduce_cases, shape_cases, loss_cases})
    for (OpCase& c : family()) cases.push_back(std::move(c));
  return cases;
}

// --- Running a case -------------------------------------------------------------------

// The process's GPU backend, made once; nullptr without a device (why: skip_reason()).
Backend* gpu() {
  static std::unique_ptr<Backend> backend = [] {
    return cuda_device_count() > 0 ? make_backend(BackendKind::kCuda) : nullptr;
  }();
  return backend.get();
}
std::string skip_reason() {
  if (!cuda_built()) return "not a CUDA build (cmake --preset gpu)";
  try {
    make_backend(BackendKind::kCuda);
  } catch (const Error& e) {
    return std::string("no CUDA device: ") + e.what();
  }
  return "no CUDA device";
}

Task task_of(const OpCase& c) {
  Task task;
  task.name = c.name;
  task.op_type = c.op;
  task.attributes = c.attributes;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    task.inputs.push_back(c.inputs[i].defined() ? ValueId(static_cast<uint32_t>(i)) : ValueId::invalid());
  for (size_t o = 0; o < c.outputs; ++o) task.outputs.push_back(ValueId(static_cast<uint32_t>(100 + o)));
  return task;
}

// Runs `kernel` on the case: on host tensors when `device` is null, else on copies in its memory, with outputs
// filled with 0xFF bytes first (NaN, −1, an invalid bool) so an element a kernel forgets shows. Outputs on the host.
std::vector<Tensor> run(const OpCase& c, KernelFn kernel, Backend* device) {
  const Task task = task_of(c);
  std::vector<Tensor> inputs;
  for (const Tensor& t : c.inputs) inputs.push_back(device && t.defined() ? device->to_device(t) : t);
  std::vector<const Tensor*> input_ptrs;
  for (const Tensor& t : inputs) input_ptrs.push_back(t.defined() ? &t : nullptr);
  const std::vector<std::pair<std::string, Tensor>> tensor_attributes;
  std::vector<Tensor> outputs(c.outputs);
  OutputAllocator allocate = [device](size_t, DType dtype, const std::vector<int64_t>& shape) {
    if (!device) return Tensor(dtype, shape);
    Tensor probe = Tensor::over(dtype, shape, nullptr, false);
    Tensor t = Tensor::over(dtype, shape, device->allocate(std::max<int64_t>(probe.bytes(), 256)), false);
    std::vector<std::byte> poison(static_cast<size_t>(t.bytes()), std::byte{0xFF});
    if (t.bytes() > 0) device->copy_to_device(poison.data(), t.raw(), t.bytes());
    return t;
  };
  KernelContext ctx(task, c.opset, input_ptrs, tensor_attributes, outputs, allocate, c.random_stream);
  if (device) ctx.set_backend(device, [&c](size_t i) -> const Tensor& { return c.inputs.at(i); });
  kernel(ctx);
  if (device) {
    device->synchronize();
    for (Tensor& t : outputs)
      if (t.defined()) t = device->to_host(t);
  }
  return outputs;
}

// "" when `got` matches `want` within the case's tolerance; else what differs.
std::string compare(const Tensor& got, const Tensor& want, double tolerance) {
  if (got.defined() != want.defined()) return got.defined() ? "an output the CPU kernel did not write" : "a missing output";
  if (!want.defined()) return "";
  if (got.dtype() != want.dtype()) return "dtype " + std::string(dtype_name(got.dtype())) + " != " + std::string(dtype_name(want.dtype()));
  if (got.shape() != want.shape()) return "shape " + shape_string(got.shape()) + " != " + shape_string(want.shape());
  std::ostringstream why;
  const bool floating = want.dtype() == DType::kFloat32 || want.dtype() == DType::kFloat64;
  if (tolerance == 0 || !floating) {
    const int64_t es = dtype_size(want.dtype());
    for (int64_t i = 0; i < want.elements(); ++i)
      if (std::memcmp(got.raw() + i * es, want.raw() + i * es, static_cast<size_t>(es)) != 0) {
        why << "element " << i << " differs bitwise: " << got.scalar_as_double(i) << " != " << want.scalar_as_double(i);
        return why.str();
      }
    return "";
  }
  double max_diff = 0, max_ref = 0;
  int64_t worst = -1;
  for (int64_t i = 0; i < want.elements(); ++i) {
    const double a = got.scalar_as_double(i), b = want.scalar_as_double(i);
    if (std::isnan(a) != std::isnan(b)) {
      why << "element " << i << ": " << a << " != " << b;
      return why.str();
    }
    if (std::isnan(b) || a == b) continue;
    if (std::fabs(a - b) > max_diff) max_diff = std::fabs(a - b), worst = i;
    max_ref = std::max(max_ref, std::fabs(b));
  }
  const double error = max_diff == 0 ? 0 : max_diff / std::max(max_ref, std::numeric_limits<double>::min());
  if (error <= tolerance) return "";
  why << "normalised error " << error << " > " << tolerance << " (element " << worst << ": " << got.scalar_as_double(worst)
      << " != " << want.scalar_as_double(worst) << ")";
  return why.str();
}

class ACudaKernel : public ::testing::TestWithParam<OpCase> {
 protected:
  void SetUp() override {
    if (!gpu()) GTEST_SKIP() << skip_reason();
  }
};

TEST_P(ACudaKernel, MatchesTheCpuKernel) {
  const OpCase& c = GetParam();
  const KernelFn cpu_kernel = find_kernel(c.op);
  ASSERT_NE(cpu_kernel, nullptr) << c.op;
  const KernelFn cuda_kernel = gpu()->find_kernel(c.op);
  ASSERT_NE(cuda_kernel, nullptr) << c.op << " has no CUDA kernel";
  const std::vector<Tensor> want = run(c, cpu_kernel, nullptr);
  const std::vector<Tensor> got = run(c, cuda_kernel, gpu());
  for (size_t o = 0; o < c.outputs; ++o) EXPECT_EQ(compare(got[o], want[o], c.tolerance), "") << "output " << o;
}

INSTANTIATE_TEST_SUITE_P(EveryFamily, ACudaKernel, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) { return info.param.name; });

// --- Errors the device reports -----------------------------------------------------------

class ACudaKernelError : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu()) GTEST_SKIP() << skip_reason();
  }
  // The message of the InvalidArgument the CUDA kernel of `c` throws ("" when it throws none).
  static std::string invalid_argument(const OpCase& c) {
    try {
      run(c, gpu()->find_kernel(c.op), gpu());
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(ACudaKernelError, GatherNamesTheNodeAndTheIndexOutOfRange) {
  Tensor indices = ints({1, 50, 2});
  const std::string what = invalid_argument({"embedding_lookup", "Gather", {floats({50, 4}, 150), indices}, {}});
  EXPECT_NE(what.find("embedding_lookup"), std::string::npos) << what;
  EXPECT_NE(what.find("index 50"), std::string::npos) << what;
}

TEST_F(ACudaKernelError, ScatterNDNamesTheNodeAndTheIndexOutOfRange) {
  Tensor indices(DType::kInt64, {2, 1});
  indices.data<int64_t>()[0] = 1;
  indices.data<int64_t>()[1] = -11;
  const std::string what =
      invalid_argument({"embedding_grad", "ScatterND", {floats({10, 3}, 151), indices, floats({2, 3}, 152)}, {}});
  EXPECT_NE(what.find("embedding_grad"), std::string::npos) << what;
  EXPECT_NE(what.find("out of range"), std::string::npos) << what;
}

TEST_F(ACudaKernelError, SoftmaxCrossEntropyNamesTheNodeAndTheLabelOutOfRange) {
  const std::string what = invalid_argument(
      {"loss", "SoftmaxCrossEntropyLoss", {floats({3, 4}, 153), ints({0, 4, 1})}, {}});
  EXPECT_NE(what.find("'loss'"), std::string::npos) << what;
  EXPECT_NE(what.find("label 4"), std::string::npos) << what;
}

TEST(TheCudaOpTable, NamesEveryCaseUniquely) {
  std::set<std::string> names;
  for (const OpCase& c : all_cases()) EXPECT_TRUE(names.insert(c.name).second) << c.name;
}

}  // namespace
}  // namespace apart
