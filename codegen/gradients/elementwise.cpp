// Gradient rules of elementwise ops: arithmetic (broadcast undone by ReduceSum), variadic Sum/Mean/Max/Min,
// unary math, activations.
#include <cmath>

#include "codegen/gradients/gradient.h"

namespace apart::autodiff {
namespace {

// Gives input i the gradient `g` (of the output's shape), summed back to the input's shape.
void give_unbroadcast(GradNode& n, size_t i, const std::string& g) {
  if (n.wants(i)) n.give(i, n.e.unbroadcast(g, n.out(0).shape, n.in(i).shape));
}

DType dt(GradNode& n) { return n.out(0).dtype; }

void add_rule(GradNode& n) {
  give_unbroadcast(n, 0, n.gy());
  give_unbroadcast(n, 1, n.gy());
}

void sub_rule(GradNode& n) {
  give_unbroadcast(n, 0, n.gy());
  if (n.wants(1)) give_unbroadcast(n, 1, n.e.neg(n.gy()));
}

void mul_rule(GradNode& n) {
  if (n.wants(0)) give_unbroadcast(n, 0, n.e.mul(n.gy(), n.x(1)));
  if (n.wants(1)) give_unbroadcast(n, 1, n.e.mul(n.gy(), n.x(0)));
}

void div_rule(GradNode& n) {  // y = a / b: da = g / b, db = -g · y / b
  if (n.wants(0)) give_unbroadcast(n, 0, n.e.div(n.gy(), n.x(1)));
  if (n.wants(1)) give_unbroadcast(n, 1, n.e.neg(n.e.div(n.e.mul(n.gy(), n.y(0)), n.x(1))));
}

void pow_rule(GradNode& n) {  // y = a^b: da = g · b · a^(b-1), db = g · y · ln a
  if (n.wants(0)) {
    std::string b = n.x(1);
    if (n.meta(b).dtype != dt(n)) {
      b = n.e.op("Cast", {b});
      set_attr(n.e.last(), "to", static_cast<int64_t>(dt(n)));
    }
    const std::string b_minus_1 = n.e.sub(b, n.e.scalar(1, dt(n)));
    give_unbroadcast(n, 0, n.e.mul(n.gy(), n.e.mul(b, n.e.op("Pow", {n.x(0), b_minus_1}))));
  }
  if (n.wants(1)) give_unbroadcast(n, 1, n.e.mul(n.gy(), n.e.mul(n.y(0), n.e.op("Log", {n.x(0)}))));
}

void sqrt_rule(GradNode& n) {  // g / (2 y)
  n.give(0, n.e.div(n.e.mul(n.gy(), n.e.scalar(0.5, dt(n))), n.y(0)));
}
void exp_rule(GradNode& n) { n.give(0, n.e.mul(n.gy(), n.y(0))); }
void log_rule(GradNode& n) { n.give(0, n.e.div(n.gy(), n.x(0))); }
void neg_rule(GradNode& n) { n.give(0, n.e.neg(n.gy())); }
void reciprocal_rule(GradNode& n) {  // -g · y²
  n.give(0, n.e.neg(n.e.mul(n.gy(), n.e.mul(n.y(0), n.y(0)))));
}
void erf_rule(GradNode& n) {  // g · 2/√π · exp(-x²)
  auto& e = n.e;
  const std::string x2 = e.mul(n.x(0), n.x(0));
  const std::string ex = e.op("Exp", {e.neg(x2)});
  n.give(0, e.mul(n.gy(), e.mul(ex, e.scalar(2.0 / std::sqrt(M_PI), dt(n)))));
}
void tanh_rule(GradNode& n) {  // g · (1 - y²)
  auto& e = n.e;
  n.give(0, e.mul(n.gy(), e.sub(e.scalar(1, dt(n)), e.mul(n.y(0), n.y(0)))));
}
void sigmoid_rule(GradNode& n) {  // g · y · (1 - y)
  auto& e = n.e;
  n.give(0, e.mul(n.gy(), e.mul(n.y(0), e.sub(e.scalar(1, dt(n)), n.y(0)))));
}
void abs_rule(GradNode& n) {  // g · sign(x), 0 at 0 (torch)
  auto& e = n.e;
  const std::string zero = e.scalar(0, n.in(0).dtype);
  const std::string negative = e.op("Where", {e.op("Less", {n.x(0), zero}), e.neg(n.gy()), e.scalar(0, dt(n))});
  n.give(0, e.op("Where", {e.op("Greater", {n.x(0), zero}), n.gy(), negative}));
}
void relu_rule(GradNode& n) {  // Where(x > 0, g, 0)
  auto& e = n.e;
  const std::string positive = e.op("Greater", {n.x(0), e.scalar(0, n.in(0).dtype)});
  n.give(0, e.op("Where", {positive, n.gy(), e.scalar(0, dt(n))}));
}
void leaky_relu_rule(GradNode& n) {
  auto& e = n.e;
  const double alpha = n.attr_float("alpha", 0.01f);
  const std::string positive = e.op("Greater", {n.x(0), e.scalar(0, n.in(0).dtype)});
  n.give(0, e.op("Where", {positive, n.gy(), e.mul(n.gy(), e.scalar(alpha, dt(n)))}));
}
void hard_sigmoid_rule(GradNode& n) {  // g · α where 0 < α·x + β < 1, else 0
  auto& e = n.e;
  const double alpha = n.attr_float("alpha", 0.2f), beta = n.attr_float("beta", 0.5f);
  const std::string z = e.add(e.mul(n.x(0), e.scalar(alpha, dt(n))), e.scalar(beta, dt(n)));
  const std::string inside = e.op("And", {e.op("Greater", {z, e.scalar(0, dt(n))}), e.op("Less", {z, e.scalar(1, dt(n))})});
  n.give(0, e.op("Where", {inside, e.mul(n.gy(), e.scalar(alpha, dt(n))), e.scalar(0, dt(n))}));
}
void hard_swish_rule(GradNode& n) {  // g · (0 below −3, x/3 + 1/2 up to 3, 1 above): torch's hardswish_backward
  auto& e = n.e;
  const std::string slope = e.add(e.mul(n.x(0), e.scalar(1.0 / 3.0, dt(n))), e.scalar(0.5, dt(n)));
  const std::string upper = e.op("Where", {e.op("Greater", {n.x(0), e.scalar(3, dt(n))}), e.scalar(1, dt(n)), slope});
  n.give(0, e.mul(n.gy(), e.op("Where", {e.op("Less", {n.x(0), e.scalar(-3, dt(n))}), e.scalar(0, dt(n)), upper})));
}
void softplus_rule(GradNode& n) {  // g · sigmoid(x)
  n.give(0, n.e.mul(n.gy(), n.e.op("Sigmoid", {n.x(0)})));
}
void identity_rule(GradNode& n) { n.give(0, n.gy()); }
void zero_rule(GradNode&) {}  // Floor, Ceil, Round, Sign: zero almost everywhere

void cast_rule(GradNode& n) {  // back to the input's float type; nothing flows into integer inputs
  const DType from = n.in(0).dtype;
  if (from == dt(n)) return n.give(0, n.gy());
  if (from != DType::kFloat32 && from != DType::kFloat64 && from != DType::kFloat16 && from != DType::kBFloat16) return;
  std::string g = n.e.op("Cast", {n.gy()});
  set_attr(n.e.last(), "to", static_cast<int64_t>(from));
  n.give(0, g);
}

void sum_rule(GradNode& n) {  // variadic, broadcasting
  for (size_t i = 0; i < n.num_inputs(); ++i) give_unbroadcast(n, i, n.gy());
}

void mean_rule(GradNode& n) {  // variadic, broadcasting: g / n to each input
  const std::string share = n.e.mul(n.gy(), n.e.scalar(1.0 / static_cast<double>(n.num_inputs()), dt(n)));
  for (size_t i = 0; i < n.num_inputs(); ++i) give_unbroadcast(n, i, share);
}

// Max / Min (variadic, broadcasting): g goes to the inputs equal to the result, split evenly among ties
// (torch's maximum/minimum: half each for two; central differences at a two-way tie agree).
void extreme_rule(GradNode& n) {
  auto& e = n.e;
  if (n.num_inputs() == 1) return n.give(0, n.gy());
  std::vector<std::string> masks;
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    masks.push_back(e.op("Cast", {e.op("Equal", {n.x(i), n.y(0)})}));
    set_attr(e.last(), "to", static_cast<int64_t>(dt(n)));
  }
  const std::string share = e.div(n.gy(), e.op("Sum", masks));  // output-shaped: every mask is
  for (size_t i = 0; i < n.num_inputs(); ++i)
    if (n.wants(i)) give_unbroadcast(n, i, e.mul(share, masks[i]));
}

void clip_rule(GradNode& n) {  // g where min ≤ x ≤ max (bounds from inputs ≥ opset 11)
  auto& e = n.e;
  std::string pass;
  auto both = [&](const std::string& c) { pass = pass.empty() ? c : e.op("And", {pass, c}); };
  if (n.has_input(1)) both(e.op("GreaterOrEqual", {n.x(0), n.x(1)}));
  if (n.has_input(2)) both(e.op("LessOrEqual", {n.x(0), n.x(2)}));
  n.give(0, pass.empty() ? n.gy() : e.op("Where", {pass, n.gy(), e.scalar(0, dt(n))}));
}

void where_rule(GradNode& n) {  // Where(c, a, b): a gets g where c, b where not c
  auto& e = n.e;
  const std::string zero = e.scalar(0, dt(n));
  if (n.wants(1)) give_unbroadcast(n, 1, e.op("Where", {n.x(0), n.gy(), zero}));
  if (n.wants(2)) give_unbroadcast(n, 2, e.op("Where", {n.x(0), zero, n.gy()}));
}

void dropout_rule(GradNode& n) {  // training: g · mask / (1 - ratio); inference: identity
  auto& e = n.e;
  bool training = false;
  if (n.has_input(2)) {
    const auto& m = n.meta(n.x(2));
    training = !m.ints || (!m.ints->empty() && (*m.ints)[0] != 0);
  }
  if (!training) return n.give(0, n.gy());
  std::string mask = e.op("Cast", {n.y(1)});
  set_attr(e.last(), "to", static_cast<int64_t>(dt(n)));
  std::string scale;  // 1 / (1 - ratio), from the ratio input (default 0.5)
  if (n.has_input(1)) {
    std::string ratio = n.x(1);
    if (n.meta(ratio).dtype != dt(n)) {
      ratio = e.op("Cast", {ratio});
      set_attr(e.last(), "to", static_cast<int64_t>(dt(n)));
    }
    scale = e.div(e.scalar(1, dt(n)), e.sub(e.scalar(1, dt(n)), ratio));
  } else {
    scale = e.scalar(2, dt(n));
  }
  n.give(0, e.mul(e.mul(n.gy(), mask), scale));
}

}  // namespace

