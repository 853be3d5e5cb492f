// CUDA data-movement kernels (dtype-agnostic: elements move as words of their size): Reshape, Flatten, Squeeze,
// Unsqueeze, Transpose, Concat, Split, Slice, Gather, Expand, ScatterND, Trilu. Output shapes and index geometry
// come from op_args.h, the very code the CPU kernels use; Shape, Size, Constant, ConstantOfShape and Range stay
// CPU-only (the executor falls back; they are precomputed).
#include <cuda_runtime.h>

#include <string>
#include <type_traits>

#include "graph/error.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/op_args.h"

namespace apart::cuda {
namespace {

// --- Views: the output is the input's bytes under another shape ------------------------

void reshape_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  copy_device_bytes(ctx, x, ctx.output(0, x.dtype(), reshape_output_shape(ctx)));
}
void flatten_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  copy_device_bytes(ctx, x, ctx.output(0, x.dtype(), flatten_output_shape(ctx)));
}
void squeeze_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  copy_device_bytes(ctx, x, ctx.output(0, x.dtype(), squeeze_output_shape(ctx)));
}
void unsqueeze_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  copy_device_bytes(ctx, x, ctx.output(0, x.dtype(), unsqueeze_output_shape(ctx)));
}

// --- Gathers through an IndexMap: Transpose, Slice, Expand ------------------------------

template <class W>
__global__ void strided_copy_kernel(const W* x, W* y, int64_t n, int64_t base, IndexMap<1> map) {
  for (int64_t i = first_thread(); i < n; i += thread_stride()) {
    int64_t off[1];
    map.offsets(i, off);
    y[i] = x[base + off[0]];
  }
}

// y (view.shape) = x read at view's strides from view.base.
void strided_copy(const KernelContext& ctx, const Tensor& x, const StridedView& view, Tensor& y) {
  if (y.elements() == 0) return;
  const IndexMap<1> map = strided_map<1>(ctx, view.shape, {view.strides});
  dispatch_word(ctx, x.dtype(), [&](auto tag) {
    using W = decltype(tag);
    launch_1d(ctx, y.elements(), strided_copy_kernel<W>, device_data<W>(ctx, x), device_data<W>(ctx, y), y.elements(),
              view.base, map);
  });
}

void transpose_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const StridedView view = transpose_view(ctx);
  strided_copy(ctx, x, view, ctx.output(0, x.dtype(), view.shape));
}

void slice_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const StridedView view = slice_view(ctx);
  strided_copy(ctx, x, view, ctx.output(0, x.dtype(), view.shape));
}

void expand_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  StridedView view;
  view.shape = broadcast_shapes(ctx, x.shape(), ctx.host_input(1).to_int64s());
  view.strides = broadcast_strides(x.shape(), view.shape);
  strided_copy(ctx, x, view, ctx.output(0, x.dtype(), view.shape));
}

// --- Concat and Split: rows of bytes between two pitches -------------------------------

template <class W>
__global__ void copy_rows_kernel(const W* src, int64_t src_pitch, W* dst, int64_t dst_pitch, int64_t rows,
                                 int64_t width) {
  const int64_t n = rows * width;
  for (int64_t i = first_thread(); i < n; i += thread_stride()) {
    const int64_t row = i / width, column = i % width;
    dst[row * dst_pitch + column] = src[row * src_pitch + column];
  }
}

// `rows` rows of `width` bytes from src (rows `src_pitch` bytes apart) to dst (`dst_pitch` apart), in the widest
// word that divides every address, pitch and width.
void copy_rows(const KernelContext& ctx, const std::byte* src, int64_t src_pitch, std::byte* dst, int64_t dst_pitch,
               int64_t rows, int64_t width) {
  if (rows == 0 || width == 0) return;
  const auto bits = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) |
                    static_cast<uint64_t>(src_pitch | dst_pitch | width);
  auto go = [&](auto tag) {
    using W = decltype(tag);
    constexpr int64_t w = sizeof(W);
    launch_1d(ctx, rows * (width / w), copy_rows_kernel<W>, reinterpret_cast<const W*>(src), src_pitch / w,
              reinterpret_cast<W*>(dst), dst_pitch / w, rows, width / w);
  };
  if (bits % 8 == 0) go(uint64_t{});
  else if (bits % 4 == 0) go(uint32_t{});
  else if (bits % 2 == 0) go(uint16_t{});
  else go(uint8_t{});
}

