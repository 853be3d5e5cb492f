// float16/bfloat16 storage with float32 compute: tensor conversions and the widening pass (see half_precision.h).
#include "runtime/half_precision.h"

#include <onnx/onnx_pb.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <vector>

#include "graph/error.h"
#include "graph/text.h"

namespace apart {

namespace fs = std::filesystem;

float float_rounded_to_odd(double d) {
  float f = static_cast<float>(d);  // to nearest even
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);  // truncated instead
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);  // inexact: the last bit set
}

Tensor widen_to_float32(const Tensor& half) {
  APART_CHECK(is_half(half.dtype()) && half.on_host(), "widen_to_float32 of a " + std::string(dtype_name(half.dtype())) + " tensor");
  Tensor wide(DType::kFloat32, half.shape());
  const uint16_t* in = half.data<uint16_t>();
  float* out = wide.data<float>();
  for (int64_t i = 0; i < half.elements(); ++i) out[i] = half_bits_to_float(half.dtype(), in[i]);
  return wide;
}

Tensor narrow_from_float32(const Tensor& wide, DType to) {
  APART_CHECK(wide.dtype() == DType::kFloat32 && is_half(to) && wide.on_host(),
              "narrow_from_float32 of a " + std::string(dtype_name(wide.dtype())) + " tensor to " + std::string(dtype_name(to)));
  Tensor half(to, wide.shape());
  const float* in = wide.data<float>();
  uint16_t* out = half.data<uint16_t>();
  for (int64_t i = 0; i < wide.elements(); ++i) out[i] = float_to_half_bits(to, in[i]);
  return half;
}

Tensor rounded_through(const Tensor& wide, DType half) {
  APART_CHECK(wide.dtype() == DType::kFloat32 && is_half(half) && wide.on_host(),
              "rounded_through of a " + std::string(dtype_name(wide.dtype())) + " tensor to " + std::string(dtype_name(half)));
  Tensor rounded(DType::kFloat32, wide.shape());
  const float* in = wide.data<float>();
  float* out = rounded.data<float>();
  for (int64_t i = 0; i < wide.elements(); ++i) out[i] = half_bits_to_float(half, float_to_half_bits(half, in[i]));
  return rounded;
}

namespace {

constexpr int32_t kFloat = onnx::TensorProto::FLOAT;
bool half_type(int64_t onnx_type) { return onnx_type == onnx::TensorProto::FLOAT16 || onnx_type == onnx::TensorProto::BFLOAT16; }

// The element types a TypeProto declares (tensors, and tensors inside sequences, optionals and maps), widened when
// `apply`; whether one was half.
bool widen_type(onnx::TypeProto& type, bool apply) {
  switch (type.value_case()) {
    case onnx::TypeProto::kTensorType:
      if (!half_type(type.tensor_type().elem_type())) return false;
      if (apply) type.mutable_tensor_type()->set_elem_type(kFloat);
      return true;
    case onnx::TypeProto::kSequenceType:
      return type.sequence_type().has_elem_type() && widen_type(*type.mutable_sequence_type()->mutable_elem_type(), apply);
    case onnx::TypeProto::kOptionalType:
      return type.optional_type().has_elem_type() && widen_type(*type.mutable_optional_type()->mutable_elem_type(), apply);
    case onnx::TypeProto::kMapType:
      return type.map_type().has_value_type() && widen_type(*type.mutable_map_type()->mutable_value_type(), apply);
    default: return false;
  }
}

// An attribute that names an element type the node produces: Cast's `to`, and `dtype` (RandomNormal, EyeLike…).
bool names_output_type(std::string_view domain, std::string_view op_type, std::string_view attribute) {
  return (domain.empty() || domain == "ai.onnx") && ((op_type == "Cast" && attribute == "to") || attribute == "dtype");
}

// A half TensorProto (an initializer, a tensor attribute) read, widened and written back inline.
void widen_tensor(onnx::TensorProto& tensor, const fs::path& base_dir, HalfWidening& widened) {
  const Tensor half = tensor_from_proto(tensor, base_dir);
  onnx::TensorProto fresh;
  tensor_to_proto(widen_to_float32(half), tensor.name(), fresh);
  if (tensor.has_doc_string()) fresh.set_doc_string(tensor.doc_string());
  tensor = std::move(fresh);
  ++widened.tensors;
  widened.stored_bytes += half.bytes();
  widened.formats.insert(half.dtype());
}

// One walk for both uses: counts what is half and, when `apply`, widens it. Without `apply` it changes nothing: every
// mutable accessor it reaches is of a field that is present (has_half_precision walks a const model through it).
// `top` is the main graph, whose inputs and outputs are the model's interface.
void walk(onnx::GraphProto& g, const fs::path& base_dir, bool apply, bool top, HalfWidening& widened) {
  std::set<std::string> initializers;
  for (auto& init : *g.mutable_initializer()) {
    initializers.insert(init.name());
    if (!half_type(init.data_type())) continue;
    if (apply) widen_tensor(init, base_dir, widened);
    else ++widened.tensors;
  }
  auto widen_info = [&](onnx::ValueInfoProto& info) { return info.has_type() && widen_type(*info.mutable_type(), apply); };
  // The main graph's inputs (but initializers' entries) and outputs are the model's interface; the rest are types.
  for (auto& info : *g.mutable_input()) {
    const auto stored = static_cast<DType>(info.type().tensor_type().elem_type());
    if (!widen_info(info)) continue;
    if (top && !initializers.count(info.name())) widened.inputs[info.name()] = stored;
    else ++widened.value_types;
  }
  for (auto& info : *g.mutable_output()) {
    const auto stored = static_cast<DType>(info.type().tensor_type().elem_type());
    if (!widen_info(info)) continue;
    if (top) widened.outputs[info.name()] = stored;
    else ++widened.value_types;
  }
  for (auto& info : *g.mutable_value_info())
    if (widen_info(info)) ++widened.value_types;
  for (auto& node : *g.mutable_node()) {
    for (auto& a : *node.mutable_attribute()) {
      if (a.has_t() && half_type(a.t().data_type())) {
        if (apply) widen_tensor(*a.mutable_t(), base_dir, widened);
        else ++widened.tensors;
      }
      if (a.type() == onnx::AttributeProto::INT && names_output_type(node.domain(), node.op_type(), a.name()) &&
          half_type(a.i())) {
        if (apply) a.set_i(kFloat);
        ++widened.casts;
      }
      if (a.has_g()) walk(*a.mutable_g(), base_dir, apply, false, widened);
      for (auto& body : *a.mutable_graphs()) walk(body, base_dir, apply, false, widened);
    }
  }
}

}  // namespace

