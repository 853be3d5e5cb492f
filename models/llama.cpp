// The Llama family (HF LlamaForCausalLM) as a current torch.onnx.export writes it at opset 17 with constant folding:
// RMSNorm, rotary embeddings with rotate_half, grouped-query attention through repeat_kv, SwiGLU MLP, untied head.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "models/graph_builder.h"

namespace apart::models {
namespace {

constexpr int64_t kBatch = -1;  // marks the batch dim in GraphBuilder::input/output
constexpr float kRmsEps = 1e-5f;  // rms_norm_eps of every Llama 3 config

// LlamaRMSNorm: weight * (x * rsqrt(mean(x^2, -1) + eps)); torch writes rsqrt as Div(1, Sqrt(.)).
std::string llama_rms_norm(GraphBuilder& b, const std::string& module, const std::string& x, int64_t dim) {
  auto s = b.scope(module);
  const std::string weight = b.param("weight", {dim}, Init::ones());
  const std::string var = b.node("ReduceMean", {b.node("Pow", {x, b.scalar(2.0)})}, {attr_ints("axes", {-1})});
  const std::string inv = b.node("Div", {b.scalar(1.0), b.node("Sqrt", {b.node("Add", {var, b.scalar(kRmsEps)})})});
  return b.node("Mul", {weight, b.node("Mul", {x, inv})});
}

// LlamaRotaryEmbedding folded for positions 0..S-1: cos and sin of [S, head_dim] (the frequencies repeated twice,
// torch.cat((freqs, freqs), -1)), as [1, S, head_dim] Constants the way a constant-folded export leaves them.
struct RotaryTables {
  std::string cos, sin;
};
RotaryTables rotary_tables(GraphBuilder& b, int64_t seq, int64_t head_dim, double theta) {
  auto s = b.scope("rotary_emb");
  const int64_t half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j)  // 1 / theta^(2j / d), in float32 as HF computes it
    inv_freq[static_cast<size_t>(j)] = static_cast<float>(
        1.0 / std::pow(theta, static_cast<double>(static_cast<float>(2 * j) / static_cast<float>(head_dim))));
  std::vector<float> cos(static_cast<size_t>(seq * head_dim)), sin(cos.size());
  for (int64_t p = 0; p < seq; ++p)
    for (int64_t i = 0; i < head_dim; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[static_cast<size_t>(i % half)];
      cos[static_cast<size_t>(p * head_dim + i)] = std::cos(angle);
      sin[static_cast<size_t>(p * head_dim + i)] = std::sin(angle);
    }
  return {b.float_tensor({1, seq, head_dim}, cos), b.float_tensor({1, seq, head_dim}, sin)};
}

// rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2]): two Slices, Neg, Concat.
std::string rotate_half(GraphBuilder& b, const std::string& x, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  const std::string x1 = b.node("Slice", {x, b.int64s({0}), b.int64s({half}), b.int64s({-1}), b.int64s({1})});
  const std::string x2 = b.node("Slice", {x, b.int64s({half}), b.int64s({std::numeric_limits<int64_t>::max()}),
                                          b.int64s({-1}), b.int64s({1})});
  return b.node("Concat", {b.node("Neg", {x2}), x1}, {attr_int("axis", -1)});
}

// apply_rotary_pos_emb for one of q, k ([B, heads, S, hd]): x * cos + rotate_half(x) * sin.
std::string apply_rotary(GraphBuilder& b, const std::string& x, const std::string& cos, const std::string& sin,
                         int64_t head_dim) {
  return b.node("Add", {b.node("Mul", {x, cos}), b.node("Mul", {rotate_half(b, x, head_dim), sin})});
}

// [B, S, n*hd] -> [B, n, S, hd].
std::string to_heads(GraphBuilder& b, const std::string& x, int64_t n, int64_t hd) {
  const std::string r = b.node("Reshape", {x, b.int64s({0, 0, n, hd})}, {attr_int("allowzero", 0)});
  return b.node("Transpose", {r}, {attr_ints("perm", {0, 2, 1, 3})});
}

// repeat_kv: x[:, :, None].expand(B, kv, n_rep, S, hd).reshape(B, kv * n_rep, S, hd) as Unsqueeze, Expand,
// Reshape. The expand's shape is a constant (a constant-folded export's; its batch entry 1 broadcasts, so it holds for
// any batch); torch without folding writes it through ConstantOfShape(Shape(x)), which the importer has to fold.
std::string repeat_kv(GraphBuilder& b, const std::string& x, int64_t kv, int64_t n_rep, int64_t seq, int64_t hd) {
  if (n_rep == 1) return x;
  const std::string u = b.node("Unsqueeze", {x, b.int64s({2})});
  const std::string e = b.node("Expand", {u, b.int64s({1, kv, n_rep, seq, hd})});
  return b.node("Reshape", {e, b.int64s({0, kv * n_rep, seq, hd})}, {attr_int("allowzero", 0)});
}

struct LlamaDims {
  int64_t hidden, heads, kv_heads, head_dim, ffn, seq;
};

// LlamaAttention (eager): projections without bias, RoPE on q and k, GQA, causal softmax(q k^T * d^-0.5) v, o_proj.
std::string llama_attention(GraphBuilder& b, const std::string& x, const LlamaDims& d, const RotaryTables& rope,
                            const std::string& mask) {
  auto s = b.scope("self_attn");
  const Init w = Init::normal(0.02);
  const int64_t q_width = d.heads * d.head_dim, kv_width = d.kv_heads * d.head_dim;
  std::string q = to_heads(b, b.linear("q_proj", x, d.hidden, q_width, false, w, {}), d.heads, d.head_dim);
  std::string k = to_heads(b, b.linear("k_proj", x, d.hidden, kv_width, false, w, {}), d.kv_heads, d.head_dim);
  std::string v = to_heads(b, b.linear("v_proj", x, d.hidden, kv_width, false, w, {}), d.kv_heads, d.head_dim);
  // cos/sin.unsqueeze(1): [1, 1, S, hd], broadcast over batch and heads.
  const std::string cos = b.node("Unsqueeze", {rope.cos, b.int64s({1})});
  const std::string sin = b.node("Unsqueeze", {rope.sin, b.int64s({1})});
  q = apply_rotary(b, q, cos, sin, d.head_dim);
  k = apply_rotary(b, k, cos, sin, d.head_dim);
  const int64_t n_rep = d.heads / d.kv_heads;
  k = repeat_kv(b, k, d.kv_heads, n_rep, d.seq, d.head_dim);
  v = repeat_kv(b, v, d.kv_heads, n_rep, d.seq, d.head_dim);
  const std::string kt = b.node("Transpose", {k}, {attr_ints("perm", {0, 1, 3, 2})});
  std::string scores = b.node("Mul", {b.node("MatMul", {q, kt}),
                                      b.scalar(1.0 / std::sqrt(static_cast<double>(d.head_dim)))});
  scores = b.node("Where", {mask, b.scalar(-std::numeric_limits<double>::infinity()), scores});
  const std::string probs = b.node("Softmax", {scores}, {attr_int("axis", -1)});
  const std::string ctx = b.node("Transpose", {b.node("MatMul", {probs, v})}, {attr_ints("perm", {0, 2, 1, 3})});
  const std::string merged = b.node("Reshape", {ctx, b.int64s({0, 0, q_width})}, {attr_int("allowzero", 0)});
  return b.linear("o_proj", merged, q_width, d.hidden, false, w, {});
}

// LlamaMLP: down_proj(silu(gate_proj(x)) * up_proj(x)); torch writes SiLU as Mul(x, Sigmoid(x)).
std::string llama_mlp(GraphBuilder& b, const std::string& x, const LlamaDims& d) {
  auto s = b.scope("mlp");
  const Init w = Init::normal(0.02);
  const std::string gate = b.linear("gate_proj", x, d.hidden, d.ffn, false, w, {});
  std::string act;
  {
    auto a = b.scope("act_fn");
    act = b.node("Mul", {gate, b.node("Sigmoid", {gate})});
  }
  const std::string up = b.linear("up_proj", x, d.hidden, d.ffn, false, w, {});
  return b.linear("down_proj", b.node("Mul", {act, up}), d.ffn, d.hidden, false, w, {});
}

}  // namespace

