// float16/bfloat16 ↔ float32: every half pattern round-trips, narrowing matches a brute-force nearest-even oracle (and
// the compiler's _Float16), the Cast kernel converts both ways, and the model pass widens what it says.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <limits>
#include <random>
#include <vector>

#include "runtime/half_precision.h"
#include "runtime/kernel.h"
#include "tests/support/temp_dir.h"

namespace apart {
namespace {

// A format's value table: patterns 0 … inf of the positive half, ordered by value as by pattern, the inf pattern
// standing for the first value past the largest finite one (2^16, 2^128), which is where nearest-even rounds to inf.
struct Format {
  DType dtype;
  int mantissa_bits;
  int bias;
  uint16_t inf;
};
constexpr Format kFloat16{DType::kFloat16, 10, 15, 0x7c00};
constexpr Format kBFloat16{DType::kBFloat16, 7, 127, 0x7f80};

// The value of a half pattern from its definition (sign, biased exponent, mantissa), in double: no bit tricks.
double defined_value(const Format& f, uint16_t bits) {
  const int exponent_bits = 15 - f.mantissa_bits;
  const int mask = (1 << exponent_bits) - 1;
  const int exponent = (bits >> f.mantissa_bits) & mask;
  const int mantissa = bits & ((1 << f.mantissa_bits) - 1);
  const double sign = bits & 0x8000 ? -1.0 : 1.0;
  if (exponent == mask) return mantissa ? std::nan("") : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(mantissa, 1 - f.bias - f.mantissa_bits);
  return sign * std::ldexp((1 << f.mantissa_bits) + mantissa, exponent - f.bias - f.mantissa_bits);
}

std::vector<double> value_table(const Format& f) {
  std::vector<double> table;
  for (uint32_t p = 0; p < f.inf; ++p) table.push_back(defined_value(f, static_cast<uint16_t>(p)));
  table.push_back(std::ldexp(1.0, (1 << (15 - f.mantissa_bits)) - 1 - f.bias));  // the value inf stands for
  return table;
}

// The oracle: the nearest table entry to |x|, ties to the even pattern; the sign copied. Exact in double.
uint16_t nearest_even(const std::vector<double>& table, const Format& f, double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= table.back()) return sign | f.inf;
  const size_t above = static_cast<size_t>(std::upper_bound(table.begin(), table.end(), a) - table.begin());
  const size_t below = above - 1;
  if (table[below] == a) return static_cast<uint16_t>(sign | below);
  const double down = a - table[below], up = table[above] - a;
  const size_t pick = down < up ? below : up < down ? above : (below % 2 == 0 ? below : above);
  return static_cast<uint16_t>(sign | pick);
}

// Every float the oracle should be asked about: each half value, each midpoint between neighbours (exact in float:
// one bit more than a half has), the floats either side of it, both signs; specials; and random bit patterns.
std::vector<float> edge_cases(const std::vector<double>& table) {
  std::vector<float> xs;
  for (size_t i = 0; i + 1 < table.size(); ++i) {
    const float mid = static_cast<float>((table[i] + table[i + 1]) / 2);
    EXPECT_EQ(static_cast<double>(mid), (table[i] + table[i + 1]) / 2);
    for (float x : {static_cast<float>(table[i]), mid, std::nextafter(mid, 0.f), std::nextafter(mid, INFINITY)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  for (float x : {0.f, -0.f, INFINITY, -INFINITY, std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::denorm_min(), 65504.f, 65519.996f, 65520.f, 1e-8f, 3e38f})
    xs.push_back(x);
  std::mt19937 rng(7);
  for (int i = 0; i < 1'000'000; ++i) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (!std::isnan(x)) xs.push_back(x);
  }
  return xs;
}

void expect_every_pattern_round_trips(const Format& format) {
  for (uint32_t p = 0; p < 65536; ++p) {
    const uint16_t bits = static_cast<uint16_t>(p);
    const float f = half_bits_to_float(format.dtype, bits);
    const double want = defined_value(format, bits);
    if (std::isnan(want)) EXPECT_TRUE(std::isnan(f)) << std::hex << p;
    else EXPECT_EQ(static_cast<double>(f), want) << std::hex << p;
    EXPECT_EQ(std::signbit(f), (p & 0x8000) != 0) << std::hex << p;
    ASSERT_EQ(float_to_half_bits(format.dtype, f), bits) << std::hex << p;
  }
}

TEST(Float16, EveryPatternWidensToItsDefinedValueAndRoundTripsBitwise) { expect_every_pattern_round_trips(kFloat16); }
TEST(BFloat16, EveryPatternWidensToItsDefinedValueAndRoundTripsBitwise) { expect_every_pattern_round_trips(kBFloat16); }

TEST(Float16, RoundsEveryEdgeCaseToNearestEvenAsTheBruteForceOracleDoes) {
  const std::vector<double> table = value_table(kFloat16);
  for (float x : edge_cases(table)) {
    ASSERT_EQ(float_to_half(x), nearest_even(table, kFloat16, x)) << x;
#ifdef __FLT16_MAX__
    const _Float16 compiler = static_cast<_Float16>(x);  // GCC's own conversion (libgcc or F16C): nearest even
    uint16_t bits;
    std::memcpy(&bits, &compiler, 2);
    ASSERT_EQ(float_to_half(x), bits) << x;
#endif
  }
  EXPECT_EQ(float_to_half(65519.996f), 0x7bff);  // just below the tie with 65536: the largest finite
  EXPECT_EQ(float_to_half(65520.f), 0x7c00);     // the tie: to even, which is inf
  EXPECT_EQ(float_to_half(0x1p-25f), 0x0000);    // half the least subnormal: a tie, to even (zero)
  EXPECT_EQ(float_to_half(0x1.8p-24f), 0x0002);  // 1.5 × the least subnormal: a tie, to even (2)
}

TEST(BFloat16, RoundsEveryEdgeCaseToNearestEvenAsTheBruteForceOracleDoes) {
  const std::vector<double> table = value_table(kBFloat16);
  for (float x : edge_cases(table)) ASSERT_EQ(float_to_bfloat16(x), nearest_even(table, kBFloat16, x)) << x;
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::max()), 0x7f80);  // past bfloat16's largest: inf
  EXPECT_EQ(float_to_bfloat16(1.0f + 0x1p-8f), 0x3f80);                     // a tie: to even (1.0)
  EXPECT_EQ(float_to_bfloat16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);          // just past it: up
}

TEST(HalfFormats, KeepNaNsAsNaNsWithTheirSignAndPayload) {
  const float quiet = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(float_to_half(quiet), 0x7e00);
  EXPECT_EQ(float_to_half(-quiet), 0xfe00);
  EXPECT_EQ(float_to_bfloat16(quiet), 0x7fc0);
  // A payload only in float32's low bits would be lost: the quiet bit keeps the value a NaN.
  const float low_payload = std::bit_cast<float>(0x7f800001u);
  EXPECT_EQ(float_to_half(low_payload), 0x7e00);
  EXPECT_EQ(float_to_bfloat16(low_payload), 0x7fc0);
  EXPECT_TRUE(std::isnan(half_to_float(0x7c01)));  // a signalling float16 NaN stays a NaN
}

TEST(DoubleToHalf, RoundsOnceWhereRoundingToFloatFirstWouldRoundTwice) {
  // 1 + 2^-11 is the tie between float16's 1 and 1 + 2^-10; a hair above it must round up. Rounding to float32 first
  // drops the hair (2^-40 is below float32's ulp at 1) and the tie then goes to even: 1.
  const double above_tie = 1.0 + 0x1p-11 + 0x1p-40;
  EXPECT_EQ(float_to_half(static_cast<float>(above_tie)), 0x3c00);  // the double rounding
  EXPECT_EQ(double_to_half(above_tie), 0x3c01);
  EXPECT_EQ(double_to_half(1.0 + 0x1p-11 - 0x1p-40), 0x3c00);
  EXPECT_EQ(double_to_bfloat16(1.0 + 0x1p-8 + 0x1p-40), 0x3f81);
  EXPECT_EQ(double_to_half(1e300), 0x7c00);
  EXPECT_EQ(double_to_half(-1e-300), 0x8000);
  // Against the oracle on random doubles spread over float16's range.
  const std::vector<double> table = value_table(kFloat16);
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> exponent(-27, 17), mantissa(1, 2);
  for (int i = 0; i < 200'000; ++i) {
    const double x = std::ldexp(mantissa(rng), static_cast<int>(exponent(rng))) * (i % 2 ? -1 : 1);
    ASSERT_EQ(double_to_half(x), nearest_even(table, kFloat16, x)) << x;
  }
}

// The Cast kernel on its own (the executor widens half models, so a model run would never hand it a half tensor).
Tensor cast(const Tensor& x, DType to) {
  Task task;
  task.op_type = "Cast";
  task.outputs.push_back(ValueId(0));
  Attribute a;
  a.name = "to";
  a.type = Attribute::Type::kInt;
  a.i = static_cast<int64_t>(to);
  task.attributes.push_back(a);
  std::vector<Tensor> outputs(1);
  const std::vector<std::pair<std::string, Tensor>> no_tensor_attributes;
  KernelContext ctx(task, 17, {&x}, no_tensor_attributes, outputs,
                    [](size_t, DType dtype, const std::vector<int64_t>& shape) { return Tensor(dtype, shape); });
  find_kernel("Cast")(ctx);
  return outputs[0];
}

Tensor halves(DType dtype, const std::vector<uint16_t>& bits) {
  Tensor t(dtype, {static_cast<int64_t>(bits.size())});
  std::memcpy(t.raw(), bits.data(), bits.size() * 2);
  return t;
}

TEST(TheCastKernel, ConvertsFloat16AndBFloat16ToAndFromFloat32BothWays) {
  const std::vector<float> values{0.f, -0.f, 1.f, -2.5f, 65504.f, 65520.f, 1e-7f, 0x1p-24f, INFINITY, -INFINITY, 1.0f + 0x1p-11f};
  Tensor x(DType::kFloat32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), x.data<float>());
  for (DType half : {DType::kFloat16, DType::kBFloat16}) {
    const Tensor narrow = cast(x, half);
    ASSERT_EQ(narrow.dtype(), half);
    for (size_t i = 0; i < values.size(); ++i)
      EXPECT_EQ(narrow.data<uint16_t>()[i], float_to_half_bits(half, values[i])) << dtype_name(half) << " " << values[i];
    const Tensor wide = cast(narrow, DType::kFloat32);
    ASSERT_EQ(wide.dtype(), DType::kFloat32);
    for (size_t i = 0; i < values.size(); ++i)
      EXPECT_EQ(std::bit_cast<uint32_t>(wide.data<float>()[i]),
                std::bit_cast<uint32_t>(half_bits_to_float(half, narrow.data<uint16_t>()[i])));
  }
  // To and from other types by way of float32: saturating to ints, once-rounded from double, between the halves.
  const Tensor h = halves(DType::kFloat16, {0x3c00, 0xc100, 0x7c00, 0x7e00, 0x3555});  // 1, -2.5, inf, NaN, 0.333…
  const Tensor ints = cast(h, DType::kInt32);
  EXPECT_EQ(std::vector<int32_t>(ints.data<int32_t>(), ints.data<int32_t>() + 5),
            (std::vector<int32_t>{1, -2, std::numeric_limits<int32_t>::max(), 0, 0}));
  const Tensor doubles = cast(h, DType::kFloat64);
  EXPECT_EQ(doubles.data<double>()[4], static_cast<double>(half_to_float(0x3555)));
  const Tensor b = cast(h, DType::kBFloat16);
  EXPECT_EQ(b.data<uint16_t>()[0], 0x3f80);
  EXPECT_EQ(b.data<uint16_t>()[4], float_to_bfloat16(half_to_float(0x3555)));
  Tensor d(DType::kFloat64, {1});
  d.data<double>()[0] = 1.0 + 0x1p-11 + 0x1p-40;
  EXPECT_EQ(cast(d, DType::kFloat16).data<uint16_t>()[0], 0x3c01);
  Tensor i64(DType::kInt64, {2});
  i64.data<int64_t>()[0] = 70000, i64.data<int64_t>()[1] = -3;
  const Tensor from_ints = cast(i64, DType::kFloat16);
  EXPECT_EQ(from_ints.data<uint16_t>()[0], 0x7c00);
  EXPECT_EQ(from_ints.data<uint16_t>()[1], 0xc200);
}

