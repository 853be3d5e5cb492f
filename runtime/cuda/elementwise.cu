// CUDA elementwise kernels: unary math, broadcasting binary arithmetic/comparison/logic, variadic Sum/Mean/Min/Max,
// Where, Clip, Cast, Identity, Dropout — the semantics and dtypes of cpu/elementwise.cpp, one thread per element.
#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "runtime/cuda/families.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/op_args.h"

namespace apart::cuda {
namespace {

// --- Unary ------------------------------------------------------------------------

template <class T, class Op>
__global__ void unary_kernel(const T* x, T* y, int64_t n, Op op) {
  for (int64_t i = first_thread(); i < n; i += thread_stride()) y[i] = static_cast<T>(op(x[i]));
}

template <class T, class Op>
void launch_unary(KernelContext& ctx, Op op) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  launch_1d(ctx, x.elements(), unary_kernel<T, Op>, device_data<T>(ctx, x), device_data<T>(ctx, y),
                  x.elements(), op);
}

template <class Op>
void unary_float(KernelContext& ctx, Op op) {
  dispatch_float(ctx, ctx.input(0).dtype(), [&](auto tag) { launch_unary<decltype(tag)>(ctx, op); });
}

// Signed and unsigned integers and floats; bool refused as the CPU kernel refuses it.
template <class Op>
void unary_numeric(KernelContext& ctx, Op op) {
  if (ctx.input(0).dtype() == DType::kBool) ctx.unsupported("bool input");
  dispatch(ctx, ctx.input(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) launch_unary<T>(ctx, op);
  }, true);
}

struct SqrtOp { template <class T> __device__ T operator()(T v) const { return sqrt(v); } };
struct ExpOp { template <class T> __device__ T operator()(T v) const { return exp(v); } };
struct LogOp { template <class T> __device__ T operator()(T v) const { return log(v); } };
struct ErfOp { template <class T> __device__ T operator()(T v) const { return erf(v); } };
struct TanhOp { template <class T> __device__ T operator()(T v) const { return tanh(v); } };
struct SigmoidOp { template <class T> __device__ T operator()(T v) const { return T(1) / (T(1) + exp(-v)); } };
struct ReciprocalOp { template <class T> __device__ T operator()(T v) const { return T(1) / v; } };
struct FloorOp { template <class T> __device__ T operator()(T v) const { return floor(v); } };
struct CeilOp { template <class T> __device__ T operator()(T v) const { return ceil(v); } };
struct SoftplusOp { template <class T> __device__ T operator()(T v) const { return log1p(exp(v)); } };
struct LeakyReluOp {
  double alpha;
  template <class T> __device__ T operator()(T v) const { return v < 0 ? static_cast<T>(v * alpha) : v; }
};
struct ReluOp {
  template <class T> __device__ T operator()(T v) const {
    if constexpr (std::is_unsigned_v<T>) return v;
    else return v < 0 ? T(0) : v;
  }
};
struct NegOp {
  template <class T> __device__ T operator()(T v) const {
    if constexpr (std::is_unsigned_v<T>) return static_cast<T>(0 - v);
    else return static_cast<T>(-v);
  }
};
struct AbsOp {
  template <class T> __device__ T operator()(T v) const {
    if constexpr (std::is_unsigned_v<T>) return v;
    else return v < 0 ? static_cast<T>(-v) : v;
  }
};

void sqrt_k(KernelContext& c) { unary_float(c, SqrtOp{}); }
void exp_k(KernelContext& c) { unary_float(c, ExpOp{}); }
void log_k(KernelContext& c) { unary_float(c, LogOp{}); }
void erf_k(KernelContext& c) { unary_float(c, ErfOp{}); }
void tanh_k(KernelContext& c) { unary_float(c, TanhOp{}); }
void sigmoid_k(KernelContext& c) { unary_float(c, SigmoidOp{}); }
void reciprocal_k(KernelContext& c) { unary_float(c, ReciprocalOp{}); }
void floor_k(KernelContext& c) { unary_float(c, FloorOp{}); }
void ceil_k(KernelContext& c) { unary_float(c, CeilOp{}); }
void softplus_k(KernelContext& c) { unary_float(c, SoftplusOp{}); }
void leaky_relu_k(KernelContext& c) { unary_float(c, LeakyReluOp{c.attr_float("alpha", 0.01)}); }
void relu_k(KernelContext& c) { unary_numeric(c, ReluOp{}); }
void neg_k(KernelContext& c) { unary_numeric(c, NegOp{}); }
void abs_k(KernelContext& c) { unary_numeric(c, AbsOp{}); }

