// Resize and Upsample (nearest, linear, cubic; every coordinate_transformation_mode of opset 11–13) and their
// gradient ai.apart.ResizeGrad (float32/float64). Resizing is separable: one 1-D pass per resized axis, innermost
// first as ONNX's reference interpolates, each output element a weighted sum of a few input elements along the axis
// (its taps). The gradient runs the transposed passes in the opposite order, scattering with the same weights.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/cpu/families.h"
#include "runtime/cpu/threads.h"
#include "runtime/op_args.h"

namespace apart::cpu {
namespace {

// One axis's taps: output index o reads input indices index[o·width + k] with weight[o·width + k], or, where
// outside[o], is the extrapolation value (tf_crop_and_resize outside the roi).
struct AxisTaps {
  int64_t in = 0, out = 0, width = 1;
  std::vector<int64_t> index;
  std::vector<double> weight;
  std::vector<bool> outside;
  bool identity() const {
    if (in != out || width != 1) return false;
    for (int64_t o = 0; o < out; ++o)
      if (outside[o] || index[o] != o) return false;
    return true;
  }
};

// The input coordinate of output index o (ONNX's coordinate transforms; "output width" is scale · in, as the
// reference computes it), and whether it lies outside a tf_crop_and_resize roi.
double original_coordinate(const ResizeArgs& a, size_t d, int64_t o, bool& outside) {
  const double in = static_cast<double>(a.in_shape[d]), scale = a.scales[d], width = scale * in;
  const double x = static_cast<double>(o);
  const std::string& m = a.coordinate_mode;
  outside = false;
  if (m == "align_corners") return width == 1 ? 0.0 : x * (in - 1) / (width - 1);
  if (m == "asymmetric") return x / scale;
  if (m == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  if (m == "pytorch_half_pixel") return width == 1 ? -0.5 : (x + 0.5) / scale - 0.5;
  if (m == "tf_crop_and_resize") {
    const size_t r = a.in_shape.size();
    const double start = a.roi[d], end = a.roi[d + r];
    double v = width == 1 ? (end - start) * (in - 1) / 2 : x * (end - start) * (in - 1) / (width - 1);
    v += start * (in - 1);
    outside = !(v >= 0 && v <= in - 1);  // NaN too (a roi read from a file)
    return outside ? 0.0 : v;
  }
  return (x + 0.5) / scale - 0.5;  // half_pixel
}

AxisTaps axis_taps(const ResizeArgs& a, size_t d) {
  AxisTaps t;
  t.in = a.in_shape[d];
  t.out = a.out_shape[d];
  t.width = a.mode == "cubic" ? 4 : a.mode == "linear" ? 2 : 1;
  t.index.resize(static_cast<size_t>(t.out * t.width));
  t.weight.resize(t.index.size());
  t.outside.assign(static_cast<size_t>(t.out), false);
  for (int64_t o = 0; o < t.out; ++o) {
    bool outside = false;
    const double x = original_coordinate(a, d, o, outside);
    t.outside[o] = outside;
    // The left neighbour x0 and ratio in (0, 1]: an integral x is x0 + 1 with ratio 1, as the reference has it.
    const int64_t x0 = static_cast<int64_t>(std::ceil(x)) - 1;
    const double ratio = x - static_cast<double>(x0);
    int64_t* idx = &t.index[static_cast<size_t>(o * t.width)];
    double* w = &t.weight[static_cast<size_t>(o * t.width)];
    if (t.width == 1) {
      const std::string& nm = a.nearest_mode;
      const bool right = ratio == 1 || nm == "ceil" || (nm == "round_prefer_floor" && ratio > 0.5) ||
                         (nm == "round_prefer_ceil" && ratio >= 0.5);
      idx[0] = right ? x0 + 1 : x0;
      w[0] = 1;
    } else if (t.width == 2) {
      idx[0] = x0, idx[1] = x0 + 1;
      w[0] = 1 - ratio, w[1] = ratio;
    } else {
      const double A = a.cubic_a, r1 = ratio + 1, l = 1 - ratio, l1 = l + 1;
      idx[0] = x0 - 1, idx[1] = x0, idx[2] = x0 + 1, idx[3] = x0 + 2;
      w[0] = ((A * r1 - 5 * A) * r1 + 8 * A) * r1 - 4 * A;
      w[1] = ((A + 2) * ratio - (A + 3)) * ratio * ratio + 1;
      w[2] = ((A + 2) * l - (A + 3)) * l * l + 1;
      w[3] = ((A * l1 - 5 * A) * l1 + 8 * A) * l1 - 4 * A;
    }
    if (a.exclude_outside && t.width > 1) {
      double sum = 0;
      for (int64_t k = 0; k < t.width; ++k) {
        if (idx[k] < 0 || idx[k] >= t.in) w[k] = 0;
        sum += w[k];
      }
      for (int64_t k = 0; k < t.width; ++k) w[k] /= sum;
    }
    for (int64_t k = 0; k < t.width; ++k) idx[k] = std::clamp<int64_t>(idx[k], 0, t.in - 1);  // edge padding
  }
  return t;
}

std::vector<AxisTaps> all_taps(const KernelContext& ctx, const ResizeArgs& a) {
  std::vector<AxisTaps> taps;
  for (size_t d = 0; d < a.in_shape.size(); ++d) {
    if (a.in_shape[d] == 0 && a.out_shape[d] > 0) ctx.invalid("cannot resize an empty axis");
    taps.push_back(axis_taps(a, d));
  }
  return taps;
}

// One 1-D pass along `axis` of a tensor of `shape`: forward reads taps, transposed scatters into them.
void resize_axis(const AxisTaps& t, const std::vector<int64_t>& shape, size_t axis, double extrapolation,
                 const std::vector<double>& src, std::vector<double>& dst, bool transposed) {
  const int64_t outer = product(shape, 0, axis), inner = product(shape, axis + 1);
  const int64_t src_len = transposed ? t.out : t.in, dst_len = transposed ? t.in : t.out;
  dst.assign(static_cast<size_t>(outer * dst_len * inner), 0.0);
  parallel_for(outer, t.out * inner * t.width, [&](int64_t ob, int64_t oe) {
    for (int64_t p = ob; p < oe; ++p) {
      const double* s = src.data() + p * src_len * inner;
      double* dd = dst.data() + p * dst_len * inner;
      for (int64_t o = 0; o < t.out; ++o) {
        const int64_t* idx = &t.index[static_cast<size_t>(o * t.width)];
        const double* w = &t.weight[static_cast<size_t>(o * t.width)];
        if (transposed) {
          if (t.outside[o]) continue;  // a constant: no gradient
          for (int64_t k = 0; k < t.width; ++k)
            for (int64_t i = 0; i < inner; ++i) dd[idx[k] * inner + i] += w[k] * s[o * inner + i];
        } else if (t.outside[o]) {
          for (int64_t i = 0; i < inner; ++i) dd[o * inner + i] = extrapolation;
        } else {
          for (int64_t k = 0; k < t.width; ++k)
            for (int64_t i = 0; i < inner; ++i) dd[o * inner + i] += w[k] * s[idx[k] * inner + i];
        }
      }
    }
  });
}

// Forward (x of in_shape → y of out_shape) or transposed (dy of out_shape → dx of in_shape), in double.
template <class T>
void resample(const KernelContext& ctx, const ResizeArgs& a, const T* src, T* dst, bool transposed) {
  const std::vector<AxisTaps> taps = all_taps(ctx, a);
  std::vector<int64_t> shape = transposed ? a.out_shape : a.in_shape;
  std::vector<double> cur(src, src + product(shape)), next;
  const size_t r = shape.size();
  for (size_t k = 0; k < r; ++k) {
    const size_t d = transposed ? k : r - 1 - k;  // the forward goes innermost first; its transpose the other way
    if (taps[d].identity()) continue;
    resize_axis(taps[d], shape, d, a.extrapolation, cur, next, transposed);
    shape[d] = transposed ? a.in_shape[d] : a.out_shape[d];
    cur.swap(next);
  }
  for (size_t i = 0; i < cur.size(); ++i) dst[i] = static_cast<T>(cur[i]);
}

void resize_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const ResizeArgs a = resize_args(ctx, x.shape());
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& y = ctx.output(0, x.dtype(), a.out_shape);
    resample<T>(ctx, a, x.data<T>(), y.data<T>(), false);
  });
}

// ai.apart.ResizeGrad(dY, roi, scales, x_shape) → dX: the forward's passes transposed.
void resize_grad_k(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const ResizeArgs a = resize_grad_args(ctx);
  dispatch_float(ctx, dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& dx = ctx.output(0, dy.dtype(), a.in_shape);
    resample<T>(ctx, a, dy.data<T>(), dx.data<T>(), true);
  });
}

}  // namespace

void register_resize_kernels() {
  register_kernel("Resize", resize_k);
  register_kernel("Upsample", resize_k);
  register_kernel("ai.apart.ResizeGrad", resize_grad_k);
}

}  // namespace apart::cpu
