// A 2-D convolution as im2col + GEMM in its three directions (output, data gradient, weight gradient), shared by
// Conv, ConvTranspose and their ai.apart gradients (1-D runs with a height of 1; float32/float64).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/conv_window.h"
#include "runtime/kernel.h"

namespace apart::cpu {

// Kernel, strides, dilations and begin pads of a 1-D or 2-D window (1-D as height 1). The end pads only bound
// the output size, which the caller knows.
struct Window2d {
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, ph = 0, pw = 0;
};
// From a gradient op's attributes (explicit pads only) for `spatial_rank` dims; Unsupported beyond 2-D.
Window2d window2d(const KernelContext& ctx, int64_t spatial_rank, std::vector<int64_t> kernel);
// From conv_window's or conv_transpose_window's result.
Window2d window2d(const KernelContext& ctx, const Window& w);

// The convolution y = conv(x, w): x (n, c, h, w), w (m, c/group, kh, kw), y (n, m, oh, ow).
struct ConvGeometry {
  int64_t n = 1, c = 1, h = 1, w = 1, m = 1, oh = 1, ow = 1, group = 1;
  Window2d win;
  int64_t channels_per_group() const { return c / group; }
  int64_t col_rows() const { return c / group * win.kh * win.kw; }
  int64_t out_spatial() const { return oh * ow; }
  // Offset in a group's input planes of column entry (r, oy, ox), or -1 in the padding.
  int64_t source(int64_t r, int64_t oy, int64_t ox) const {
    const int64_t ch = r / (win.kh * win.kw), ky = (r / win.kw) % win.kh, kx = r % win.kw;
    const int64_t iy = oy * win.sh - win.ph + ky * win.dh, ix = ox * win.sw - win.pw + kx * win.dw;
    return iy >= 0 && iy < h && ix >= 0 && ix < w ? (ch * h + iy) * w + ix : -1;
  }
};
// x and y shapes with 1 or 2 spatial dims (the same count), so 1-D gets its height of 1. InvalidModel through ctx
// when channels and group do not fit.
ConvGeometry conv_geometry(const KernelContext& ctx, const std::vector<int64_t>& x_shape,
                           const std::vector<int64_t>& y_shape, int64_t group, const Window2d& win);

// Each writes its whole output (no bias).
template <class T>
void conv_forward(const ConvGeometry& g, const T* x, const T* w, T* y);  // y = W · im2col(x)
template <class T>
void conv_data_grad(const ConvGeometry& g, const T* dy, const T* w, T* dx);  // dx = col2im(Wᵀ · dy)
template <class T>
void conv_weight_grad(const ConvGeometry& g, const T* dy, const T* x, T* dw);  // dw = Σ_images dy · im2col(x)ᵀ

}  // namespace apart::cpu
