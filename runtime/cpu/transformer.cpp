// The opset-23 transformer ops RMSNormalization and RotaryEmbedding, and RotaryEmbedding's ai.apart gradient op
// RotaryEmbeddingGrad (docs/autodiff.md). Attention is attention.cpp's.
#include "runtime/cpu/families.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/cpu/broadcast.h"
#include "runtime/cpu/threads.h"
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

}  // namespace

void register_transformer_kernels() {
  register_kernel("RMSNormalization", rms_norm_k);
  register_kernel("RotaryEmbedding", rotary_embedding_k);
  register_kernel("ai.apart.RotaryEmbeddingGrad", rotary_embedding_grad_k);
}

}  // namespace apart::cpu