// A float16 model with every place half can hide: an external-data initializer, an inline one, a bfloat16 Constant,
// a Cast to float16, a RandomNormal of dtype float16, a half value_info, half inputs and outputs, and a subgraph.
onnx::ModelProto every_kind_of_half(const std::filesystem::path& dir) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  auto declare = [](onnx::ValueInfoProto* info, const std::string& name, int elem) {
    info->set_name(name);
    info->mutable_type()->mutable_tensor_type()->set_elem_type(elem);
  };
  declare(g->add_input(), "x", onnx::TensorProto::FLOAT16);
  declare(g->add_output(), "y", onnx::TensorProto::FLOAT16);
  declare(g->add_value_info(), "xw", onnx::TensorProto::FLOAT16);
  const std::vector<uint16_t> w{0x3c00, 0xc000, 0x0001, 0x7c00};  // 1, -2, the least subnormal, inf
  {
    std::ofstream out(dir / "w.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(w.data()), 8);
  }
  auto* ext = g->add_initializer();
  ext->set_name("w_external"), ext->set_data_type(onnx::TensorProto::FLOAT16), ext->add_dims(4);
  ext->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* kv = ext->add_external_data();
  kv->set_key("location"), kv->set_value("w.bin");
  tensor_to_proto(halves(DType::kFloat16, w), "w_inline", *g->add_initializer());
  auto node = [&](const std::string& op, std::vector<std::string> in, std::string out) {
    auto* n = g->add_node();
    n->set_op_type(op);
    for (auto& i : in) n->add_input(i);
    n->add_output(out);
    return n;
  };
  auto int_attribute = [](onnx::NodeProto* n, const std::string& name, int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(name), a->set_type(onnx::AttributeProto::INT), a->set_i(v);
  };
  auto* constant = node("Constant", {}, "c")->add_attribute();
  constant->set_name("value"), constant->set_type(onnx::AttributeProto::TENSOR);
  tensor_to_proto(halves(DType::kBFloat16, {0x3f80, 0xff80, 0x7fc1, 0x0001}), "", *constant->mutable_t());
  node("Mul", {"x", "w_external"}, "xw");
  int_attribute(node("Cast", {"xw"}, "xh"), "to", onnx::TensorProto::FLOAT16);
  int_attribute(node("RandomNormal", {}, "noise"), "dtype", onnx::TensorProto::FLOAT16);
  auto* branch = node("If", {"cond"}, "y")->add_attribute();
  branch->set_name("then_branch"), branch->set_type(onnx::AttributeProto::GRAPH);
  declare(branch->mutable_g()->add_output(), "xh", onnx::TensorProto::BFLOAT16);
  return m;
}

