// Reductions (ReduceMean/Sum/Max/Min/Prod, ArgMax/ArgMin), Softmax, LogSoftmax and LayerNormalization.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "runtime/cpu/broadcast.h"
#include "runtime/cpu/families.h"
#include "runtime/cpu/threads.h"
#include "runtime/op_args.h"

namespace apart::cpu {
namespace {

enum class Reduction { kSum, kMean, kMax, kMin, kProd };

void reduce(KernelContext& ctx, Reduction kind) {
  const Tensor& x = ctx.input(0);
  const int64_t r = x.rank();
  const ReduceArgs args = reduce_args(ctx);
  if (args.noop) {
    copy_bytes(x, ctx.output(0, x.dtype(), x.shape()));
    return;
  }
  const std::vector<int64_t>& kept_shape = args.kept_shape;
  const std::vector<int64_t>& out_shape = args.out_shape;
  const int64_t count = args.count;
  if (x.dtype() == DType::kBool) ctx.unsupported("bool input");
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      using Acc = std::conditional_t<std::is_floating_point_v<T>, double, T>;
      const int64_t n_out = product(kept_shape);
      std::vector<Acc> acc(static_cast<size_t>(n_out));
      Acc init = 0;
      if (kind == Reduction::kMax) init = std::is_floating_point_v<T> ? -std::numeric_limits<Acc>::infinity() : std::numeric_limits<Acc>::lowest();
      if (kind == Reduction::kMin) init = std::is_floating_point_v<T> ? std::numeric_limits<Acc>::infinity() : std::numeric_limits<Acc>::max();
      if (kind == Reduction::kProd) init = 1;
      std::fill(acc.begin(), acc.end(), init);
      // Walk the input in rows of its last dim; the output strides are 0 on reduced axes.
      const auto out_strides = broadcast_strides(kept_shape, x.shape());
      const T* px = x.data<T>();
      const int64_t inner = r == 0 ? 1 : x.dim(r - 1);
      const int64_t rows = r == 0 ? 1 : product(x.shape(), 0, static_cast<size_t>(r - 1));
      const int64_t inner_stride = r == 0 ? 0 : out_strides[static_cast<size_t>(r - 1)];
      for (int64_t row = 0; row < rows && inner > 0; ++row) {
        int64_t off = 0, rem = row;
        for (int64_t d = r - 2; d >= 0; --d) {
          off += (rem % x.dim(d)) * out_strides[static_cast<size_t>(d)];
          rem /= x.dim(d);
        }
        const T* src = px + row * inner;
        for (int64_t j = 0; j < inner; ++j) {
          Acc& a = acc[static_cast<size_t>(off + j * inner_stride)];
          const Acc v = static_cast<Acc>(src[j]);
          switch (kind) {
            case Reduction::kSum:
            case Reduction::kMean: a += v; break;
            case Reduction::kMax: a = (v > a || std::isnan(static_cast<double>(v))) ? v : a; break;
            case Reduction::kMin: a = (v < a || std::isnan(static_cast<double>(v))) ? v : a; break;
            case Reduction::kProd: a *= v; break;
          }
        }
      }
      Tensor& y = ctx.output(0, x.dtype(), out_shape);
      T* py = y.data<T>();
      for (int64_t i = 0; i < n_out; ++i) {
        Acc v = acc[static_cast<size_t>(i)];
        if (kind == Reduction::kMean) v = count == 0 ? Acc(0) : static_cast<Acc>(v / static_cast<Acc>(count));
        py[i] = static_cast<T>(v);
      }
    }
  }, true);
}

void reduce_sum_k(KernelContext& c) { reduce(c, Reduction::kSum); }
void reduce_mean_k(KernelContext& c) { reduce(c, Reduction::kMean); }
void reduce_max_k(KernelContext& c) { reduce(c, Reduction::kMax); }
void reduce_min_k(KernelContext& c) { reduce(c, Reduction::kMin); }
void reduce_prod_k(KernelContext& c) { reduce(c, Reduction::kProd); }

