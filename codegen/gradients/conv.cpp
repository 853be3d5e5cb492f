// Gradient rules of Conv, ConvTranspose and pools (ai.apart.ConvGrad/ConvTransposeGrad/MaxPoolGrad/AveragePoolGrad:
// docs/autodiff.md), GlobalAveragePool, GlobalMaxPool and BatchNormalization (standard ops, training and inference).
#include "codegen/gradients/gradient.h"

namespace apart::autodiff {
namespace {

// Explicit pads for the backward op (auto_pad resolved from the static shapes).
std::vector<int64_t> explicit_pads(GradNode& n, const std::vector<int64_t>& kernel) {
  const auto& xs = n.in(0).shape;
  const auto& ys = n.out(0).shape;
  const size_t s = xs.size() - 2;
  const auto strides = n.attr_ints("strides").value_or(std::vector<int64_t>(s, 1));
  const auto dilations = n.attr_ints("dilations").value_or(std::vector<int64_t>(s, 1));
  auto pads = n.attr_ints("pads").value_or(std::vector<int64_t>(2 * s, 0));
  const std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
  if (auto_pad == "VALID") return std::vector<int64_t>(2 * s, 0);
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    for (size_t i = 0; i < s; ++i) {
      const int64_t extent = (kernel[i] - 1) * dilations[i] + 1;
      const int64_t total = std::max<int64_t>(0, (ys[i + 2] - 1) * strides[i] + extent - xs[i + 2]);
      pads[i] = auto_pad == "SAME_UPPER" ? total / 2 : (total + 1) / 2;
      pads[i + s] = total - pads[i];
    }
  }
  return pads;
}

void window_attrs(GradNode& n, onnx::NodeProto& to, const std::vector<int64_t>& kernel) {
  const size_t s = n.in(0).shape.size() - 2;
  set_attr(to, "kernel_shape", kernel);
  set_attr(to, "strides", n.attr_ints("strides").value_or(std::vector<int64_t>(s, 1)));
  set_attr(to, "dilations", n.attr_ints("dilations").value_or(std::vector<int64_t>(s, 1)));
  set_attr(to, "pads", explicit_pads(n, kernel));
}

// Conv's and ConvTranspose's bias (input 2): dY summed over the batch and the spatial dims.
void bias_rule(GradNode& n) {
  if (!n.has_input(2) || !n.wants(2)) return;
  std::vector<int64_t> axes{0};
  for (size_t i = 2; i < n.out(0).shape.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  n.give(2, n.e.reduce_sum(n.gy(), axes, false));
}

void conv_rule(GradNode& n) {
  auto& e = n.e;
  const auto& ws = n.in(1).shape;
  const std::vector<int64_t> kernel(ws.begin() + 2, ws.end());
  if (n.wants(0) || n.wants(1)) {
    const std::string gx = n.wants(0) ? e.fresh("ConvGrad_dx") : "", gw = n.wants(1) ? e.fresh("ConvGrad_dw") : "";
    auto& node = e.node("ConvGrad", {n.gy(), n.x(0), n.x(1)}, {gx, gw}, kApartDomain);
    window_attrs(n, node, kernel);
    set_attr(node, "group", n.attr_int("group", 1));
    if (n.wants(0)) n.give(0, gx);
    if (n.wants(1)) n.give(1, gw);
  }
  bias_rule(n);
}

// ConvTranspose is the data gradient of the Conv from Y to X (same W, window and group), so its dX is that Conv of
// dY and its dW that Conv's weight gradient: both from ai.apart.ConvTransposeGrad, which takes the forward's
// attributes as they are (the runtime's conv_transpose_window resolves pads, output_shape and auto_pad).
void conv_transpose_rule(GradNode& n) {
  auto& e = n.e;
  if (n.wants(0) || n.wants(1)) {
    const std::string gx = n.wants(0) ? e.fresh("ConvTransposeGrad_dx") : "",
                      gw = n.wants(1) ? e.fresh("ConvTransposeGrad_dw") : "";
    auto& node = e.node("ConvTransposeGrad", {n.gy(), n.x(0), n.x(1)}, {gx, gw}, kApartDomain);
    n.copy_attrs(node);
    if (n.wants(0)) n.give(0, gx);
    if (n.wants(1)) n.give(1, gw);
  }
  bias_rule(n);
}

void pool_rule(GradNode& n, const char* grad_op) {
  auto& e = n.e;
  const auto kernel = n.attr_ints("kernel_shape").value_or(std::vector<int64_t>{});
  if (n.num_outputs() > 1 && !n.y(1).empty() && !n.gy(1).empty()) n.unsupported("a gradient through MaxPool's Indices");
  const std::string gx = e.fresh(grad_op);
  auto& node = e.node(grad_op, {n.gy(), n.x(0)}, {gx}, kApartDomain);
  window_attrs(n, node, kernel);
  if (std::string(grad_op) == "AveragePoolGrad") set_attr(node, "count_include_pad", n.attr_int("count_include_pad", 0));
  n.give(0, gx);
}
void max_pool_rule(GradNode& n) { pool_rule(n, "MaxPoolGrad"); }
void average_pool_rule(GradNode& n) { pool_rule(n, "AveragePoolGrad"); }

void global_average_pool_rule(GradNode& n) {
  const auto& xs = n.in(0).shape;
  int64_t count = 1;
  for (size_t i = 2; i < xs.size(); ++i) count *= xs[i];
  n.give(0, n.e.expand(n.e.mul(n.gy(), n.e.scalar(1.0 / static_cast<double>(count), n.out(0).dtype)), xs));
}

// GlobalMaxPool: ReduceMax over the spatial axes (keepdims): g to the maxima, split evenly among ties.
void global_max_pool_rule(GradNode& n) {
  std::vector<int64_t> axes;
  for (size_t i = 2; i < n.in(0).shape.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  n.give(0, extreme_reduction_grad(n, n.x(0), n.y(0), n.gy(), axes));
}

// BatchNormalization. Training mode: batch statistics recomputed from x (standard ops);
// dx = scale·σ⁻¹ · (g − mean(g) − x̂ · mean(g·x̂)). Inference mode: running statistics are constants.
void batch_norm_rule(GradNode& n) {
  auto& e = n.e;
  const auto& xs = n.in(0).shape;
  const DType dt = n.in(0).dtype;
  const int64_t channels = xs.size() > 1 ? xs[1] : 1;
  std::vector<int64_t> axes{0}, channel_shape(xs.size(), 1);
  if (xs.size() > 1) channel_shape[1] = channels;
  int64_t count = xs[0];
  for (size_t i = 2; i < xs.size(); ++i) axes.push_back(static_cast<int64_t>(i)), count *= xs[i];
  const std::string eps = e.scalar(n.attr_float("epsilon", 1e-5f), dt);
  const std::string inv_m = e.scalar(1.0 / static_cast<double>(count), dt);
  const bool training = n.attr_int("training_mode", 0) != 0;
  std::string mean, var;
  if (training) {
    mean = e.mul(e.reduce_sum(n.x(0), axes, true), inv_m);
    const std::string centred = e.sub(n.x(0), mean);
    var = e.mul(e.reduce_sum(e.mul(centred, centred), axes, true), inv_m);
  } else {
    mean = e.reshape(n.x(3), channel_shape);
    var = e.reshape(n.x(4), channel_shape);
  }
  const std::string inv_std = e.op("Reciprocal", {e.op("Sqrt", {e.add(var, eps)})});
  const std::string xhat = e.mul(e.sub(n.x(0), mean), inv_std);
  const std::string& g = n.gy();
  const std::string sum_g = e.reduce_sum(g, axes, true);
  const std::string sum_gx = e.reduce_sum(e.mul(g, xhat), axes, true);
  if (n.wants(1)) n.give(1, e.reshape(sum_gx, {channels}));
  if (n.wants(2)) n.give(2, e.reshape(sum_g, {channels}));
  if (n.wants(0)) {
    const std::string scale = e.mul(e.reshape(n.x(1), channel_shape), inv_std);
    if (!training) return n.give(0, e.mul(g, scale));
    const std::string inner = e.sub(e.sub(g, e.mul(sum_g, inv_m)), e.mul(xhat, e.mul(sum_gx, inv_m)));
    n.give(0, e.mul(scale, inner));
  }
}

}  // namespace

void register_conv_rules() {
  auto& r = rules();
  r["Conv"] = conv_rule;
  r["ConvTranspose"] = conv_transpose_rule;
  r["MaxPool"] = max_pool_rule;
  r["AveragePool"] = average_pool_rule;
  r["GlobalAveragePool"] = global_average_pool_rule;
  r["GlobalMaxPool"] = global_max_pool_rule;
  r["BatchNormalization"] = batch_norm_rule;
}

}  // namespace apart::autodiff
