// Gradient rules of the transformer ops of opsets 20–23: Gelu and RMSNormalization in standard ops, RotaryEmbedding
// and Attention through the ai.apart gradient ops RotaryEmbeddingGrad and AttentionGrad (docs/autodiff.md says why).
#include <cmath>
#include <numbers>

#include "codegen/gradients/gradient.h"

namespace apart::autodiff {
namespace {

// Gelu-20. "none": y = x·Φ(x), dy/dx = Φ(x) + x·φ(x) with φ(x) = exp(−x²/2)/√(2π).
// "tanh": y = ½x(1 + t), t = tanh(u), u = √(2/π)(x + 0.044715x³): dy/dx = ½(1 + t) + ½x(1 − t²)·√(2/π)(1 + 3·0.044715x²).
void gelu_rule(GradNode& n) {
  auto& e = n.e;
  const DType dt = n.out(0).dtype;
  const std::string& x = n.x(0);
  const std::string half = e.scalar(0.5, dt), one = e.scalar(1, dt), x2 = e.mul(x, x);
  const std::string approximate = n.attr_string("approximate", "none");
  std::string slope;
  if (approximate == "tanh") {
    const double k = std::sqrt(2 / std::numbers::pi), c = 0.044715;
    const std::string inner = e.add(one, e.mul(x2, e.scalar(c, dt)));                  // 1 + c·x²
    const std::string t = e.op("Tanh", {e.mul(e.mul(x, inner), e.scalar(k, dt))});     // tanh(k(x + c·x³))
    const std::string du = e.mul(e.add(one, e.mul(x2, e.scalar(3 * c, dt))), e.scalar(k, dt));
    const std::string dt_dx = e.mul(e.sub(one, e.mul(t, t)), du);
    slope = e.mul(half, e.add(e.add(one, t), e.mul(x, dt_dx)));
  } else if (approximate == "none") {
    const std::string cdf = e.mul(half, e.add(one, e.op("Erf", {e.mul(x, e.scalar(1 / std::numbers::sqrt2, dt))})));
    const std::string pdf = e.mul(e.op("Exp", {e.mul(x2, e.scalar(-0.5, dt))}),
                                  e.scalar(1 / std::sqrt(2 * std::numbers::pi), dt));
    slope = e.add(cdf, e.mul(x, pdf));
  } else {
    n.unsupported("approximate '" + approximate + "'");
  }
  n.give(0, e.mul(n.gy(), slope));
}

// RMSNormalization-23 (one output, so the statistic is recomputed): r = 1/√(mean(x²) + ε), x̂ = x·r, y = x̂·scale;
// dx = r·(dx̂ − x̂·mean(dx̂·x̂)) with dx̂ = g·scale, dscale = Σ g·x̂ over the broadcast dims.
void rms_norm_rule(GradNode& n) {
  auto& e = n.e;
  const auto& xs = n.in(0).shape;
  const DType dt = n.in(0).dtype;
  const int64_t axis = norm_axis(n.attr_int("axis", -1), xs.size());
  if (fuses_norm_gradient(n, axis, 1)) {  // one kernel: ai.apart.RMSNormalizationGrad
    fused_norm_gradient(n, "RMSNormalizationGrad", {n.gy(), n.x(0), n.x(1)}, 2);
    return;
  }
  std::vector<int64_t> norm;
  int64_t count = 1;
  for (int64_t a = axis; a < static_cast<int64_t>(xs.size()); ++a) norm.push_back(a), count *= xs[static_cast<size_t>(a)];
  const std::string inv_n = e.scalar(1.0 / static_cast<double>(count), dt);
  const std::string mean_square = e.mul(e.reduce_sum(e.mul(n.x(0), n.x(0)), norm, true), inv_n);
  const std::string eps = e.scalar(n.attr_float("epsilon", 1e-5f), dt);
  const std::string r = e.op("Reciprocal", {e.op("Sqrt", {e.add(mean_square, eps)})});
  const std::string xhat = e.mul(n.x(0), r);
  const std::string& g = n.gy();
  if (n.wants(1)) n.give(1, e.unbroadcast(e.mul(g, xhat), xs, n.in(1).shape));
  if (n.wants(0)) {
    const std::string gxhat = e.mul(g, n.x(1));
    const std::string mean_gx = e.mul(e.reduce_sum(e.mul(gxhat, xhat), norm, true), inv_n);
    n.give(0, e.mul(r, e.sub(gxhat, e.mul(xhat, mean_gx))));
  }
}

// ai.apart.<op>(dY, the forward's inputs 0–2 and its optional input 3) with the forward's attributes → the
// gradients of inputs 0–2 that are wanted (the others left as empty outputs).
void gradients_of_first_three(GradNode& n, const std::string& op) {
  auto& e = n.e;
  std::vector<std::string> outs(3);
  for (size_t i = 0; i < 3; ++i)
    if (n.wants(i)) outs[i] = e.fresh(op + "_d" + std::to_string(i));
  std::vector<std::string> ins{n.gy(), n.x(0), n.x(1), n.x(2)};
  if (n.has_input(3)) ins.push_back(n.x(3));
  n.copy_attrs(e.node(op, ins, outs, kApartDomain));
  for (size_t i = 0; i < 3; ++i)
    if (!outs[i].empty()) n.give(i, outs[i]);
}

// RotaryEmbedding-23: ai.apart.RotaryEmbeddingGrad(dY, X, cos, sin, position_ids) → (dX, dcos, dsin). dX alone is
// the rotation by the opposite angle; the caches' gradients (when they are trained initializers or computed from
// params) sum over heads and positions, which one loop over the rotation's own indexing does best.
void rotary_embedding_rule(GradNode& n) {
  if (n.has_input(3) && n.wants(3)) n.unsupported("a gradient to position_ids");
  gradients_of_first_three(n, "RotaryEmbeddingGrad");
}

// Attention-23 (the forms the CPU kernel runs: no KV cache, no qk_matmul_output): ai.apart.AttentionGrad(dY, Q, K,
// V, attn_mask) → (dQ, dK, dV), recomputing the weights row by row so that no S × L tensor exists (flash
// attention's backward). A gradient to the mask would be that S × L tensor: refused.
void attention_rule(GradNode& n) {
  if (n.has_input(3) && n.wants(3)) n.unsupported("a gradient to attn_mask (a float mask computed from params)");
  for (size_t i = 4; i < n.num_inputs(); ++i)
    if (n.has_input(i)) n.unsupported("past_key/past_value or nonpad_kv_seqlen (a KV cache) in training");
  for (size_t i = 1; i < n.num_outputs(); ++i)
    if (!n.y(i).empty() && !n.gy(i).empty()) n.unsupported("a gradient through present_key/present_value/qk_matmul_output");
  gradients_of_first_three(n, "AttentionGrad");
}

}  // namespace

void register_transformer_rules() {
  auto& r = rules();
  r["Gelu"] = gelu_rule;
  r["RMSNormalization"] = rms_norm_rule;
  r["RotaryEmbedding"] = rotary_embedding_rule;
  r["Attention"] = attention_rule;
  r["ai.apart.Attention"] = attention_rule;  // the same op below opset 23 (codegen/attention_fusion.h)
}

}  // namespace apart::autodiff