// --- Binary (numpy broadcasting through an IndexMap) ----------------------------------

template <class TA, class TB, class TO, class Op>
__global__ void binary_kernel(const TA* a, const TB* b, TO* out, int64_t n, IndexMap<2> map, Op op) {
  for (int64_t i = first_thread(); i < n; i += thread_stride()) {
    int64_t off[2];
    map.offsets(i, off);
    out[i] = static_cast<TO>(op(a[off[0]], b[off[1]]));
  }
}

// out (already allocated with the broadcast shape) = op(a, b).
template <class TA, class TB, class TO, class Op>
void launch_binary(const KernelContext& ctx, const Tensor& a, const Tensor& b, Tensor& out, Op op) {
  const IndexMap<2> map = broadcast_map<2>(ctx, out.shape(), {a.shape(), b.shape()});
  launch_1d(ctx, out.elements(), binary_kernel<TA, TB, TO, Op>, device_data<TA>(ctx, a),
                  device_data<TB>(ctx, b), device_data<TO>(ctx, out), out.elements(), map, op);
}

template <class Op>
void binary_arith(KernelContext& ctx, Op op) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != b.dtype()) ctx.invalid("operand dtypes differ");
  if (a.dtype() == DType::kBool) ctx.unsupported("bool operands");
  const auto shape = broadcast_shapes(ctx, a.shape(), b.shape());
  dispatch(ctx, a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) launch_binary<T, T, T>(ctx, a, b, ctx.output(0, a.dtype(), shape), op);
  }, true);
}

struct AddOp { template <class T> __device__ T operator()(T a, T b) const { return a + b; } };
struct SubOp { template <class T> __device__ T operator()(T a, T b) const { return a - b; } };
struct MulOp { template <class T> __device__ T operator()(T a, T b) const { return a * b; } };
struct DivOp {
  template <class T> __device__ T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) return b == 0 ? T(0) : static_cast<T>(a / b);  // as the CPU kernel
    else return a / b;
  }
};
// float^float in float (x² exactly as x·x, the CPU kernel's fast path); other pairs through double.
struct PowOp {
  template <class TA, class TB> __device__ TA operator()(TA x, TB z) const {
    if constexpr (std::is_same_v<TA, float> && std::is_same_v<TB, float>) return z == 2.f ? x * x : powf(x, z);
    else return static_cast<TA>(pow(static_cast<double>(x), static_cast<double>(z)));
  }
};

void add_k(KernelContext& c) { binary_arith(c, AddOp{}); }
void sub_k(KernelContext& c) { binary_arith(c, SubOp{}); }
void mul_k(KernelContext& c) { binary_arith(c, MulOp{}); }
void div_k(KernelContext& c) { binary_arith(c, DivOp{}); }

void pow_k(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  const auto shape = broadcast_shapes(ctx, a.shape(), b.shape());
  dispatch(ctx, a.dtype(), [&](auto ta) {
    using TA = decltype(ta);
    Tensor& y = ctx.output(0, a.dtype(), shape);
    dispatch(ctx, b.dtype(), [&](auto tb) { launch_binary<TA, decltype(tb), TA>(ctx, a, b, y, PowOp{}); }, true);
  });
}

