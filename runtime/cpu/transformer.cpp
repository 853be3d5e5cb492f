// The opset-23 transformer ops: RMSNormalization, RotaryEmbedding, Attention (fused: no seq × seq tensor), and
// their ai.apart gradient ops RotaryEmbeddingGrad and AttentionGrad (docs/autodiff.md).
#include "runtime/cpu/families.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/cpu/broadcast.h"
#include "runtime/kernel.h"

namespace apart::cpu {
namespace {

// --- RMSNormalization ---------------------------------------------------------------------------------------

// Y = X / sqrt(mean(X², axes axis…) + epsilon) · scale, the statistic computed in double (stash_type float or
// wider: the result of a float stash is the same to rounding).
void rms_norm_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t axis = normalize_axis(ctx, ctx.attr_int("axis", -1), x.rank());
  const std::vector<int64_t> norm_shape(x.shape().begin() + axis, x.shape().end());
  const int64_t n = product(norm_shape), rows = product(x.shape(), 0, static_cast<size_t>(axis));
  const double eps = ctx.attr_float("epsilon", 1e-5);
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (ctx.input(1).dtype() != x.dtype()) ctx.invalid("scale's dtype differs from X's");
    const Tensor scale = broadcast_to(ctx.input(1), norm_shape);
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    const T* px = x.data<T>();
    const T* ps = scale.data<T>();
    T* py = y.data<T>();
    parallel_for(rows, n * 4, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        const T* row = px + i * n;
        double squares = 0;
        for (int64_t j = 0; j < n; ++j) squares += static_cast<double>(row[j]) * row[j];
        const double inv = 1.0 / std::sqrt(squares / static_cast<double>(n) + eps);
        for (int64_t j = 0; j < n; ++j) py[i * n + j] = static_cast<T>(row[j] * inv * ps[j]);
      }
    });
  });
}

// --- RotaryEmbedding ----------------------------------------------------------------------------------------

// Where RotaryEmbedding's operands are: X as [B, S, H, D] through strides (4-D X is [B, H, S, D], 3-D X is
// [B, S, H·D] with num_heads), the rotated pairs (first `half` of the rotary dims against the second, or even
// against odd when interleaved), and the cache row of each (batch, position): position_ids[b, s], else b·S + s.
struct RotaryGeometry {
  int64_t batch = 0, seq = 0, heads = 0, head_size = 0, half = 0;
  int64_t stride_b = 0, stride_s = 0, stride_h = 0;
  bool interleaved = false;
  const int64_t* position_ids = nullptr;
  int64_t cache_rows = 0;

  int64_t offset(int64_t b, int64_t s, int64_t h) const { return b * stride_b + s * stride_s + h * stride_h; }
  int64_t first(int64_t i) const { return interleaved ? 2 * i : i; }
  int64_t second(int64_t i) const { return interleaved ? 2 * i + 1 : i + half; }
  int64_t cache_row(int64_t b, int64_t s) const { return position_ids ? position_ids[b * seq + s] : b * seq + s; }
};

