// CUDA reductions (ReduceSum/Mean/Max/Min/Prod over any axes), Softmax/LogSoftmax and LayerNormalization, with the
// semantics of cpu/reduce.cpp (op_args.h reads the axes): floating types accumulate in double as the CPU does,
// integers in 64 bits that wrap to the element type as the CPU's do. Deterministic: fixed trees, no atomics.
#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "runtime/cuda/families.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/op_args.h"

namespace apart::cuda {
namespace {

enum class Reduction : int { kSum, kMean, kMax, kMin, kProd };

// a ⊕ v; Max and Min let a NaN through (the CPU kernel's `v > a || isnan(v)`), so trees propagate it too.
struct Combine {
  Reduction kind;
  template <class A>
  __device__ A operator()(A a, A v) const {
    switch (kind) {
      case Reduction::kMax: return (v > a || isnan(static_cast<double>(v))) ? v : a;
      case Reduction::kMin: return (v < a || isnan(static_cast<double>(v))) ? v : a;
      case Reduction::kProd: return a * v;
      default: return a + v;
    }
  }
};

// The element type's value of an accumulated output (Mean divides as the CPU does: in double for floats, in T for
// integers).
template <class T, class A>
__device__ T finish(Reduction kind, A acc, int64_t count) {
  if (kind != Reduction::kMean) return static_cast<T>(acc);
  if (count == 0) return T(0);
  if constexpr (std::is_floating_point_v<T>) return static_cast<T>(acc / static_cast<A>(count));
  else return static_cast<T>(static_cast<T>(acc) / static_cast<T>(count));
}

struct ReduceGeometry {
  IndexMap<1> kept;     // output index → input offset of its first element
  IndexMap<1> reduced;  // reduction index → offset from there
  int64_t outputs = 0, count = 0;
};

// The innermost input dim is reduced: one block per output, threads stride over its elements.
template <class T>
__global__ void reduce_rows_kernel(const T* x, T* y, ReduceGeometry g, Combine op, AccumulatorOf<T> init) {
  using A = AccumulatorOf<T>;
  __shared__ A shared[32];
  for (int64_t o = blockIdx.x; o < g.outputs; o += gridDim.x) {
    int64_t base[1];
    g.kept.offsets(o, base);
    A acc = init;
    for (int64_t r = threadIdx.x; r < g.count; r += blockDim.x) {
      int64_t off[1];
      g.reduced.offsets(r, off);
      acc = op(acc, static_cast<A>(x[base[0] + off[0]]));
    }
    acc = block_reduce(acc, op, shared);
    if (threadIdx.x == 0) y[o] = finish<T>(op.kind, acc, g.count);
  }
}

// The innermost input dim is kept: 32 consecutive outputs per block row (coalesced reads), kColumnSplit threads
// down each output's elements, their partials combined in order.
constexpr int kColumnSplit = 8;
template <class T>
__global__ void reduce_columns_kernel(const T* x, T* y, ReduceGeometry g, Combine op, AccumulatorOf<T> init) {
  using A = AccumulatorOf<T>;
  __shared__ A partial[kColumnSplit][32];
  for (int64_t tile = blockIdx.x * 32ll; tile < g.outputs; tile += gridDim.x * 32ll) {
    const int64_t o = tile + threadIdx.x;
    A acc = init;
    if (o < g.outputs) {
      int64_t base[1];
      g.kept.offsets(o, base);
      for (int64_t r = threadIdx.y; r < g.count; r += kColumnSplit) {
        int64_t off[1];
        g.reduced.offsets(r, off);
        acc = op(acc, static_cast<A>(x[base[0] + off[0]]));
      }
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && o < g.outputs) {
      A total = partial[0][threadIdx.x];
      for (int s = 1; s < kColumnSplit; ++s) total = op(total, partial[s][threadIdx.x]);
      y[o] = finish<T>(op.kind, total, g.count);
    }
    __syncthreads();
  }
}

void reduce(KernelContext& ctx, Reduction kind) {
  const Tensor& x = ctx.input(0);
  const ReduceArgs args = reduce_args(ctx);
  if (args.noop) {
    copy_device_bytes(ctx, x, ctx.output(0, x.dtype(), x.shape()));
    return;
  }
  if (x.dtype() == DType::kBool) ctx.unsupported("bool input");
  // Split the input's dims into the kept ones (indexed by the output) and the reduced ones (by the reduction).
  const auto strides = contiguous_strides(x.shape());
  std::vector<int64_t> kept_dims, kept_strides, reduced_dims, reduced_strides;
  int64_t innermost = -1;  // the last dim of size > 1
  for (int64_t d = 0; d < x.rank(); ++d) {
    if (x.dim(d) != 1) innermost = d;
    auto& dims = args.reduced[d] ? reduced_dims : kept_dims;
    auto& steps = args.reduced[d] ? reduced_strides : kept_strides;
    dims.push_back(x.dim(d));
    steps.push_back(strides[static_cast<size_t>(d)]);
  }
  ReduceGeometry g;
  g.kept = strided_map<1>(ctx, kept_dims, {kept_strides});
  g.reduced = strided_map<1>(ctx, reduced_dims, {reduced_strides});
  g.outputs = product(kept_dims);
  g.count = args.count;
  const bool rows = innermost >= 0 && args.reduced[static_cast<size_t>(innermost)];
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      using A = AccumulatorOf<T>;
      A init = 0;
      constexpr bool floating = std::is_floating_point_v<T>;
      if (kind == Reduction::kMax)
        init = floating ? -std::numeric_limits<A>::infinity() : static_cast<A>(std::numeric_limits<T>::lowest());
      if (kind == Reduction::kMin)
        init = floating ? std::numeric_limits<A>::infinity() : static_cast<A>(std::numeric_limits<T>::max());
      if (kind == Reduction::kProd) init = 1;
      Tensor& y = ctx.output(0, x.dtype(), args.out_shape);
      if (g.outputs == 0) return;
      const int64_t block_items = rows ? g.outputs : (g.outputs + 31) / 32;
      const auto blocks = static_cast<unsigned>(std::min<int64_t>(block_items, kMaxBlocks));
      if (rows)
        launch(ctx, blocks, static_cast<unsigned>(row_threads(g.count)), 0, reduce_rows_kernel<T>,
               device_data<T>(ctx, x), device_data<T>(ctx, y), g, Combine{kind}, init);
      else
        launch(ctx, blocks, dim3(32, kColumnSplit), 0, reduce_columns_kernel<T>, device_data<T>(ctx, x),
               device_data<T>(ctx, y), g, Combine{kind}, init);
    }
  }, true);
}