template <class Op>
void compare(KernelContext& ctx, Op op) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != b.dtype()) ctx.invalid("operand dtypes differ");
  const auto shape = broadcast_shapes(ctx, a.shape(), b.shape());
  dispatch(ctx, a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch_binary<T, T, bool>(ctx, a, b, ctx.output(0, DType::kBool, shape), op);
  }, true);
}
struct EqualOp { template <class T> __device__ bool operator()(T a, T b) const { return a == b; } };
struct LessOp { template <class T> __device__ bool operator()(T a, T b) const { return a < b; } };
struct GreaterOp { template <class T> __device__ bool operator()(T a, T b) const { return a > b; } };
struct LessEqualOp { template <class T> __device__ bool operator()(T a, T b) const { return a <= b; } };
struct GreaterEqualOp { template <class T> __device__ bool operator()(T a, T b) const { return a >= b; } };
void equal_k(KernelContext& c) { compare(c, EqualOp{}); }
void less_k(KernelContext& c) { compare(c, LessOp{}); }
void greater_k(KernelContext& c) { compare(c, GreaterOp{}); }
void less_equal_k(KernelContext& c) { compare(c, LessEqualOp{}); }
void greater_equal_k(KernelContext& c) { compare(c, GreaterEqualOp{}); }

template <class Op>
void logic(KernelContext& ctx, Op op) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != DType::kBool || b.dtype() != DType::kBool) ctx.invalid("operands must be bool");
  launch_binary<bool, bool, bool>(ctx, a, b, ctx.output(0, DType::kBool, broadcast_shapes(ctx, a.shape(), b.shape())),
                                  op);
}
struct AndOp { __device__ bool operator()(bool a, bool b) const { return a && b; } };
struct OrOp { __device__ bool operator()(bool a, bool b) const { return a || b; } };
struct XorOp { __device__ bool operator()(bool a, bool b) const { return a != b; } };
struct NotOp { __device__ bool operator()(bool a) const { return !a; } };
void and_k(KernelContext& c) { logic(c, AndOp{}); }
void or_k(KernelContext& c) { logic(c, OrOp{}); }
void xor_k(KernelContext& c) { logic(c, XorOp{}); }
void not_k(KernelContext& ctx) {
  if (ctx.input(0).dtype() != DType::kBool) ctx.invalid("input must be bool");
  launch_unary<bool>(ctx, NotOp{});
}

// --- Variadic Sum/Mean/Min/Max: the output starts as input 0 broadcast, then folds in each further input ----

struct FirstOp { template <class T> __device__ T operator()(T a, T) const { return a; } };
struct MinOp {
  template <class T> __device__ T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>)
      if (isnan(a) || isnan(b)) return static_cast<T>(NAN);
    return b < a ? b : a;
  }
};
struct MaxOfOp {
  template <class T> __device__ T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>)
      if (isnan(a) || isnan(b)) return static_cast<T>(NAN);
    return b > a ? b : a;
  }
};
template <class T>
struct DivideByOp {
  T n;
  __device__ T operator()(T v) const { return static_cast<T>(v / n); }
};

template <class Op>
void variadic(KernelContext& ctx, Op op, bool mean = false) {
  const size_t n = ctx.num_inputs();
  const VariadicArgs args = variadic_args(ctx);
  const DType dt = args.dtype;
  const std::vector<int64_t>& shape = args.shape;
  dispatch(ctx, dt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      Tensor& y = ctx.output(0, dt, shape);
      launch_binary<T, T, T>(ctx, ctx.input(0), ctx.input(0), y, FirstOp{});
      // Elementwise in place: each thread reads y[i] before it writes it.
      for (size_t i = 1; i < n; ++i) launch_binary<T, T, T>(ctx, y, ctx.input(i), y, op);
      if (mean)
        launch_1d(ctx, y.elements(), unary_kernel<T, DivideByOp<T>>, device_data<T>(ctx, y),
                        device_data<T>(ctx, y), y.elements(), DivideByOp<T>{static_cast<T>(n)});
    }
  }, true);
}
void min_k(KernelContext& c) { variadic(c, MinOp{}); }
void max_k(KernelContext& c) { variadic(c, MaxOfOp{}); }
void sum_k(KernelContext& c) { variadic(c, AddOp{}); }
void mean_k(KernelContext& c) { variadic(c, AddOp{}, true); }

