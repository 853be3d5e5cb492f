// Convolution and ConvTranspose (1-D/2-D, groups, strides, pads, auto_pad, dilations; im2col + GEMM, conv_gemm.h;
// float32/float64), MaxPool and AveragePool (N-d, ceil_mode, count_include_pad), global pools, BatchNormalization.
#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/conv_window.h"
#include "runtime/cpu/broadcast.h"
#include "runtime/cpu/conv_gemm.h"
#include "runtime/cpu/families.h"
#include "runtime/cpu/threads.h"

namespace apart::cpu {
namespace {

// Adds bias input 2 (one value per output channel) to y (n, m, spatial…).
template <class T>
void add_bias(const KernelContext& ctx, Tensor& y) {
  if (!ctx.has_input(2)) return;
  const T* pb = ctx.input(2).template data<T>();
  const int64_t m = y.dim(1), spatial = product(y.shape(), 2);
  if (ctx.input(2).elements() != m) ctx.invalid("B must have one value per output channel");
  T* py = y.data<T>();
  for (int64_t b = 0; b < y.dim(0); ++b)
    for (int64_t o = 0; o < m; ++o)
      for (int64_t i = 0; i < spatial; ++i) py[(b * m + o) * spatial + i] += pb[o];
}

void conv_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& wt = ctx.input(1);
  if (x.rank() != 3 && x.rank() != 4) ctx.unsupported("Conv over " + std::to_string(x.rank() - 2) + " spatial dims (1-D and 2-D are supported)");
  const int64_t c = x.dim(1), m = wt.dim(0), group = ctx.attr_int("group", 1);
  const std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end());
  std::vector<int64_t> kernel(wt.shape().begin() + 2, wt.shape().end());
  if (ctx.has_attr("kernel_shape") && ctx.attr_ints("kernel_shape") != kernel) ctx.invalid("kernel_shape differs from W");
  if (group <= 0 || c % group != 0 || wt.dim(1) != c / group) ctx.invalid("channels do not match group");
  const Window w = conv_window(ctx, in, kernel, false);
  std::vector<int64_t> out_shape{x.dim(0), m};
  out_shape.insert(out_shape.end(), w.out.begin(), w.out.end());
  const ConvGeometry geo = conv_geometry(ctx, x.shape(), out_shape, group, window2d(ctx, w));
  // float64 too: whole-model gradient checks run in double (tests/codegen/autodiff_test.cpp).
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& y = ctx.output(0, x.dtype(), out_shape);
    conv_forward<T>(geo, x.data<T>(), wt.data<T>(), y.data<T>());
    add_bias<T>(ctx, y);
  });
}

// ConvTranspose (1-D/2-D): the data gradient of the Conv that maps Y to X with the same W, strides, dilations,
// pads and group (col2im(Wᵀ · X)), plus the bias. W is (C, M/group, k…); the window rules are conv_window.h's.
void conv_transpose_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& wt = ctx.input(1);
  if (x.rank() != 3 && x.rank() != 4)
    ctx.unsupported("ConvTranspose over " + std::to_string(x.rank() - 2) + " spatial dims (1-D and 2-D are supported)");
  const int64_t c = x.dim(1), group = ctx.attr_int("group", 1);
  if (wt.rank() != x.rank() || wt.dim(0) != c || group <= 0 || c % group != 0) ctx.invalid("W does not match X and group");
  const std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end());
  const std::vector<int64_t> kernel(wt.shape().begin() + 2, wt.shape().end());
  if (ctx.has_attr("kernel_shape") && ctx.attr_ints("kernel_shape") != kernel) ctx.invalid("kernel_shape differs from W");
  const Window w = conv_transpose_window(ctx, in, kernel);
  std::vector<int64_t> out_shape{x.dim(0), wt.dim(1) * group};
  out_shape.insert(out_shape.end(), w.out.begin(), w.out.end());
  // The Conv from Y (out_shape) to X: its weight is W as stored.
  const ConvGeometry geo = conv_geometry(ctx, out_shape, x.shape(), group, window2d(ctx, w));
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& y = ctx.output(0, x.dtype(), out_shape);
    conv_data_grad<T>(geo, x.data<T>(), wt.data<T>(), y.data<T>());
    add_bias<T>(ctx, y);
  });
}

