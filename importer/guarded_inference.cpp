// ONNX 1.12's shape inference, guarded where it trusts its inputs too far (guarded_inference.h).
#include "importer/guarded_inference.h"

#include <onnx/defs/shape_inference.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "importer/opset_adapter.h"

namespace apart {

namespace {

// The convolution and pooling ops, with W's input index (−1 for the pools).
struct ConvFamilyOp {
  const char* op;
  int weight;
};
constexpr ConvFamilyOp kConvFamily[] = {{"Conv", 1},        {"ConvInteger", 1}, {"QLinearConv", 3}, {"ConvTranspose", 1},
                                        {"AveragePool", -1}, {"MaxPool", -1},     {"LpPool", -1}};

// Inputs whose rank an op's inference takes for granted.
struct RankRule {
  const char* op;
  size_t input;
  int rank;
};
constexpr RankRule kRankRules[] = {{"Gemm", 0, 2}, {"Gemm", 1, 2}};

std::string conv_family_hazard(const ConvFamilyOp& op, const NodeShapes& node) {
  const int rank = node.rank(0);
  if (rank < 0) return "";  // ONNX infers nothing without X's shape
  const std::string input = " (input " + node.name(0) + " is " + node.shape(0) + ")";
  if (rank < 2) return "its input needs at least 2 dims (batch and channels)" + input;
  if (op.weight >= 0 && static_cast<size_t>(op.weight) < node.inputs) {
    const int w = node.rank(static_cast<size_t>(op.weight));
    if (w >= 0 && w != rank)
      return "its weight " + node.name(static_cast<size_t>(op.weight)) + " has rank " + std::to_string(w) + " (" +
             node.shape(static_cast<size_t>(op.weight)) + ") but its input has rank " + std::to_string(rank) +
             "; they must agree" + input;
  }
  const int spatial = rank - 2;
  for (const char* name : {"kernel_shape", "strides", "dilations", "output_padding", "output_shape", "pads"}) {
    const int want = std::string_view(name) == "pads" ? 2 * spatial : spatial, length = node.ints_length(name);
    if (length >= 0 && length != want)
      return "attribute " + std::string(name) + " has " + std::to_string(length) + " values, not the " +
             std::to_string(want) + " its input's " + std::to_string(spatial) + " spatial dims need" + input;
  }
  return "";
}

// Whether every input `schema` requires has a type: a null type there is a value whose type inference did not find
// (an optional input left empty is null too, and allowed).
template <class Context>  // onnx::InferenceContext or onnx::DataPropagationContext
bool required_inputs_typed(const Context& ctx, const onnx::OpSchema& schema) {
  const auto& formal = schema.inputs();
  for (size_t i = 0; i < ctx.getNumInputs(); ++i) {
    const onnx::TypeProto* type = ctx.getInputType(i);
    if (type != nullptr && type->value_case() != onnx::TypeProto::VALUE_NOT_SET) continue;
    const bool optional = !formal.empty() && formal[std::min(i, formal.size() - 1)].GetOption() ==
                                                 onnx::OpSchema::FormalParameterOption::Optional;
    if (type != nullptr || !optional) return false;
  }
  return true;
}

// The node ONNX is about to infer, as inference_hazard reads it (names and shapes are not needed there).
NodeShapes shapes_of(const onnx::InferenceContext& ctx) {
  NodeShapes node;
  node.inputs = ctx.getNumInputs();
  node.rank = [&ctx](size_t i) {
    if (i >= ctx.getNumInputs()) return -1;
    const onnx::TypeProto* type = ctx.getInputType(i);
    if (type == nullptr || !type->has_tensor_type() || !type->tensor_type().has_shape()) return -1;
    return type->tensor_type().shape().dim_size();
  };
  node.ints_length = [&ctx](const char* name) {
    const onnx::AttributeProto* a = ctx.getAttribute(name);
    return a == nullptr ? -1 : a->ints_size();
  };
  node.name = node.shape = [](size_t) { return std::string(); };
  return node;
}

}  // namespace

std::string inference_hazard(const std::string& op, const NodeShapes& node) {
  for (const RankRule& rule : kRankRules) {
    if (op != rule.op || rule.input >= node.inputs) continue;
    const int rank = node.rank(rule.input);
    if (rank >= 0 && rank != rule.rank)
      return "input " + node.name(rule.input) + " has rank " + std::to_string(rank) + " (" + node.shape(rule.input) +
             "); " + op + " takes rank " + std::to_string(rule.rank) + " there";
  }
  for (const ConvFamilyOp& entry : kConvFamily)
    if (op == entry.op) return conv_family_hazard(entry, node);
  return "";
}

const onnx::OpSchema* GuardedSchemaRegistry::GetSchema(const std::string& key, const int maxInclusiveVersion,
                                                       const std::string& domain) const {
  // Opsets past ONNX 1.12's are read with the adapted schemas (importer/opset_adapter.h).
  const onnx::OpSchema* schema = opset_schema(key, maxInclusiveVersion, domain).schema;
  if (schema == nullptr || (!schema->has_type_and_shape_inference_function() && !schema->has_data_propagation_function()))
    return schema;
  std::lock_guard<std::mutex> lock(mutex_);
  std::unique_ptr<onnx::OpSchema>& guarded = guarded_[schema];
  if (!guarded) {
    const bool default_domain = domain.empty() || domain == "ai.onnx";
    guarded = std::make_unique<onnx::OpSchema>(*schema);
    // Data propagation (Shape's, Gather's… partial values) reads input types the same way.
    if (schema->has_data_propagation_function())
      guarded->PartialDataPropagationFunction(
          [propagate = schema->GetDataPropagationFunction(), schema](onnx::DataPropagationContext& ctx) {
            if (required_inputs_typed(ctx, *schema)) propagate(ctx);
          });
    if (schema->has_type_and_shape_inference_function())
      guarded->TypeAndShapeInferenceFunction(
          [infer = schema->GetTypeAndShapeInferenceFunction(), schema, default_domain](onnx::InferenceContext& ctx) {
            if (!required_inputs_typed(ctx, *schema)) return;
            if (default_domain && !inference_hazard(schema->Name(), shapes_of(ctx)).empty()) return;
            infer(ctx);
          });
  }
  return guarded.get();
}

GuardedSchemaRegistry& guarded_schemas() {
  static GuardedSchemaRegistry registry;
  return registry;
}

}  // namespace apart