// --- Where, Clip, Cast, Identity, Dropout ----------------------------------------------

template <class T>
__global__ void where_kernel(const bool* cond, const T* x, const T* y, T* out, int64_t n, IndexMap<3> map) {
  for (int64_t i = first_thread(); i < n; i += thread_stride()) {
    int64_t off[3];
    map.offsets(i, off);
    out[i] = cond[off[0]] ? x[off[1]] : y[off[2]];
  }
}

void where_k(KernelContext& ctx) {
  const Tensor& cond = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& y = ctx.input(2);
  if (cond.dtype() != DType::kBool) ctx.invalid("condition must be bool");
  if (x.dtype() != y.dtype()) ctx.invalid("X and Y dtypes differ");
  const auto shape = broadcast_shapes(ctx, broadcast_shapes(ctx, cond.shape(), x.shape()), y.shape());
  dispatch_word(ctx, x.dtype(), [&](auto tag) {
    using W = decltype(tag);  // Where moves elements: by their bytes
    Tensor& out = ctx.output(0, x.dtype(), shape);
    const IndexMap<3> map = broadcast_map<3>(ctx, shape, {cond.shape(), x.shape(), y.shape()});
    launch_1d(ctx, out.elements(), where_kernel<W>, device_data<bool>(ctx, cond), device_data<W>(ctx, x),
                    device_data<W>(ctx, y), device_data<W>(ctx, out), out.elements(), map);
  });
}

template <class T>
struct ClipOp {
  T lo, hi;
  __device__ T operator()(T v) const { return v < lo ? lo : (v > hi ? hi : v); }
};

void clip_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      ctx.unsupported("bool input");
    } else {
      const auto [lo, hi] = clip_bounds<T>(ctx);
      launch_unary<T>(ctx, ClipOp<T>{lo, hi});
    }
  }, true);
}

// Float → integer saturates (NaN → 0) as the CPU kernel does; the bounds come from the host's numeric_limits.
template <class TI, class TO>
struct CastOp {
  double lowest, highest;
  TO lowest_value, highest_value;
  __device__ TO operator()(TI v) const {
    if constexpr (std::is_same_v<TO, bool>) {
      return v != TI(0);
    } else if constexpr (std::is_floating_point_v<TI> && std::is_integral_v<TO>) {
      const double d = static_cast<double>(v);
      return isnan(d) ? TO(0) : d <= lowest ? lowest_value : d >= highest ? highest_value : static_cast<TO>(d);
    } else {
      return static_cast<TO>(v);
    }
  }
};

template <class TI, class TO>
__global__ void cast_kernel(const TI* x, TO* y, int64_t n, CastOp<TI, TO> op) {
  for (int64_t i = first_thread(); i < n; i += thread_stride()) y[i] = op(x[i]);
}

void cast_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const auto to = dtype_from_onnx(static_cast<int32_t>(ctx.attr_int("to", 0)));
  if (!to) ctx.invalid("attribute 'to' is not a known dtype");
  dispatch(ctx, x.dtype(), [&](auto tin) {
    using TI = decltype(tin);
    dispatch(ctx, *to, [&](auto tout) {
      using TO = decltype(tout);
      Tensor& y = ctx.output(0, *to, x.shape());
      if constexpr (std::is_same_v<TI, TO>) {
        copy_device_bytes(ctx, x, y);
      } else {
        CastOp<TI, TO> op{static_cast<double>(std::numeric_limits<TO>::lowest()),
                          static_cast<double>(std::numeric_limits<TO>::max()), std::numeric_limits<TO>::lowest(),
                          std::numeric_limits<TO>::max()};
        launch_1d(ctx, x.elements(), cast_kernel<TI, TO>, device_data<TI>(ctx, x), device_data<TO>(ctx, y),
                        x.elements(), op);
      }
    }, true);
  }, true);
}

