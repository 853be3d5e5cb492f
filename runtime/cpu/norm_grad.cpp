// The normalisations' gradient ops, one kernel each (docs/autodiff.md): ai.apart.LayerNormalizationGrad from the
// forward's saved Mean and InvStdDev, ai.apart.RMSNormalizationGrad recomputing its statistic. Per row, in double:
// x̂ = (x − μ)·σ⁻¹ (RMS: x·r), dx̂ = dY·scale, dX = σ⁻¹·(dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂)) (RMS: no mean(dx̂) term);
// then dScale = Σ_rows dY·x̂ and dBias = Σ_rows dY over blocks of columns, so that no two threads add to one element
// and the sums run in the same order whatever the thread count.
#include "runtime/cpu/families.h"

#include <cmath>
#include <vector>

#include "runtime/cpu/broadcast.h"
#include "runtime/kernel.h"

namespace apart::cpu {
namespace {

// Rows × columns of X with the normalised axes last; the scale broadcast to the normalised shape.
struct NormRows {
  int64_t rows = 0, n = 0;
  std::vector<int64_t> norm_shape;
};
NormRows norm_rows(const KernelContext& ctx, const Tensor& x) {
  NormRows r;
  const int64_t axis = normalize_axis(ctx, ctx.attr_int("axis", -1), x.rank());
  r.norm_shape.assign(x.shape().begin() + axis, x.shape().end());
  r.n = product(r.norm_shape);
  r.rows = product(x.shape(), 0, static_cast<size_t>(axis));
  return r;
}

// dScale (and dBias) as the scale's own shape: Σ over rows of dY·x̂ (and of dY), x̂ of row i and column j from `xhat`.
template <class T, class XHat>
void scale_gradients(KernelContext& ctx, const NormRows& r, const T* dy, const Tensor& scale, size_t scale_out,
                     size_t bias_out, const XHat& xhat) {
  T* ds = ctx.num_outputs() > scale_out && ctx.wants_output(scale_out)
              ? ctx.output(scale_out, scale.dtype(), scale.shape()).template data<T>()
              : nullptr;
  T* db = ctx.num_outputs() > bias_out && ctx.wants_output(bias_out)
              ? ctx.output(bias_out, scale.dtype(), scale.shape()).template data<T>()
              : nullptr;
  if (!ds && !db) return;
  if (scale.elements() != r.n) ctx.invalid("scale must have as many elements as the normalised axes for its gradient");
  parallel_for(r.n, r.rows * 4, [&](int64_t j0, int64_t j1) {
    std::vector<double> s(static_cast<size_t>(j1 - j0), 0.0), b(s.size(), 0.0);
    for (int64_t i = 0; i < r.rows; ++i)
      for (int64_t j = j0; j < j1; ++j) {
        const double g = dy[i * r.n + j];
        s[static_cast<size_t>(j - j0)] += g * xhat(i, j);
        b[static_cast<size_t>(j - j0)] += g;
      }
    for (int64_t j = j0; j < j1; ++j) {
      if (ds) ds[j] = static_cast<T>(s[static_cast<size_t>(j - j0)]);
      if (db) db[j] = static_cast<T>(b[static_cast<size_t>(j - j0)]);
    }
  });
}

// ai.apart.LayerNormalizationGrad(dY, X, Scale, Mean, InvStdDev) → (dX, dScale, dBias); LayerNormalization's
// attributes (axis). Mean and InvStdDev have one element per row, in X's dtype.
void layer_norm_grad_k(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const NormRows r = norm_rows(ctx, x);
  if (dy.shape() != x.shape()) ctx.invalid("dY's shape differs from X's");
  const Tensor& mean = ctx.input(3);
  const Tensor& inv = ctx.input(4);
  if (mean.elements() != r.rows || inv.elements() != r.rows) ctx.invalid("Mean and InvStdDev need one value per row");
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (const Tensor* t : {&dy, &ctx.input(2), &mean, &inv})
      if (t->dtype() != x.dtype()) ctx.invalid("dY, Scale, Mean and InvStdDev must have X's dtype");
    const Tensor scale = broadcast_to(ctx.input(2), r.norm_shape);
    const T *pg = dy.data<T>(), *px = x.data<T>(), *ps = scale.data<T>(), *pm = mean.data<T>(), *pi = inv.data<T>();
    auto xhat = [&](int64_t i, int64_t j) {
      return (static_cast<double>(px[i * r.n + j]) - pm[i]) * static_cast<double>(pi[i]);
    };
    if (ctx.wants_output(0)) {
      T* dx = ctx.output(0, x.dtype(), x.shape()).template data<T>();
      parallel_for(r.rows, r.n * 8, [&](int64_t s, int64_t e) {
        for (int64_t i = s; i < e; ++i) {
          double sum_g = 0, sum_gx = 0;
          for (int64_t j = 0; j < r.n; ++j) {
            const double g = static_cast<double>(pg[i * r.n + j]) * ps[j];
            sum_g += g;
            sum_gx += g * xhat(i, j);
          }
          const double mean_g = sum_g / static_cast<double>(r.n), mean_gx = sum_gx / static_cast<double>(r.n);
          for (int64_t j = 0; j < r.n; ++j) {
            const double g = static_cast<double>(pg[i * r.n + j]) * ps[j];
            dx[i * r.n + j] = static_cast<T>(static_cast<double>(pi[i]) * (g - mean_g - xhat(i, j) * mean_gx));
          }
        }
      });
    }
    scale_gradients<T>(ctx, r, pg, ctx.input(2), 1, 2, xhat);
  });
}

