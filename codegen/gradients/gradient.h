// Gradient rules: what one forward node contributes to the backward graph (one file per op family).
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/dtype.h"

namespace apart::autodiff {

inline constexpr const char* kApartDomain = "ai.apart";

// What the importer knows about a forward value: dtype, static shape, integer contents.
struct ValueMeta {
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;
  bool shape_known = false;
  std::optional<std::vector<int64_t>> ints;  // known integer contents (axes, perms, starts…)
};

void set_attr(onnx::NodeProto& n, const std::string& name, int64_t v);
void set_attr(onnx::NodeProto& n, const std::string& name, const std::vector<int64_t>& v);
void set_attr(onnx::NodeProto& n, const std::string& name, float v);
void set_attr(onnx::NodeProto& n, const std::string& name, const std::string& v);

// Appends backward nodes to a graph with deterministic names ("grad/<counter>_<hint>").
class Emitter {
 public:
  Emitter(onnx::GraphProto& graph, int64_t opset) : graph_(graph), opset_(opset) {}

  int64_t opset() const { return opset_; }
  void set_scope(std::string scope) { scope_ = std::move(scope); }
  std::string fresh(std::string_view hint);
  onnx::NodeProto& node(const std::string& op, const std::vector<std::string>& inputs,
                        const std::vector<std::string>& outputs, const std::string& domain = "");
  // A single-output node with a fresh output name.
  std::string op(const std::string& op, const std::vector<std::string>& inputs);
  onnx::NodeProto& last() { return *graph_.mutable_node(graph_.node_size() - 1); }

  std::string ints(const std::vector<int64_t>& values);  // Constant int64 1-D tensor
  std::string scalar(double value, DType dtype);         // Constant rank-0 tensor
  std::string filled(double value, DType dtype, const std::vector<int64_t>& shape);  // ConstantOfShape

  std::string add(const std::string& a, const std::string& b) { return op("Add", {a, b}); }
  std::string sub(const std::string& a, const std::string& b) { return op("Sub", {a, b}); }
  std::string mul(const std::string& a, const std::string& b) { return op("Mul", {a, b}); }
  std::string div(const std::string& a, const std::string& b) { return op("Div", {a, b}); }
  std::string neg(const std::string& a) { return op("Neg", {a}); }
  std::string reshape(const std::string& x, const std::vector<int64_t>& shape);
  std::string transpose(const std::string& x, const std::vector<int64_t>& perm);
  std::string reduce_sum(const std::string& x, const std::vector<int64_t>& axes, bool keepdims);
  std::string expand(const std::string& x, const std::vector<int64_t>& shape);
  // Sums `g` (of shape `from`, the broadcast result) down to `to` (numpy broadcasting undone).
  std::string unbroadcast(const std::string& g, const std::vector<int64_t>& from, const std::vector<int64_t>& to);

 private:
  onnx::GraphProto& graph_;
  int64_t opset_;
  std::string scope_;
  int64_t counter_ = 0;
  int64_t node_counter_ = 0;
};

// One forward node seen from its backward: metadata, output gradients, and where input gradients go.
class GradNode {
 public:
  using MetaFn = std::function<const ValueMeta&(const std::string&)>;
  GradNode(const onnx::NodeProto& node, Emitter& emitter, MetaFn meta, std::vector<std::string> output_grads,
           std::vector<bool> wants)
      : e(emitter), node_(node), meta_(std::move(meta)), gy_(std::move(output_grads)), wants_(std::move(wants)),
        given_(node.input_size()) {}

  const onnx::NodeProto& node() const { return node_; }
  Emitter& e;

