// What an op's attributes and shape-like inputs mean, for the CPU and the CUDA kernels alike (op_args.h).
#include "runtime/op_args.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <string>

#include "graph/checked.h"
#include "graph/error.h"

namespace apart {

std::vector<int64_t> reshape_output_shape(const KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> shape = ctx.opset() < 5 ? ctx.attr_ints("shape") : ctx.host_input(1).to_int64s();
  const bool allowzero = ctx.attr_int("allowzero", 0) != 0;
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0 && !allowzero) {
      if (static_cast<int64_t>(i) >= x.rank()) ctx.invalid("shape dim 0 copies a dim the input lacks");
      shape[i] = x.dim(static_cast<int64_t>(i));
    }
    if (shape[i] == -1) {
      if (infer >= 0) ctx.invalid("more than one -1 in the target shape");
      infer = static_cast<int64_t>(i);
    } else if (shape[i] < 0) {
      ctx.invalid("negative dim in the target shape");
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || x.elements() % known != 0) ctx.invalid("cannot infer the -1 dim");
    shape[static_cast<size_t>(infer)] = x.elements() / known;
  }
  if (product(shape) != x.elements())
    ctx.invalid("cannot reshape " + shape_string(x.shape()) + " to " + shape_string(shape));
  return shape;
}

std::vector<int64_t> flatten_output_shape(const KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  int64_t axis = ctx.attr_int("axis", 1);
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis > x.rank()) ctx.invalid("axis out of range");
  return {product(x.shape(), 0, static_cast<size_t>(axis)), product(x.shape(), static_cast<size_t>(axis))};
}

namespace {
std::vector<int64_t> axes_arg(const KernelContext& ctx, size_t input) {
  if (ctx.opset() >= 13) return ctx.has_input(input) ? ctx.host_input(input).to_int64s() : std::vector<int64_t>{};
  return ctx.attr_ints("axes");
}
}  // namespace

std::vector<int64_t> squeeze_output_shape(const KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> axes = axes_arg(ctx, 1);
  std::vector<bool> drop(static_cast<size_t>(x.rank()), false);
  if (axes.empty())
    for (int64_t d = 0; d < x.rank(); ++d) drop[d] = x.dim(d) == 1;
  for (int64_t a : axes) {
    a = normalize_axis(ctx, a, x.rank());
    if (x.dim(a) != 1) ctx.invalid("cannot squeeze axis " + std::to_string(a) + " of size " + std::to_string(x.dim(a)));
    drop[static_cast<size_t>(a)] = true;
  }
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (!drop[d]) shape.push_back(x.dim(d));
  return shape;
}

std::vector<int64_t> unsqueeze_output_shape(const KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> axes = axes_arg(ctx, 1);
  const int64_t r = x.rank() + static_cast<int64_t>(axes.size());
  std::vector<bool> inserted(static_cast<size_t>(r), false);
  for (int64_t a : axes) {
    a = normalize_axis(ctx, a, r);
    if (inserted[a]) ctx.invalid("repeated axis");
    inserted[static_cast<size_t>(a)] = true;
  }
  std::vector<int64_t> shape;
  size_t src = 0;
  for (int64_t d = 0; d < r; ++d) shape.push_back(inserted[d] ? 1 : x.shape()[src++]);
  return shape;
}

StridedView transpose_view(const KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t r = x.rank();
  std::vector<int64_t> perm = ctx.attr_ints("perm");
  if (perm.empty())
    for (int64_t d = r - 1; d >= 0; --d) perm.push_back(d);
  if (static_cast<int64_t>(perm.size()) != r) ctx.invalid("perm has the wrong length");
  const auto in_strides = contiguous_strides(x.shape());
  StridedView view;
  view.shape.resize(static_cast<size_t>(r));
  view.strides.resize(static_cast<size_t>(r));
  for (int64_t d = 0; d < r; ++d) {
    const int64_t p = normalize_axis(ctx, perm[d], r);
    view.shape[d] = x.dim(p);
    view.strides[d] = in_strides[static_cast<size_t>(p)];
  }
  return view;
}

