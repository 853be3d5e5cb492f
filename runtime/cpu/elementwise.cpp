// Elementwise kernels: unary math and activations, broadcasting binary arithmetic/comparison/logic, variadic
// Min/Max/Sum/Mean, Where, Clip, Cast, Identity, Dropout.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <type_traits>

#include "runtime/cpu/broadcast.h"
#include "runtime/cpu/families.h"
#include "runtime/cpu/threads.h"
#include "runtime/half_precision.h"
#include "runtime/op_args.h"

namespace apart::cpu {
namespace {

// --- Unary ------------------------------------------------------------------------

template <class Fn>
void unary_float(KernelContext& ctx, Fn fn) {
  const Tensor& x = ctx.input(0);
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(x.elements(), 8, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) py[i] = static_cast<T>(fn(px[i]));
    });
  });
}

// Signed numeric (float, double, int32, int64, int8, int16); unsigned where the op allows.
template <class Fn>
void unary_numeric(KernelContext& ctx, Fn fn) {
  const Tensor& x = ctx.input(0);
  if (x.dtype() == DType::kBool) ctx.unsupported("bool input");
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      ctx.unsupported("bool input");
    } else {
      Tensor& y = ctx.output(0, x.dtype(), x.shape());
      const T* px = x.data<T>();
      T* py = y.data<T>();
      parallel_for(x.elements(), 1, [&](int64_t s, int64_t e) {
        for (int64_t i = s; i < e; ++i) py[i] = static_cast<T>(fn(px[i]));
      });
    }
  }, true);
}

void sqrt_k(KernelContext& c) { unary_float(c, [](auto v) { return std::sqrt(v); }); }
void exp_k(KernelContext& c) { unary_float(c, [](auto v) { return std::exp(v); }); }
void log_k(KernelContext& c) { unary_float(c, [](auto v) { return std::log(v); }); }
void erf_k(KernelContext& c) { unary_float(c, [](auto v) { return std::erf(v); }); }
void tanh_k(KernelContext& c) { unary_float(c, [](auto v) { return std::tanh(v); }); }
// Gelu-20: x·Φ(x) (approximate "none"), or its tanh form 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
void gelu_k(KernelContext& c) {
  const std::string approximate = c.attr_string("approximate", "none");
  if (approximate == "tanh") {
    unary_float(c, [](auto v) {
      const double x = v;
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
    });
  } else if (approximate == "none") {
    unary_float(c, [](auto v) { return 0.5 * v * (1 + std::erf(v / std::numbers::sqrt2)); });
  } else {
    c.invalid("approximate '" + approximate + "' (expected none or tanh)");
  }
}
void sigmoid_k(KernelContext& c) {
  unary_float(c, [](auto v) { return decltype(v)(1) / (decltype(v)(1) + std::exp(-v)); });
}
void reciprocal_k(KernelContext& c) { unary_float(c, [](auto v) { return decltype(v)(1) / v; }); }
void floor_k(KernelContext& c) { unary_float(c, [](auto v) { return std::floor(v); }); }
void ceil_k(KernelContext& c) { unary_float(c, [](auto v) { return std::ceil(v); }); }
void softplus_k(KernelContext& c) { unary_float(c, [](auto v) { return std::log1p(std::exp(v)); }); }
void leaky_relu_k(KernelContext& c) {
  const double alpha = c.attr_float("alpha", 0.01);
  unary_float(c, [alpha](auto v) { return v < 0 ? static_cast<decltype(v)>(v * alpha) : v; });
}
// HardSigmoid: max(0, min(1, α·x + β)) (α 0.2, β 0.5); HardSwish: x · HardSigmoid(x) with α = 1/6, β = 0.5.
void hard_sigmoid_k(KernelContext& c) {
  const double alpha = c.attr_float("alpha", 0.2), beta = c.attr_float("beta", 0.5);
  unary_float(c, [alpha, beta](auto v) { return std::clamp(alpha * v + beta, 0.0, 1.0); });
}
void hard_swish_k(KernelContext& c) {
  unary_float(c, [](auto v) { return v * std::clamp(v / 6.0 + 0.5, 0.0, 1.0); });
}
void relu_k(KernelContext& c) { unary_numeric(c, [](auto v) { return v < 0 ? decltype(v)(0) : v; }); }
void neg_k(KernelContext& c) {
  unary_numeric(c, [](auto v) {
    if constexpr (std::is_unsigned_v<decltype(v)>) return static_cast<decltype(v)>(0 - v);
    else return -v;
  });
}
void abs_k(KernelContext& c) {
  unary_numeric(c, [](auto v) {
    if constexpr (std::is_unsigned_v<decltype(v)>) return v;
    else return v < 0 ? static_cast<decltype(v)>(-v) : v;
  });
}

// --- Binary -----------------------------------------------------------------------