RotaryGeometry rotary_geometry(const KernelContext& ctx, const Tensor& x, const Tensor& cos, const Tensor& sin,
                               const Tensor* position_ids) {
  RotaryGeometry g;
  if (x.rank() == 4) {
    g.batch = x.dim(0), g.heads = x.dim(1), g.seq = x.dim(2), g.head_size = x.dim(3);
    g.stride_b = g.heads * g.seq * g.head_size, g.stride_h = g.seq * g.head_size, g.stride_s = g.head_size;
  } else if (x.rank() == 3) {
    g.heads = ctx.attr_int("num_heads", 0);
    if (g.heads <= 0 || x.dim(2) % g.heads != 0)
      ctx.invalid("3-D input needs num_heads dividing its hidden size " + std::to_string(x.dim(2)));
    g.batch = x.dim(0), g.seq = x.dim(1), g.head_size = x.dim(2) / g.heads;
    g.stride_b = g.seq * x.dim(2), g.stride_s = x.dim(2), g.stride_h = g.head_size;
  } else {
    ctx.invalid("input of rank " + std::to_string(x.rank()) + " (expected 3 or 4)");
  }
  const int64_t rotary = ctx.attr_int("rotary_embedding_dim", 0) > 0 ? ctx.attr_int("rotary_embedding_dim", 0) : g.head_size;
  if (rotary % 2 != 0 || rotary > g.head_size)
    ctx.invalid("rotary_embedding_dim " + std::to_string(rotary) + " is odd or exceeds the head size");
  g.half = rotary / 2;
  g.interleaved = ctx.attr_int("interleaved", 0) != 0;
  if (cos.shape() != sin.shape() || cos.rank() < 2 || cos.dim(-1) != g.half)
    ctx.invalid("cos_cache " + shape_string(cos.shape()) + " and sin_cache " + shape_string(sin.shape()) +
                " must match, with a last dim of rotary_embedding_dim / 2 = " + std::to_string(g.half));
  g.cache_rows = cos.elements() / g.half;
  if (position_ids) {
    if (position_ids->dtype() != DType::kInt64 || position_ids->elements() != g.batch * g.seq)
      ctx.invalid("position_ids must be int64 [batch, sequence]");
    g.position_ids = position_ids->data<int64_t>();
    for (int64_t i = 0; i < g.batch * g.seq; ++i)
      if (g.position_ids[i] < 0 || g.position_ids[i] >= g.cache_rows)
        ctx.invalid("position id " + std::to_string(g.position_ids[i]) + " is outside the caches' " +
                    std::to_string(g.cache_rows) + " rows");
  } else if (g.cache_rows != g.batch * g.seq) {
    ctx.invalid("without position_ids the caches must be [batch, sequence, rotary_embedding_dim / 2]");
  }
  return g;
}

const Tensor* optional_input(const KernelContext& ctx, size_t i) { return ctx.has_input(i) ? &ctx.input(i) : nullptr; }

// y = rotate(x) with angle sign `sign`: (x1, x2) → (c·x1 − sign·s·x2, sign·s·x1 + c·x2); dims past the rotary
// ones copied. sign −1 is the transposed rotation: RotaryEmbedding's input gradient.
template <class T>
void rotate(const RotaryGeometry& g, const T* x, const T* cos, const T* sin, T sign, T* y) {
  parallel_for(g.batch * g.seq, g.heads * g.head_size * 2, [&](int64_t s0, int64_t s1) {
    for (int64_t bs = s0; bs < s1; ++bs) {
      const int64_t b = bs / g.seq, s = bs % g.seq;
      const T* c = cos + g.cache_row(b, s) * g.half;
      const T* sn = sin + g.cache_row(b, s) * g.half;
      for (int64_t h = 0; h < g.heads; ++h) {
        const int64_t o = g.offset(b, s, h);
        for (int64_t i = 0; i < g.half; ++i) {
          const T x1 = x[o + g.first(i)], x2 = x[o + g.second(i)];
          y[o + g.first(i)] = c[i] * x1 - sign * sn[i] * x2;
          y[o + g.second(i)] = sign * sn[i] * x1 + c[i] * x2;
        }
        for (int64_t d = 2 * g.half; d < g.head_size; ++d) y[o + d] = x[o + d];
      }
    }
  });
}

void rotary_embedding_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const RotaryGeometry g = rotary_geometry(ctx, x, ctx.input(1), ctx.input(2), optional_input(ctx, 3));
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    rotate<T>(g, x.data<T>(), ctx.input(1).data<T>(), ctx.input(2).data<T>(), T(1),
              ctx.output(0, x.dtype(), x.shape()).template data<T>());
  });
}

