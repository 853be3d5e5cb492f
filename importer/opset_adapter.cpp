// ONNX opsets 18–23 on ONNX 1.12's schemas (the lookup rules are in opset_adapter.h).
#include "importer/opset_adapter.h"

#include <onnx/defs/shape_inference.h>
#include <onnx/defs/tensor_proto_util.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

namespace apart {
namespace {

using onnx::AttributeProto;
using onnx::InferenceContext;
using onnx::OpSchema;

// --- Which ops ONNX revised after 17 (onnx/defs/operator_sets.h, opsets 18–28) ------------------------------------

// Every default-domain revision from opset 18 on, by opset: the op names of OpSet_Onnx_verN.
constexpr std::pair<int, const char*> kRevisions[] = {
    {18,
     "Pad CenterCropPad Resize Mish OptionalGetElement OptionalHasElement Split Col2Im ScatterND ScatterElements "
     "ReduceSumSquare ReduceLogSum ReduceLogSumExp ReduceL1 ReduceL2 ReduceMax ReduceMin ReduceMean ReduceProd "
     "BitwiseAnd BitwiseOr BitwiseXor BitwiseNot GroupNormalization LpPool"},
    {19,
     "Equal AveragePool Cast CastLike Constant DeformConv DequantizeLinear Identity If Loop Pad QuantizeLinear "
     "Resize Reshape Scan Shape Size"},
    {20,
     "AffineGrid ConstantOfShape DFT Gelu GridSample ImageDecoder IsInf IsNaN ReduceMax ReduceMin RegexFullMatch "
     "StringConcat StringSplit"},
    {21,
     "Cast CastLike Constant ConstantOfShape DequantizeLinear Flatten GroupNormalization Identity If Loop Pad "
     "QLinearMatMul QuantizeLinear Reshape Scan Shape Size Squeeze Transpose Unsqueeze"},
    {22,
     "EyeLike RandomUniform RandomNormal RandomUniformLike RandomNormalLike Multinomial Bernoulli ThresholdedRelu "
     "Selu Elu Mish HardSigmoid HardSwish Softsign Softplus Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh "
     "Round Det NegativeLogLikelihoodLoss AveragePool MaxPool MaxUnpool LpPool MaxRoiPool Conv ConvTranspose "
     "DeformConv GlobalAveragePool GlobalMaxPool GlobalLpPool InstanceNormalization LpNormalization Dropout RoiAlign "
     "RNN GRU LSTM GridSample"},
    {23,
     "Attention Cast CastLike Constant ConstantOfShape DequantizeLinear Flatten Identity If Loop Pad QuantizeLinear "
     "Reshape RMSNormalization RotaryEmbedding Scan Shape Size Squeeze Transpose Unsqueeze"},
    {24,
     "Attention Cast CastLike Constant ConstantOfShape DequantizeLinear Flatten Identity If Loop Pad QuantizeLinear "
     "Reshape Scan Shape Size Swish SplitToSequence Squeeze TopK Transpose Unsqueeze TensorScatter"},
    {25,
     "Attention Cast CastLike Constant ConstantOfShape DequantizeLinear Flatten Identity Reshape Shape Size If Loop "
     "Scan Pad Squeeze Transpose Unsqueeze QuantizeLinear"},
    {26, "BitCast CumProd"},
    {27, "CausalConvWithState LinearAttention Range"},
    {28, "Celu SwiGLU"},
};

// op → the opsets (ascending) that revised it after 17.
const std::map<std::string, std::vector<int>>& revisions() {
  static const std::map<std::string, std::vector<int>> table = [] {
    std::map<std::string, std::vector<int>> t;
    for (const auto& [opset, ops] : kRevisions) {
      std::istringstream words(ops);
      for (std::string op; words >> op;) t[op].push_back(opset);
    }
    return t;
  }();
  return table;
}

// The newest revision of `op` in (kLibraryOpset, opset], or 0.
int latest_revision(const std::string& op, int opset) {
  const auto it = revisions().find(op);
  if (it == revisions().end()) return 0;
  int latest = 0;
  for (int v : it->second)
    if (v <= opset) latest = v;
  return latest;
}

// --- Ops ONNX revised in 18–23 that apart does not adapt ------------------------------------------------------------

constexpr const char* kNotAdapted[] = {"CenterCropPad", "Col2Im",     "DeformConv",   "AffineGrid",
                                       "DFT",           "GridSample", "ImageDecoder", "RegexFullMatch",
                                       "StringConcat",  "StringSplit"};

bool not_adapted(const std::string& op) {
  return std::find(std::begin(kNotAdapted), std::end(kNotAdapted), op) != std::end(kNotAdapted);
}

// --- Helpers for inference functions -----------------------------------------------------------------------------

// The integer values of input `i` when inference knows them (an initializer, a Constant, or propagated shape data).
std::optional<std::vector<int64_t>> input_ints(InferenceContext& ctx, size_t i) {
  if (i >= ctx.getNumInputs() || ctx.getInputType(i) == nullptr) return std::nullopt;
  if (const onnx::TensorProto* data = ctx.getInputData(i)) {
    if (data->data_type() == onnx::TensorProto::INT64) return onnx::ParseData<int64_t>(data);
    if (data->data_type() == onnx::TensorProto::INT32) {
      const auto v = onnx::ParseData<int32_t>(data);
      return std::vector<int64_t>(v.begin(), v.end());
    }
    return std::nullopt;
  }
  if (const onnx::TensorShapeProto* symbolic = ctx.getSymbolicInput(i)) {
    std::vector<int64_t> out;
    for (const auto& d : symbolic->dim()) {
      if (!d.has_dim_value()) return std::nullopt;
      out.push_back(d.dim_value());
    }
    return out;
  }
  return std::nullopt;
}

std::optional<std::vector<float>> input_floats(InferenceContext& ctx, size_t i) {
  if (i >= ctx.getNumInputs() || ctx.getInputType(i) == nullptr) return std::nullopt;
  const onnx::TensorProto* data = ctx.getInputData(i);
  if (data == nullptr || data->data_type() != onnx::TensorProto::FLOAT) return std::nullopt;
  return onnx::ParseData<float>(data);
}

bool has_input(InferenceContext& ctx, size_t i) { return i < ctx.getNumInputs() && ctx.getInputType(i) != nullptr; }

// The input's dims, -1 where unknown; nullopt without a shape.
std::optional<std::vector<int64_t>> input_dims(InferenceContext& ctx, size_t i) {
  if (!onnx::hasInputShape(ctx, i)) return std::nullopt;
  std::vector<int64_t> dims;
  for (const auto& d : onnx::getInputShape(ctx, i).dim()) dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
  return dims;
}

// Sets output `o` to `dims` (-1 for an unknown dim).
void set_output_dims(InferenceContext& ctx, size_t o, const std::vector<int64_t>& dims) {
  auto* shape = ctx.getOutputType(o)->mutable_tensor_type()->mutable_shape();
  shape->clear_dim();
  for (int64_t d : dims) {
    auto* dim = shape->add_dim();
    if (d >= 0) dim->set_dim_value(d);
  }
}

// Output `o`'s dims the rule left unknown take the symbol (dim_param, "batch") of the input dim each comes from:
// {output axis, input, input axis}. set_output_dims writes numbers only.
void keep_dim_symbols(InferenceContext& ctx, size_t o, const std::vector<std::array<size_t, 3>>& from) {
  auto* shape = ctx.getOutputType(o)->mutable_tensor_type()->mutable_shape();
  for (const auto& [axis, input, input_axis] : from) {
    if (static_cast<int>(axis) >= shape->dim_size() || shape->dim(static_cast<int>(axis)).has_dim_value() ||
        !onnx::hasInputShape(ctx, input))
      continue;
    const auto& in = onnx::getInputShape(ctx, input);
    if (static_cast<int>(input_axis) < in.dim_size() && in.dim(static_cast<int>(input_axis)).has_dim_param())
      shape->mutable_dim(static_cast<int>(axis))->set_dim_param(in.dim(static_cast<int>(input_axis)).dim_param());
  }
}

int64_t normalized_axis(int64_t axis, int64_t rank) {
  const int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) fail_shape_inference("axis ", axis, " is out of range for rank ", rank);
  return a;
}

const OpSchema* library_schema(const std::string& op, int opset) {
  return onnx::OpSchemaRegistry::Instance()->GetSchema(op, opset, "");
}

// ONNX 1.12's schema of `op` (as of opset 17), declared again as `name` revised at `version`: inputs, outputs,
// attributes, type constraints and functions. Built anew rather than copied, since Finalize() on a finalized copy
// counts its inputs twice.
OpSchema revised_copy(const std::string& op, const std::string& name, int version) {
  const OpSchema* base = library_schema(op, static_cast<int>(kLibraryOpset));
  if (base == nullptr) throw std::logic_error("ONNX 1.12 has no schema " + op);  // a table entry is wrong
  OpSchema s;
  s.SetName(name).SetDomain("").SinceVersion(version);
  const auto formal = [](const OpSchema::FormalParameter& p, auto declare) {
    declare(p.GetName(), p.GetDescription(), p.GetTypeStr(), p.GetOption(), p.GetIsHomogeneous(), p.GetMinArity(),
            p.GetDifferentiationCategory());
  };
  for (size_t i = 0; i < base->inputs().size(); ++i)
    formal(base->inputs()[i], [&](auto&&... a) { s.Input(static_cast<int>(i), a...); });
  for (size_t i = 0; i < base->outputs().size(); ++i)
    formal(base->outputs()[i], [&](auto&&... a) { s.Output(static_cast<int>(i), a...); });
  for (const auto& [attr_name, attr] : base->attributes()) s.Attr(attr);
  for (const auto& c : base->typeConstraintParams())
    s.TypeConstraint(c.type_param_str, c.allowed_type_strs, c.description);
  if (base->has_type_and_shape_inference_function())
    s.TypeAndShapeInferenceFunction(base->GetTypeAndShapeInferenceFunction());
  if (base->has_data_propagation_function()) s.PartialDataPropagationFunction(base->GetDataPropagationFunction());
  return s;
}

const std::vector<std::string> kFloatTypes = {"tensor(float16)", "tensor(float)", "tensor(double)", "tensor(bfloat16)"};

// A schema for an op ONNX 1.12 lacks: `inputs` (name, optional?), one output per `outputs` of type T, and `infer`.
OpSchema new_op(const std::string& name, int version, const std::vector<std::pair<const char*, bool>>& inputs,
                const std::vector<std::pair<const char*, bool>>& outputs, onnx::InferenceFunction infer) {
  OpSchema s;
  s.SetName(name).SetDomain("").SinceVersion(version);
  for (size_t i = 0; i < inputs.size(); ++i)
    s.Input(static_cast<int>(i), inputs[i].first, "", "T", inputs[i].second ? OpSchema::Optional : OpSchema::Single);
  for (size_t i = 0; i < outputs.size(); ++i)
    s.Output(static_cast<int>(i), outputs[i].first, "", "T", outputs[i].second ? OpSchema::Optional : OpSchema::Single);
  s.TypeConstraint("T", kFloatTypes, "");
  s.TypeAndShapeInferenceFunction(std::move(infer));
  return s;
}

// --- Revised ops with their own inference --------------------------------------------------------------------------

// Reduce*-18 (ReduceMax/Min-20: bool too): axes became input 1, as ReduceSum's did at 13; the shapes follow the same
// rule whatever the reduction, so ReduceSum-13's schema (attributes keepdims, noop_with_empty_axes) serves.
OpSchema reduce_schema(const std::string& op, int version) { return revised_copy("ReduceSum", op, version); }

// Split-18: num_outputs, equal parts of ceil(dim / n) with a smaller last one, when no split sizes are given.
OpSchema split_schema(int version) {
  OpSchema s = revised_copy("Split", "Split", version);
  s.Attr("num_outputs", "number of equal parts (the last may be smaller)", AttributeProto::INT, false);
  s.TypeAndShapeInferenceFunction([base = s.GetTypeAndShapeInferenceFunction()](InferenceContext& ctx) {
    const AttributeProto* parts = ctx.getAttribute("num_outputs");
    if (parts == nullptr || has_input(ctx, 1)) return base(ctx);
    const size_t n = ctx.getNumOutputs();
    if (parts->i() != static_cast<int64_t>(n))
      fail_shape_inference("Split: num_outputs ", parts->i(), " but the node has ", n, " outputs");
    for (size_t o = 0; o < n; ++o) onnx::propagateElemTypeFromInputToOutput(ctx, 0, o);
    const auto dims = input_dims(ctx, 0);
    if (!dims) return;
    const int64_t axis = normalized_axis(onnx::getAttribute(ctx, "axis", 0), static_cast<int64_t>(dims->size()));
    const int64_t dim = (*dims)[static_cast<size_t>(axis)];
    const int64_t chunk = dim < 0 ? -1 : (dim + static_cast<int64_t>(n) - 1) / static_cast<int64_t>(n);
    for (size_t o = 0; o < n; ++o) {
      std::vector<int64_t> out = *dims;
      out[static_cast<size_t>(axis)] =
          dim < 0 ? -1 : std::clamp<int64_t>(dim - chunk * static_cast<int64_t>(o), 0, chunk);
      set_output_dims(ctx, o, out);
    }
  });
  return s;
}

// Pad-18: input 3, the axes `pads` covers (all of them when absent); Pad-19: mode "wrap" (same shapes).
OpSchema pad_schema(int version) {
  OpSchema s = revised_copy("Pad", "Pad", version);
  s.TypeConstraint("Tind", {"tensor(int32)", "tensor(int64)"}, "axes");
  s.Input(3, "axes", "the axes pads applies to", "Tind", OpSchema::Optional);
  s.TypeAndShapeInferenceFunction([base = s.GetTypeAndShapeInferenceFunction()](InferenceContext& ctx) {
    if (!has_input(ctx, 3)) return base(ctx);
    onnx::propagateElemTypeFromInputToOutput(ctx, 0, 0);
    auto dims = input_dims(ctx, 0);
    const auto pads = input_ints(ctx, 1), axes = input_ints(ctx, 3);
    if (!dims || !pads || !axes) return;
    const auto rank = static_cast<int64_t>(dims->size());
    if (pads->size() != 2 * axes->size())
      fail_shape_inference("Pad: pads holds ", pads->size(), " values for ", axes->size(), " axes");
    for (size_t k = 0; k < axes->size(); ++k) {
      int64_t& d = (*dims)[static_cast<size_t>(normalized_axis((*axes)[k], rank))];
      if (d >= 0) d += (*pads)[k] + (*pads)[k + axes->size()];
    }
    set_output_dims(ctx, 0, *dims);
  });
  return s;
}

// Resize-18: attributes antialias (same shapes), axes (scales/sizes name only those axes) and keep_aspect_ratio_policy
// (with sizes: one scale for all axes, the largest that fits or the smallest that covers); Resize-19: the
// coordinate_transformation_mode half_pixel_symmetric (same shapes).
OpSchema resize_schema(int version) {
  OpSchema s = revised_copy("Resize", "Resize", version);
  s.Attr("antialias", "", AttributeProto::INT, int64_t{0});
  s.Attr("axes", "", AttributeProto::INTS, false);
  s.Attr("keep_aspect_ratio_policy", "", AttributeProto::STRING, std::string("stretch"));
  s.TypeAndShapeInferenceFunction([base = s.GetTypeAndShapeInferenceFunction()](InferenceContext& ctx) {
    const AttributeProto* axes_attr = ctx.getAttribute("axes");
    const std::string policy = onnx::getAttribute(ctx, "keep_aspect_ratio_policy", std::string("stretch"));
    if (axes_attr == nullptr && policy == "stretch") return base(ctx);
    onnx::propagateElemTypeFromInputToOutput(ctx, 0, 0);
    auto dims = input_dims(ctx, 0);
    if (!dims) return;
    const auto rank = static_cast<int64_t>(dims->size());
    std::vector<int64_t> axes;
    if (axes_attr != nullptr)
      for (int64_t a : axes_attr->ints()) axes.push_back(normalized_axis(a, rank));
    else
      for (int64_t a = 0; a < rank; ++a) axes.push_back(a);
    if (const auto sizes = input_ints(ctx, 3)) {
      if (sizes->size() != axes.size())
        fail_shape_inference("Resize: sizes holds ", sizes->size(), " values for ", axes.size(), " axes");
      if (policy == "stretch") {
        for (size_t k = 0; k < axes.size(); ++k) (*dims)[static_cast<size_t>(axes[k])] = (*sizes)[k];
      } else {
        double scale = policy == "not_larger" ? 1e300 : 0;
        for (size_t k = 0; k < axes.size(); ++k) {
          const int64_t in = (*dims)[static_cast<size_t>(axes[k])];
          if (in <= 0) return;
          const double r = static_cast<double>((*sizes)[k]) / static_cast<double>(in);
          scale = policy == "not_larger" ? std::min(scale, r) : std::max(scale, r);
        }
        for (int64_t a : axes) {
          int64_t& d = (*dims)[static_cast<size_t>(a)];
          d = static_cast<int64_t>(std::round(scale * static_cast<double>(d)));
        }
      }
    } else if (const auto scales = input_floats(ctx, 2); scales && !scales->empty()) {
      if (scales->size() != axes.size())
        fail_shape_inference("Resize: scales holds ", scales->size(), " values for ", axes.size(), " axes");
      for (size_t k = 0; k < axes.size(); ++k) {
        int64_t& d = (*dims)[static_cast<size_t>(axes[k])];
        if (d >= 0) d = static_cast<int64_t>(std::floor(static_cast<double>(d) * (*scales)[k]));
      }
    } else {
      return;
    }
    set_output_dims(ctx, 0, *dims);
  });
  return s;
}

// --- Ops ONNX 1.12 lacks ------------------------------------------------------------------------------------------

OpSchema same_shape_op(const std::string& name, int version, const std::vector<std::pair<const char*, bool>>& inputs) {
  return new_op(name, version, inputs, {{"Y", false}}, onnx::propagateShapeAndTypeFromFirstInput);
}

// Attention-23: Q, K, V as [batch, heads, seq, head_size] (4-D) or [batch, seq, heads · head_size] (3-D, with
// q_num_heads and kv_num_heads); past_key/past_value [batch, kv_heads, past, head_size] prepend to K/V.
// Y: Q's layout with V's head size; present_key/value: [batch, kv_heads, past + kv_seq, head_size];
// qk_matmul_output: [batch, q_heads, q_seq, past + kv_seq].
void attention_inference(InferenceContext& ctx) {
  for (size_t o = 0; o < ctx.getNumOutputs(); ++o) onnx::propagateElemTypeFromInputToOutput(ctx, 0, o);
  const auto q = input_dims(ctx, 0), k = input_dims(ctx, 1), v = input_dims(ctx, 2);
  if (!q || !k || !v || q->size() != k->size() || q->size() != v->size() || (q->size() != 3 && q->size() != 4)) return;
  const int64_t q_heads_attr = onnx::getAttribute(ctx, "q_num_heads", 0),
                kv_heads_attr = onnx::getAttribute(ctx, "kv_num_heads", 0);
  const bool four_d = q->size() == 4;
  if (!four_d && (q_heads_attr <= 0 || kv_heads_attr <= 0))
    fail_shape_inference("Attention with 3-D inputs needs q_num_heads and kv_num_heads");
  const int64_t batch = (*q)[0];
  const int64_t q_heads = four_d ? (*q)[1] : q_heads_attr, kv_heads = four_d ? (*k)[1] : kv_heads_attr;
  const int64_t q_seq = four_d ? (*q)[2] : (*q)[1], kv_seq = four_d ? (*k)[2] : (*k)[1];
  const auto per_head = [&](int64_t d) { return four_d ? d : (d < 0 ? -1 : d / kv_heads); };
  const int64_t k_head = per_head(four_d ? (*k)[3] : (*k)[2]), v_head = per_head(four_d ? (*v)[3] : (*v)[2]);
  int64_t past = 0;
  if (has_input(ctx, 4)) {
    const auto p = input_dims(ctx, 4);
    past = p && p->size() == 4 ? (*p)[2] : -1;
  }
  const int64_t total = past < 0 || kv_seq < 0 ? -1 : past + kv_seq;
  // A symbolic batch (or sequence) stays the symbol it is in Q, K and V.
  set_output_dims(ctx, 0,
                  four_d ? std::vector<int64_t>{batch, q_heads, q_seq, v_head}
                         : std::vector<int64_t>{batch, q_seq, v_head < 0 ? -1 : q_heads * v_head});
  keep_dim_symbols(ctx, 0,
                   four_d ? std::vector<std::array<size_t, 3>>{{0, 0, 0}, {1, 0, 1}, {2, 0, 2}, {3, 2, 3}}
                          : std::vector<std::array<size_t, 3>>{{0, 0, 0}, {1, 0, 1}});
  const size_t kv_axis = four_d ? 1 : 0;  // a kv-head count only 4-D inputs hold as a dim
  if (ctx.getNumOutputs() > 1 && ctx.getOutputType(1) != nullptr) {
    set_output_dims(ctx, 1, {batch, kv_heads, total, k_head});
    keep_dim_symbols(ctx, 1, {{0, 0, 0}, {1, 1, kv_axis}});
  }
  if (ctx.getNumOutputs() > 2 && ctx.getOutputType(2) != nullptr) {
    set_output_dims(ctx, 2, {batch, kv_heads, total, v_head});
    keep_dim_symbols(ctx, 2, {{0, 0, 0}, {1, 1, kv_axis}});
  }
  if (ctx.getNumOutputs() > 3 && ctx.getOutputType(3) != nullptr) {
    set_output_dims(ctx, 3, {batch, q_heads, q_seq, total});
    keep_dim_symbols(ctx, 3,
                     four_d ? std::vector<std::array<size_t, 3>>{{0, 0, 0}, {1, 0, 1}, {2, 0, 2}}
                            : std::vector<std::array<size_t, 3>>{{0, 0, 0}, {2, 0, 1}});
  }
}

OpSchema attention_schema(int version) {
  OpSchema s = new_op(
      "Attention", version,
      {{"Q", false}, {"K", false}, {"V", false}, {"attn_mask", true}, {"past_key", true}, {"past_value", true}},
      {{"Y", false}, {"present_key", true}, {"present_value", true}, {"qk_matmul_output", true}}, attention_inference);
  // attn_mask may be bool; the type check is off in the importer's inference, so T stays the float types.
  s.Attr("is_causal", "", AttributeProto::INT, int64_t{0});
  s.Attr("kv_num_heads", "", AttributeProto::INT, false);
  s.Attr("q_num_heads", "", AttributeProto::INT, false);
  s.Attr("qk_matmul_output_mode", "", AttributeProto::INT, int64_t{0});
  s.Attr("scale", "", AttributeProto::FLOAT, false);
  s.Attr("softcap", "", AttributeProto::FLOAT, 0.0f);
  s.Attr("softmax_precision", "", AttributeProto::INT, false);
  return s;
}

// A schema apart defines for an op 1.12 lacks, at revision `version`; nullopt when `op` is not one.
std::optional<OpSchema> new_op_schema(const std::string& op, int version) {
  if (op == "Gelu") {
    OpSchema s = same_shape_op(op, version, {{"X", false}});
    s.Attr("approximate", "", AttributeProto::STRING, std::string("none"));
    return s;
  }
  if (op == "Mish") return same_shape_op(op, version, {{"X", false}});
  if (op == "GroupNormalization") {
    OpSchema s = same_shape_op(op, version, {{"X", false}, {"scale", false}, {"bias", false}});
    s.Attr("epsilon", "", AttributeProto::FLOAT, 1e-5f);
    s.Attr("num_groups", "", AttributeProto::INT, true);
    if (version >= 21) s.Attr("stash_type", "", AttributeProto::INT, int64_t{1});
    return s;
  }
  if (op == "RMSNormalization") {
    OpSchema s = same_shape_op(op, version, {{"X", false}, {"scale", false}});
    s.Attr("axis", "", AttributeProto::INT, int64_t{-1});
    s.Attr("epsilon", "", AttributeProto::FLOAT, 1e-5f);
    s.Attr("stash_type", "", AttributeProto::INT, int64_t{1});
    return s;
  }
  if (op == "RotaryEmbedding") {
    OpSchema s = new_op(op, version, {{"X", false}, {"cos_cache", false}, {"sin_cache", false}, {"position_ids", true}},
                        {{"Y", false}}, onnx::propagateShapeAndTypeFromFirstInput);
    s.TypeConstraint("M", {"tensor(int64)"}, "position ids");
    s.Input(3, "position_ids", "", "M", OpSchema::Optional);
    s.Attr("interleaved", "", AttributeProto::INT, int64_t{0});
    s.Attr("num_heads", "", AttributeProto::INT, false);
    s.Attr("rotary_embedding_dim", "", AttributeProto::INT, int64_t{0});
    return s;
  }
  if (op == "Attention") return attention_schema(version);
  // Integer elementwise ops with numpy broadcasting: Add's and Neg's shapes and types.
  if (op == "BitwiseAnd" || op == "BitwiseOr" || op == "BitwiseXor") return revised_copy("Add", op, version);
  if (op == "BitwiseNot") return revised_copy("Neg", op, version);
  return std::nullopt;
}

// --- Revised ops whose new attributes keep the old meaning at their defaults ----------------------------------------

struct AddedAttribute {
  const char* op;
  int since;
  const char* name;
  AttributeProto::AttributeType type;
};
constexpr AddedAttribute kAddedAttributes[] = {
    {"Cast", 19, "saturate", AttributeProto::INT},
    {"CastLike", 19, "saturate", AttributeProto::INT},
    {"QuantizeLinear", 19, "saturate", AttributeProto::INT},
    {"QuantizeLinear", 21, "block_size", AttributeProto::INT},
    {"QuantizeLinear", 21, "output_dtype", AttributeProto::INT},
    {"QuantizeLinear", 23, "precision", AttributeProto::INT},
    {"DequantizeLinear", 21, "block_size", AttributeProto::INT},
    {"DequantizeLinear", 23, "output_dtype", AttributeProto::INT},
    {"AveragePool", 19, "dilations", AttributeProto::INTS},
    {"LpPool", 18, "ceil_mode", AttributeProto::INT},
};

OpSchema types_only_schema(const std::string& op, int version) {
  OpSchema s = revised_copy(op, op, version);
  for (const AddedAttribute& a : kAddedAttributes)
    if (op == a.op && version >= a.since) s.Attr(a.name, "", a.type, false);
  return s;
}

// A schema apart built, or why it has none; kept for the life of the process, as ONNX's registry keeps its own.
struct BuiltSchema {
  std::unique_ptr<OpSchema> schema;
  std::string refusal;
};

BuiltSchema build_schema(const std::string& op, int version) {
  if (not_adapted(op))
    return {nullptr, op + "-" + std::to_string(version) + " (ONNX opset " + std::to_string(version) +
                         ") is not adapted onto ONNX 1.12's schemas: apart has no shape rule for this revision"};
  std::optional<OpSchema> s;
  if (op.rfind("Reduce", 0) == 0)
    s = reduce_schema(op, version);
  else if (op == "Split")
    s = split_schema(version);
  else if (op == "Pad")
    s = pad_schema(version);
  else if (op == "Resize")
    s = resize_schema(version);
  else
    s = new_op_schema(op, version);
  if (!s) s = types_only_schema(op, version);
  s->Finalize();
  return {std::make_unique<OpSchema>(std::move(*s)), ""};
}

}  // namespace

