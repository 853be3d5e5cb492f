// Weights stored as Constant nodes turned into initializers (constant_params.h).
#include "importer/constant_params.h"

#include <optional>
#include <set>
#include <string_view>

#include "graph/dtype.h"
#include "graph/error.h"
#include "graph/text.h"
#include "graph/units.h"

namespace apart {
namespace {

// The inputs of `op` (default domain) that hold weights: a Constant feeding one of them is a parameter. So is one
// added to the output of a MatMul, Gemm or Conv (a bias; constants_to_initializers).
bool is_weight_slot(std::string_view op, int input) {
  if (op == "Conv" || op == "ConvTranspose") return input == 1 || input == 2;
  if (op == "MatMul") return input == 0 || input == 1;
  if (op == "Gemm") return input >= 0 && input <= 2;
  if (op == "BatchNormalization" || op == "LayerNormalization" || op == "InstanceNormalization")
    return input == 1 || input == 2;
  if (op == "Gather") return input == 0;
  return false;
}

bool is_default_domain(const std::string& domain) { return domain.empty() || domain == "ai.onnx"; }

// The tensor a Constant node holds as an initializer named `name`, when it is a float tensor of rank ≥ 1;
// nullopt otherwise (value_float, integers, strings: shape arithmetic and scalars stay constants).
std::optional<onnx::TensorProto> weight_tensor(const onnx::NodeProto& node, const std::string& name) {
  for (const auto& a : node.attribute()) {
    if (a.name() == "sparse_value")
      throw Unsupported("Constant node " + quote(node.name().empty() ? name : node.name()) + " holds a sparse tensor (" +
                        "sparse_value) that feeds a weight slot; apart trains dense parameters only: densify it in the "
                        "exporter, or pass --constants-as-params off to keep it a constant");
    if (a.name() == "value" && a.has_t()) {
      const auto dtype = dtype_from_onnx(a.t().data_type());
      if (!dtype || !is_floating(*dtype) || a.t().dims_size() == 0) return std::nullopt;
      onnx::TensorProto t = a.t();
      t.set_name(name);
      return t;
    }
    if (a.name() == "value_floats" && a.floats_size() > 0) {
      onnx::TensorProto t;
      t.set_name(name);
      t.set_data_type(onnx::TensorProto::FLOAT);
      t.add_dims(a.floats_size());
      for (float f : a.floats()) t.add_float_data(f);
      return t;
    }
  }
  return std::nullopt;
}

int64_t tensor_bytes(const onnx::TensorProto& t) {
  int64_t elements = 1;
  for (int64_t d : t.dims()) elements *= d;
  const auto dtype = dtype_from_onnx(t.data_type());
  return dtype ? elements * dtype_size(*dtype) : 0;
}

}  // namespace

ConstantParams constants_to_initializers(onnx::ModelProto& model) {
  ConstantParams converted;
  onnx::GraphProto& g = *model.mutable_graph();
  // Which values feed a weight slot of a main-graph node.
  std::set<std::string> weights, linear_outputs;
  for (const auto& n : g.node()) {
    if (!is_default_domain(n.domain())) continue;
    for (int i = 0; i < n.input_size(); ++i)
      if (!n.input(i).empty() && is_weight_slot(n.op_type(), i)) weights.insert(n.input(i));
    if (n.op_type() == "MatMul" || n.op_type() == "Gemm" || n.op_type() == "Conv" || n.op_type() == "ConvTranspose")
      for (const auto& out : n.output()) linear_outputs.insert(out);
  }
  // A bias added to a linear op's output (tf2onnx writes Keras' BiasAdd as MatMul/Conv then Add): the other operand
  // of that Add is a weight too.
  for (const auto& n : g.node()) {
    if (!is_default_domain(n.domain()) || n.op_type() != "Add" || n.input_size() != 2) continue;
    for (int i = 0; i < 2; ++i)
      if (linear_outputs.count(n.input(i)) && !n.input(1 - i).empty()) weights.insert(n.input(1 - i));
  }
  if (weights.empty()) return converted;
  std::set<std::string> taken;  // names an initializer or graph input already has: never shadowed
  for (const auto& t : g.initializer()) taken.insert(t.name());
  for (const auto& in : g.input()) taken.insert(in.name());

  google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
  kept.Reserve(g.node_size());
  for (auto& n : *g.mutable_node()) {
    const bool candidate = n.op_type() == "Constant" && is_default_domain(n.domain()) && n.output_size() == 1 &&
                           weights.count(n.output(0)) && !taken.count(n.output(0));
    std::optional<onnx::TensorProto> tensor = candidate ? weight_tensor(n, n.output(0)) : std::nullopt;
    if (!tensor) {
      *kept.Add() = std::move(n);
      continue;
    }
    ++converted.count;
    converted.bytes += tensor_bytes(*tensor);
    if (model.ir_version() < 4) {  // IR < 4: every initializer is also a graph input
      auto* in = g.add_input();
      in->set_name(tensor->name());
      auto* tt = in->mutable_type()->mutable_tensor_type();
      tt->set_elem_type(tensor->data_type());
      auto* shape = tt->mutable_shape();
      for (int64_t d : tensor->dims()) shape->add_dim()->set_dim_value(d);
    }
    taken.insert(tensor->name());
    *g.add_initializer() = std::move(*tensor);
  }
  g.mutable_node()->Swap(&kept);  // every node was moved into `kept` or converted
  return converted;
}

std::string constant_params_note(const ConstantParams& converted) {
  if (converted.count == 0) return "";
  return std::to_string(converted.count) + " Constant node" + (converted.count == 1 ? "" : "s") +
         " feed weight slots (Conv/MatMul/Gemm weights, norm scales and biases, embedding tables) and are trained as "
         "parameters (" + format_bytes(static_cast<double>(converted.bytes)) + ", " + std::to_string(converted.bytes) +
         " bytes); --constants-as-params off keeps them constants";
}

}  // namespace apart