void register_elementwise_rules() {
  auto& r = rules();
  r["Add"] = add_rule;
  r["Sub"] = sub_rule;
  r["Mul"] = mul_rule;
  r["Div"] = div_rule;
  r["Pow"] = pow_rule;
  r["Sqrt"] = sqrt_rule;
  r["Exp"] = exp_rule;
  r["Log"] = log_rule;
  r["Neg"] = neg_rule;
  r["Reciprocal"] = reciprocal_rule;
  r["Erf"] = erf_rule;
  r["Tanh"] = tanh_rule;
  r["Sigmoid"] = sigmoid_rule;
  r["Relu"] = relu_rule;
  r["LeakyRelu"] = leaky_relu_rule;
  r["HardSigmoid"] = hard_sigmoid_rule;
  r["HardSwish"] = hard_swish_rule;
  r["Softplus"] = softplus_rule;
  r["Identity"] = identity_rule;
  r["Floor"] = zero_rule;
  r["Ceil"] = zero_rule;
  r["Round"] = zero_rule;
  r["Sign"] = zero_rule;
  r["Cast"] = cast_rule;
  r["Sum"] = sum_rule;
  r["Mean"] = mean_rule;
  r["Max"] = extreme_rule;
  r["Min"] = extreme_rule;
  r["Abs"] = abs_rule;
  r["Clip"] = clip_rule;
  r["Where"] = where_rule;
  r["Dropout"] = dropout_rule;
}

}  // namespace apart::autodiff
