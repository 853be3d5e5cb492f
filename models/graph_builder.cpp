// GraphBuilder: node naming, Constant nodes, parameters, and the op patterns torch.onnx.export emits.
#include "models/graph_builder.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "graph/error.h"

namespace apart::models {

Attr attr_int(const std::string& name, int64_t v) {
  Attr a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(v);
  return a;
}

Attr attr_ints(const std::string& name, const std::vector<int64_t>& v) {
  Attr a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a.add_ints(x);
  return a;
}

Attr attr_float(const std::string& name, float v) {
  Attr a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::FLOAT);
  a.set_f(v);
  return a;
}

Attr attr_string(const std::string& name, const std::string& v) {
  Attr a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::STRING);
  a.set_s(v);
  return a;
}

int32_t onnx_float_type(FloatType t) {
  switch (t) {
    case FloatType::kFp32: return onnx::TensorProto::FLOAT;
    case FloatType::kFp16: return onnx::TensorProto::FLOAT16;
    case FloatType::kBf16: return onnx::TensorProto::BFLOAT16;
  }
  return onnx::TensorProto::FLOAT;
}

int64_t float_type_size(FloatType t) { return t == FloatType::kFp32 ? 4 : 2; }

namespace {

uint16_t float_to_half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // subnormal half (or zero): value / 2^-24, rounded to nearest even
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  const uint32_t mant_rounded = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even at bit 13
  return static_cast<uint16_t>(sign | ((mant_rounded - 0x38000000u) >> 13));
}

uint16_t float_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace

void append_float_bytes(std::string* out, float v, FloatType t) {
  char bytes[4];
  if (t == FloatType::kFp32) {
    const uint32_t u = std::bit_cast<uint32_t>(v);
    for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>((u >> (8 * i)) & 0xff);
    out->append(bytes, 4);
    return;
  }
  const uint16_t h = t == FloatType::kFp16 ? float_to_half(v) : float_to_bf16(v);
  bytes[0] = static_cast<char>(h & 0xff);
  bytes[1] = static_cast<char>(h >> 8);
  out->append(bytes, 2);
}

std::string GraphBuilder::scope_path() const {
  std::string path;
  for (const auto& s : scopes_) path += "/" + s;
  return path;
}

std::string GraphBuilder::param_prefix() const {
  std::string prefix;
  for (const auto& s : scopes_) prefix += s + ".";
  return prefix;
}

std::string GraphBuilder::next_node_name(const std::string& op) {
  const std::string base = scope_path() + "/" + op;
  const int k = op_counts_[base]++;
  return k == 0 ? base : base + "_" + std::to_string(k);
}

std::vector<std::string> GraphBuilder::node_n(const std::string& op, const std::vector<std::string>& inputs,
                                              int outputs, const std::vector<Attr>& attrs) {
  onnx::NodeProto* n = graph_->add_node();
  const std::string name = next_node_name(op);
  n->set_name(name);
  n->set_op_type(op);
  for (const auto& in : inputs) n->add_input(in);
  std::vector<std::string> outs;
  for (int i = 0; i < outputs; ++i) {
    outs.push_back(name + "_output_" + std::to_string(i));
    n->add_output(outs.back());
  }
  for (const auto& a : attrs) *n->add_attribute() = a;
  return outs;
}

std::string GraphBuilder::node_named(const std::string& op, const std::vector<std::string>& inputs,
                                     const std::string& output, const std::vector<Attr>& attrs) {
  onnx::NodeProto* n = graph_->add_node();
  n->set_name(next_node_name(op));
  n->set_op_type(op);
  for (const auto& in : inputs) n->add_input(in);
  n->add_output(output);
  for (const auto& a : attrs) *n->add_attribute() = a;
  return output;
}

std::string GraphBuilder::param(const std::string& local_name, std::vector<int64_t> dims, Init init) {
  ParamSpec p;
  p.name = param_prefix() + local_name;
  p.numel = 1;
  for (int64_t d : dims) {
    APART_CHECK(d > 0, "parameter " + p.name + " has a non-positive dim");
    p.numel *= d;
  }
  p.dims = std::move(dims);
  p.init = init;
  params_.push_back(std::move(p));
  return params_.back().name;
}

int64_t GraphBuilder::param_count() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.numel;
  return n;
}

std::string GraphBuilder::add_constant(onnx::TensorProto tensor) {
  onnx::NodeProto* n = graph_->add_node();
  const std::string name = next_node_name("Constant");
  n->set_name(name);
  n->set_op_type("Constant");
  n->add_output(name + "_output_0");
  onnx::AttributeProto* a = n->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  *a->mutable_t() = std::move(tensor);
  return name + "_output_0";
}

std::string GraphBuilder::scalar(double value) {
  return float_tensor({}, {static_cast<float>(value)});
}

std::string GraphBuilder::float_tensor(const std::vector<int64_t>& dims, const std::vector<float>& values) {
  onnx::TensorProto t;
  t.set_data_type(float_elem());
  for (int64_t d : dims) t.add_dims(d);
  std::string raw;
  raw.reserve(values.size() * float_type_size(dtype_));
  for (float v : values) append_float_bytes(&raw, v, dtype_);
  t.set_raw_data(std::move(raw));
  return add_constant(std::move(t));
}

