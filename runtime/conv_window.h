// The ONNX window rules of Conv, ConvTranspose and the pools (kernel, strides, dilations, pads incl. auto_pad, ceil_mode → output
// sizes and effective pads) and BatchNormalization's attribute rules: one home, used by the CPU kernels
// (cpu/conv.cpp) and the CUDA ones (cuda/conv.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/kernel.h"

namespace apart {

struct Window {
  std::vector<int64_t> kernel, stride, dilation, pad_begin, pad_end, out;
};

// Output sizes and effective pads for the `spatial` input dims of ctx's node (attributes strides, dilations, pads,
// auto_pad); throws InvalidModel through ctx when they do not fit.
Window conv_window(const KernelContext& ctx, const std::vector<int64_t>& spatial, std::vector<int64_t> kernel,
                   bool ceil_mode);

// ConvTranspose's output sizes and pads for its `spatial` input dims (attributes strides, dilations, pads,
// output_padding, output_shape, auto_pad). The full output is stride·(in − 1) + output_padding + extent; pads crop
// it. An output_shape (or SAME_*: in·stride) fixes the total crop, split as Conv splits it: SAME_LOWER puts the odd
// one at the begin, SAME_UPPER and NOTSET at the end; an output_shape beyond the full size adds zeros at the end
// (a negative end pad), as ONNX's test_convtranspose_output_shape expects.
Window conv_transpose_window(const KernelContext& ctx, const std::vector<int64_t>& spatial, std::vector<int64_t> kernel);

// BatchNormalization's mode and constants, after the checks both backends make: spatial=1 only; the training
// outputs only in training mode; no saved_mean/saved_var (opset < 14). Unsupported through ctx otherwise.
struct BatchNormArgs {
  bool training = false;
  double epsilon = 1e-5;
  double momentum = 0.9;
};
BatchNormArgs batch_norm_args(const KernelContext& ctx);

}  // namespace apart