void reduce_sum_k(KernelContext& c) { reduce(c, Reduction::kSum); }
void reduce_mean_k(KernelContext& c) { reduce(c, Reduction::kMean); }
void reduce_max_k(KernelContext& c) { reduce(c, Reduction::kMax); }
void reduce_min_k(KernelContext& c) { reduce(c, Reduction::kMin); }
void reduce_prod_k(KernelContext& c) { reduce(c, Reduction::kProd); }

// --- Softmax / LogSoftmax -------------------------------------------------------------

// Contiguous lines (inner = 1): one block per line; max, Σ exp and the write are three passes over it.
template <class T>
__global__ void softmax_rows_kernel(const T* x, T* y, int64_t lines, int64_t n, bool log_output) {
  __shared__ T shared[32];
  for (int64_t line = blockIdx.x; line < lines; line += gridDim.x) {
    const T* in = x + line * n;
    T* out = y + line * n;
    T mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = MaxOp{}(mx, in[j]);
    mx = block_reduce(mx, MaxOp{}, shared);
    T sum = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += exp(in[j] - mx);
    sum = block_reduce(sum, SumOp{}, shared);
    if (log_output) {
      const T lse = log(sum);
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) out[j] = in[j] - mx - lse;
    } else {
      const T inv = T(1) / sum;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) out[j] = exp(in[j] - mx) * inv;
    }
  }
}

// Strided lines (inner > 1): one thread per line; neighbouring threads read neighbouring elements.
template <class T>
__global__ void softmax_strided_kernel(const T* x, T* y, int64_t lines, int64_t n, int64_t inner, bool log_output) {
  for (int64_t line = first_thread(); line < lines; line += thread_stride()) {
    const int64_t base = (line / inner) * n * inner + line % inner;
    T mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) mx = MaxOp{}(mx, x[base + j * inner]);
    T sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += exp(x[base + j * inner] - mx);
    if (log_output) {
      const T lse = log(sum);
      for (int64_t j = 0; j < n; ++j) y[base + j * inner] = x[base + j * inner] - mx - lse;
    } else {
      const T inv = T(1) / sum;
      for (int64_t j = 0; j < n; ++j) y[base + j * inner] = exp(x[base + j * inner] - mx) * inv;
    }
  }
}

void softmax(KernelContext& ctx, bool log_output) {
  const Tensor& x = ctx.input(0);
  const SoftmaxArgs args = softmax_args(ctx);
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    launch_softmax<T>(ctx, device_data<T>(ctx, x), device_data<T>(ctx, y), args.outer, args.n, args.inner, log_output);
  });
}
void softmax_k(KernelContext& c) { softmax(c, false); }
void log_softmax_k(KernelContext& c) { softmax(c, true); }

// --- LayerNormalization ---------------------------------------------------------------

