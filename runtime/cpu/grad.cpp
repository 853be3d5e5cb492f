// Kernels training graphs need (docs/autodiff.md): ScatterND (reduction none/add/mul/max/min) and
// the ai.apart gradient ops ConvGrad, ConvTransposeGrad, MaxPoolGrad, AveragePoolGrad (2-D, or 1-D as height 1;
// float32/float64).
#include <algorithm>
#include <cstring>
#include <limits>

#include "runtime/cpu/conv_gemm.h"
#include "runtime/cpu/families.h"
#include "runtime/kernel.h"

namespace apart::cpu {
namespace {

void scatter_nd_k(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  const Tensor& updates = ctx.input(2);
  const std::string reduction = ctx.attr_string("reduction", "none");
  Tensor& out = ctx.output(0, data.dtype(), data.shape());
  copy_bytes(data, out);
  const std::vector<int64_t> idx = indices.to_int64s();
  const int64_t k = indices.dim(-1);
  if (k > data.rank()) ctx.invalid("indices' last dim exceeds the data's rank");
  const int64_t slice = product(data.shape(), static_cast<size_t>(k));
  const int64_t count = indices.elements() / std::max<int64_t>(k, 1);
  if (updates.elements() != count * slice) ctx.invalid("updates do not match indices and data");
  const auto strides = contiguous_strides(data.shape());
  dispatch(ctx, data.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* po = out.data<T>();
    const T* pu = updates.data<T>();
    for (int64_t i = 0; i < count; ++i) {
      int64_t offset = 0;
      for (int64_t j = 0; j < k; ++j) {
        int64_t v = idx[static_cast<size_t>(i * k + j)];
        const int64_t dim = data.dim(j);
        if (v < 0) v += dim;
        if (v < 0 || v >= dim) ctx.invalid("index " + std::to_string(v) + " out of range");
        offset += v * strides[static_cast<size_t>(j)];
      }
      for (int64_t s = 0; s < slice; ++s) {
        T& dst = po[offset + s];
        const T src = pu[i * slice + s];
        if (reduction == "add") dst = static_cast<T>(dst + src);
        else if (reduction == "mul") dst = static_cast<T>(dst * src);
        else if (reduction == "max") dst = std::max(dst, src);
        else if (reduction == "min") dst = std::min(dst, src);
        else dst = src;
      }
    }
  });
}

// dims: N, C, H, W of x and OH, OW of dy.
struct Dims {
  int64_t n, c, h, w, oh, ow;
};
Dims dims_of(const Tensor& x, const Tensor& dy) {
  const bool one_d = x.rank() == 3;
  return {x.dim(0), x.dim(1), one_d ? 1 : x.dim(2), x.dim(-1), one_d ? 1 : dy.dim(2), dy.dim(-1)};
}

// ConvGrad(dY, X, W) → (dX, dW), attrs of the forward Conv with explicit pads (float32 or float64); either output
// may be absent. dX = col2im(Wᵀ · dY), dW = Σ dY · im2col(X)ᵀ (conv_gemm.h).
void conv_grad_k(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& wt = ctx.input(2);
  if (x.rank() != 3 && x.rank() != 4) ctx.unsupported("ConvGrad over rank " + std::to_string(x.rank()));
  const Window2d win = window2d(ctx, x.rank() - 2, std::vector<int64_t>(wt.shape().begin() + 2, wt.shape().end()));
  const ConvGeometry geo = conv_geometry(ctx, x.shape(), dy.shape(), ctx.attr_int("group", 1), win);
  if (wt.dim(0) != geo.m || wt.dim(1) != geo.channels_per_group()) ctx.invalid("W does not match X, dY and group");
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (ctx.wants_output(0))
      conv_data_grad<T>(geo, dy.data<T>(), wt.data<T>(), ctx.output(0, x.dtype(), x.shape()).template data<T>());
    if (ctx.num_outputs() > 1 && ctx.wants_output(1))
      conv_weight_grad<T>(geo, dy.data<T>(), x.data<T>(), ctx.output(1, wt.dtype(), wt.shape()).template data<T>());
  });
}