// ai.apart.RotaryEmbeddingGrad(dY, X, cos_cache, sin_cache, position_ids?) → (dX, dcos_cache, dsin_cache), the
// forward's attributes; any output may be absent. dX is the rotation by the opposite angle; the caches' gradients
// sum over heads (and over the positions that read the same row): dcos = g1·x1 + g2·x2, dsin = g2·x1 − g1·x2.
void rotary_embedding_grad_k(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& cos = ctx.input(2);
  const Tensor& sin = ctx.input(3);
  const RotaryGeometry g = rotary_geometry(ctx, x, cos, sin, optional_input(ctx, 4));
  if (dy.shape() != x.shape()) ctx.invalid("dY's shape differs from X's");
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pg = dy.data<T>();
    const T* px = x.data<T>();
    if (ctx.wants_output(0))
      rotate<T>(g, pg, cos.data<T>(), sin.data<T>(), T(-1), ctx.output(0, x.dtype(), x.shape()).template data<T>());
    const bool want_cos = ctx.num_outputs() > 1 && ctx.wants_output(1), want_sin = ctx.num_outputs() > 2 && ctx.wants_output(2);
    if (!want_cos && !want_sin) return;
    std::vector<double> dcos(static_cast<size_t>(cos.elements()), 0.0), dsin(dcos.size(), 0.0);
    for (int64_t b = 0; b < g.batch; ++b)
      for (int64_t s = 0; s < g.seq; ++s) {
        const int64_t row = g.cache_row(b, s) * g.half;
        for (int64_t h = 0; h < g.heads; ++h) {
          const int64_t o = g.offset(b, s, h);
          for (int64_t i = 0; i < g.half; ++i) {
            const double x1 = px[o + g.first(i)], x2 = px[o + g.second(i)];
            const double g1 = pg[o + g.first(i)], g2 = pg[o + g.second(i)];
            dcos[static_cast<size_t>(row + i)] += g1 * x1 + g2 * x2;
            dsin[static_cast<size_t>(row + i)] += g2 * x1 - g1 * x2;
          }
        }
      }
    auto write = [&](size_t out, const std::vector<double>& from) {
      T* p = ctx.output(out, cos.dtype(), cos.shape()).template data<T>();
      for (size_t i = 0; i < from.size(); ++i) p[i] = static_cast<T>(from[i]);
    };
    if (want_cos) write(1, dcos);
    if (want_sin) write(2, dsin);
  });
}

// --- Attention ----------------------------------------------------------------------------------------------

// Attention-23's operands as [B, heads, seq, head] through strides (3-D Q/K/V are [B, seq, heads · head] with
// q_num_heads / kv_num_heads), query head h reading KV head h / (Hq / Hkv) (GQA: np.repeat of the KV heads), and
// the mask broadcast to [B, Hq, S, L] (a last dim shorter than L masks the keys past it, as the reference pads).
struct AttentionGeometry {
  int64_t batch = 0, q_heads = 0, kv_heads = 0, q_seq = 0, kv_seq = 0, head = 0, v_head = 0;
  std::array<int64_t, 3> q_strides{}, k_strides{}, v_strides{}, y_strides{};  // per batch, head, position
  double scale = 1;
  double softcap = 0;
  bool causal = false;
  // The mask, as strides over [B, Hq, S, L] (0 where it broadcasts) and its own last dim.
  const Tensor* mask = nullptr;
  std::array<int64_t, 4> mask_strides{};
  int64_t mask_keys = 0;

  int64_t group() const { return q_heads / kv_heads; }
  static int64_t at(const std::array<int64_t, 3>& st, int64_t b, int64_t h, int64_t s) {
    return b * st[0] + h * st[1] + s * st[2];
  }
};

// Strides of a [B, heads, seq, head] view of `t` (4-D as it is, 3-D as [B, seq, heads · head]).
std::array<int64_t, 3> head_strides(const Tensor& t, int64_t heads, int64_t head) {
  if (t.rank() == 4) return {t.dim(1) * t.dim(2) * t.dim(3), t.dim(2) * t.dim(3), t.dim(3)};
  return {t.dim(1) * heads * head, head, heads * head};
}

