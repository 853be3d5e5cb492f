// Kernels training graphs need (docs/autodiff.md): ScatterND (reduction none/add/mul/max/min) and
// the ai.apart gradient ops ConvGrad, MaxPoolGrad, AveragePoolGrad (2-D, or 1-D as height 1; float32/float64).
#include <algorithm>
#include <cstring>
#include <limits>

#include "runtime/cpu/families.h"
#include "runtime/cpu/gemm.h"
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

// The window of a gradient op: 2-D (1-D inputs get a height of 1); explicit pads only.
struct Window2d {
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, ph = 0, pw = 0;
};
Window2d window2d(const KernelContext& ctx, int64_t spatial_rank, std::vector<int64_t> kernel) {
  auto get = [&](const char* name, int64_t fill, size_t n) {
    auto v = ctx.attr_ints(name, std::vector<int64_t>(n, fill));
    if (v.size() != n) ctx.invalid(std::string(name) + " does not match the spatial rank");
    return v;
  };
  const size_t s = static_cast<size_t>(spatial_rank);
  const auto strides = get("strides", 1, s), dilations = get("dilations", 1, s), pads = get("pads", 0, 2 * s);
  if (kernel.size() != s) ctx.invalid("kernel_shape does not match the spatial rank");
  Window2d w;
  if (s == 1) {
    w.kw = kernel[0], w.sw = strides[0], w.dw = dilations[0], w.pw = pads[0];
  } else if (s == 2) {
    w.kh = kernel[0], w.kw = kernel[1], w.sh = strides[0], w.sw = strides[1];
    w.dh = dilations[0], w.dw = dilations[1], w.ph = pads[0], w.pw = pads[1];
  } else {
    ctx.unsupported(std::to_string(s) + "-D windows (1-D and 2-D are supported)");
  }
  return w;
}

// dims: N, C, H, W of x and OH, OW of dy.
struct Dims {
  int64_t n, c, h, w, oh, ow;
};
Dims dims_of(const Tensor& x, const Tensor& dy) {
  const bool one_d = x.rank() == 3;
  return {x.dim(0), x.dim(1), one_d ? 1 : x.dim(2), x.dim(-1), one_d ? 1 : dy.dim(2), dy.dim(-1)};
}

// ConvGrad(dY, X, W) → (dX, dW), attrs of the forward Conv with explicit pads (float32 or float64).
// Per image and group, with col = im2col(X) as in the forward: dW += dY · colᵀ, dcol = Wᵀ · dY, dX = col2im(dcol).
void conv_grad_k(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& wt = ctx.input(2);
  if (x.rank() != 3 && x.rank() != 4) ctx.unsupported("ConvGrad over rank " + std::to_string(x.rank()));
  const Window2d win = window2d(ctx, x.rank() - 2, std::vector<int64_t>(wt.shape().begin() + 2, wt.shape().end()));
  const Dims d = dims_of(x, dy);
  const int64_t m = wt.dim(0), group = ctx.attr_int("group", 1);
  if (group <= 0 || d.c % group != 0 || m % group != 0 || wt.dim(1) != d.c / group) ctx.invalid("channels do not match group");
  const int64_t cg = d.c / group, mg = m / group, col_rows = cg * win.kh * win.kw, spatial = d.oh * d.ow;
  // Input position of column entry (r, o), or -1 in the padding.
  auto source = [&](int64_t r, int64_t oy, int64_t ox) -> int64_t {
    const int64_t ch = r / (win.kh * win.kw), ky = (r / win.kw) % win.kh, kx = r % win.kw;
    const int64_t iy = oy * win.sh - win.ph + ky * win.dh, ix = ox * win.sw - win.pw + kx * win.dw;
    return iy >= 0 && iy < d.h && ix >= 0 && ix < d.w ? (ch * d.h + iy) * d.w + ix : -1;
  };
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    const T* pw = wt.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = ctx.wants_output(0) ? ctx.output(0, x.dtype(), x.shape()).template data<T>() : nullptr;
    T* pdw = ctx.num_outputs() > 1 && ctx.wants_output(1) ? ctx.output(1, wt.dtype(), wt.shape()).template data<T>() : nullptr;
    std::vector<T> col(static_cast<size_t>(col_rows * spatial));
    for (int64_t b = 0; b < d.n; ++b)
      for (int64_t g = 0; g < group; ++g) {
        const int64_t plane = (b * d.c + g * cg) * d.h * d.w;
        const T* dyg = pdy + (b * m + g * mg) * spatial;
        if (pdw) {
          parallel_for(col_rows, spatial, [&](int64_t s, int64_t e) {
            for (int64_t r = s; r < e; ++r)
              for (int64_t oy = 0; oy < d.oh; ++oy)
                for (int64_t ox = 0; ox < d.ow; ++ox) {
                  const int64_t src = source(r, oy, ox);
                  col[static_cast<size_t>(r * spatial + oy * d.ow + ox)] = src < 0 ? T{0} : px[plane + src];
                }
          });
          gemm<T>(false, true, mg, col_rows, spatial, T{1}, dyg, spatial, col.data(), spatial, T{1},
                  pdw + g * mg * col_rows, col_rows);
        }
        if (pdx) {
          gemm<T>(true, false, col_rows, spatial, mg, T{1}, pw + g * mg * col_rows, col_rows, dyg, spatial, T{0},
                  col.data(), spatial);
          // col2im: serial, since column entries of different rows may land on the same input element.
          for (int64_t r = 0; r < col_rows; ++r)
            for (int64_t oy = 0; oy < d.oh; ++oy)
              for (int64_t ox = 0; ox < d.ow; ++ox) {
                const int64_t src = source(r, oy, ox);
                if (src >= 0) pdx[plane + src] += col[static_cast<size_t>(r * spatial + oy * d.ow + ox)];
              }
        }
      }
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
  register_kernel("ai.apart.MaxPoolGrad", pool_grad_k<true>);
  register_kernel("ai.apart.AveragePoolGrad", pool_grad_k<false>);
}

}  // namespace apart::cpu