// ai.apart.RMSNormalizationGrad(dY, X, Scale) → (dX, dScale); RMSNormalization's attributes (axis, epsilon):
// r = 1/√(mean(x²) + ε) recomputed per row, x̂ = x·r.
void rms_norm_grad_k(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const NormRows r = norm_rows(ctx, x);
  if (dy.shape() != x.shape()) ctx.invalid("dY's shape differs from X's");
  const double eps = ctx.attr_float("epsilon", 1e-5);
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (dy.dtype() != x.dtype() || ctx.input(2).dtype() != x.dtype()) ctx.invalid("dY and Scale must have X's dtype");
    const Tensor scale = broadcast_to(ctx.input(2), r.norm_shape);
    const T *pg = dy.data<T>(), *px = x.data<T>(), *ps = scale.data<T>();
    std::vector<double> inv(static_cast<size_t>(r.rows));
    parallel_for(r.rows, r.n * 2, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        double squares = 0;
        for (int64_t j = 0; j < r.n; ++j) squares += static_cast<double>(px[i * r.n + j]) * px[i * r.n + j];
        inv[static_cast<size_t>(i)] = 1.0 / std::sqrt(squares / static_cast<double>(r.n) + eps);
      }
    });
    auto xhat = [&](int64_t i, int64_t j) {
      return static_cast<double>(px[i * r.n + j]) * inv[static_cast<size_t>(i)];
    };
    if (ctx.wants_output(0)) {
      T* dx = ctx.output(0, x.dtype(), x.shape()).template data<T>();
      parallel_for(r.rows, r.n * 6, [&](int64_t s, int64_t e) {
        for (int64_t i = s; i < e; ++i) {
          double sum_gx = 0;
          for (int64_t j = 0; j < r.n; ++j) sum_gx += static_cast<double>(pg[i * r.n + j]) * ps[j] * xhat(i, j);
          const double mean_gx = sum_gx / static_cast<double>(r.n), ri = inv[static_cast<size_t>(i)];
          for (int64_t j = 0; j < r.n; ++j)
            dx[i * r.n + j] =
                static_cast<T>(ri * (static_cast<double>(pg[i * r.n + j]) * ps[j] - xhat(i, j) * mean_gx));
        }
      });
    }
    scale_gradients<T>(ctx, r, pg, ctx.input(2), 1, 2, xhat);
  });
}

}  // namespace

void register_norm_grad_kernels() {
  register_kernel("ai.apart.LayerNormalizationGrad", layer_norm_grad_k, OutputWrites::kEvery);
  register_kernel("ai.apart.RMSNormalizationGrad", rms_norm_grad_k, OutputWrites::kEvery);
}

}  // namespace apart::cpu