template <class Op>
void binary_arith(KernelContext& ctx, Op op) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != b.dtype()) ctx.invalid("operand dtypes differ");
  if (a.dtype() == DType::kBool) ctx.unsupported("bool operands");
  auto shape = broadcast_shapes(ctx, a.shape(), b.shape());
  dispatch(ctx, a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      Tensor& y = ctx.output(0, a.dtype(), shape);
      binary_broadcast<T, T, T>(a, b, y, [&](T x, T z) { return static_cast<T>(op(x, z)); });
    }
  }, true);
}

void add_k(KernelContext& c) { binary_arith(c, [](auto a, auto b) { return a + b; }); }
void sub_k(KernelContext& c) { binary_arith(c, [](auto a, auto b) { return a - b; }); }
void mul_k(KernelContext& c) { binary_arith(c, [](auto a, auto b) { return a * b; }); }
void div_k(KernelContext& c) {
  binary_arith(c, [](auto a, auto b) {
    using T = decltype(a);
    if constexpr (std::is_integral_v<T>) {
      if (b == 0) return T(0);  // integer division by zero is undefined; ONNX leaves it open
      return static_cast<T>(a / b);
    } else {
      return a / b;
    }
  });
}

void pow_k(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  auto shape = broadcast_shapes(ctx, a.shape(), b.shape());
  dispatch(ctx, a.dtype(), [&](auto ta) {
    using TA = decltype(ta);
    Tensor& y = ctx.output(0, a.dtype(), shape);
    if constexpr (std::is_same_v<TA, float>) {
      // x², the usual exporter pattern (variance in LayerNorm), without calling pow.
      if (b.elements() == 1 && b.scalar_as_double() == 2.0 && a.elements() == y.elements()) {
        const float* px = a.data<float>();
        float* py = y.data<float>();
        parallel_for(a.elements(), 1, [&](int64_t s, int64_t e) {
          for (int64_t i = s; i < e; ++i) py[i] = px[i] * px[i];
        });
        return;
      }
    }
    dispatch(ctx, b.dtype(), [&](auto tb) {
      using TB = decltype(tb);
      binary_broadcast<TA, TB, TA>(a, b, y, [](TA x, TB z) {
        if constexpr (std::is_same_v<TA, float> && std::is_same_v<TB, float>) return std::pow(x, z);
        else return static_cast<TA>(std::pow(static_cast<double>(x), static_cast<double>(z)));
      });
    }, true);
  });
}

template <class Op>
void compare(KernelContext& ctx, Op op) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != b.dtype()) ctx.invalid("operand dtypes differ");
  auto shape = broadcast_shapes(ctx, a.shape(), b.shape());
  dispatch(ctx, a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& y = ctx.output(0, DType::kBool, shape);
    binary_broadcast<T, T, bool>(a, b, y, op);
  }, true);
}
void equal_k(KernelContext& c) { compare(c, [](auto a, auto b) { return a == b; }); }
void less_k(KernelContext& c) { compare(c, [](auto a, auto b) { return a < b; }); }
void greater_k(KernelContext& c) { compare(c, [](auto a, auto b) { return a > b; }); }
void less_equal_k(KernelContext& c) { compare(c, [](auto a, auto b) { return a <= b; }); }
void greater_equal_k(KernelContext& c) { compare(c, [](auto a, auto b) { return a >= b; }); }

template <class Op>
void logic(KernelContext& ctx, Op op) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != DType::kBool || b.dtype() != DType::kBool) ctx.invalid("operands must be bool");
  Tensor& y = ctx.output(0, DType::kBool, broadcast_shapes(ctx, a.shape(), b.shape()));
  binary_broadcast<bool, bool, bool>(a, b, y, op);
}
void and_k(KernelContext& c) { logic(c, [](bool a, bool b) { return a && b; }); }
void or_k(KernelContext& c) { logic(c, [](bool a, bool b) { return a || b; }); }
void xor_k(KernelContext& c) { logic(c, [](bool a, bool b) { return a != b; }); }
void not_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.dtype() != DType::kBool) ctx.invalid("input must be bool");
  Tensor& y = ctx.output(0, DType::kBool, x.shape());
  for (int64_t i = 0; i < x.elements(); ++i) y.data<bool>()[i] = !x.data<bool>()[i];
}

