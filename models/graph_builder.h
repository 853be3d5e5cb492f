// Builds an ONNX graph the way torch.onnx.export names it: module scopes, "/scope/Op_k" nodes, Constant nodes.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/zoo.h"

namespace apart::models {

// How a parameter's initial values are drawn (framework default inits; see docs/zoo.md).
struct Init {
  enum Kind { kZeros, kOnes, kNormal, kUniform } kind = kZeros;
  double a = 0;  // normal: mean; uniform: low
  double b = 0;  // normal: stddev; uniform: high
  static Init zeros() { return {kZeros, 0, 0}; }
  static Init ones() { return {kOnes, 0, 0}; }
  static Init normal(double std) { return {kNormal, 0, std}; }
  static Init uniform(double bound) { return {kUniform, -bound, bound}; }
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> dims;
  Init init;
  int64_t numel = 1;
};

using Attr = onnx::AttributeProto;
Attr attr_int(const std::string& name, int64_t v);
Attr attr_ints(const std::string& name, const std::vector<int64_t>& v);
Attr attr_float(const std::string& name, float v);
Attr attr_string(const std::string& name, const std::string& v);

int32_t onnx_float_type(FloatType t);
int64_t float_type_size(FloatType t);

class GraphBuilder {
 public:
  GraphBuilder(onnx::GraphProto* graph, FloatType dtype) : graph_(graph), dtype_(dtype) {}

  // Module scope, as torch names nodes: {"blocks.0", "attn"} -> "/blocks.0/attn/MatMul".
  class Scope {
   public:
    Scope(GraphBuilder* b, const std::string& name) : b_(b) { b_->scopes_.push_back(name); }
    ~Scope() { b_->scopes_.pop_back(); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    GraphBuilder* b_;
  };
  Scope scope(const std::string& name) { return Scope(this, name); }
  // "blocks.0.attn" prefix for parameter names in the current scope.
  std::string param_prefix() const;

  // One node; returns its outputs ("/scope/Op_k_output_i").
  std::vector<std::string> node_n(const std::string& op, const std::vector<std::string>& inputs, int outputs,
                                  const std::vector<Attr>& attrs = {});
  std::string node(const std::string& op, const std::vector<std::string>& inputs, const std::vector<Attr>& attrs = {}) {
    return node_n(op, inputs, 1, attrs)[0];
  }
  // Same, but the output gets a fixed name (graph outputs such as "logits", "loss").
  std::string node_named(const std::string& op, const std::vector<std::string>& inputs, const std::string& output,
                         const std::vector<Attr>& attrs = {});

  // A trainable parameter (an initializer) named "<scope.path.>local_name". Returns the full name.
  std::string param(const std::string& local_name, std::vector<int64_t> dims, Init init);

  // Constant nodes (never initializers, so that initializers are exactly the parameters).
  std::string scalar(double value);                       // 0-d, model float type
  std::string float_tensor(const std::vector<int64_t>& dims, const std::vector<float>& values);  // model float type
  std::string int64s(const std::vector<int64_t>& values);  // 1-D int64
  std::string int64_tensor(const std::vector<int64_t>& dims, const std::vector<int64_t>& values);
  std::string bool_tensor(const std::vector<int64_t>& dims, const std::vector<uint8_t>& values);

  // Graph inputs/outputs; dims < 0 is the batch dim (symbolic "batch" or --batch N).
  void input(const std::string& name, int32_t elem_type, const std::vector<int64_t>& dims);
  void output(const std::string& name, int32_t elem_type, const std::vector<int64_t>& dims);
  void set_batch(int64_t batch) { batch_ = batch; }
  // Renames a value everywhere (used to give the final node's output its graph-output name).
  void rename(const std::string& from, const std::string& to);

  // Common patterns, exactly as torch exports them.
  std::string linear(const std::string& module, const std::string& x, int64_t in, int64_t out, bool bias, Init w,
                     Init b);  // MatMul(x, W[in,out]) (+ Add(bias, .))
  std::string layer_norm(const std::string& module, const std::string& x, int64_t dim, float eps,
                         LayerNormStyle style);
  std::string rms_norm(const std::string& module, const std::string& x, int64_t dim, float eps);  // T5LayerNorm
  std::string gelu(const std::string& module, const std::string& x);  // x*0.5*(1+erf(x/sqrt2)), torch order

  FloatType dtype() const { return dtype_; }
  int32_t float_elem() const { return onnx_float_type(dtype_); }
  const std::vector<ParamSpec>& params() const { return params_; }
  int64_t param_count() const;

 private:
  std::string scope_path() const;
  std::string next_node_name(const std::string& op);
  std::string add_constant(onnx::TensorProto tensor);
  void set_type(onnx::ValueInfoProto* v, int32_t elem_type, const std::vector<int64_t>& dims) const;

  onnx::GraphProto* graph_;
  FloatType dtype_;
  int64_t batch_ = 0;
  std::vector<std::string> scopes_;
  std::map<std::string, int> op_counts_;  // "/scope/Op" -> uses so far
  std::vector<ParamSpec> params_;
};

// Converts a float to the raw little-endian bytes of `t` (fp32, fp16 round-to-nearest-even, bf16 RNE).
void append_float_bytes(std::string* out, float v, FloatType t);

// Family builders (transformers.cpp, resnet.cpp, llama.cpp): fill the graph and its inputs/outputs, record the params.
void build_gpt(GraphBuilder& b, const ZooOptions& o);
void build_bert(GraphBuilder& b, const ZooOptions& o);
void build_t5(GraphBuilder& b, const ZooOptions& o);
void build_resnet(GraphBuilder& b, const ZooOptions& o);
void build_mlp(GraphBuilder& b, const ZooOptions& o);
void build_llama(GraphBuilder& b, const ZooOptions& o);  // llama.cpp

// 0, 1, …, n-1 (position ids).
std::vector<int64_t> arange(int64_t n);
// [S, S] bool Constant, true above the diagonal: the positions a causal query must not see (torch: ~tril(ones)).
std::string causal_mask(GraphBuilder& b, int64_t seq);

// Appends --loss to `output` (shape `dims`, -1 = batch): adds the `labels`/`target` input and the scalar
// `loss` output; with Loss::kNone, `output` is renamed to `output_name` and becomes the graph output.
void finish_with_loss(GraphBuilder& b, const ZooOptions& o, const std::string& output, const std::string& output_name,
                      const std::vector<int64_t>& dims, int64_t classes);

}  // namespace apart::models