std::string GraphBuilder::int64s(const std::vector<int64_t>& values) {
  return int64_tensor({static_cast<int64_t>(values.size())}, values);
}

std::string GraphBuilder::int64_tensor(const std::vector<int64_t>& dims, const std::vector<int64_t>& values) {
  onnx::TensorProto t;
  t.set_data_type(onnx::TensorProto::INT64);
  for (int64_t d : dims) t.add_dims(d);
  std::string raw(values.size() * 8, '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    const auto u = static_cast<uint64_t>(values[i]);
    for (int k = 0; k < 8; ++k) raw[i * 8 + k] = static_cast<char>((u >> (8 * k)) & 0xff);
  }
  t.set_raw_data(std::move(raw));
  return add_constant(std::move(t));
}

std::string GraphBuilder::bool_tensor(const std::vector<int64_t>& dims, const std::vector<uint8_t>& values) {
  onnx::TensorProto t;
  t.set_data_type(onnx::TensorProto::BOOL);
  for (int64_t d : dims) t.add_dims(d);
  t.set_raw_data(std::string(values.begin(), values.end()));
  return add_constant(std::move(t));
}

void GraphBuilder::set_type(onnx::ValueInfoProto* v, int32_t elem_type, const std::vector<int64_t>& dims) const {
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem_type);
  auto* shape = tt->mutable_shape();
  for (int64_t d : dims) {
    auto* dim = shape->add_dim();
    if (d >= 0) {
      dim->set_dim_value(d);
    } else if (batch_ > 0) {
      dim->set_dim_value(batch_);
    } else {
      dim->set_dim_param("batch");
    }
  }
}

void GraphBuilder::input(const std::string& name, int32_t elem_type, const std::vector<int64_t>& dims) {
  set_type(graph_->add_input(), elem_type, dims);
  graph_->mutable_input(graph_->input_size() - 1)->set_name(name);
}

void GraphBuilder::output(const std::string& name, int32_t elem_type, const std::vector<int64_t>& dims) {
  set_type(graph_->add_output(), elem_type, dims);
  graph_->mutable_output(graph_->output_size() - 1)->set_name(name);
}

void GraphBuilder::rename(const std::string& from, const std::string& to) {
  for (auto& n : *graph_->mutable_node()) {
    for (auto& in : *n.mutable_input()) if (in == from) in = to;
    for (auto& out : *n.mutable_output()) if (out == from) out = to;
  }
}

std::string GraphBuilder::linear(const std::string& module, const std::string& x, int64_t in, int64_t out, bool bias,
                                 Init w, Init b) {
  auto s = scope(module);
  // torch stores nn.Linear weights as [out, in]; the exporter folds the transpose into an [in, out] initializer.
  const std::string weight = param("weight", {in, out}, w);
  std::string y = node("MatMul", {x, weight});
  if (bias) y = node("Add", {param("bias", {out}, b), y});
  return y;
}

std::string GraphBuilder::layer_norm(const std::string& module, const std::string& x, int64_t dim, float eps,
                                     LayerNormStyle style) {
  auto s = scope(module);
  const std::string weight = param("weight", {dim}, Init::ones());
  const std::string bias = param("bias", {dim}, Init::zeros());
  if (style == LayerNormStyle::kFused) {
    return node("LayerNormalization", {x, weight, bias}, {attr_int("axis", -1), attr_float("epsilon", eps)});
  }
  // torch <= 1.13 at opset < 17: ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add.
  const std::string mean = node("ReduceMean", {x}, {attr_ints("axes", {-1})});
  const std::string centered = node("Sub", {x, mean});
  const std::string sq = node("Pow", {centered, scalar(2.0)});
  const std::string var = node("ReduceMean", {sq}, {attr_ints("axes", {-1})});
  const std::string std_dev = node("Sqrt", {node("Add", {var, scalar(eps)})});
  const std::string normed = node("Div", {centered, std_dev});
  return node("Add", {node("Mul", {normed, weight}), bias});
}

std::string GraphBuilder::rms_norm(const std::string& module, const std::string& x, int64_t dim, float eps) {
  auto s = scope(module);
  const std::string weight = param("weight", {dim}, Init::ones());
  // HF T5LayerNorm: x * rsqrt(mean(x^2) + eps) * weight.
  const std::string var = node("ReduceMean", {node("Pow", {x, scalar(2.0)})}, {attr_ints("axes", {-1})});
  const std::string inv = node("Reciprocal", {node("Sqrt", {node("Add", {var, scalar(eps)})})});
  return node("Mul", {weight, node("Mul", {x, inv})});
}

std::string GraphBuilder::gelu(const std::string& module, const std::string& x) {
  auto s = scope(module);
  const std::string erf = node("Erf", {node("Div", {x, scalar(1.4142135381698608)})});
  const std::string y = node("Mul", {x, node("Add", {erf, scalar(1.0)})});
  return node("Mul", {y, scalar(0.5)});
}

}  // namespace apart::models