// Min, Max, Sum, Mean over any number of broadcasting inputs.
template <class Op>
void variadic(KernelContext& ctx, Op op, bool mean = false) {
  const size_t n = ctx.num_inputs();
  const VariadicArgs args = variadic_args(ctx);
  const DType dt = args.dtype;
  const std::vector<int64_t>& shape = args.shape;
  dispatch(ctx, dt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      Tensor acc = ctx.input(0).clone();
      for (size_t i = 1; i < n; ++i) {
        Tensor next(dt, broadcast_shapes(ctx, acc.shape(), ctx.input(i).shape()));
        binary_broadcast<T, T, T>(acc, ctx.input(i), next, [&](T a, T b) { return static_cast<T>(op(a, b)); });
        acc = std::move(next);
      }
      Tensor& y = ctx.output(0, dt, shape);
      Tensor zero(dt, {});
      binary_broadcast<T, T, T>(acc, zero, y, [](T a, T) { return a; });  // broadcast a single input
      if (mean)
        for (auto& v : y.span<T>()) v = static_cast<T>(v / static_cast<T>(n));
    }
  }, true);
}
void min_k(KernelContext& c) {
  variadic(c, [](auto a, auto b) {
    if constexpr (std::is_floating_point_v<decltype(a)>)
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<decltype(a)>::quiet_NaN();
    return b < a ? b : a;
  });
}
void max_k(KernelContext& c) {
  variadic(c, [](auto a, auto b) {
    if constexpr (std::is_floating_point_v<decltype(a)>)
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<decltype(a)>::quiet_NaN();
    return b > a ? b : a;
  });
}
void sum_k(KernelContext& c) { variadic(c, [](auto a, auto b) { return a + b; }); }
void mean_k(KernelContext& c) { variadic(c, [](auto a, auto b) { return a + b; }, true); }

void where_k(KernelContext& ctx) {
  const Tensor& cond = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& y = ctx.input(2);
  if (cond.dtype() != DType::kBool) ctx.invalid("condition must be bool");
  if (x.dtype() != y.dtype()) ctx.invalid("X and Y dtypes differ");
  auto shape = broadcast_shapes(ctx, broadcast_shapes(ctx, cond.shape(), x.shape()), y.shape());
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& out = ctx.output(0, x.dtype(), shape);
    const bool* pc = cond.data<bool>();
    const T* px = x.data<T>();
    const T* py = y.data<T>();
    T* po = out.data<T>();
    std::array<std::vector<int64_t>, 3> strides{broadcast_strides(cond.shape(), shape),
                                                broadcast_strides(x.shape(), shape), broadcast_strides(y.shape(), shape)};
    broadcast_rows<3>(shape, strides, 1, [&](int64_t o, auto offs, auto inner, int64_t len) {
      for (int64_t j = 0; j < len; ++j)
        po[o + j] = pc[offs[0] + j * inner[0]] ? px[offs[1] + j * inner[1]] : py[offs[2] + j * inner[2]];
    });
  }, true);
}

void clip_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      ctx.unsupported("bool input");
    } else {
      const auto [lo, hi] = clip_bounds<T>(ctx);
      Tensor& y = ctx.output(0, x.dtype(), x.shape());
      const T* px = x.data<T>();
      T* py = y.data<T>();
      for (int64_t i = 0; i < x.elements(); ++i) py[i] = px[i] < lo ? lo : (px[i] > hi ? hi : px[i]);
    }
  }, true);
}

// float16/bfloat16 go through float32 (runtime/half_precision.h): a half input is widened first (exact), a half
// output is each value rounded once to nearest even (from double by way of float32 rounded to odd).
void cast_k(KernelContext& ctx) {
  const Tensor& given = ctx.input(0);
  auto to = dtype_from_onnx(static_cast<int32_t>(ctx.attr_int("to", 0)));
  if (!to) ctx.invalid("attribute 'to' is not a known dtype");
  const Tensor x = is_half(given.dtype()) ? widen_to_float32(given) : given;
  if (is_half(*to)) {
    Tensor& y = ctx.output(0, *to, x.shape());
    uint16_t* py = y.data<uint16_t>();
    if (x.dtype() == DType::kFloat32) {
      const float* px = x.data<float>();
      for (int64_t i = 0; i < x.elements(); ++i) py[i] = float_to_half_bits(*to, px[i]);
      return;
    }
    dispatch(ctx, x.dtype(), [&](auto tin) {
      using TI = decltype(tin);
      const TI* px = x.data<TI>();
      for (int64_t i = 0; i < x.elements(); ++i) {
        const float f = float_rounded_to_odd(static_cast<double>(px[i]));
        py[i] = float_to_half_bits(*to, f);
      }
    }, true);
    return;
  }
  dispatch(ctx, x.dtype(), [&](auto tin) {
    using TI = decltype(tin);
    dispatch(ctx, *to, [&](auto tout) {
      using TO = decltype(tout);
      Tensor& y = ctx.output(0, *to, x.shape());
      const TI* px = x.data<TI>();
      TO* py = y.data<TO>();
      for (int64_t i = 0; i < x.elements(); ++i) {
        if constexpr (std::is_same_v<TO, bool>) {
          py[i] = px[i] != TI(0);
        } else if constexpr (std::is_floating_point_v<TI> && std::is_integral_v<TO>) {
          // Out-of-range float→int is undefined in C++; saturate (NaN → 0) instead.
          const double v = static_cast<double>(px[i]);
          py[i] = std::isnan(v) ? TO(0)
                  : v <= static_cast<double>(std::numeric_limits<TO>::lowest()) ? std::numeric_limits<TO>::lowest()
                  : v >= static_cast<double>(std::numeric_limits<TO>::max())    ? std::numeric_limits<TO>::max()
                                                                                 : static_cast<TO>(v);
        } else {
          py[i] = static_cast<TO>(px[i]);
        }
      }
    }, true);
  }, true);
}