OpsetSchema opset_schema(const std::string& op, int opset, const std::string& domain) {
  const bool default_domain = domain.empty() || domain == "ai.onnx";
  if (!default_domain || opset <= kLibraryOpset)
    return {onnx::OpSchemaRegistry::Instance()->GetSchema(op, opset, domain), ""};
  const int version = latest_revision(op, std::min<int>(opset, kMaxOpset));
  if (version == 0) return {library_schema(op, static_cast<int>(kLibraryOpset)), ""};
  static std::mutex mutex;
  static std::map<std::pair<std::string, int>, BuiltSchema> built;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = built.find({op, version});
  if (it == built.end()) it = built.emplace(std::pair{op, version}, build_schema(op, version)).first;
  return {it->second.schema.get(), it->second.refusal};
}

std::string newer_revision(const std::string& op, int64_t opset) {
  const auto it = revisions().find(op);
  if (it == revisions().end()) return "";
  int latest = 0;
  for (int v : it->second)
    if (v > kMaxOpset && v <= opset) latest = v;
  return latest == 0 ? "" : op + "-" + std::to_string(latest);
}

int64_t newest_listed_opset() { return std::end(kRevisions)[-1].first; }

std::string adapted_node_problem(const onnx::NodeProto& node, int64_t opset) {
  if (opset <= kLibraryOpset || !(node.domain().empty() || node.domain() == "ai.onnx")) return "";
  for (const auto& a : node.attribute()) {
    if (node.op_type() == "AveragePool" && a.name() == "dilations" &&
        std::any_of(a.ints().begin(), a.ints().end(), [](int64_t d) { return d != 1; }))
      return "AveragePool-19's dilations other than 1 are not adapted (ONNX 1.12's AveragePool has none)";
    if (node.op_type() == "LpPool" && a.name() == "ceil_mode" && a.i() != 0)
      return "LpPool-18's ceil_mode 1 is not adapted (ONNX 1.12's LpPool rounds down)";
  }
  return "";
}

}  // namespace apart