AttentionGeometry attention_geometry(const KernelContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor* mask) {
  if (q.rank() != k.rank() || q.rank() != v.rank() || (q.rank() != 3 && q.rank() != 4))
    ctx.invalid("Q, K and V must all be 3-D or all be 4-D");
  AttentionGeometry g;
  g.batch = q.dim(0);
  if (q.rank() == 4) {
    g.q_heads = q.dim(1), g.kv_heads = k.dim(1), g.q_seq = q.dim(2), g.kv_seq = k.dim(2), g.head = q.dim(3);
    g.v_head = v.dim(3);
    if (v.dim(1) != g.kv_heads || v.dim(2) != g.kv_seq || k.dim(3) != g.head) ctx.invalid("K and V do not match Q");
  } else {
    g.q_heads = ctx.attr_int("q_num_heads", 0), g.kv_heads = ctx.attr_int("kv_num_heads", 0);
    if (g.q_heads <= 0 || g.kv_heads <= 0 || q.dim(2) % g.q_heads != 0 || k.dim(2) % g.kv_heads != 0 ||
        v.dim(2) % g.kv_heads != 0)
      ctx.invalid("3-D Q, K, V need q_num_heads and kv_num_heads dividing their hidden sizes");
    g.q_seq = q.dim(1), g.kv_seq = k.dim(1), g.head = q.dim(2) / g.q_heads, g.v_head = v.dim(2) / g.kv_heads;
    if (k.dim(2) / g.kv_heads != g.head || v.dim(1) != g.kv_seq) ctx.invalid("K and V do not match Q");
  }
  if (k.dim(0) != g.batch || v.dim(0) != g.batch) ctx.invalid("Q, K and V have different batch sizes");
  if (g.q_heads % g.kv_heads != 0)
    ctx.invalid(std::to_string(g.q_heads) + " query heads are not a multiple of " + std::to_string(g.kv_heads) + " KV heads");
  g.q_strides = head_strides(q, g.q_heads, g.head);
  g.k_strides = head_strides(k, g.kv_heads, g.head);
  g.v_strides = head_strides(v, g.kv_heads, g.v_head);
  g.y_strides = q.rank() == 4 ? std::array<int64_t, 3>{g.q_heads * g.q_seq * g.v_head, g.q_seq * g.v_head, g.v_head}
                              : std::array<int64_t, 3>{g.q_seq * g.q_heads * g.v_head, g.v_head, g.q_heads * g.v_head};
  g.scale = ctx.has_attr("scale") ? ctx.attr_float("scale", 1.0) : 1.0 / std::sqrt(static_cast<double>(g.head));
  g.softcap = ctx.attr_float("softcap", 0.0);
  g.causal = ctx.attr_int("is_causal", 0) != 0;
  if (mask) {
    if (mask->rank() < 2 || mask->rank() > 4 || mask->dim(-1) > g.kv_seq)
      ctx.invalid("attn_mask " + shape_string(mask->shape()) + " does not broadcast to [batch, heads, " +
                  std::to_string(g.q_seq) + ", " + std::to_string(g.kv_seq) + "]");
    if (mask->dtype() != DType::kBool && mask->dtype() != q.dtype()) ctx.invalid("attn_mask is neither bool nor Q's dtype");
    std::vector<int64_t> padded(4 - static_cast<size_t>(mask->rank()), 1);
    padded.insert(padded.end(), mask->shape().begin(), mask->shape().end());
    const std::array<int64_t, 4> full{g.batch, g.q_heads, g.q_seq, padded[3]};
    const std::vector<int64_t> own = contiguous_strides(padded);
    for (size_t i = 0; i < 4; ++i) {
      if (padded[i] != 1 && padded[i] != full[i]) ctx.invalid("attn_mask " + shape_string(mask->shape()) + " does not broadcast");
      g.mask_strides[i] = padded[i] == 1 ? 0 : own[i];
    }
    g.mask_keys = padded[3];
    g.mask = mask;
  }
  return g;
}

// One query row's logits over the keys, softcapped then masked (the reference's order: a −∞ mask stays −∞), and
// each logit's d logit / d (q·k) (the scale times the softcap's tanh derivative). Masked keys get −∞.
struct Row {
  std::vector<double> logits, slope;
  explicit Row(int64_t keys) : logits(static_cast<size_t>(keys)), slope(static_cast<size_t>(keys)) {}
};