void build_llama(GraphBuilder& b, const ZooOptions& o) {
  const LlamaDims d{o.hidden, o.heads, o.resolved_kv_heads(), o.resolved_head_dim(), o.resolved_ffn(), o.seq};
  const int64_t V = o.vocab;
  b.input("input_ids", onnx::TensorProto::INT64, {kBatch, d.seq});

  std::string x;
  {
    auto model = b.scope("model");
    {
      auto s = b.scope("embed_tokens");
      x = b.node("Gather", {b.param("weight", {V, d.hidden}, Init::normal(0.02)), "input_ids"});
    }
    const RotaryTables rope = rotary_tables(b, d.seq, d.head_dim, o.rope_theta);
    const std::string mask = causal_mask(b, d.seq);
    for (int64_t i = 0; i < o.layers; ++i) {
      auto layer = b.scope("layers." + std::to_string(i));
      x = b.node("Add", {x, llama_attention(b, llama_rms_norm(b, "input_layernorm", x, d.hidden), d, rope, mask)});
      x = b.node("Add", {x, llama_mlp(b, llama_rms_norm(b, "post_attention_layernorm", x, d.hidden), d)});
    }
    x = llama_rms_norm(b, "norm", x, d.hidden);
  }
  // Untied LM head: lm_head.weight is a parameter of its own.
  const std::string logits = b.linear("lm_head", x, d.hidden, V, false, Init::normal(0.02), {});
  finish_with_loss(b, o, logits, "logits", {kBatch, d.seq, V}, V);
}

}  // namespace apart::models