  size_t num_inputs() const { return static_cast<size_t>(node_.input_size()); }
  size_t num_outputs() const { return static_cast<size_t>(node_.output_size()); }
  const std::string& x(size_t i) const { return node_.input(static_cast<int>(i)); }
  const std::string& y(size_t i) const { return node_.output(static_cast<int>(i)); }
  bool has_input(size_t i) const { return i < num_inputs() && !x(i).empty(); }
  const ValueMeta& in(size_t i) const;   // needs a static shape (Unsupported otherwise)
  const ValueMeta& out(size_t i) const;
  const ValueMeta& meta(const std::string& value) const { return meta_(value); }
  const std::vector<int64_t>& known_ints(size_t input) const;  // Unsupported when not known at import
  // Gradient of output i ("" when nothing flows back into it).
  const std::string& gy(size_t i = 0) const;
  // Output i's gradient, or zeros of its shape.
  std::string gy_or_zeros(size_t i);
  bool wants(size_t i) const { return i < wants_.size() && wants_[i]; }
  void give(size_t i, const std::string& grad);
  const std::vector<std::string>& given() const { return given_; }

  int64_t attr_int(std::string_view name, int64_t fallback) const;
  float attr_float(std::string_view name, float fallback) const;
  std::string attr_string(std::string_view name, std::string fallback) const;
  std::optional<std::vector<int64_t>> attr_ints(std::string_view name) const;
  // Copies the node's attributes (all, or only `names`) onto a backward node.
  void copy_attrs(onnx::NodeProto& to, const std::vector<std::string>& names = {}) const;
  [[noreturn]] void unsupported(const std::string& what) const;

 private:
  const onnx::NodeProto& node_;
  MetaFn meta_;
  std::vector<std::string> gy_;
  std::vector<bool> wants_;
  std::vector<std::string> given_;
};

using GradRule = void (*)(GradNode&);

// Registry: op type (default domain; "ai.apart.<op>" for ours) → rule. Families register from autodiff.cpp.
std::map<std::string, GradRule, std::less<>>& rules();
void register_elementwise_rules();  // elementwise.cpp
void register_linalg_rules();       // linalg.cpp: MatMul, Gemm
void register_reduce_rules();       // reduce.cpp: reductions, Softmax, LogSoftmax, LayerNorm, losses
void register_shape_rules();        // shape.cpp: Reshape…Gather, Concat, Split, Slice, Pad, Resize, Expand, Trilu, ScatterND
void register_conv_rules();         // conv.cpp: Conv, pools, BatchNormalization
void register_transformer_rules();  // transformer.cpp: Gelu, RMSNormalization, RotaryEmbedding, Attention
// tensor_parallel.cpp: ai.apart.TpCopy, TpAllReduce, TpAllGather, TpReduceScatter and TpScatter, keyed "ai.apart.<op>"
// (the only other-domain rules)
void register_tensor_parallel_rules();

// The gradient of a max/min reduction (ReduceMax/ReduceMin over `axes`, GlobalMaxPool): `g_kept` (the
// output gradient with the reduced axes kept as 1s) goes to the positions of x equal to `y_kept`, split
// evenly among ties (torch's amax/amin). reduce.cpp.
std::string extreme_reduction_grad(GradNode& n, const std::string& x, const std::string& y_kept,
                                   const std::string& g_kept, const std::vector<int64_t>& axes);

// Whether a normalisation (LayerNormalization, RMSNormalization) over the axes from `axis` gets its gradient as one
// kernel (ai.apart.<op>Grad, runtime/cpu/norm_grad.cpp): X float32 or float64, the scale (input 1) and the inputs
// up to `last_param` (the bias) with as many elements as the normalised axes and one shape. Otherwise the rules write
// the decomposed gradient. reduce.cpp.
bool fuses_norm_gradient(const GradNode& n, int64_t axis, size_t last_param);
// Writes ai.apart.`op`(`inputs`) with the forward's attributes → the gradients of inputs 0 … outputs − 1 that are
// wanted (the others left as empty outputs), and gives them. reduce.cpp.
void fused_norm_gradient(GradNode& n, const std::string& op, const std::vector<std::string>& inputs, size_t outputs);

// Normalizes a possibly negative axis.
inline int64_t norm_axis(int64_t axis, size_t rank) { return axis < 0 ? axis + static_cast<int64_t>(rank) : axis; }

}  // namespace apart::autodiff