template <class T>
void row_logits(const AttentionGeometry& g, const T* q, const T* k, int64_t b, int64_t h, int64_t i, Row& row) {
  constexpr double kMasked = -std::numeric_limits<double>::infinity();
  const T* qi = q + AttentionGeometry::at(g.q_strides, b, h, i);
  const int64_t kv = h / g.group();
  const int64_t mask_row = g.mask ? b * g.mask_strides[0] + h * g.mask_strides[1] + i * g.mask_strides[2] : 0;
  for (int64_t j = 0; j < g.kv_seq; ++j) {
    if ((g.causal && j > i) || (g.mask && j >= g.mask_keys)) {
      row.logits[j] = kMasked;
      continue;
    }
    const T* kj = k + AttentionGeometry::at(g.k_strides, b, kv, j);
    double dot = 0;
    for (int64_t d = 0; d < g.head; ++d) dot += static_cast<double>(qi[d]) * kj[d];
    double logit = dot * g.scale, slope = g.scale;
    if (g.softcap > 0) {
      const double t = std::tanh(logit / g.softcap);
      logit = g.softcap * t;
      slope *= 1 - t * t;
    }
    if (g.mask) {
      const int64_t m = mask_row + j * g.mask_strides[3];
      if (g.mask->dtype() == DType::kBool) {
        if (!g.mask->data<bool>()[m]) logit = kMasked;
      } else {
        logit += static_cast<double>(g.mask->data<T>()[m]);
      }
    }
    row.logits[j] = logit;
    row.slope[j] = slope;
  }
  // Softmax in place (a row with every key masked gets zero weights: ONNX's fully-masked-row case expects zeros).
  double mx = kMasked;
  for (double l : row.logits) mx = std::max(mx, l);
  double sum = 0;
  for (double& l : row.logits) {
    l = mx == kMasked || l == kMasked ? 0.0 : std::exp(l - mx);
    sum += l;
  }
  for (double& l : row.logits) l = sum > 0 ? l / sum : 0.0;
}

// The forms of Attention this kernel does not run: a KV cache (inputs past_key, past_value, nonpad_kv_seqlen; outputs
// present_key, present_value) and the qk_matmul_output.
void refuse_kv_cache(const KernelContext& ctx) {
  for (size_t i : {4, 5, 6})
    if (ctx.has_input(i)) ctx.unsupported("Attention with past_key/past_value or nonpad_kv_seqlen (a KV cache)");
  for (size_t i = 1; i < ctx.num_outputs(); ++i)
    if (ctx.wants_output(i)) ctx.unsupported("Attention's present_key, present_value or qk_matmul_output outputs");
}

void attention_k(KernelContext& ctx) {
  refuse_kv_cache(ctx);
  const Tensor& q = ctx.input(0);
  const Tensor& k = ctx.input(1);
  const Tensor& v = ctx.input(2);
  const AttentionGeometry g = attention_geometry(ctx, q, k, v, optional_input(ctx, 3));
  std::vector<int64_t> y_shape = q.shape();
  y_shape.back() = q.rank() == 4 ? g.v_head : g.q_heads * g.v_head;
  dispatch_float(ctx, q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *pq = q.data<T>(), *pk = k.data<T>(), *pv = v.data<T>();
    T* py = ctx.output(0, q.dtype(), y_shape).template data<T>();
    parallel_for(g.batch * g.q_heads * g.q_seq, g.kv_seq * (g.head + g.v_head), [&](int64_t r0, int64_t r1) {
      Row row(g.kv_seq);
      std::vector<double> acc(static_cast<size_t>(g.v_head));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / (g.q_heads * g.q_seq), h = r / g.q_seq % g.q_heads, i = r % g.q_seq;
        row_logits<T>(g, pq, pk, b, h, i, row);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < g.kv_seq; ++j) {
          if (row.logits[j] == 0) continue;
          const T* vj = pv + AttentionGeometry::at(g.v_strides, b, h / g.group(), j);
          for (int64_t d = 0; d < g.v_head; ++d) acc[d] += row.logits[j] * vj[d];
        }
        T* yi = py + AttentionGeometry::at(g.y_strides, b, h, i);
        for (int64_t d = 0; d < g.v_head; ++d) yi[d] = static_cast<T>(acc[d]);
      }
    });
  });
}