// ConvTransposeGrad(dY, X, W) → (dX, dW), attrs of the forward ConvTranspose (the window rules are conv_window.h's).
// ConvTranspose is the data gradient of the Conv from Y to X, so dX is that Conv of dY, and dW its weight gradient
// with dY as the Conv's input and X as its output gradient.
void conv_transpose_grad_k(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& wt = ctx.input(2);
  if (x.rank() != 3 && x.rank() != 4) ctx.unsupported("ConvTransposeGrad over rank " + std::to_string(x.rank()));
  const Window w = conv_transpose_window(ctx, std::vector<int64_t>(x.shape().begin() + 2, x.shape().end()),
                                         std::vector<int64_t>(wt.shape().begin() + 2, wt.shape().end()));
  const ConvGeometry geo = conv_geometry(ctx, dy.shape(), x.shape(), ctx.attr_int("group", 1), window2d(ctx, w));
  if (wt.dim(0) != geo.m || wt.dim(1) != geo.channels_per_group()) ctx.invalid("W does not match X, dY and group");
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (ctx.wants_output(0))
      conv_forward<T>(geo, dy.data<T>(), wt.data<T>(), ctx.output(0, x.dtype(), x.shape()).template data<T>());
    if (ctx.num_outputs() > 1 && ctx.wants_output(1))
      conv_weight_grad<T>(geo, x.data<T>(), dy.data<T>(), ctx.output(1, wt.dtype(), wt.shape()).template data<T>());
  });
}

// MaxPoolGrad / AveragePoolGrad(dY, X) → dX.
template <bool kMax>
void pool_grad_k(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  if (x.rank() != 3 && x.rank() != 4) ctx.unsupported("pool gradients over rank " + std::to_string(x.rank()));
  const Window2d win = window2d(ctx, x.rank() - 2, ctx.attr_ints("kernel_shape"));
  const bool include_pad = ctx.attr_int("count_include_pad", 0) != 0;
  const Dims d = dims_of(x, dy);
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* pdx = ctx.output(0, x.dtype(), x.shape()).template data<T>();
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    for (int64_t plane = 0; plane < d.n * d.c; ++plane) {
      const T* xp = px + plane * d.h * d.w;
      T* dxp = pdx + plane * d.h * d.w;
      for (int64_t oy = 0; oy < d.oh; ++oy)
        for (int64_t ox = 0; ox < d.ow; ++ox) {
          const T gv = pdy[(plane * d.oh + oy) * d.ow + ox];
          int64_t best = -1, inside = 0, padded = 0;
          T best_v = -std::numeric_limits<T>::infinity();
          for (int64_t ky = 0; ky < win.kh; ++ky)
            for (int64_t kx = 0; kx < win.kw; ++kx) {
              const int64_t iy = oy * win.sh - win.ph + ky * win.dh, ix = ox * win.sw - win.pw + kx * win.dw;
              if (iy < d.h + win.ph && ix < d.w + win.pw) ++padded;  // within the padded input
              if (iy < 0 || iy >= d.h || ix < 0 || ix >= d.w) continue;
              ++inside;
              if (kMax && (best < 0 || xp[iy * d.w + ix] > best_v)) best = iy * d.w + ix, best_v = xp[best];
            }
          if (kMax) {
            if (best >= 0) dxp[best] += gv;
            continue;
          }
          const int64_t count = include_pad ? padded : inside;
          if (count == 0) continue;
          const T share = gv / static_cast<T>(count);
          for (int64_t ky = 0; ky < win.kh; ++ky)
            for (int64_t kx = 0; kx < win.kw; ++kx) {
              const int64_t iy = oy * win.sh - win.ph + ky * win.dh, ix = ox * win.sw - win.pw + kx * win.dw;
              if (iy >= 0 && iy < d.h && ix >= 0 && ix < d.w) dxp[iy * d.w + ix] += share;
            }
        }
    }
  });
}

}  // namespace

void register_grad_kernels() {
  register_kernel("ScatterND", scatter_nd_k);
  register_kernel("ai.apart.ScatterND", scatter_nd_k);  // ScatterND with `reduction` at any opset (docs/autodiff.md)
  register_kernel("ai.apart.ConvGrad", conv_grad_k);
  register_kernel("ai.apart.ConvTransposeGrad", conv_transpose_grad_k);
  register_kernel("ai.apart.MaxPoolGrad", pool_grad_k<true>);
  register_kernel("ai.apart.AveragePoolGrad", pool_grad_k<false>);
}

}  // namespace apart::cpu