void concat_k(KernelContext& ctx) {
  int64_t axis = 0;
  const std::vector<int64_t> shape = concat_output_shape(ctx, axis);
  const Tensor& first = ctx.input(0);
  Tensor& y = ctx.output(0, first.dtype(), shape);
  const int64_t es = dtype_size(first.dtype());
  const int64_t outer = product(shape, 0, static_cast<size_t>(axis));
  const int64_t inner = product(shape, static_cast<size_t>(axis) + 1);
  const int64_t out_row = shape[axis] * inner * es;
  int64_t at = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor& t = ctx.input(i);
    const int64_t row = t.dim(axis) * inner * es;
    if (row > 0)
      copy_rows(ctx, device_data<std::byte>(ctx, t), row, device_data<std::byte>(ctx, y) + at, out_row, outer, row);
    at += row;
  }
}

void split_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  int64_t axis = 0;
  const std::vector<int64_t> sizes = split_sizes(ctx, axis);
  const int64_t es = dtype_size(x.dtype());
  const int64_t outer = product(x.shape(), 0, static_cast<size_t>(axis));
  const int64_t inner = product(x.shape(), static_cast<size_t>(axis) + 1);
  const int64_t in_row = x.dim(axis) * inner * es;
  int64_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<int64_t> shape = x.shape();
    shape[axis] = sizes[i];
    const int64_t row = sizes[i] * inner * es;
    if (ctx.wants_output(i)) {
      Tensor& y = ctx.output(i, x.dtype(), shape);
      if (row > 0)
        copy_rows(ctx, device_data<std::byte>(ctx, x) + at, in_row, device_data<std::byte>(ctx, y), row, outer, row);
    }
    at += row;
  }
}

// --- Trilu: the upper (j − i >= k) or lower (j − i <= k) triangle of the last two dims, zeros elsewhere ---------

template <class W>
__global__ void trilu_kernel(const W* x, W* y, int64_t n, int64_t rows, int64_t cols, int64_t k, bool upper) {
  for (int64_t e = first_thread(); e < n; e += thread_stride()) {
    const int64_t j = e % cols, i = (e / cols) % rows;
    y[e] = (upper ? j - i >= k : j - i <= k) ? x[e] : W(0);
  }
}

void trilu_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.rank() < 2) ctx.invalid("input must have rank >= 2");
  const bool upper = ctx.attr_int("upper", 1) != 0;
  const int64_t k = ctx.has_input(1) ? ctx.host_input(1).to_int64s().at(0) : 0;
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_word(ctx, x.dtype(), [&](auto tag) {
    using W = decltype(tag);
    launch_1d(ctx, x.elements(), trilu_kernel<W>, device_data<W>(ctx, x), device_data<W>(ctx, y), x.elements(),
              x.dim(-2), x.dim(-1), k, upper);
  });
}

// --- Gather and ScatterND: indices on the device, checked there --------------------------

// The first out-of-range index a kernel met: `found` is set once, `index` holds the value.
struct IndexError {
  int found;
  long long index;
};
__device__ inline void report_bad_index(IndexError* error, int64_t index) {
  if (atomicExch(&error->found, 1) == 0) error->index = index;
}

// A zeroed IndexError in scratch, and after the launch the check: InvalidArgument naming the node and the index.
// The check waits for the kernel (one small copy); an index out of range would otherwise read stray memory.
IndexError* clear_index_error(const KernelContext& ctx) {
  auto* error = static_cast<IndexError*>(backend_of(ctx).scratch(sizeof(IndexError)));
  APART_CUDA_CHECK(cudaMemsetAsync(error, 0, sizeof(IndexError), backend_of(ctx).compute_stream()));
  return error;
}
void check_index_error(const KernelContext& ctx, const IndexError* device_error, const std::string& bound) {
  IndexError error{};
  const cudaStream_t stream = backend_of(ctx).compute_stream();
  APART_CUDA_CHECK(cudaMemcpyAsync(&error, device_error, sizeof(IndexError), cudaMemcpyDeviceToHost, stream));
  APART_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (error.found)
    throw InvalidArgument("node '" + ctx.task().name + "' (" + ctx.task().op_type + "): index " +
                          std::to_string(error.index) + " out of range for " + bound);
}