StridedView slice_view(const KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t r = x.rank();
  std::vector<int64_t> starts, ends, axes, steps;
  if (ctx.opset() < 10) {
    starts = ctx.attr_ints("starts");
    ends = ctx.attr_ints("ends");
    axes = ctx.attr_ints("axes");
  } else {
    starts = ctx.host_input(1).to_int64s();
    ends = ctx.host_input(2).to_int64s();
    if (ctx.has_input(3)) axes = ctx.host_input(3).to_int64s();
    if (ctx.has_input(4)) steps = ctx.host_input(4).to_int64s();
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    ctx.invalid("starts/ends/axes/steps lengths differ");
  std::vector<int64_t> begin(static_cast<size_t>(r), 0), step(static_cast<size_t>(r), 1), shape = x.shape();
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t a = normalize_axis(ctx, axes[i], r), dim = x.dim(a), st = steps[i];
    if (st == 0) ctx.invalid("step 0");
    auto clamp = [&](int64_t v, int64_t lo, int64_t hi) { return std::max(lo, std::min(hi, v)); };
    int64_t s = starts[i], e = ends[i];
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    if (st > 0) {
      s = clamp(s, 0, dim);
      e = clamp(e, 0, dim);
      shape[a] = e > s ? (e - s + st - 1) / st : 0;
    } else {
      s = clamp(s, -1, dim - 1);
      e = clamp(e, -1, dim - 1);
      shape[a] = s > e ? (s - e - st - 1) / -st : 0;
    }
    begin[a] = s;
    step[a] = st;
  }
  const auto in_strides = contiguous_strides(x.shape());
  StridedView view;
  view.shape = shape;
  view.strides.resize(static_cast<size_t>(r));
  for (int64_t d = 0; d < r; ++d) {
    view.strides[d] = in_strides[d] * step[d];
    view.base += begin[d] * in_strides[d];
  }
  return view;
}

std::vector<int64_t> concat_output_shape(const KernelContext& ctx, int64_t& axis) {
  const Tensor& first = ctx.input(0);
  const int64_t r = first.rank();
  axis = normalize_axis(ctx, ctx.attr_int("axis", 0), r);
  std::vector<int64_t> shape = first.shape();
  shape[axis] = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor& t = ctx.input(i);
    if (t.rank() != r || t.dtype() != first.dtype()) ctx.invalid("inputs differ in rank or dtype");
    for (int64_t d = 0; d < r; ++d)
      if (d != axis && t.dim(d) != first.dim(d)) ctx.invalid("inputs differ off the concat axis");
    shape[axis] += t.dim(axis);
  }
  return shape;
}

std::vector<int64_t> split_sizes(const KernelContext& ctx, int64_t& axis) {
  const Tensor& x = ctx.input(0);
  axis = normalize_axis(ctx, ctx.attr_int("axis", 0), x.rank());
  const int64_t outputs = static_cast<int64_t>(ctx.num_outputs());
  std::vector<int64_t> sizes = ctx.has_input(1) ? ctx.host_input(1).to_int64s() : ctx.attr_ints("split");
  if (sizes.empty()) {
    // Equal parts (num_outputs, opset 18, allows a smaller last part).
    const int64_t parts = ctx.attr_int("num_outputs", outputs);
    const int64_t chunk = (x.dim(axis) + parts - 1) / parts;
    for (int64_t i = 0, left = x.dim(axis); i < parts; ++i, left -= chunk)
      sizes.push_back(std::max<int64_t>(0, std::min(chunk, left)));
  }
  if (static_cast<int64_t>(sizes.size()) != outputs) ctx.invalid("split sizes do not match the outputs");
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  if (total != x.dim(axis)) ctx.invalid("split sizes do not add up to the axis");
  return sizes;
}

