// A 2-D convolution as im2col + GEMM in its three directions (conv_gemm.h).
#include "runtime/cpu/conv_gemm.h"

#include <algorithm>
#include <string>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/threads.h"

namespace apart::cpu {

Window2d window2d(const KernelContext& ctx, int64_t spatial_rank, std::vector<int64_t> kernel) {
  auto get = [&](const char* name, int64_t fill, size_t n) {
    auto v = ctx.attr_ints(name, std::vector<int64_t>(n, fill));
    if (v.size() != n) ctx.invalid(std::string(name) + " does not match the spatial rank");
    return v;
  };
  const size_t s = static_cast<size_t>(spatial_rank);
  const auto strides = get("strides", 1, s), dilations = get("dilations", 1, s), pads = get("pads", 0, 2 * s);
  if (kernel.size() != s) ctx.invalid("kernel_shape does not match the spatial rank");
  Window w;
  w.kernel = std::move(kernel);
  w.stride = strides;
  w.dilation = dilations;
  w.pad_begin.assign(pads.begin(), pads.begin() + static_cast<int64_t>(s));
  return window2d(ctx, w);
}

Window2d window2d(const KernelContext& ctx, const Window& w) {
  Window2d r;
  if (w.kernel.size() == 1) {
    r.kw = w.kernel[0], r.sw = w.stride[0], r.dw = w.dilation[0], r.pw = w.pad_begin[0];
  } else if (w.kernel.size() == 2) {
    r.kh = w.kernel[0], r.kw = w.kernel[1], r.sh = w.stride[0], r.sw = w.stride[1];
    r.dh = w.dilation[0], r.dw = w.dilation[1], r.ph = w.pad_begin[0], r.pw = w.pad_begin[1];
  } else {
    ctx.unsupported(std::to_string(w.kernel.size()) + "-D windows (1-D and 2-D are supported)");
  }
  return r;
}

ConvGeometry conv_geometry(const KernelContext& ctx, const std::vector<int64_t>& x, const std::vector<int64_t>& y,
                           int64_t group, const Window2d& win) {
  if ((x.size() != 3 && x.size() != 4) || y.size() != x.size())
    ctx.unsupported("convolutions over " + std::to_string(static_cast<int64_t>(x.size()) - 2) +
                    " spatial dims (1-D and 2-D are supported)");
  const bool one_d = x.size() == 3;
  ConvGeometry g;
  g.n = x[0], g.c = x[1], g.h = one_d ? 1 : x[2], g.w = x.back();
  g.m = y[1], g.oh = one_d ? 1 : y[2], g.ow = y.back();
  g.group = group;
  g.win = win;
  if (group <= 0 || g.c % group != 0 || g.m % group != 0) ctx.invalid("channels do not match group");
  return g;
}

namespace {

// col[r][o] = x at column entry (r, o) of one image's group (0 in the padding).
template <class T>
void im2col(const ConvGeometry& g, const T* xg, T* col) {
  const int64_t spatial = g.out_spatial();
  parallel_for(g.col_rows(), spatial, [&](int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r)
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const int64_t src = g.source(r, oy, ox);
          col[r * spatial + oy * g.ow + ox] = src < 0 ? T{0} : xg[src];
        }
  });
}

}  // namespace

template <class T>
void conv_forward(const ConvGeometry& g, const T* x, const T* w, T* y) {
  const int64_t cg = g.channels_per_group(), mg = g.m / g.group, rows = g.col_rows(), spatial = g.out_spatial();
  std::vector<T> col(static_cast<size_t>(rows * spatial));
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t k = 0; k < g.group; ++k) {
      im2col(g, x + (b * g.c + k * cg) * g.h * g.w, col.data());
      gemm<T>(false, false, mg, spatial, rows, T{1}, w + k * mg * rows, rows, col.data(), spatial, T{0},
              y + (b * g.m + k * mg) * spatial, spatial);
    }
}

template <class T>
void conv_data_grad(const ConvGeometry& g, const T* dy, const T* w, T* dx) {
  const int64_t cg = g.channels_per_group(), mg = g.m / g.group, rows = g.col_rows(), spatial = g.out_spatial();
  std::fill(dx, dx + g.n * g.c * g.h * g.w, T{0});
  std::vector<T> col(static_cast<size_t>(rows * spatial));
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t k = 0; k < g.group; ++k) {
      gemm<T>(true, false, rows, spatial, mg, T{1}, w + k * mg * rows, rows, dy + (b * g.m + k * mg) * spatial, spatial,
              T{0}, col.data(), spatial);
      // col2im: serial, since column entries of different rows may land on the same input element.
      T* dxg = dx + (b * g.c + k * cg) * g.h * g.w;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t oy = 0; oy < g.oh; ++oy)
          for (int64_t ox = 0; ox < g.ow; ++ox) {
            const int64_t src = g.source(r, oy, ox);
            if (src >= 0) dxg[src] += col[static_cast<size_t>(r * spatial + oy * g.ow + ox)];
          }
    }
}

template <class T>
void conv_weight_grad(const ConvGeometry& g, const T* dy, const T* x, T* dw) {
  const int64_t cg = g.channels_per_group(), mg = g.m / g.group, rows = g.col_rows(), spatial = g.out_spatial();
  std::fill(dw, dw + g.m * rows, T{0});
  std::vector<T> col(static_cast<size_t>(rows * spatial));
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t k = 0; k < g.group; ++k) {
      im2col(g, x + (b * g.c + k * cg) * g.h * g.w, col.data());
      gemm<T>(false, true, mg, rows, spatial, T{1}, dy + (b * g.m + k * mg) * spatial, spatial, col.data(), spatial,
              T{1}, dw + k * mg * rows, rows);
    }
}

template void conv_forward<float>(const ConvGeometry&, const float*, const float*, float*);
template void conv_forward<double>(const ConvGeometry&, const double*, const double*, double*);
template void conv_data_grad<float>(const ConvGeometry&, const float*, const float*, float*);
template void conv_data_grad<double>(const ConvGeometry&, const double*, const double*, double*);
template void conv_weight_grad<float>(const ConvGeometry&, const float*, const float*, float*);
template void conv_weight_grad<double>(const ConvGeometry&, const double*, const double*, double*);

}  // namespace apart::cpu