void identity_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  copy_bytes(x, ctx.output(0, x.dtype(), x.shape()));
}

// Inference semantics (and training mode with ratio 0): the output is the input, the mask all ones.
void dropout_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const DropoutArgs args = dropout_args(ctx);
  if (args.drops()) {
    // Training: keep each element with probability 1 − ratio, scaled by 1 / (1 − ratio). Element i's draw is
    // counter-based (runtime/random.h): a function of (seed, step, micro-batch, node, i) and of the node's own
    // `seed` attribute, so a recomputed forward, a replica or a resumed run draws the same mask.
    const double ratio = args.ratio;
    const uint64_t stream = args.stream;
    Tensor keep = ctx.num_outputs() > 1 && ctx.wants_output(1) ? ctx.output(1, DType::kBool, x.shape())
                                                                : Tensor(DType::kBool, x.shape());  // shares storage
    bool* mask = keep.data<bool>();
    for (int64_t i = 0; i < x.elements(); ++i)
      mask[i] = random_uniform(random_bits(stream, static_cast<uint64_t>(i))) >= ratio;
    dispatch_float(ctx, x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      Tensor& y = ctx.output(0, x.dtype(), x.shape());
      const T scale = static_cast<T>(1.0 / (1.0 - ratio));
      for (int64_t i = 0; i < x.elements(); ++i) y.data<T>()[i] = keep.data<bool>()[i] ? x.data<T>()[i] * scale : T(0);
    });
    return;
  }
  copy_bytes(x, ctx.output(0, x.dtype(), x.shape()));
  if (ctx.num_outputs() > 1 && ctx.wants_output(1)) {
    Tensor& mask = ctx.output(1, DType::kBool, x.shape());
    for (auto& m : mask.span<bool>()) m = true;
  }
}

}  // namespace

void register_elementwise_kernels() {
  // kEvery: unary_float and binary_arith write every output element.
  register_kernel("Sqrt", sqrt_k, OutputWrites::kEvery);
  register_kernel("Exp", exp_k, OutputWrites::kEvery);
  register_kernel("Log", log_k, OutputWrites::kEvery);
  register_kernel("Erf", erf_k, OutputWrites::kEvery);
  register_kernel("Tanh", tanh_k, OutputWrites::kEvery);
  register_kernel("Gelu", gelu_k, OutputWrites::kEvery);
  register_kernel("Sigmoid", sigmoid_k, OutputWrites::kEvery);
  register_kernel("Reciprocal", reciprocal_k, OutputWrites::kEvery);
  register_kernel("Floor", floor_k);
  register_kernel("Ceil", ceil_k);
  register_kernel("Softplus", softplus_k);
  register_kernel("LeakyRelu", leaky_relu_k);
  register_kernel("HardSigmoid", hard_sigmoid_k);
  register_kernel("HardSwish", hard_swish_k);
  register_kernel("Relu", relu_k);
  register_kernel("Neg", neg_k);
  register_kernel("Abs", abs_k);
  register_kernel("Add", add_k, OutputWrites::kEvery);
  register_kernel("Sub", sub_k, OutputWrites::kEvery);
  register_kernel("Mul", mul_k, OutputWrites::kEvery);
  register_kernel("Div", div_k, OutputWrites::kEvery);
  register_kernel("Pow", pow_k);
  register_kernel("Equal", equal_k);
  register_kernel("Less", less_k);
  register_kernel("Greater", greater_k);
  register_kernel("LessOrEqual", less_equal_k);
  register_kernel("GreaterOrEqual", greater_equal_k);
  register_kernel("And", and_k);
  register_kernel("Or", or_k);
  register_kernel("Xor", xor_k);
  register_kernel("Not", not_k);
  register_kernel("Min", min_k);
  register_kernel("Max", max_k);
  register_kernel("Sum", sum_k);
  register_kernel("Mean", mean_k);
  register_kernel("Where", where_k);
  register_kernel("Clip", clip_k);
  register_kernel("Cast", cast_k);
  register_kernel("Identity", identity_k);
  register_kernel("Dropout", dropout_k);
}

}  // namespace apart::cpu