std::vector<int64_t> gather_output_shape(const KernelContext& ctx, int64_t& axis) {
  const Tensor& data = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  axis = normalize_axis(ctx, ctx.attr_int("axis", 0), data.rank());
  std::vector<int64_t> shape(data.shape().begin(), data.shape().begin() + axis);
  shape.insert(shape.end(), indices.shape().begin(), indices.shape().end());
  shape.insert(shape.end(), data.shape().begin() + axis + 1, data.shape().end());
  return shape;
}

ReduceArgs reduce_args(const KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t r = x.rank();
  std::vector<int64_t> axes;
  if (ctx.has_input(1)) axes = ctx.host_input(1).to_int64s();
  else axes = ctx.attr_ints("axes");
  ReduceArgs args;
  const bool keepdims = ctx.attr_int("keepdims", 1) != 0;
  if (axes.empty() && ctx.attr_int("noop_with_empty_axes", 0) != 0) {
    args.noop = true;
    args.kept_shape = args.out_shape = x.shape();
    return args;
  }
  args.reduced.assign(static_cast<size_t>(r), axes.empty());
  for (int64_t a : axes) args.reduced[static_cast<size_t>(normalize_axis(ctx, a, r))] = true;
  for (int64_t d = 0; d < r; ++d) {
    args.kept_shape.push_back(args.reduced[d] ? 1 : x.dim(d));
    if (!args.reduced[d]) args.out_shape.push_back(x.dim(d));
    else if (keepdims) args.out_shape.push_back(1);
    if (args.reduced[d]) args.count *= x.dim(d);
  }
  return args;
}

SoftmaxArgs softmax_args(const KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t r = x.rank();
  const bool legacy = ctx.opset() < 13;
  const int64_t axis = normalize_axis(ctx, ctx.attr_int("axis", legacy ? 1 : -1), r);
  SoftmaxArgs args;
  args.outer = product(x.shape(), 0, static_cast<size_t>(axis));
  args.n = legacy ? product(x.shape(), static_cast<size_t>(axis)) : (r == 0 ? 1 : x.dim(axis));
  args.inner = legacy ? 1 : product(x.shape(), static_cast<size_t>(axis) + 1);
  return args;
}

LayerNormArgs layer_norm_args(const KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t r = x.rank();
  const int64_t axis = normalize_axis(ctx, ctx.attr_int("axis", -1), r);
  LayerNormArgs args;
  args.epsilon = ctx.attr_float("epsilon", 1e-5);
  args.norm_shape.assign(x.shape().begin() + axis, x.shape().end());
  args.rows = product(x.shape(), 0, static_cast<size_t>(axis));
  args.n = product(args.norm_shape);
  args.stat_shape.assign(x.shape().begin(), x.shape().begin() + axis);
  args.stat_shape.resize(static_cast<size_t>(r), 1);
  return args;
}

DropoutArgs dropout_args(const KernelContext& ctx) {
  DropoutArgs args;
  args.ratio = ctx.attr_float("ratio", 0.5);
  if (ctx.opset() >= 12) {
    if (ctx.has_input(1)) args.ratio = ctx.host_input(1).scalar_as_double();
    if (ctx.has_input(2)) args.training = ctx.host_input(2).scalar_as_double() != 0;
  }
  if (args.drops() && args.ratio >= 1) ctx.invalid("ratio must be < 1 in training mode");
  args.stream = mix64(ctx.random_stream() ^ static_cast<uint64_t>(ctx.attr_int("seed", 0)));
  return args;
}

VariadicArgs variadic_args(const KernelContext& ctx) {
  const size_t n = ctx.num_inputs();
  if (n == 0) ctx.invalid("needs at least one input");
  VariadicArgs args{ctx.input(0).dtype(), ctx.input(0).shape()};
  for (size_t i = 1; i < n; ++i) {
    if (ctx.input(i).dtype() != args.dtype) ctx.invalid("operand dtypes differ");
    args.shape = broadcast_shapes(ctx, args.shape, ctx.input(i).shape());
  }
  if (args.dtype == DType::kBool) ctx.unsupported("bool operands");
  return args;
}