// One block per row: mean and variance in double over two passes (the CPU kernel's arithmetic), then the write.
template <class T>
__global__ void layer_norm_kernel(const T* x, const T* scale, const T* bias, T* y, T* mean_out, T* inv_out,
                                  int64_t rows, int64_t n, double epsilon) {
  __shared__ double shared[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* in = x + row * n;
    double sum = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += static_cast<double>(in[j]);
    const double mean = block_reduce(sum, SumOp{}, shared) / static_cast<double>(n);
    double squares = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const double d = static_cast<double>(in[j]) - mean;
      squares += d * d;
    }
    const double var = block_reduce(squares, SumOp{}, shared) / static_cast<double>(n);
    const double inv = 1.0 / sqrt(var + epsilon);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      y[row * n + j] = static_cast<T>((static_cast<double>(in[j]) - mean) * inv * static_cast<double>(scale[j]) +
                                      (bias ? static_cast<double>(bias[j]) : 0.0));
    if (threadIdx.x == 0) {
      if (mean_out) mean_out[row] = static_cast<T>(mean);
      if (inv_out) inv_out[row] = static_cast<T>(inv);
    }
  }
}

template <class W>
__global__ void broadcast_copy_kernel(const W* x, W* y, int64_t n, IndexMap<1> map) {
  for (int64_t i = first_thread(); i < n; i += thread_stride()) {
    int64_t off[1];
    map.offsets(i, off);
    y[i] = x[off[0]];
  }
}

void layer_norm_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const LayerNormArgs args = layer_norm_args(ctx);
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    // Scale and bias of another shape than the normalised dims are broadcast to it once, into scratch.
    const Tensor* params[2] = {&ctx.input(1), ctx.has_input(2) ? &ctx.input(2) : nullptr};
    const T* param_data[2] = {nullptr, nullptr};
    T* scratch = nullptr;
    for (int k = 0; k < 2; ++k) {
      if (!params[k]) continue;
      if (params[k]->shape() == args.norm_shape) {
        param_data[k] = device_data<T>(ctx, *params[k]);
        continue;
      }
      if (broadcast_shapes(ctx, params[k]->shape(), args.norm_shape) != args.norm_shape)
        ctx.invalid(std::string(k == 0 ? "scale" : "bias") + " " + shape_string(params[k]->shape()) +
                    " does not broadcast to the normalised dims " + shape_string(args.norm_shape));
      if (!scratch) scratch = static_cast<T*>(backend_of(ctx).scratch(2 * args.n * static_cast<int64_t>(sizeof(T))));
      T* copy = scratch + k * args.n;
      const IndexMap<1> map = broadcast_map<1>(ctx, args.norm_shape, {params[k]->shape()});
      launch_1d(ctx, args.n, broadcast_copy_kernel<T>, device_data<T>(ctx, *params[k]), copy, args.n, map);
      param_data[k] = copy;
    }
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    auto statistic = [&](size_t i) -> T* {  // Mean (1) and InvStdDev (2), when asked for
      if (ctx.num_outputs() <= i || !ctx.wants_output(i)) return nullptr;
      return device_data<T>(ctx, ctx.output(i, x.dtype(), args.stat_shape));
    };
    T* mean_out = statistic(1);
    T* inv_out = statistic(2);
    if (args.rows == 0) return;
    launch(ctx, static_cast<unsigned>(std::min<int64_t>(args.rows, kMaxBlocks)),
           static_cast<unsigned>(row_threads(args.n)), 0, layer_norm_kernel<T>, device_data<T>(ctx, x), param_data[0],
           param_data[1], device_data<T>(ctx, y), mean_out, inv_out, args.rows, args.n, args.epsilon);
  });
}

}  // namespace

template <class T>
void launch_softmax(const KernelContext& ctx, const T* x, T* y, int64_t outer, int64_t n, int64_t inner,
                    bool log_output) {
  const int64_t lines = outer * inner;
  if (lines == 0 || n == 0) return;
  if (inner == 1)
    launch(ctx, static_cast<unsigned>(std::min<int64_t>(lines, kMaxBlocks)), static_cast<unsigned>(row_threads(n)), 0,
           softmax_rows_kernel<T>, x, y, lines, n, log_output);
  else
    launch_1d(ctx, lines, softmax_strided_kernel<T>, x, y, lines, n, inner, log_output);
}
template void launch_softmax<float>(const KernelContext&, const float*, float*, int64_t, int64_t, int64_t, bool);
template void launch_softmax<double>(const KernelContext&, const double*, double*, int64_t, int64_t, int64_t, bool);

void register_reduce_kernels() {
  register_cuda_kernel("ReduceSum", reduce_sum_k);
  register_cuda_kernel("ReduceMean", reduce_mean_k);
  register_cuda_kernel("ReduceMax", reduce_max_k);
  register_cuda_kernel("ReduceMin", reduce_min_k);
  register_cuda_kernel("ReduceProd", reduce_prod_k);
  register_cuda_kernel("Softmax", softmax_k);
  register_cuda_kernel("LogSoftmax", log_softmax_k);
  register_cuda_kernel("LayerNormalization", layer_norm_k);
}

}  // namespace apart::cuda
