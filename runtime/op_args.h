// What an op's attributes and shape-like inputs mean (Reshape's target, Slice's window, a reduction's axes, …),
// read once for the CPU kernels (cpu/) and the CUDA kernels (cuda/): through KernelContext::host_input, so the
// device kernels get the same output shapes and index geometry from host copies. Errors name the node.
#pragma once

#include <cstdint>
#include <limits>
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