PadMode pad_mode(const KernelContext& ctx, const std::string& mode) {
  if (mode == "constant") return PadMode::kConstant;
  if (mode == "reflect") return PadMode::kReflect;
  if (mode == "edge") return PadMode::kEdge;
  if (mode == "wrap") return PadMode::kWrap;
  ctx.invalid("unknown Pad mode '" + mode + "'");
}

PadArgs pad_args(const KernelContext& ctx, const std::vector<int64_t>& in) {
  const int64_t r = static_cast<int64_t>(in.size());
  PadArgs a;
  a.mode = pad_mode(ctx, ctx.attr_string("mode", "constant"));
  std::vector<int64_t> pads, axes;
  if (ctx.opset() < 11) {
    pads = ctx.attr_ints("pads");
    a.value = ctx.attr_float("value", 0.0);
  } else {
    pads = ctx.host_input(1).to_int64s();
    if (ctx.has_input(2) && ctx.host_input(2).elements() > 0) a.value = ctx.host_input(2).scalar_as_double(0);
    if (ctx.has_input(3)) axes = ctx.host_input(3).to_int64s();
  }
  if (axes.empty())
    for (int64_t d = 0; d < r; ++d) axes.push_back(d);
  if (pads.size() != 2 * axes.size()) ctx.invalid("pads must hold a begin and an end per padded axis");
  a.begin.assign(in.size(), 0);
  a.end.assign(in.size(), 0);
  for (int64_t p : pads)
    if (p < -limits::kMaxDim || p > limits::kMaxDim) ctx.invalid("a pad of " + std::to_string(p) + " is out of range");
  for (size_t k = 0; k < axes.size(); ++k) {
    const int64_t d = normalize_axis(ctx, axes[k], r);
    a.begin[d] = pads[k];
    a.end[d] = pads[k + axes.size()];
  }
  a.out_shape = in;
  for (size_t d = 0; d < in.size(); ++d) {
    a.out_shape[d] = in[d] + a.begin[d] + a.end[d];
    if (a.out_shape[d] < 0) ctx.invalid("pads crop more than the axis holds");
    if (a.mode != PadMode::kConstant && in[d] == 0 && a.out_shape[d] > 0) ctx.invalid("cannot pad an empty axis but with a constant");
  }
  return a;
}

