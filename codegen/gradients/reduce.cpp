// Gradient rules of reductions (Sum, Mean, Max, Min, Prod), Softmax/LogSoftmax, LayerNormalization and the
// losses SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss.
#include <numeric>

#include "codegen/gradients/gradient.h"

namespace apart::autodiff {
namespace {

std::vector<int64_t> range(int64_t begin, int64_t end) {
  std::vector<int64_t> v;
  for (int64_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}
int64_t prod(const std::vector<int64_t>& s, size_t begin = 0) {
  int64_t p = 1;
  for (size_t i = begin; i < s.size(); ++i) p *= s[i];
  return p;
}

// The axes a Reduce* node reduces (attribute up to its opset's switch, input after), normalized; `kept` is
// the input's shape with those axes as 1s. `noop`: empty axes with noop_with_empty_axes (the identity).
struct Reduced {
  std::vector<int64_t> axes, kept;
  int64_t count = 1;  // elements per output value
  bool noop = false;
};
Reduced reduced(GradNode& n) {
  const auto& xs = n.in(0).shape;
  Reduced r;
  if (auto a = n.attr_ints("axes")) r.axes = *a;
  else if (n.has_input(1)) r.axes = n.known_ints(1);
  if (r.axes.empty()) {
    if (n.attr_int("noop_with_empty_axes", 0) != 0) {
      r.noop = true;
      return r;
    }
    r.axes = range(0, static_cast<int64_t>(xs.size()));
  }
  r.kept = xs;
  for (int64_t& a : r.axes) {
    a = norm_axis(a, xs.size());
    r.count *= xs[static_cast<size_t>(a)];
    r.kept[static_cast<size_t>(a)] = 1;
  }
  return r;
}

// `v` (an output-shaped value) with the reduced axes kept as 1s.
std::string kept(GradNode& n, const Reduced& r, const std::string& v) {
  return n.out(0).shape == r.kept ? v : n.e.reshape(v, r.kept);
}

// ReduceSum / ReduceMean: the gradient spread back over the reduced axes.
void reduce_rule(GradNode& n, bool mean) {
  auto& e = n.e;
  const auto& xs = n.in(0).shape;
  const Reduced r = reduced(n);
  if (r.noop) return n.give(0, n.gy());
  std::string g = kept(n, r, n.gy());
  if (mean && r.count != 1) g = e.mul(g, e.scalar(1.0 / static_cast<double>(r.count), n.out(0).dtype));
  n.give(0, r.kept == xs ? g : e.expand(g, xs));
}
void reduce_sum_rule(GradNode& n) { reduce_rule(n, false); }
void reduce_mean_rule(GradNode& n) { reduce_rule(n, true); }

// ReduceMax / ReduceMin: g to the positions equal to the result, split evenly among ties.
void reduce_extreme_rule(GradNode& n) {
  const Reduced r = reduced(n);
  if (r.noop) return n.give(0, n.gy());
  n.give(0, extreme_reduction_grad(n, n.x(0), kept(n, r, n.y(0)), kept(n, r, n.gy()), r.axes));
}

// ReduceProd: g · ∏(others). With no zero in a group that is g · y / x; with one zero, the zero's entry
// gets g · ∏(nonzeros) and the rest 0; with two or more, all 0. As one expression:
// g · P / x' · [zeros = 0 ∨ (x = 0 ∧ zeros = 1)], x' = x with zeros replaced by 1, P = ∏ x' per group.
void reduce_prod_rule(GradNode& n) {
  auto& e = n.e;
  const Reduced r = reduced(n);
  if (r.noop) return n.give(0, n.gy());
  const DType dt = n.in(0).dtype;
  const std::string zero = e.scalar(0, dt), one = e.scalar(1, dt);
  const std::string is_zero = e.op("Equal", {n.x(0), zero});
  const std::string nonzero = e.op("Where", {is_zero, one, n.x(0)});
  std::string product;
  if (e.opset() >= 18) {
    product = e.op("ReduceProd", {nonzero, e.ints(r.axes)});
  } else {
    product = e.op("ReduceProd", {nonzero});
    set_attr(e.last(), "axes", r.axes);
  }
  set_attr(e.last(), "keepdims", int64_t{1});
  std::string zeros = e.op("Cast", {is_zero});
  set_attr(e.last(), "to", static_cast<int64_t>(dt));
  zeros = e.reduce_sum(zeros, r.axes, true);
  const std::string pass = e.op("Or", {e.op("Equal", {zeros, zero}),
                                       e.op("And", {is_zero, e.op("Equal", {zeros, one})})});
  const std::string others = e.div(product, nonzero);  // ∏ over the group but this entry (when it passes)
  n.give(0, e.op("Where", {pass, e.mul(kept(n, r, n.gy()), others), zero}));
}

// The axes a softmax normalizes over: one axis from opset 13, the coerced 2-D tail before.
std::vector<int64_t> softmax_axes(GradNode& n) {
  const size_t r = n.in(0).shape.size();
  if (n.e.opset() >= 13) return {norm_axis(n.attr_int("axis", -1), r)};
  return range(norm_axis(n.attr_int("axis", 1), r), static_cast<int64_t>(r));
}

void softmax_rule(GradNode& n) {  // y · (g − Σ g·y)
  auto& e = n.e;
  const std::string dot = e.reduce_sum(e.mul(n.gy(), n.y(0)), softmax_axes(n), true);
  n.give(0, e.mul(n.y(0), e.sub(n.gy(), dot)));
}

void log_softmax_rule(GradNode& n) {  // g − exp(y) · Σ g
  auto& e = n.e;
  const std::string total = e.reduce_sum(n.gy(), softmax_axes(n), true);
  n.give(0, e.sub(n.gy(), e.mul(e.op("Exp", {n.y(0)}), total)));
}

}  // namespace

bool fuses_norm_gradient(const GradNode& n, int64_t axis, size_t last_param) {
  const auto& xs = n.in(0).shape;
  if (n.in(0).dtype != DType::kFloat32 && n.in(0).dtype != DType::kFloat64) return false;
  if (axis < 0 || axis > static_cast<int64_t>(xs.size())) return false;
  const int64_t count = prod(xs, static_cast<size_t>(axis));
  const auto& scale = n.in(1).shape;
  for (size_t i = 1; i <= last_param; ++i) {
    if (!n.has_input(i)) continue;
    if (n.in(i).dtype != n.in(0).dtype || n.in(i).shape != scale || prod(n.in(i).shape, 0) != count) return false;
  }
  return true;
}

void fused_norm_gradient(GradNode& n, const std::string& op, const std::vector<std::string>& inputs, size_t outputs) {
  auto& e = n.e;
  std::vector<std::string> outs(outputs);
  for (size_t i = 0; i < outputs; ++i)
    if (n.has_input(i) && n.wants(i)) outs[i] = e.fresh(op + "_d" + std::to_string(i));
  n.copy_attrs(e.node(op, inputs, outs, kApartDomain));
  for (size_t i = 0; i < outputs; ++i)
    if (!outs[i].empty()) n.give(i, outs[i]);
}

namespace {

// LayerNormalization from its saved Mean and InvStdDev (the training graph adds those outputs):
// x̂ = (x − μ)·σ⁻¹, dx = σ⁻¹ · (dx̂ − mean(dx̂) − x̂ · mean(dx̂ · x̂)) with dx̂ = g · scale.
void layer_norm_rule(GradNode& n) {
  auto& e = n.e;
  const auto& xs = n.in(0).shape;
  const DType dt = n.in(0).dtype;
  const int64_t axis = norm_axis(n.attr_int("axis", -1), xs.size());
  const std::vector<int64_t> norm = range(axis, static_cast<int64_t>(xs.size()));
  auto as_x_type = [&](const std::string& v) {
    if (dt == DType::kFloat32) return v;
    std::string c = e.op("Cast", {v});
    set_attr(e.last(), "to", static_cast<int64_t>(dt));
    return c;
  };
  const std::string mu = as_x_type(n.y(1)), inv_std = as_x_type(n.y(2));
  if (fuses_norm_gradient(n, axis, 2)) {  // one kernel: ai.apart.LayerNormalizationGrad
    fused_norm_gradient(n, "LayerNormalizationGrad", {n.gy(), n.x(0), n.x(1), mu, inv_std}, 3);
    return;
  }
  const std::string xhat = e.mul(e.sub(n.x(0), mu), inv_std);
  const std::string& g = n.gy();
  if (n.wants(1)) n.give(1, e.unbroadcast(e.mul(g, xhat), xs, n.in(1).shape));
  if (n.has_input(2) && n.wants(2)) n.give(2, e.unbroadcast(g, xs, n.in(2).shape));
  if (n.wants(0)) {
    const std::string inv_n = e.scalar(1.0 / static_cast<double>(prod(xs, static_cast<size_t>(axis))), dt);
    const std::string gxhat = e.mul(g, n.x(1));
    const std::string mean_g = e.mul(e.reduce_sum(gxhat, norm, true), inv_n);
    const std::string mean_gx = e.mul(e.reduce_sum(e.mul(gxhat, xhat), norm, true), inv_n);
    n.give(0, e.mul(inv_std, e.sub(e.sub(gxhat, mean_g), e.mul(xhat, mean_gx))));
  }
}

// The targets of SoftmaxCrossEntropyLoss / NegativeLogLikelihoodLoss (scores or log-probabilities input 0
// [N, C, d…], labels input 1 [N, d…], class weights input 2): the one-hot of the labels over axis 1 and, per
// position [N, 1, d…], the label's weight times the reduction's coefficient of the output gradient
// (0 where the label is ignore_index). d loss / d logp = −onehot · scale.
struct Targets {
  std::string onehot, scale;
};
Targets loss_targets(GradNode& n) {
  auto& e = n.e;
  const auto& ss = n.in(0).shape;
  const DType dt = n.in(0).dtype;
  if (ss.size() < 2) n.unsupported("an input of rank < 2");
  const int64_t classes = ss[1];
  std::vector<int64_t> label_shape = ss;  // [N, 1, d…]
  label_shape[1] = 1;
  std::string labels = n.x(1);
  if (n.in(1).dtype != DType::kInt64) {
    labels = e.op("Cast", {labels});
    set_attr(e.last(), "to", static_cast<int64_t>(DType::kInt64));
  }
  labels = e.reshape(labels, label_shape);
  std::vector<int64_t> class_shape(ss.size(), 1);
  class_shape[1] = classes;
  std::vector<int64_t> ids(static_cast<size_t>(classes));
  std::iota(ids.begin(), ids.end(), 0);
  const std::string class_ids = e.reshape(e.ints(ids), class_shape);
  std::string onehot = e.op("Cast", {e.op("Equal", {labels, class_ids})});
  set_attr(e.last(), "to", static_cast<int64_t>(dt));
  std::string weight;  // per position: the label's class weight, 0 where the label is ignored
  if (n.has_input(2)) weight = e.reduce_sum(e.mul(onehot, e.reshape(n.x(2), class_shape)), {1}, true);
  else weight = e.reduce_sum(onehot, {1}, true);
  if (n.attr_int("ignore_index", INT64_MIN) != INT64_MIN) {
    const std::string ignore_id = e.ints({n.attr_int("ignore_index", 0)});
    std::string keep = e.op("Cast", {e.op("Not", {e.op("Equal", {labels, ignore_id})})});
    set_attr(e.last(), "to", static_cast<int64_t>(dt));
    weight = e.mul(weight, keep);
  }
  const std::string reduction = n.attr_string("reduction", "mean");
  std::string coefficient;
  if (reduction == "mean") coefficient = e.div(n.gy(), e.reduce_sum(weight, range(0, static_cast<int64_t>(ss.size())), false));
  else if (reduction == "sum") coefficient = n.gy();
  else if (reduction == "none") coefficient = e.reshape(n.gy(), label_shape);
  else n.unsupported("reduction '" + reduction + "'");
  return {onehot, e.mul(weight, coefficient)};
}

// SoftmaxCrossEntropyLoss from its log_prob output (the training graph adds it), in standard ops:
// d scores = (softmax − onehot) · w_label · coefficient, coefficient by reduction.
void softmax_cross_entropy_rule(GradNode& n) {
  if (!n.wants(0)) return;
  const Targets t = loss_targets(n);
  const std::string softmax = n.e.op("Exp", {n.y(1)});
  n.give(0, n.e.mul(n.e.sub(softmax, t.onehot), t.scale));
}

// NegativeLogLikelihoodLoss: d input = −onehot · w_label · coefficient (no gradient to class weights).
void nll_loss_rule(GradNode& n) {
  if (!n.wants(0)) return;
  const Targets t = loss_targets(n);
  n.give(0, n.e.neg(n.e.mul(t.onehot, t.scale)));
}

}  // namespace

std::string extreme_reduction_grad(GradNode& n, const std::string& x, const std::string& y_kept,
                                   const std::string& g_kept, const std::vector<int64_t>& axes) {
  auto& e = n.e;
  std::string mask = e.op("Cast", {e.op("Equal", {x, y_kept})});
  set_attr(e.last(), "to", static_cast<int64_t>(n.meta(x).dtype));
  const std::string ties = e.reduce_sum(mask, axes, true);
  return e.mul(e.div(g_kept, ties), mask);
}

void register_reduce_rules() {
  auto& r = rules();
  r["ReduceSum"] = reduce_sum_rule;
  r["ReduceMean"] = reduce_mean_rule;
  r["ReduceMax"] = reduce_extreme_rule;
  r["ReduceMin"] = reduce_extreme_rule;
  r["ReduceProd"] = reduce_prod_rule;
  r["Softmax"] = softmax_rule;
  r["LogSoftmax"] = log_softmax_rule;
  r["LayerNormalization"] = layer_norm_rule;
  r["SoftmaxCrossEntropyLoss"] = softmax_cross_entropy_rule;
  r["NegativeLogLikelihoodLoss"] = nll_loss_rule;
}

}  // namespace apart::autodiff