// N-d pooling: for each output position, visit the in-bounds kernel positions.
void pool(KernelContext& ctx, bool is_max) {
  const Tensor& x = ctx.input(0);
  if (x.rank() < 3) ctx.invalid("input must have spatial dims");
  if (is_max && ctx.num_outputs() > 1 && ctx.wants_output(1)) ctx.unsupported("MaxPool's Indices output");
  const std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end());
  const bool ceil_mode = ctx.attr_int("ceil_mode", 0) != 0;
  const bool include_pad = ctx.attr_int("count_include_pad", 0) != 0;
  Window w = conv_window(ctx, in, ctx.attr_ints("kernel_shape"), ceil_mode);
  const size_t s = in.size();
  std::vector<int64_t> out_shape{x.dim(0), x.dim(1)};
  out_shape.insert(out_shape.end(), w.out.begin(), w.out.end());
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& y = ctx.output(0, x.dtype(), out_shape);
    const int64_t planes = x.dim(0) * x.dim(1), in_size = product(in), out_size = product(w.out), k_size = product(w.kernel);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(planes, out_size * k_size, [&](int64_t pb, int64_t pe) {
      std::vector<int64_t> o(s), k(s);
      for (int64_t p = pb; p < pe; ++p) {
        const T* plane = px + p * in_size;
        for (int64_t oi = 0; oi < out_size; ++oi) {
          for (int64_t rem = oi, d = static_cast<int64_t>(s) - 1; d >= 0; --d) {
            o[d] = rem % w.out[d];
            rem /= w.out[d];
          }
          double acc = is_max ? -std::numeric_limits<double>::infinity() : 0.0;
          int64_t count = 0, padded_count = 0;
          for (int64_t ki = 0; ki < k_size; ++ki) {
            for (int64_t rem = ki, d = static_cast<int64_t>(s) - 1; d >= 0; --d) {
              k[d] = rem % w.kernel[d];
              rem /= w.kernel[d];
            }
            bool inside = true, inside_padded = true;
            int64_t offset = 0;
            for (size_t d = 0; d < s; ++d) {
              const int64_t pos = o[d] * w.stride[d] - w.pad_begin[d] + k[d] * w.dilation[d];
              inside = inside && pos >= 0 && pos < in[d];
              inside_padded = inside_padded && pos < in[d] + w.pad_end[d];
              offset = offset * in[d] + pos;
            }
            padded_count += inside_padded;
            if (!inside) continue;
            const double v = plane[offset];
            ++count;
            if (is_max) acc = std::max(acc, v);
            else acc += v;
          }
          if (!is_max) acc = (include_pad ? padded_count : count) > 0 ? acc / static_cast<double>(include_pad ? padded_count : count) : 0.0;
          py[p * out_size + oi] = static_cast<T>(acc);
        }
      }
    });
  });
}
void max_pool_k(KernelContext& c) {
  if (c.attr_int("storage_order", 0) != 0) c.unsupported("storage_order=1");
  pool(c, true);
}
void average_pool_k(KernelContext& c) { pool(c, false); }

void global_pool(KernelContext& ctx, bool is_max) {
  const Tensor& x = ctx.input(0);
  if (x.rank() < 2) ctx.invalid("input must have rank >= 2");
  std::vector<int64_t> shape(static_cast<size_t>(x.rank()), 1);
  shape[0] = x.dim(0);
  shape[1] = x.dim(1);
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& y = ctx.output(0, x.dtype(), shape);
    const int64_t planes = x.dim(0) * x.dim(1), size = product(x.shape(), 2);
    for (int64_t p = 0; p < planes; ++p) {
      double acc = is_max ? -std::numeric_limits<double>::infinity() : 0.0;
      for (int64_t i = 0; i < size; ++i) acc = is_max ? std::max<double>(acc, x.data<T>()[p * size + i]) : acc + x.data<T>()[p * size + i];
      y.data<T>()[p] = static_cast<T>(is_max ? acc : acc / static_cast<double>(size));
    }
  });
}
void global_average_pool_k(KernelContext& c) { global_pool(c, false); }
void global_max_pool_k(KernelContext& c) { global_pool(c, true); }

