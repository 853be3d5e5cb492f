// ONNX 1.12's shape inference, guarded where it trusts its inputs too far (guarded_inference.h).
#include "importer/guarded_inference.h"

#include <onnx/defs/shape_inference.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>

namespace apart {

namespace {

constexpr ConvFamilyOp kConvFamily[] = {{"Conv", 1},        {"ConvInteger", 1}, {"QLinearConv", 3}, {"ConvTranspose", 1},
                                        {"AveragePool", -1}, {"MaxPool", -1},     {"LpPool", -1}};

// Inputs whose rank an op's ONNX 1.12 inference indexes without checking it (every version of the op): Gemm reads B's
// dim 1 (dim 0 under transB) whatever B's rank (found by fuzz/import.cpp on a Gemm-6 with a rank-1 B).
struct RankRule {
  const char* op;
  size_t input;
  int rank;
};
constexpr RankRule kRankRules[] = {{"Gemm", 0, 2}, {"Gemm", 1, 2}};

}  // namespace

int required_rank(const std::string& op, size_t input) {
  for (const RankRule& rule : kRankRules)
    if (op == rule.op && input == rule.input) return rule.rank;
  return -1;
}

namespace {

// The rank of input `i` when it is a tensor with a known shape, else −1.
int rank_of(const onnx::InferenceContext& ctx, size_t i) {
  if (i >= ctx.getNumInputs()) return -1;
  const onnx::TypeProto* type = ctx.getInputType(i);
  if (type == nullptr || !type->has_tensor_type() || !type->tensor_type().has_shape()) return -1;
  return type->tensor_type().shape().dim_size();
}

// Whether ONNX 1.12's conv/pool inference can run on `ctx` without reading out of bounds.
bool consistent(const onnx::InferenceContext& ctx, const ConvFamilyOp& op) {
  const int rank = rank_of(ctx, 0);
  if (rank < 0) return true;  // ONNX infers nothing without X's shape
  if (rank < 2) return false;
  if (op.weight >= 0) {
    const int w = rank_of(ctx, static_cast<size_t>(op.weight));
    if (w >= 0 && w != rank) return false;
  }
  const int spatial = rank - 2;
  for (const char* name : {"kernel_shape", "strides", "dilations", "output_padding", "output_shape"})
    if (const onnx::AttributeProto* a = ctx.getAttribute(name); a != nullptr && a->ints_size() != spatial) return false;
  if (const onnx::AttributeProto* a = ctx.getAttribute("pads"); a != nullptr && a->ints_size() != 2 * spatial)
    return false;
  return true;
}

bool ranks_as_required(const onnx::InferenceContext& ctx, const std::string& op) {
  for (size_t i = 0; i < ctx.getNumInputs(); ++i) {
    const int want = required_rank(op, i), rank = rank_of(ctx, i);
    if (want >= 0 && rank >= 0 && rank != want) return false;
  }
  return true;
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

}  // namespace

const ConvFamilyOp* conv_family_op(const std::string& op) {
  for (const ConvFamilyOp& entry : kConvFamily)
    if (op == entry.op) return &entry;
  return nullptr;
}

const onnx::OpSchema* GuardedSchemaRegistry::GetSchema(const std::string& key, const int maxInclusiveVersion,
                                                       const std::string& domain) const {
  const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Instance()->GetSchema(key, maxInclusiveVersion, domain);
  if (schema == nullptr || (!schema->has_type_and_shape_inference_function() && !schema->has_data_propagation_function()))
    return schema;
  std::lock_guard<std::mutex> lock(mutex_);
  std::unique_ptr<onnx::OpSchema>& guarded = guarded_[schema];
  if (!guarded) {
    const bool default_domain = domain.empty() || domain == "ai.onnx";
    const ConvFamilyOp* conv = default_domain ? conv_family_op(key) : nullptr;
    guarded = std::make_unique<onnx::OpSchema>(*schema);
    // Data propagation (Shape's, Gather's… partial values) reads input types the same way.
    if (schema->has_data_propagation_function())
      guarded->PartialDataPropagationFunction(
          [propagate = schema->GetDataPropagationFunction(), schema](onnx::DataPropagationContext& ctx) {
            if (required_inputs_typed(ctx, *schema)) propagate(ctx);
          });
    if (schema->has_type_and_shape_inference_function()) {
      const std::optional<ConvFamilyOp> family = conv ? std::optional<ConvFamilyOp>(*conv) : std::nullopt;
      guarded->TypeAndShapeInferenceFunction(
          [infer = schema->GetTypeAndShapeInferenceFunction(), schema, family,
           default_domain](onnx::InferenceContext& ctx) {
            if (!required_inputs_typed(ctx, *schema)) return;
            if (family && !consistent(ctx, *family)) return;
            if (default_domain && !ranks_as_required(ctx, schema->Name())) return;
            infer(ctx);
          });
    }
  }
  return guarded.get();
}

GuardedSchemaRegistry& guarded_schemas() {
  static GuardedSchemaRegistry registry;
  return registry;
}

}  // namespace apart