bool has_half_precision(const onnx::ModelProto& model) {
  HalfWidening found;
  walk(const_cast<onnx::GraphProto&>(model.graph()), {}, /*apply=*/false, true, found);  // changes nothing (walk)
  return found.changed();
}

HalfWidening widen_half_precision(onnx::ModelProto& model, const fs::path& base_dir) {
  HalfWidening widened;
  if (!has_half_precision(model)) return widened;
  walk(*model.mutable_graph(), base_dir, /*apply=*/true, true, widened);
  if (model.ByteSizeLong() > static_cast<size_t>(INT_MAX))
    throw Unsupported("the model's float16/bfloat16 weights widened to float32 (" + std::to_string(widened.tensors) +
                      " tensors) pass protobuf's 2 GiB limit, which the runtime's in-memory model has: apart computes "
                      "half-precision models in float32 on the CPU up to about 1 GiB of half weights");
  return widened;
}

std::string half_widening_note(const HalfWidening& widened) {
  if (!widened.changed()) return "";
  auto count = [](int64_t n, const std::string& what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); };
  std::string formats;
  for (DType t : widened.formats) formats += (formats.empty() ? "" : "/") + std::string(dtype_name(t));
  std::vector<std::string> parts;
  if (widened.tensors > 0) {
    char mb[32];
    std::snprintf(mb, sizeof mb, " (%.2f MB)", static_cast<double>(widened.stored_bytes) / 1e6);
    parts.push_back(count(widened.tensors, formats + " tensor") + mb);
  }
  if (widened.casts > 0) parts.push_back(count(widened.casts, "cast") + " to half");
  if (!widened.inputs.empty() || !widened.outputs.empty())
    parts.push_back(count(static_cast<int64_t>(widened.inputs.size()), "input") + " and " +
                    count(static_cast<int64_t>(widened.outputs.size()), "output"));
  std::string note = "widened ";
  for (size_t i = 0; i < parts.size(); ++i) note += (i == 0 ? "" : ", ") + parts[i];
  return note + (parts.empty() ? "the model's value types" : "") +
         " to float32: compute is float32 (the weights are float32 masters; --save-model writes them back in their "
         "stored dtype)";
}

void widen_half_values(TaskGraph& graph) {
  for (uint32_t t = 0; t < graph.num_tasks(); ++t) {
    Task& task = graph.task(TaskId(t));
    for (Attribute& a : task.attributes)
      if (a.type == Attribute::Type::kInt && names_output_type(task.domain, task.op_type, a.name) && half_type(a.i))
        a.i = kFloat;
  }
  for (uint32_t v = 0; v < graph.num_values(); ++v) {
    Value& value = graph.value(ValueId(v));
    if (!is_half(value.dtype)) continue;
    value.dtype = DType::kFloat32;
    value.bytes = value.elements * dtype_size(DType::kFloat32);
    value.external_data = false;  // widened initializers are inline
  }
}

}  // namespace apart