// out[o, k, j] = data[o, indices[k], j] over words; an out-of-range index writes 0 and reports itself.
template <class W, class I>
__global__ void gather_kernel(const W* data, const I* indices, W* out, int64_t n, int64_t count, int64_t inner,
                              int64_t dim, IndexError* error) {
  for (int64_t i = first_thread(); i < n; i += thread_stride()) {
    const int64_t j = i % inner, ok = i / inner;
    const int64_t k = ok % count, o = ok / count;
    int64_t index = static_cast<int64_t>(indices[k]);
    if (index < 0) index += dim;
    if (index < 0 || index >= dim) {
      report_bad_index(error, static_cast<int64_t>(indices[k]));
      out[i] = W(0);
    } else {
      out[i] = data[(o * dim + index) * inner + j];
    }
  }
}

// Calls f(I{}) for an integer index dtype (what Tensor::to_int64s reads on the CPU).
template <class F>
void dispatch_index(const KernelContext& ctx, DType dtype, F&& f) {
  dispatch(ctx, dtype, [&](auto tag) {
    using I = decltype(tag);
    if constexpr (std::is_integral_v<I>) f(tag);
    else ctx.invalid("indices must be integers, not " + std::string(dtype_name(dtype)));
  }, true);
}

void gather_k(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  int64_t axis = 0;
  const std::vector<int64_t> shape = gather_output_shape(ctx, axis);
  Tensor& y = ctx.output(0, data.dtype(), shape);
  if (y.elements() == 0) return;
  const int64_t inner = product(data.shape(), static_cast<size_t>(axis) + 1), dim = data.dim(axis);
  IndexError* error = clear_index_error(ctx);
  dispatch_word(ctx, data.dtype(), [&](auto word) {
    using W = decltype(word);
    dispatch_index(ctx, indices.dtype(), [&](auto index) {
      using I = decltype(index);
      launch_1d(ctx, y.elements(), gather_kernel<W, I>, device_data<W>(ctx, data), device_data<I>(ctx, indices),
                device_data<W>(ctx, y), y.elements(), indices.elements(), inner, dim, error);
    });
  });
  check_index_error(ctx, error, "a dim of " + std::to_string(dim));
}

// ScatterND's index tuples address the first `k` dims of data.
struct ScatterGeometry {
  int k = 0;
  int64_t dims[kMaxIndexRank] = {}, strides[kMaxIndexRank] = {};
  int64_t count = 0, slice = 0;
};

enum class ScatterReduction : int { kNone, kAdd, kMul, kMax, kMin };

// *address ⊕= v for the 4- and 8-byte types ScatterND takes: hardware atomicAdd for add, a CAS loop otherwise.
template <class T>
__device__ void atomic_apply(T* address, T v, ScatterReduction reduction) {
  if (reduction == ScatterReduction::kNone) {
    *address = v;  // duplicates in the indices: some one of them wins, as ONNX leaves it
    return;
  }
  if (reduction == ScatterReduction::kAdd) {
    if constexpr (std::is_same_v<T, int64_t>)
      atomicAdd(reinterpret_cast<unsigned long long*>(address), static_cast<unsigned long long>(v));
    else atomicAdd(address, v);
    return;
  }
  using Word = std::conditional_t<sizeof(T) == 8, unsigned long long, unsigned int>;
  Word* word = reinterpret_cast<Word*>(address);
  Word seen = *word, expected;
  do {
    expected = seen;
    T current;
    memcpy(&current, &expected, sizeof(T));
    T next = reduction == ScatterReduction::kMul   ? static_cast<T>(current * v)
             : reduction == ScatterReduction::kMax ? (v > current ? v : current)
                                                   : (v < current ? v : current);
    Word desired;
    memcpy(&desired, &next, sizeof(T));
    seen = atomicCAS(word, expected, desired);
  } while (seen != expected);
}

