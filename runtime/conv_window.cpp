// The ONNX window rules of Conv and the pools (conv_window.h).
#include "runtime/conv_window.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "graph/checked.h"

namespace apart {

// Output sizes and effective pads for `spatial` input dims (ONNX Conv/Pool rules incl. auto_pad).
Window conv_window(const KernelContext& ctx, const std::vector<int64_t>& in, std::vector<int64_t> kernel, bool ceil_mode) {
  const size_t s = in.size();
  Window w;
  w.kernel = std::move(kernel);
  w.stride = ctx.attr_ints("strides", std::vector<int64_t>(s, 1));
  w.dilation = ctx.attr_ints("dilations", std::vector<int64_t>(s, 1));
  std::vector<int64_t> pads = ctx.attr_ints("pads", std::vector<int64_t>(2 * s, 0));
  if (w.kernel.size() != s || w.stride.size() != s || w.dilation.size() != s || pads.size() != 2 * s)
    ctx.invalid("kernel_shape/strides/dilations/pads do not match the input's spatial rank");
  const std::string auto_pad = ctx.attr_string("auto_pad", "NOTSET");
  w.pad_begin.assign(pads.begin(), pads.begin() + static_cast<int64_t>(s));
  w.pad_end.assign(pads.begin() + static_cast<int64_t>(s), pads.end());
  w.out.resize(s);
  for (size_t i = 0; i < s; ++i) {
    if (w.stride[i] <= 0 || w.dilation[i] <= 0) ctx.invalid("strides and dilations must be positive");
    const int64_t extent = (w.kernel[i] - 1) * w.dilation[i] + 1;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      w.out[i] = (in[i] + w.stride[i] - 1) / w.stride[i];
      const int64_t total = std::max<int64_t>(0, (w.out[i] - 1) * w.stride[i] + extent - in[i]);
      w.pad_begin[i] = auto_pad == "SAME_UPPER" ? total / 2 : (total + 1) / 2;
      w.pad_end[i] = total - w.pad_begin[i];
    } else {
      if (auto_pad == "VALID") w.pad_begin[i] = w.pad_end[i] = 0;
      else if (auto_pad != "NOTSET" && !auto_pad.empty()) ctx.invalid("unknown auto_pad '" + auto_pad + "'");
      const int64_t span = in[i] + w.pad_begin[i] + w.pad_end[i] - extent;
      if (span < 0) ctx.invalid("the kernel is larger than the padded input");
      w.out[i] = (ceil_mode ? (span + w.stride[i] - 1) / w.stride[i] : span / w.stride[i]) + 1;
      // A window may not start in the end padding (ceil_mode).
      if (ceil_mode && (w.out[i] - 1) * w.stride[i] >= in[i] + w.pad_begin[i]) --w.out[i];
    }
  }
  return w;
}

Window conv_transpose_window(const KernelContext& ctx, const std::vector<int64_t>& in, std::vector<int64_t> kernel) {
  const size_t s = in.size();
  Window w;
  w.kernel = std::move(kernel);
  w.stride = ctx.attr_ints("strides", std::vector<int64_t>(s, 1));
  w.dilation = ctx.attr_ints("dilations", std::vector<int64_t>(s, 1));
  const std::vector<int64_t> pads = ctx.attr_ints("pads", std::vector<int64_t>(2 * s, 0));
  const std::vector<int64_t> output_padding = ctx.attr_ints("output_padding", std::vector<int64_t>(s, 0));
  std::vector<int64_t> output_shape = ctx.attr_ints("output_shape");
  if (output_shape.size() == s + 2) output_shape.erase(output_shape.begin(), output_shape.begin() + 2);  // N, C given too
  if (w.kernel.size() != s || w.stride.size() != s || w.dilation.size() != s || pads.size() != 2 * s ||
      output_padding.size() != s || (!output_shape.empty() && output_shape.size() != s))
    ctx.invalid("kernel_shape/strides/dilations/pads/output_padding/output_shape do not match the input's spatial rank");
  const std::string auto_pad = ctx.attr_string("auto_pad", "NOTSET");
  const bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  if (!same && auto_pad != "NOTSET" && auto_pad != "VALID" && !auto_pad.empty()) ctx.invalid("unknown auto_pad '" + auto_pad + "'");
  w.pad_begin.assign(pads.begin(), pads.begin() + static_cast<int64_t>(s));
  w.pad_end.assign(pads.begin() + static_cast<int64_t>(s), pads.end());
  w.out.resize(s);
  for (size_t i = 0; i < s; ++i) {
    if (w.stride[i] <= 0 || w.dilation[i] <= 0 || w.kernel[i] <= 0) ctx.invalid("strides, dilations and kernel must be positive");
    // In double first: attributes from a file must not overflow the int64 arithmetic.
    const double full_estimate = static_cast<double>(w.stride[i]) * static_cast<double>(in[i]) +
                                 std::fabs(static_cast<double>(output_padding[i])) +
                                 static_cast<double>(w.kernel[i]) * static_cast<double>(w.dilation[i]);
    if (full_estimate > static_cast<double>(limits::kMaxDim) ||
        std::max(std::abs(w.pad_begin[i]), std::abs(w.pad_end[i])) > limits::kMaxDim ||
        (!output_shape.empty() && (output_shape[i] < 0 || output_shape[i] > limits::kMaxDim)))
      ctx.invalid("ConvTranspose's output would exceed " + std::to_string(limits::kMaxDim) + " along a dim");
    const int64_t full = w.stride[i] * (in[i] - 1) + output_padding[i] + (w.kernel[i] - 1) * w.dilation[i] + 1;
    if (!output_shape.empty() || same) {
      const int64_t total = full - (output_shape.empty() ? in[i] * w.stride[i] : output_shape[i]);
      w.pad_begin[i] = total < 0 ? 0 : auto_pad == "SAME_LOWER" ? total - total / 2 : total / 2;
      w.pad_end[i] = total - w.pad_begin[i];
    } else if (auto_pad == "VALID") {
      w.pad_begin[i] = w.pad_end[i] = 0;
    }
    w.out[i] = full - w.pad_begin[i] - w.pad_end[i];
    if (w.out[i] <= 0) ctx.invalid("the pads leave no output");
  }
  return w;
}

BatchNormArgs batch_norm_args(const KernelContext& ctx) {
  BatchNormArgs args;
  args.training = ctx.attr_int("training_mode", 0) != 0;
  if (ctx.attr_int("spatial", 1) == 0) ctx.unsupported("spatial=0");
  if (!args.training)
    for (size_t i = 1; i < ctx.num_outputs(); ++i)
      if (ctx.wants_output(i)) ctx.unsupported("BatchNormalization's training outputs outside training mode");
  if (args.training && ctx.num_outputs() > 3 && (ctx.wants_output(3) || ctx.wants_output(4)))
    ctx.unsupported("BatchNormalization's saved_mean/saved_var outputs (opset < 14)");
  args.epsilon = ctx.attr_float("epsilon", 1e-5);
  args.momentum = ctx.attr_float("momentum", 0.9);
  return args;
}

}  // namespace apart