TEST(TheWideningPass, WidensEveryHalfTensorTypeAndCastAndIsIdempotent) {
  const testing::TempDir scratch("half_pass");
  const std::filesystem::path& dir = scratch.path();
  onnx::ModelProto m = every_kind_of_half(dir);
  ASSERT_TRUE(has_half_precision(m));
  const int nodes = m.graph().node_size();
  const HalfWidening widened = widen_half_precision(m, dir);
  EXPECT_EQ(widened.tensors, 3);       // both initializers and the Constant's value
  EXPECT_EQ(widened.stored_bytes, 24);
  EXPECT_EQ(widened.formats, (std::set<DType>{DType::kFloat16, DType::kBFloat16}));
  EXPECT_EQ(widened.casts, 2);         // Cast's to, RandomNormal's dtype
  EXPECT_EQ(widened.value_types, 2);   // xw, and the subgraph's output
  EXPECT_EQ(widened.inputs, (std::map<std::string, DType>{{"x", DType::kFloat16}}));
  EXPECT_EQ(widened.outputs, (std::map<std::string, DType>{{"y", DType::kFloat16}}));
  EXPECT_EQ(m.graph().node_size(), nodes);  // node indices stay the task graph's
  EXPECT_FALSE(has_half_precision(m));
  EXPECT_FALSE(widen_half_precision(m, dir).changed());

  for (const auto& init : m.graph().initializer()) {
    ASSERT_EQ(init.data_type(), onnx::TensorProto::FLOAT) << init.name();
    EXPECT_NE(init.data_location(), onnx::TensorProto::EXTERNAL) << init.name();
    const Tensor t = tensor_from_proto(init);
    EXPECT_EQ(std::vector<float>(t.data<float>(), t.data<float>() + 4),
              (std::vector<float>{1.f, -2.f, 0x1p-24f, INFINITY})) << init.name();
  }
  const Tensor c = tensor_from_proto(m.graph().node(0).attribute(0).t());
  ASSERT_EQ(c.dtype(), DType::kFloat32);
  EXPECT_EQ(c.data<float>()[0], 1.f);
  EXPECT_EQ(c.data<float>()[1], -INFINITY);
  EXPECT_TRUE(std::isnan(c.data<float>()[2]));
  EXPECT_EQ(c.data<float>()[3], bfloat16_to_float(0x0001));
  EXPECT_EQ(m.graph().node(2).attribute(0).i(), onnx::TensorProto::FLOAT);
  EXPECT_EQ(m.graph().node(3).attribute(0).i(), onnx::TensorProto::FLOAT);
  EXPECT_EQ(m.graph().input(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT);
  EXPECT_EQ(m.graph().node(4).attribute(0).g().output(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT);
}

TEST(TheWideningPass, LeavesAFloat32ModelAsItIs) {
  onnx::ModelProto m;
  m.add_opset_import()->set_version(17);
  auto* cast = m.mutable_graph()->add_node();
  cast->set_op_type("Cast");
  auto* to = cast->add_attribute();
  to->set_name("to"), to->set_type(onnx::AttributeProto::INT), to->set_i(onnx::TensorProto::DOUBLE);
  const std::string before = m.SerializeAsString();
  EXPECT_FALSE(has_half_precision(m));
  EXPECT_FALSE(widen_half_precision(m, {}).changed());
  EXPECT_EQ(m.SerializeAsString(), before);
  EXPECT_EQ(half_widening_note(HalfWidening{}), "");
}

}  // namespace
}  // namespace apart