template <class T, class I>
__global__ void scatter_nd_kernel(T* out, const I* indices, const T* updates, ScatterGeometry g,
                                  ScatterReduction reduction, IndexError* error) {
  const int64_t n = g.count * g.slice;
  for (int64_t i = first_thread(); i < n; i += thread_stride()) {
    const int64_t tuple = i / g.slice, s = i % g.slice;
    int64_t offset = 0;
    bool in_range = true;
    for (int j = 0; j < g.k; ++j) {
      int64_t v = static_cast<int64_t>(indices[tuple * g.k + j]);
      if (v < 0) v += g.dims[j];
      if (v < 0 || v >= g.dims[j]) {
        report_bad_index(error, v);
        in_range = false;
        break;
      }
      offset += v * g.strides[j];
    }
    if (in_range) atomic_apply(out + offset + s, updates[i], reduction);
  }
}

// out = data with updates scattered in. Add, mul, max and min are atomics: with repeated indices floating sums
// may differ from the CPU's sequential order in the last bits.
void scatter_nd_k(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  const Tensor& updates = ctx.input(2);
  const std::string reduction_name = ctx.attr_string("reduction", "none");
  ScatterReduction reduction = ScatterReduction::kNone;
  if (reduction_name == "add") reduction = ScatterReduction::kAdd;
  else if (reduction_name == "mul") reduction = ScatterReduction::kMul;
  else if (reduction_name == "max") reduction = ScatterReduction::kMax;
  else if (reduction_name == "min") reduction = ScatterReduction::kMin;
  Tensor& out = ctx.output(0, data.dtype(), data.shape());
  copy_device_bytes(ctx, data, out);
  const int64_t k = indices.rank() == 0 ? 0 : indices.dim(-1);
  if (k > data.rank()) ctx.invalid("indices' last dim exceeds the data's rank");
  if (k > kMaxIndexRank) ctx.unsupported("index tuples of more than " + std::to_string(kMaxIndexRank) + " dims");
  ScatterGeometry g;
  g.k = static_cast<int>(k);
  g.slice = product(data.shape(), static_cast<size_t>(k));
  g.count = indices.elements() / std::max<int64_t>(k, 1);
  if (updates.elements() != g.count * g.slice) ctx.invalid("updates do not match indices and data");
  const auto strides = contiguous_strides(data.shape());
  for (int j = 0; j < g.k; ++j) {
    g.dims[j] = data.dim(j);
    g.strides[j] = strides[static_cast<size_t>(j)];
  }
  if (g.count * g.slice == 0) return;
  IndexError* error = clear_index_error(ctx);
  dispatch(ctx, data.dtype(), [&](auto tag) {
    using T = decltype(tag);  // float, double, int64, int32: what the CPU kernel takes, and what atomics exist for
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int64_t> ||
                  std::is_same_v<T, int32_t>) {
      dispatch_index(ctx, indices.dtype(), [&](auto index) {
        using I = decltype(index);
        launch_1d(ctx, g.count * g.slice, scatter_nd_kernel<T, I>, device_data<T>(ctx, out),
                  device_data<I>(ctx, indices), device_data<T>(ctx, updates), g, reduction, error);
      });
    }
  });
  check_index_error(ctx, error, "the data's dims " + shape_string(data.shape()));
}

}  // namespace

void register_shape_kernels() {
  register_cuda_kernel("Reshape", reshape_k);
  register_cuda_kernel("Flatten", flatten_k);
  register_cuda_kernel("Squeeze", squeeze_k);
  register_cuda_kernel("Unsqueeze", unsqueeze_k);
  register_cuda_kernel("Transpose", transpose_k);
  register_cuda_kernel("Concat", concat_k);
  register_cuda_kernel("Split", split_k);
  register_cuda_kernel("Slice", slice_k);
  register_cuda_kernel("Gather", gather_k);
  register_cuda_kernel("Expand", expand_k);
  register_cuda_kernel("ScatterND", scatter_nd_k);
  register_cuda_kernel("ai.apart.ScatterND", scatter_nd_k);  // ScatterND with `reduction` at any opset
  register_cuda_kernel("Trilu", trilu_k);
}

}  // namespace apart::cuda
