// What the CUDA kernel families share (device code; .cu files only): launch geometry and checks on the compute
// stream, grid-stride loops, block reductions, index maps of a KernelContext's shapes, device copies.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/index_map.h"
#include "runtime/kernel.h"

namespace apart::cuda {

inline constexpr int kThreads = 256;
// Grids are 1-D (x allows 2^31 − 1 blocks; y and z stop at 65535) and capped: kernels loop grid-stride past it.
inline constexpr int64_t kMaxBlocks = 1 << 16;

inline unsigned blocks_for(int64_t items, int threads = kThreads) {
  return static_cast<unsigned>(std::clamp<int64_t>((items + threads - 1) / threads, 1, kMaxBlocks));
}

__device__ inline int64_t first_thread() { return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; }
__device__ inline int64_t thread_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// kernel<<<blocks, threads, shared_bytes, the compute stream>>>(args…), nothing for 0 blocks (empty tensors); a
// failed launch (bad configuration, no kernel image for this GPU, …) throws CudaError naming the node.
template <class... Params, class... Args>
void launch(const KernelContext& ctx, unsigned blocks, dim3 threads, size_t shared_bytes,
            void (*kernel)(Params...), Args... args) {
  if (blocks == 0) return;
  kernel<<<blocks, threads, shared_bytes, backend_of(ctx).compute_stream()>>>(args...);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    const std::string what = "the kernel launch of node '" + ctx.task().name + "' (" + ctx.task().op_type + ")";
    throw_cuda_error("CUDA", what.c_str(), __FILE__, __LINE__,
                     std::string(cudaGetErrorString(status)) + " (" + cudaGetErrorName(status) + ")");
  }
}

// One thread per item, grid-stride.
template <class... Params, class... Args>
void launch_1d(const KernelContext& ctx, int64_t items, void (*kernel)(Params...), Args... args) {
  if (items > 0) launch(ctx, blocks_for(items), kThreads, 0, kernel, args...);
}

// The map of `out_shape` over operands at explicit element strides (Transpose, Slice); Unsupported naming the
// node past kMaxIndexRank merged dims.
template <int K>
IndexMap<K> strided_map(const KernelContext& ctx, const std::vector<int64_t>& out_shape,
                        const std::array<std::vector<int64_t>, K>& strides) {
  IndexMap<K> map;
  if (!make_index_map<K>(out_shape, strides, map))
    ctx.unsupported("a shape of more than " + std::to_string(kMaxIndexRank) + " dims that do not merge on the GPU: " +
                    shape_string(out_shape));
  return map;
}

// The map of `out_shape` over operands of `shapes` broadcast to it (numpy rules: broadcast_strides).
template <int K>
IndexMap<K> broadcast_map(const KernelContext& ctx, const std::vector<int64_t>& out_shape,
                          const std::array<std::vector<int64_t>, K>& shapes) {
  std::array<std::vector<int64_t>, K> strides;
  for (int k = 0; k < K; ++k) strides[k] = broadcast_strides(shapes[k], out_shape);
  return strided_map<K>(ctx, out_shape, strides);
}

// The device pointer of a tensor the kernel reads or writes (an input already on the device, an output the
// executor handed out); Internal for host memory, which a CUDA kernel must not dereference.
template <class T>
const T* device_data(const KernelContext& ctx, const Tensor& t) {
  APART_CHECK(!t.on_host() || t.elements() == 0, "node '" + ctx.task().name + "': a host tensor reached a CUDA kernel");
  return t.data<T>();
}
template <class T>
T* device_data(const KernelContext& ctx, Tensor& t) {
  APART_CHECK(!t.on_host() || t.elements() == 0, "node '" + ctx.task().name + "': a host tensor reached a CUDA kernel");
  return t.data<T>();
}

// Device-to-device bytes on the compute stream (Reshape, Identity and the other copies).
inline void copy_device_bytes(const KernelContext& ctx, const Tensor& from, Tensor& to) {
  APART_CHECK(from.bytes() == to.bytes(), "node '" + ctx.task().name + "': copy of unequal sizes");
  if (from.bytes() == 0 || from.raw() == to.raw()) return;
  APART_CUDA_CHECK(cudaMemcpyAsync(to.raw(), from.raw(), static_cast<size_t>(from.bytes()), cudaMemcpyDeviceToDevice,
                                   backend_of(ctx).compute_stream()));
}

// Element types moved as unsigned words of their size (shape kernels are dtype-agnostic).
template <int Bytes> struct WordOf;
template <> struct WordOf<1> { using type = uint8_t; };
template <> struct WordOf<2> { using type = uint16_t; };
template <> struct WordOf<4> { using type = uint32_t; };
template <> struct WordOf<8> { using type = uint64_t; };
template <class F>
void dispatch_word(const KernelContext& ctx, DType dtype, F&& f) {
  switch (dtype_size(dtype)) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    case 8: return f(uint64_t{});
    default: ctx.unsupported("dtype " + std::string(dtype_name(dtype)) + " on the GPU");
  }
}

// Accumulators: double for floating types, 64-bit integers for integers (which wrap to T as the CPU's T does).
template <class T>
using AccumulatorOf = std::conditional_t<std::is_floating_point_v<T>, double,
                                         std::conditional_t<std::is_same_v<T, uint64_t>, uint64_t, int64_t>>;

// The reduction of v over the block (blockDim.x a multiple of 32, at most 1024), returned to every thread.
// `shared` holds 32 values. Deterministic: the same tree for the same launch.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T* shared) {
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    T r = shared[0];
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) r = op(r, shared[w]);
    shared[0] = r;
  }
  __syncthreads();
  return shared[0];
}

struct SumOp {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <class T> __device__ T operator()(T a, T b) const { return b > a ? b : a; }
};

// Threads per block for one block per row of n elements: enough to cover short rows without idle warps.
inline int row_threads(int64_t n) { return n <= 64 ? 32 : n <= 512 ? 128 : n <= 4096 ? 256 : 512; }

// y = Softmax (or LogSoftmax) of x's outer × inner lines of n elements spaced `inner` apart, on the compute stream
// (reduce.cu, float and double; loss.cu's log_prob is one too).
template <class T>
void launch_softmax(const KernelContext& ctx, const T* x, T* y, int64_t outer, int64_t n, int64_t inner,
                    bool log_output);

}  // namespace apart::cuda