// Inference: y = (x − mean) / sqrt(var + ε) · scale + bias, per channel (axis 1). Training mode
// (opset ≥ 14): batch statistics (population variance) normalise, and outputs 1/2 are the running
// statistics: running = input · momentum + batch · (1 − momentum).
void batch_norm_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const BatchNormArgs args = batch_norm_args(ctx);
  const bool training = args.training;
  const double eps = args.epsilon, momentum = args.momentum;
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    const int64_t n = x.dim(0), c = x.rank() > 1 ? x.dim(1) : 1, inner = product(x.shape(), 2);
    for (size_t i = 1; i < 5; ++i)
      if (ctx.input(i).elements() != c) ctx.invalid("scale/B/mean/var must have C elements");
    const T *scale = ctx.input(1).template data<T>(), *bias = ctx.input(2).template data<T>();
    std::vector<double> mean(static_cast<size_t>(c)), var(static_cast<size_t>(c));
    for (int64_t ch = 0; ch < c; ++ch) {
      mean[ch] = static_cast<double>(ctx.input(3).template data<T>()[ch]);
      var[ch] = static_cast<double>(ctx.input(4).template data<T>()[ch]);
    }
    if (training) {
      const double count = static_cast<double>(n * inner);
      for (int64_t ch = 0; ch < c; ++ch) {
        double sum = 0, sq = 0;
        for (int64_t b = 0; b < n; ++b) {
          const T* src = x.data<T>() + (b * c + ch) * inner;
          for (int64_t i = 0; i < inner; ++i) sum += src[i];
        }
        const double mu = sum / count;
        for (int64_t b = 0; b < n; ++b) {
          const T* src = x.data<T>() + (b * c + ch) * inner;
          for (int64_t i = 0; i < inner; ++i) sq += (src[i] - mu) * (src[i] - mu);
        }
        const double batch_var = sq / count;
        mean[ch] = mu;
        var[ch] = batch_var;
      }
      for (size_t k = 1; k <= 2; ++k) {
        if (ctx.num_outputs() <= k || !ctx.wants_output(k)) continue;
        Tensor& running = ctx.output(k, x.dtype(), {c});
        for (int64_t ch = 0; ch < c; ++ch) {
          const double old = static_cast<double>(ctx.input(2 + k).template data<T>()[ch]);
          const double batch = k == 1 ? mean[ch] : var[ch];
          running.template data<T>()[ch] = static_cast<T>(old * momentum + batch * (1 - momentum));
        }
      }
    }
    for (int64_t b = 0; b < n; ++b)
      for (int64_t ch = 0; ch < c; ++ch) {
        const double mul = scale[ch] / std::sqrt(var[ch] + eps);
        const double add = bias[ch] - mean[ch] * mul;
        const T* src = x.data<T>() + (b * c + ch) * inner;
        T* dst = y.data<T>() + (b * c + ch) * inner;
        for (int64_t i = 0; i < inner; ++i) dst[i] = static_cast<T>(src[i] * mul + add);
      }
  });
}

}  // namespace

void register_conv_kernels() {
  register_kernel("Conv", conv_k);
  register_kernel("ConvTranspose", conv_transpose_k);
  register_kernel("MaxPool", max_pool_k);
  register_kernel("AveragePool", average_pool_k);
  register_kernel("GlobalAveragePool", global_average_pool_k);
  register_kernel("GlobalMaxPool", global_max_pool_k);
  register_kernel("BatchNormalization", batch_norm_k);
}

}  // namespace apart::cpu