void identity_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  copy_device_bytes(ctx, x, ctx.output(0, x.dtype(), x.shape()));
}

// Element i is kept when its counter-based draw (random.h, the CPU kernel's very bits) is >= ratio.
template <class T>
__global__ void dropout_kernel(const T* x, T* y, bool* mask, int64_t n, uint64_t stream, double ratio, T scale) {
  for (int64_t i = first_thread(); i < n; i += thread_stride()) {
    const bool keep = random_uniform(random_bits(stream, static_cast<uint64_t>(i))) >= ratio;
    if (mask) mask[i] = keep;
    y[i] = keep ? x[i] * scale : T(0);
  }
}

__global__ void fill_true_kernel(bool* mask, int64_t n) {
  for (int64_t i = first_thread(); i < n; i += thread_stride()) mask[i] = true;
}

// Inference (and training with ratio 0): the output is the input, the mask all ones.
void dropout_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const DropoutArgs args = dropout_args(ctx);
  const bool want_mask = ctx.num_outputs() > 1 && ctx.wants_output(1);
  if (args.drops()) {
    bool* mask = want_mask ? device_data<bool>(ctx, ctx.output(1, DType::kBool, x.shape())) : nullptr;
    dispatch_float(ctx, x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      Tensor& y = ctx.output(0, x.dtype(), x.shape());
      launch_1d(ctx, x.elements(), dropout_kernel<T>, device_data<T>(ctx, x), device_data<T>(ctx, y), mask,
                      x.elements(), args.stream, args.ratio, static_cast<T>(1.0 / (1.0 - args.ratio)));
    });
    return;
  }
  copy_device_bytes(ctx, x, ctx.output(0, x.dtype(), x.shape()));
  if (want_mask) {
    Tensor& mask = ctx.output(1, DType::kBool, x.shape());
    launch_1d(ctx, mask.elements(), fill_true_kernel, device_data<bool>(ctx, mask), mask.elements());
  }
}

}  // namespace

void register_elementwise_kernels() {
  register_cuda_kernel("Sqrt", sqrt_k);
  register_cuda_kernel("Exp", exp_k);
  register_cuda_kernel("Log", log_k);
  register_cuda_kernel("Erf", erf_k);
  register_cuda_kernel("Tanh", tanh_k);
  register_cuda_kernel("Sigmoid", sigmoid_k);
  register_cuda_kernel("Reciprocal", reciprocal_k);
  register_cuda_kernel("Floor", floor_k);
  register_cuda_kernel("Ceil", ceil_k);
  register_cuda_kernel("Softplus", softplus_k);
  register_cuda_kernel("LeakyRelu", leaky_relu_k);
  register_cuda_kernel("Relu", relu_k);
  register_cuda_kernel("Neg", neg_k);
  register_cuda_kernel("Abs", abs_k);
  register_cuda_kernel("Add", add_k);
  register_cuda_kernel("Sub", sub_k);
  register_cuda_kernel("Mul", mul_k);
  register_cuda_kernel("Div", div_k);
  register_cuda_kernel("Pow", pow_k);
  register_cuda_kernel("Equal", equal_k);
  register_cuda_kernel("Less", less_k);
  register_cuda_kernel("Greater", greater_k);
  register_cuda_kernel("LessOrEqual", less_equal_k);
  register_cuda_kernel("GreaterOrEqual", greater_equal_k);
  register_cuda_kernel("And", and_k);
  register_cuda_kernel("Or", or_k);
  register_cuda_kernel("Xor", xor_k);
  register_cuda_kernel("Not", not_k);
  register_cuda_kernel("Min", min_k);
  register_cuda_kernel("Max", max_k);
  register_cuda_kernel("Sum", sum_k);
  register_cuda_kernel("Mean", mean_k);
  register_cuda_kernel("Where", where_k);
  register_cuda_kernel("Clip", clip_k);
  register_cuda_kernel("Cast", cast_k);
  register_cuda_kernel("Identity", identity_k);
  register_cuda_kernel("Dropout", dropout_k);
}

}  // namespace apart::cuda
