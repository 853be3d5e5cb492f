// What an op's attributes and shape-like inputs mean (Reshape's target, Slice's window, a reduction's axes, …),
// read once for the CPU kernels (cpu/) and the CUDA kernels (cuda/): through KernelContext::host_input, so the
// device kernels get the same output shapes and index geometry from host copies. Errors name the node.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "runtime/kernel.h"

namespace apart {

// Reshape (target shape: 0 copies a dim unless allowzero, one -1 is inferred), Flatten, Squeeze, Unsqueeze.
std::vector<int64_t> reshape_output_shape(const KernelContext& ctx);
std::vector<int64_t> flatten_output_shape(const KernelContext& ctx);
std::vector<int64_t> squeeze_output_shape(const KernelContext& ctx);
std::vector<int64_t> unsqueeze_output_shape(const KernelContext& ctx);

// An output that reads the input at element strides from a base offset: out[i] = in[base + Σ idx_d · strides_d].
struct StridedView {
  std::vector<int64_t> shape, strides;
  int64_t base = 0;
};
StridedView transpose_view(const KernelContext& ctx);  // perm (default: reversed dims)
StridedView slice_view(const KernelContext& ctx);      // starts/ends/axes/steps (attributes before opset 10)

// Concat's output shape (inputs checked to agree off the axis) and normalised axis.
std::vector<int64_t> concat_output_shape(const KernelContext& ctx, int64_t& axis);
// Split's part sizes along its normalised axis (input, attribute, or equal parts), one per output.
std::vector<int64_t> split_sizes(const KernelContext& ctx, int64_t& axis);
// Gather's output shape: data[:axis] + indices + data[axis+1:].
std::vector<int64_t> gather_output_shape(const KernelContext& ctx, int64_t& axis);

// Reduce*: which dims are reduced (axes from the attribute or, opset 13+/18+, input 1), the output shape with and
// without keepdims, the elements per output. `noop`: empty axes with noop_with_empty_axes (a copy).
struct ReduceArgs {
  bool noop = false;
  std::vector<bool> reduced;
  std::vector<int64_t> kept_shape, out_shape;
  int64_t count = 1;
};
ReduceArgs reduce_args(const KernelContext& ctx);

// Softmax/LogSoftmax: `n` elements spaced `inner` apart, outer × inner lines. Opset < 13 coerces to 2-D at axis
// (n = the product of the trailing dims, inner = 1), opset 13+ normalises along one axis.
struct SoftmaxArgs {
  int64_t outer = 1, n = 1, inner = 1;
};
SoftmaxArgs softmax_args(const KernelContext& ctx);

// LayerNormalization: rows of n elements (the dims from axis on), epsilon, the Mean/InvStdDev shape.
struct LayerNormArgs {
  int64_t rows = 1, n = 1;
  double epsilon = 1e-5;
  std::vector<int64_t> norm_shape, stat_shape;
};
LayerNormArgs layer_norm_args(const KernelContext& ctx);

// Dropout: the ratio and mode (attribute before opset 12, inputs 1 and 2 after); `stream` is the node's random
// stream mixed with its own `seed` attribute. InvalidModel for ratio >= 1 in training mode.
struct DropoutArgs {
  double ratio = 0.5;
  bool training = false;
  uint64_t stream = 0;
  bool drops() const { return training && ratio > 0; }
};
DropoutArgs dropout_args(const KernelContext& ctx);

// Sum/Mean/Min/Max: the inputs' common dtype and broadcast shape (at least one input, one dtype, not bool;
// InvalidModel/Unsupported through ctx otherwise).
struct VariadicArgs {
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;
};
VariadicArgs variadic_args(const KernelContext& ctx);

// Pad: per-axis begin/end pads (negative ones crop), the mode and the constant: the `pads`/`value` attributes before
// opset 11, inputs 1 (pads) and 2 (constant_value) from 11, input 3 (axes) from 18.
enum class PadMode { kConstant, kReflect, kEdge, kWrap };
struct PadArgs {
  std::vector<int64_t> begin, end, out_shape;
  PadMode mode = PadMode::kConstant;
  double value = 0;
};
PadArgs pad_args(const KernelContext& ctx, const std::vector<int64_t>& in_shape);
// PadMode from its ONNX name; InvalidModel through ctx for another.
PadMode pad_mode(const KernelContext& ctx, const std::string& mode);
// The input index that output index `o` of an axis (input length `len`, `begin` pads) reads, or -1 for the constant.
// Reflect mirrors about the edge elements without repeating them (numpy's "reflect"), edge repeats them, wrap is
// periodic; all three hold for pads longer than the axis.
inline int64_t pad_source(int64_t o, int64_t len, int64_t begin, PadMode mode) {
  const int64_t i = o - begin;
  if (i >= 0 && i < len) return i;
  switch (mode) {
    case PadMode::kConstant: return -1;
    case PadMode::kEdge: return i < 0 ? 0 : len - 1;
    case PadMode::kWrap: return ((i % len) + len) % len;
    case PadMode::kReflect: {
      if (len == 1) return 0;
      const int64_t period = 2 * (len - 1), m = ((i % period) + period) % period;
      return m < len ? m : period - m;
    }
  }
  return -1;
}

// Resize (opset 10: scales = input 1; 11+: roi, scales, sizes = inputs 1–3) and Upsample (scales: attribute at
// opset 7, input 1 from 9): the shapes, each axis's scale (given, or out/in when sizes are) and the attributes.
// Resize-10 and Upsample are asymmetric and round nearest down, as their ONNX reference does.
struct ResizeArgs {
  std::vector<int64_t> in_shape, out_shape;
  std::vector<double> scales, roi;  // roi: starts then ends, normalised (tf_crop_and_resize)
  std::string mode = "nearest", coordinate_mode = "half_pixel", nearest_mode = "round_prefer_floor";
  double cubic_a = -0.75, extrapolation = 0;
  bool exclude_outside = false;
};
ResizeArgs resize_args(const KernelContext& ctx, const std::vector<int64_t>& in_shape);
// ai.apart.ResizeGrad(dY, roi, scales, x_shape): the forward Resize's arguments, from its attributes, its roi and
// scales (either may be empty) and the shape of X.
ResizeArgs resize_grad_args(const KernelContext& ctx);

// Clip's bounds (T not bool): the min/max attributes before opset 11, the optional scalar inputs 1 and 2 from 11;
// the type's whole range where one is absent.
template <class T>
std::pair<T, T> clip_bounds(const KernelContext& ctx) {
  T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
  if (ctx.opset() < 11) {
    lo = static_cast<T>(ctx.attr_float("min", -std::numeric_limits<float>::max()));
    hi = static_cast<T>(ctx.attr_float("max", std::numeric_limits<float>::max()));
  } else {
    if (ctx.has_input(1)) lo = ctx.host_input(1).template data<T>()[0];
    if (ctx.has_input(2)) hi = ctx.host_input(2).template data<T>()[0];
  }
  return {lo, hi};
}

}  // namespace apart