namespace {

// The attributes Resize and its gradient share; Upsample and Resize-10 are asymmetric with nearest rounding down.
ResizeArgs resize_attributes(const KernelContext& ctx, bool legacy) {
  ResizeArgs a;
  a.mode = ctx.attr_string("mode", "nearest");
  std::transform(a.mode.begin(), a.mode.end(), a.mode.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (a.mode == "bilinear") a.mode = "linear";  // Upsample-7's spelling
  if (a.mode != "nearest" && a.mode != "linear" && a.mode != "cubic") ctx.invalid("unknown resize mode '" + a.mode + "'");
  if (legacy) {
    a.coordinate_mode = "asymmetric";
    a.nearest_mode = "floor";
  } else {
    a.coordinate_mode = ctx.attr_string("coordinate_transformation_mode", "half_pixel");
    a.nearest_mode = ctx.attr_string("nearest_mode", "round_prefer_floor");
    a.cubic_a = ctx.attr_float("cubic_coeff_a", -0.75);
    a.exclude_outside = ctx.attr_int("exclude_outside", 0) != 0;
    a.extrapolation = ctx.attr_float("extrapolation_value", 0.0);
  }
  static const char* kCoordinateModes[] = {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                                           "tf_half_pixel_for_nn", "tf_crop_and_resize"};
  if (std::find(std::begin(kCoordinateModes), std::end(kCoordinateModes), a.coordinate_mode) == std::end(kCoordinateModes))
    ctx.unsupported("coordinate_transformation_mode '" + a.coordinate_mode + "'");
  static const char* kNearestModes[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
  if (std::find(std::begin(kNearestModes), std::end(kNearestModes), a.nearest_mode) == std::end(kNearestModes))
    ctx.invalid("unknown nearest_mode '" + a.nearest_mode + "'");
  if (ctx.attr_int("antialias", 0) != 0) ctx.unsupported("Resize with antialias");
  if (ctx.has_attr("axes")) ctx.unsupported("Resize with axes (opset 18)");
  if (ctx.attr_string("keep_aspect_ratio_policy", "stretch") != "stretch") ctx.unsupported("keep_aspect_ratio_policy");
  return a;
}

// A float input (scales, roi) as doubles; empty when absent or empty.
std::vector<double> float_input(const KernelContext& ctx, size_t i) {
  std::vector<double> v;
  if (!ctx.has_input(i)) return v;
  const Tensor& t = ctx.host_input(i);
  for (int64_t k = 0; k < t.elements(); ++k) v.push_back(t.scalar_as_double(k));
  return v;
}

// Scales given per axis, or out/in where only the sizes are; roi checked to hold a start and an end per axis.
void resize_scales(const KernelContext& ctx, ResizeArgs& a, std::vector<double> scales) {
  const size_t r = a.in_shape.size();
  if (scales.empty()) {
    for (size_t d = 0; d < r; ++d)
      scales.push_back(a.in_shape[d] == 0 ? 1.0 : static_cast<double>(a.out_shape[d]) / static_cast<double>(a.in_shape[d]));
  }
  if (scales.size() != r) ctx.invalid("scales must have one value per input dim");
  for (double s : scales)
    if (!(s > 0)) ctx.invalid("scales must be positive");
  a.scales = std::move(scales);
  if (a.coordinate_mode == "tf_crop_and_resize" && a.roi.size() != 2 * r) ctx.invalid("tf_crop_and_resize needs a roi of 2 values per dim");
}

}  // namespace

ResizeArgs resize_args(const KernelContext& ctx, const std::vector<int64_t>& in) {
  const bool upsample = ctx.task().op_type == "Upsample";
  ResizeArgs a = resize_attributes(ctx, upsample || ctx.opset() < 11);
  a.in_shape = in;
  std::vector<double> scales;
  std::vector<int64_t> sizes;
  if (upsample && ctx.opset() < 9) {
    if (const Attribute* attr = ctx.task().attr("scales")) scales = attr->floats;
  } else if (upsample || ctx.opset() < 11) {
    scales = float_input(ctx, 1);
  } else {
    a.roi = float_input(ctx, 1);
    scales = float_input(ctx, 2);
    if (ctx.has_input(3)) sizes = ctx.host_input(3).to_int64s();
  }
  if (!sizes.empty()) {
    if (!scales.empty()) ctx.invalid("give scales or sizes, not both");
    if (sizes.size() != in.size()) ctx.invalid("sizes must have one value per input dim");
    a.out_shape = sizes;
  } else {
    if (scales.size() != in.size()) ctx.invalid("scales must have one value per input dim");
    a.out_shape.resize(in.size());
    for (size_t d = 0; d < in.size(); ++d) {
      const double out = std::floor(static_cast<double>(in[d]) * scales[d]);
      if (!(out >= 0 && out <= static_cast<double>(limits::kMaxDim))) ctx.invalid("scales give an output dim out of range");
      a.out_shape[d] = static_cast<int64_t>(out);
    }
  }
  for (int64_t v : a.out_shape)
    if (v < 0 || v > limits::kMaxDim) ctx.invalid("an output dim of " + std::to_string(v) + " is out of range");
  resize_scales(ctx, a, std::move(scales));
  return a;
}

ResizeArgs resize_grad_args(const KernelContext& ctx) {
  ResizeArgs a = resize_attributes(ctx, false);
  a.in_shape = ctx.host_input(3).to_int64s();
  a.out_shape = ctx.input(0).shape();
  if (a.in_shape.size() != a.out_shape.size()) ctx.invalid("x_shape and dY differ in rank");
  for (int64_t v : a.in_shape)
    if (v < 0 || v > limits::kMaxDim) ctx.invalid("x_shape holds a dim out of range");
  a.roi = float_input(ctx, 1);
  resize_scales(ctx, a, float_input(ctx, 2));
  return a;
}

}  // namespace apart