// ai.apart.AttentionGrad(dY, Q, K, V, attn_mask?) → (dQ, dK, dV), the forward's attributes; any output may be
// absent. Recomputes each query row's weights P (nothing of size S × L is kept), then dV_j += P_j·dY_i,
// dP_j = dY_i·V_j, dL_j = P_j·(dP_j − Σ P·dP), and dQ_i += dL_j·slope_j·K_j, dK_j += dL_j·slope_j·Q_i. One task
// per (batch, KV head), so a KV head's query group accumulates into its dK, dV without races.
void attention_grad_k(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& q = ctx.input(1);
  const Tensor& k = ctx.input(2);
  const Tensor& v = ctx.input(3);
  const AttentionGeometry g = attention_geometry(ctx, q, k, v, optional_input(ctx, 4));
  dispatch_float(ctx, q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *pg = dy.data<T>(), *pq = q.data<T>(), *pk = k.data<T>(), *pv = v.data<T>();
    auto out = [&](size_t i, const Tensor& like) -> T* {
      if (ctx.num_outputs() <= i || !ctx.wants_output(i)) return nullptr;
      Tensor& t = ctx.output(i, like.dtype(), like.shape());
      std::fill(t.data<T>(), t.data<T>() + t.elements(), T(0));
      return t.data<T>();
    };
    T *dq = out(0, q), *dk = out(1, k), *dv = out(2, v);
    parallel_for(g.batch * g.kv_heads, g.group() * g.q_seq * g.kv_seq * (2 * g.head + 2 * g.v_head), [&](int64_t t0, int64_t t1) {
      Row row(g.kv_seq);
      std::vector<double> dp(static_cast<size_t>(g.kv_seq)), dqi(static_cast<size_t>(g.head));
      for (int64_t task = t0; task < t1; ++task) {
        const int64_t b = task / g.kv_heads, kv = task % g.kv_heads;
        for (int64_t h = kv * g.group(); h < (kv + 1) * g.group(); ++h)
          for (int64_t i = 0; i < g.q_seq; ++i) {
            row_logits<T>(g, pq, pk, b, h, i, row);
            const T* gi = pg + AttentionGeometry::at(g.y_strides, b, h, i);
            const T* qi = pq + AttentionGeometry::at(g.q_strides, b, h, i);
            double weighted = 0;
            for (int64_t j = 0; j < g.kv_seq; ++j) {
              if (row.logits[j] == 0) continue;
              const int64_t vo = AttentionGeometry::at(g.v_strides, b, kv, j);
              double dot = 0;
              for (int64_t d = 0; d < g.v_head; ++d) dot += static_cast<double>(gi[d]) * pv[vo + d];
              dp[j] = dot;
              weighted += row.logits[j] * dot;
              if (dv)
                for (int64_t d = 0; d < g.v_head; ++d) dv[vo + d] += static_cast<T>(row.logits[j] * gi[d]);
            }
            std::fill(dqi.begin(), dqi.end(), 0.0);
            for (int64_t j = 0; j < g.kv_seq; ++j) {
              if (row.logits[j] == 0) continue;
              const double dlogit = row.logits[j] * (dp[j] - weighted) * row.slope[j];
              const int64_t ko = AttentionGeometry::at(g.k_strides, b, kv, j);
              for (int64_t d = 0; d < g.head; ++d) dqi[d] += dlogit * pk[ko + d];
              if (dk)
                for (int64_t d = 0; d < g.head; ++d) dk[ko + d] += static_cast<T>(dlogit * qi[d]);
            }
            if (dq) {
              T* dqo = dq + AttentionGeometry::at(g.q_strides, b, h, i);
              for (int64_t d = 0; d < g.head; ++d) dqo[d] = static_cast<T>(dqi[d]);
            }
          }
      }
    });
  });
}

}  // namespace

void register_transformer_kernels() {
  register_kernel("RMSNormalization", rms_norm_k);
  register_kernel("RotaryEmbedding", rotary_embedding_k);
  register_kernel("Attention", attention_k);
  register_kernel("ai.apart.RotaryEmbeddingGrad", rotary_embedding_grad_k);
  register_kernel("ai.apart.AttentionGrad", attention_grad_k);
}

}  // namespace apart::cpu