// Softmax over `n` elements spaced `inner` apart (softmax_args: the opset's axis semantics).
void softmax(KernelContext& ctx, bool log) {
  const Tensor& x = ctx.input(0);
  const SoftmaxArgs args = softmax_args(ctx);
  const int64_t outer = args.outer, n = args.n, inner = args.inner;
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(outer * inner, n * 4, [&](int64_t s, int64_t e) {
      for (int64_t line = s; line < e; ++line) {
        const int64_t base = (line / inner) * n * inner + line % inner;
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < n; ++j) mx = std::max(mx, px[base + j * inner]);
        // Summed in double, as the loss kernel does: a float running sum over a 50k vocabulary row drifts by ~1e-5.
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          const T ex = std::exp(px[base + j * inner] - mx);
          py[base + j * inner] = ex;
          sum += static_cast<double>(ex);
        }
        if (log) {
          const T lse = static_cast<T>(std::log(sum));
          for (int64_t j = 0; j < n; ++j) py[base + j * inner] = px[base + j * inner] - mx - lse;
        } else {
          const T inv = static_cast<T>(1.0 / sum);
          for (int64_t j = 0; j < n; ++j) py[base + j * inner] *= inv;
        }
      }
    });
  });
}
void softmax_k(KernelContext& c) { softmax(c, false); }
void log_softmax_k(KernelContext& c) { softmax(c, true); }

void layer_norm_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const LayerNormArgs args = layer_norm_args(ctx);
  const double eps = args.epsilon;
  const std::vector<int64_t>& norm_shape = args.norm_shape;
  const int64_t rows = args.rows, n = args.n;
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor scale = broadcast_to(ctx.input(1), norm_shape);
    Tensor bias = ctx.has_input(2) ? broadcast_to(ctx.input(2), norm_shape) : Tensor(x.dtype(), norm_shape);
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    const std::vector<int64_t>& stat_shape = args.stat_shape;
    T* mean_out = ctx.num_outputs() > 1 && ctx.wants_output(1) ? ctx.output(1, x.dtype(), stat_shape).template data<T>() : nullptr;
    T* inv_out = ctx.num_outputs() > 2 && ctx.wants_output(2) ? ctx.output(2, x.dtype(), stat_shape).template data<T>() : nullptr;
    const T* px = x.data<T>();
    const T* ps = scale.data<T>();
    const T* pb = bias.data<T>();
    T* py = y.data<T>();
    parallel_for(rows, n * 6, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        const T* row = px + i * n;
        double mean = 0, var = 0;
        for (int64_t j = 0; j < n; ++j) mean += row[j];
        mean /= static_cast<double>(n);
        for (int64_t j = 0; j < n; ++j) var += (row[j] - mean) * (row[j] - mean);
        var /= static_cast<double>(n);
        const double inv = 1.0 / std::sqrt(var + eps);
        for (int64_t j = 0; j < n; ++j) py[i * n + j] = static_cast<T>((row[j] - mean) * inv * ps[j] + pb[j]);
        if (mean_out) mean_out[i] = static_cast<T>(mean);
        if (inv_out) inv_out[i] = static_cast<T>(inv);
      }
    });
  });
}

// ArgMax / ArgMin along `axis` (keepdims, select_last_index): int64 indices of the first extreme, or the last.
template <bool kMax>
void arg_extreme_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.rank() == 0) ctx.invalid("input must have rank >= 1");
  const int64_t axis = normalize_axis(ctx, ctx.attr_int("axis", 0), x.rank());
  const bool keepdims = ctx.attr_int("keepdims", 1) != 0, last = ctx.attr_int("select_last_index", 0) != 0;
  std::vector<int64_t> shape = x.shape();
  if (keepdims) shape[static_cast<size_t>(axis)] = 1;
  else shape.erase(shape.begin() + axis);
  const int64_t outer = product(x.shape(), 0, static_cast<size_t>(axis)), n = x.dim(axis),
                inner = product(x.shape(), static_cast<size_t>(axis) + 1);
  if (n == 0) ctx.invalid("cannot take the extreme of an empty axis");
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    int64_t* py = ctx.output(0, DType::kInt64, shape).template data<int64_t>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        const T* line = px + o * n * inner + i;
        int64_t best = 0;
        for (int64_t k = 1; k < n; ++k) {
          const T v = line[k * inner], b = line[best * inner];
          if (kMax ? (v > b || (last && v == b)) : (v < b || (last && v == b))) best = k;
        }
        py[o * inner + i] = best;
      }
  }, true);
}

}  // namespace

void register_reduce_kernels() {
  register_kernel("ReduceSum", reduce_sum_k);
  register_kernel("ReduceMean", reduce_mean_k);
  register_kernel("ReduceMax", reduce_max_k);
  register_kernel("ReduceMin", reduce_min_k);
  register_kernel("ReduceProd", reduce_prod_k);
  register_kernel("ArgMax", arg_extreme_k<true>);
  register_kernel("ArgMin", arg_extreme_k<false>);
  register_kernel("Softmax", softmax_k);
  register_kernel("LogSoftmax", log_softmax_k);
  register_kernel("LayerNormalization", layer_norm_k);
}

}  // namespace apart::cpu
