// The pools', batch norm's and the convolution border's CUDA kernels (conv_kernels.h): one thread per output element
// with grid-stride loops (int64 indices, 1-D grids), sums in double as the CPU kernels keep them.
#include "runtime/cuda/conv_kernels.h"

#include <algorithm>
#include <cmath>

#include "runtime/cuda/cuda_check.h"

namespace apart::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 20;  // grid-stride loops cover the rest

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

__device__ inline int64_t global_thread() { return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; }
__device__ inline int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// The sum of `v` over the block (kThreads threads); valid in thread 0.
__device__ double block_sum(double v) {
  __shared__ double warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  __syncthreads();  // warp_sums may be reused by the caller's next call
  return total;
}
// std::max(acc, v) of the CPU kernels: keeps acc unless acc < v (so a NaN v is skipped).
__device__ inline double keep_max(double acc, double v) { return acc < v ? v : acc; }

template <class T>
__global__ void pool_forward_kernel(PoolShape s, bool is_max, bool include_pad, const T* x, T* y) {
  const int64_t out_size = s.out_size(), in_size = s.in_size(), total = s.planes * out_size;
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const int64_t p = idx / out_size;
    int64_t r = idx % out_size;
    const int64_t o2 = r % s.out[2];
    r /= s.out[2];
    const int64_t o1 = r % s.out[1], o0 = r / s.out[1];
    const T* plane = x + p * in_size;
    double acc = is_max ? -INFINITY : 0.0;
    int64_t count = 0, padded = 0;
    for (int64_t k0 = 0; k0 < s.kernel[0]; ++k0) {
      const int64_t i0 = o0 * s.stride[0] - s.pad_begin[0] + k0 * s.dilation[0];
      const bool in0 = i0 >= 0 && i0 < s.in[0], pad0 = i0 < s.in[0] + s.pad_end[0];
      for (int64_t k1 = 0; k1 < s.kernel[1]; ++k1) {
        const int64_t i1 = o1 * s.stride[1] - s.pad_begin[1] + k1 * s.dilation[1];
        const bool in1 = i1 >= 0 && i1 < s.in[1], pad1 = i1 < s.in[1] + s.pad_end[1];
        for (int64_t k2 = 0; k2 < s.kernel[2]; ++k2) {
          const int64_t i2 = o2 * s.stride[2] - s.pad_begin[2] + k2 * s.dilation[2];
          const bool in2 = i2 >= 0 && i2 < s.in[2], pad2 = i2 < s.in[2] + s.pad_end[2];
          padded += pad0 && pad1 && pad2;
          if (!(in0 && in1 && in2)) continue;
          const double v = static_cast<double>(plane[(i0 * s.in[1] + i1) * s.in[2] + i2]);
          ++count;
          acc = is_max ? keep_max(acc, v) : acc + v;
        }
      }
    }
    if (!is_max) {
      const int64_t divisor = include_pad ? padded : count;
      acc = divisor > 0 ? acc / static_cast<double>(divisor) : 0.0;
    }
    y[idx] = static_cast<T>(acc);
  }
}

// Per output: the in-plane offset of the window's first maximum (compared in T as the CPU does), or -1.
template <class T>
__global__ void pool_argmax_kernel(PoolShape s, const T* x, int32_t* argmax) {
  const int64_t out_size = s.out_size(), in_size = s.in_size(), total = s.planes * out_size;
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const int64_t p = idx / out_size;
    int64_t r = idx % out_size;
    const int64_t o2 = r % s.out[2];
    r /= s.out[2];
    const int64_t o1 = r % s.out[1], o0 = r / s.out[1];
    const T* plane = x + p * in_size;
    int64_t best = -1;
    T best_v = -INFINITY;
    for (int64_t k0 = 0; k0 < s.kernel[0]; ++k0) {
      const int64_t i0 = o0 * s.stride[0] - s.pad_begin[0] + k0 * s.dilation[0];
      if (i0 < 0 || i0 >= s.in[0]) continue;
      for (int64_t k1 = 0; k1 < s.kernel[1]; ++k1) {
        const int64_t i1 = o1 * s.stride[1] - s.pad_begin[1] + k1 * s.dilation[1];
        if (i1 < 0 || i1 >= s.in[1]) continue;
        for (int64_t k2 = 0; k2 < s.kernel[2]; ++k2) {
          const int64_t i2 = o2 * s.stride[2] - s.pad_begin[2] + k2 * s.dilation[2];
          if (i2 < 0 || i2 >= s.in[2]) continue;
          const int64_t at = (i0 * s.in[1] + i1) * s.in[2] + i2;
          if (best < 0 || plane[at] > best_v) best = at, best_v = plane[at];
        }
      }
    }
    argmax[idx] = static_cast<int32_t>(best);
  }
}

// The outputs whose window covers input position i along one dim: o·stride − pad + k·dilation = i.
struct Cover {
  int64_t o;
  bool valid;
};
__device__ inline Cover cover(int64_t i, int64_t k, const PoolShape& s, int d) {
  const int64_t t = i + s.pad_begin[d] - k * s.dilation[d];
  if (t < 0 || t % s.stride[d] != 0) return {0, false};
  const int64_t o = t / s.stride[d];
  return {o, o < s.out[d]};
}
// How many of a window's positions along dim d are inside the input, and before the end padding's edge.
__device__ inline void window_counts(int64_t o, const PoolShape& s, int d, int64_t& inside, int64_t& padded) {
  inside = padded = 0;
  for (int64_t k = 0; k < s.kernel[d]; ++k) {
    const int64_t i = o * s.stride[d] - s.pad_begin[d] + k * s.dilation[d];
    inside += i >= 0 && i < s.in[d];
    padded += i < s.in[d] + s.pad_end[d];
  }
}

// Gathers, for every input position, the dY of the windows that cover it (max: those whose argmax it is; average:
// each window's dY/count), so no two threads write one element.
template <class T, bool kMax>
__global__ void pool_grad_kernel(PoolShape s, bool include_pad, const T* dy, const int32_t* argmax, T* dx) {
  const int64_t out_size = s.out_size(), in_size = s.in_size(), total = s.planes * in_size;
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const int64_t p = idx / in_size, at = idx % in_size;
    const int64_t i2 = at % s.in[2], i1 = (at / s.in[2]) % s.in[1], i0 = at / (s.in[2] * s.in[1]);
    double acc = 0;
    for (int64_t k0 = 0; k0 < s.kernel[0]; ++k0) {
      const Cover c0 = cover(i0, k0, s, 0);
      if (!c0.valid) continue;
      for (int64_t k1 = 0; k1 < s.kernel[1]; ++k1) {
        const Cover c1 = cover(i1, k1, s, 1);
        if (!c1.valid) continue;
        for (int64_t k2 = 0; k2 < s.kernel[2]; ++k2) {
          const Cover c2 = cover(i2, k2, s, 2);
          if (!c2.valid) continue;
          const int64_t o = p * out_size + (c0.o * s.out[1] + c1.o) * s.out[2] + c2.o;
          if constexpr (kMax) {
            if (argmax[o] == at) acc += static_cast<double>(dy[o]);
          } else {
            int64_t inside[3], padded[3];
            window_counts(c0.o, s, 0, inside[0], padded[0]);
            window_counts(c1.o, s, 1, inside[1], padded[1]);
            window_counts(c2.o, s, 2, inside[2], padded[2]);
            const int64_t count = include_pad ? padded[0] * padded[1] * padded[2] : inside[0] * inside[1] * inside[2];
            if (count > 0) acc += static_cast<double>(dy[o] / static_cast<T>(count));  // the CPU's share, in T
          }
        }
      }
    }
    dx[idx] = static_cast<T>(acc);
  }
}

template <class T>
__global__ void global_pool_kernel(int64_t size, bool is_max, const T* x, T* y) {
  const T* plane = x + static_cast<int64_t>(blockIdx.x) * size;
  if (is_max) {
    __shared__ double maxima[kThreads];
    double acc = -INFINITY;
    for (int64_t i = threadIdx.x; i < size; i += blockDim.x) acc = keep_max(acc, static_cast<double>(plane[i]));
    maxima[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      double m = -INFINITY;
      for (int t = 0; t < kThreads; ++t) m = keep_max(m, maxima[t]);
      y[blockIdx.x] = static_cast<T>(m);
    }
    return;
  }
  double acc = 0;
  for (int64_t i = threadIdx.x; i < size; i += blockDim.x) acc += static_cast<double>(plane[i]);
  const double total = block_sum(acc);
  if (threadIdx.x == 0) y[blockIdx.x] = static_cast<T>(total / static_cast<double>(size));
}

// Batch norm, pass 1 and 2: per (channel, block) the sum of x (center == nullptr) or of (x − center[c])².
template <class T>
__global__ void channel_partial_kernel(BatchNormShape s, const T* x, const double* center, double* partials) {
  const int64_t blocks = s.blocks_per_channel;
  const int64_t c = blockIdx.x / blocks, part = blockIdx.x % blocks, count = s.n * s.inner;
  const double mu = center ? center[c] : 0.0;
  double acc = 0;
  for (int64_t e = part * blockDim.x + threadIdx.x; e < count; e += blocks * blockDim.x) {
    const int64_t b = e / s.inner, i = e % s.inner;
    const double v = static_cast<double>(x[(b * s.channels + c) * s.inner + i]);
    acc += center ? (v - mu) * (v - mu) : v;
  }
  const double total = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}
// Per channel: partials summed in order, divided by the count.
__global__ void channel_mean_kernel(BatchNormShape s, const double* partials, double* out) {
  const int64_t c = global_thread();
  if (c >= s.channels) return;
  double sum = 0;
  for (int b = 0; b < s.blocks_per_channel; ++b) sum += partials[c * s.blocks_per_channel + b];
  out[c] = sum / static_cast<double>(s.n * s.inner);
}
// Per channel: the statistics in use, the running outputs, and y's mul/add.
template <class T>
__global__ void batch_norm_finish_kernel(BatchNormShape s, bool training, double epsilon, double momentum,
                                         const T* scale, const T* bias, const T* input_mean, const T* input_var,
                                         T* running_mean, T* running_var, double* mean, double* var, double* mul,
                                         double* add) {
  const int64_t c = global_thread();
  if (c >= s.channels) return;
  if (training) {
    if (running_mean)
      running_mean[c] = static_cast<T>(static_cast<double>(input_mean[c]) * momentum + mean[c] * (1 - momentum));
    if (running_var)
      running_var[c] = static_cast<T>(static_cast<double>(input_var[c]) * momentum + var[c] * (1 - momentum));
  } else {
    mean[c] = static_cast<double>(input_mean[c]);
    var[c] = static_cast<double>(input_var[c]);
  }
  mul[c] = static_cast<double>(scale[c]) / sqrt(var[c] + epsilon);
  add[c] = static_cast<double>(bias[c]) - mean[c] * mul[c];
}
template <class T>
__global__ void batch_norm_apply_kernel(BatchNormShape s, const T* x, const double* mul, const double* add, T* y) {
  const int64_t total = s.n * s.channels * s.inner;
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const int64_t c = (idx / s.inner) % s.channels;
    y[idx] = static_cast<T>(static_cast<double>(x[idx]) * mul[c] + add[c]);
  }
}

template <class T>
__global__ void border_copy_kernel(BorderCopy b, const T* src, T* dst) {
  const int64_t dst_size = b.dst[0] * b.dst[1] * b.dst[2], src_size = b.src[0] * b.src[1] * b.src[2];
  const int64_t total = b.outer * dst_size;
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const int64_t o = idx / dst_size, at = idx % dst_size;
    const int64_t d2 = at % b.dst[2], d1 = (at / b.dst[2]) % b.dst[1], d0 = at / (b.dst[2] * b.dst[1]);
    const int64_t s0 = d0 - b.offset[0], s1 = d1 - b.offset[1], s2 = d2 - b.offset[2];
    const bool inside = s0 >= 0 && s0 < b.src[0] && s1 >= 0 && s1 < b.src[1] && s2 >= 0 && s2 < b.src[2];
    dst[idx] = inside ? src[o * src_size + (s0 * b.src[1] + s1) * b.src[2] + s2] : T{0};
  }
}

}  // namespace

template <class T>
void launch_pool_forward(const PoolShape& s, bool is_max, bool include_pad, const T* x, T* y, cudaStream_t stream) {
  const int64_t total = s.planes * s.out_size();
  if (total == 0) return;
  pool_forward_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(s, is_max, include_pad, x, y);
  APART_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_max_pool_grad(const PoolShape& s, const T* dy, const T* x, int32_t* argmax, T* dx, cudaStream_t stream) {
  const int64_t outputs = s.planes * s.out_size(), inputs = s.planes * s.in_size();
  if (inputs == 0) return;
  if (outputs > 0) {
    pool_argmax_kernel<T><<<blocks_for(outputs), kThreads, 0, stream>>>(s, x, argmax);
    APART_CUDA_CHECK(cudaGetLastError());
  }
  pool_grad_kernel<T, true><<<blocks_for(inputs), kThreads, 0, stream>>>(s, false, dy, argmax, dx);
  APART_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_average_pool_grad(const PoolShape& s, bool include_pad, const T* dy, T* dx, cudaStream_t stream) {
  const int64_t inputs = s.planes * s.in_size();
  if (inputs == 0) return;
  pool_grad_kernel<T, false><<<blocks_for(inputs), kThreads, 0, stream>>>(s, include_pad, dy, nullptr, dx);
  APART_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_global_pool(int64_t planes, int64_t size, bool is_max, const T* x, T* y, cudaStream_t stream) {
  if (planes == 0) return;
  if (planes > 0x7fffffff) throw CudaError("global pool over " + std::to_string(planes) + " planes (at most 2^31-1)");
  global_pool_kernel<T><<<static_cast<unsigned>(planes), kThreads, 0, stream>>>(size, is_max, x, y);
  APART_CUDA_CHECK(cudaGetLastError());
}

int batch_norm_blocks_per_channel(int64_t channels, int64_t per_channel, int multiprocessors) {
  // Enough blocks to fill the GPU twice over, none with fewer than ~16 values per thread, at most 1024.
  const int64_t wanted = (2 * std::max(multiprocessors, 1) + channels - 1) / std::max<int64_t>(channels, 1);
  const int64_t useful = std::max<int64_t>(1, per_channel / (16 * kThreads));
  return static_cast<int>(std::clamp<int64_t>(std::min(wanted, useful), 1, 1024));
}

int64_t batch_norm_scratch_bytes(const BatchNormShape& s) {
  return static_cast<int64_t>(sizeof(double)) * s.channels * (s.blocks_per_channel + 4);
}

template <class T>
void launch_batch_norm(const BatchNormShape& s, bool training, double epsilon, double momentum, const T* x,
                       const T* scale, const T* bias, const T* input_mean, const T* input_var, T* y, T* running_mean,
                       T* running_var, void* scratch, cudaStream_t stream) {
  if (s.channels == 0) return;
  const int64_t partial_blocks = s.channels * s.blocks_per_channel;
  if (partial_blocks > 0x7fffffff) throw CudaError("batch norm over " + std::to_string(s.channels) + " channels");
  double* partials = static_cast<double*>(scratch);
  double* mean = partials + partial_blocks;
  double *var = mean + s.channels, *mul = var + s.channels, *add = mul + s.channels;
  const unsigned channel_blocks = blocks_for(s.channels);
  if (training) {
    channel_partial_kernel<T><<<static_cast<unsigned>(partial_blocks), kThreads, 0, stream>>>(s, x, nullptr, partials);
    APART_CUDA_CHECK(cudaGetLastError());
    channel_mean_kernel<<<channel_blocks, kThreads, 0, stream>>>(s, partials, mean);
    APART_CUDA_CHECK(cudaGetLastError());
    channel_partial_kernel<T><<<static_cast<unsigned>(partial_blocks), kThreads, 0, stream>>>(s, x, mean, partials);
    APART_CUDA_CHECK(cudaGetLastError());
    channel_mean_kernel<<<channel_blocks, kThreads, 0, stream>>>(s, partials, var);
    APART_CUDA_CHECK(cudaGetLastError());
  }
  batch_norm_finish_kernel<T><<<channel_blocks, kThreads, 0, stream>>>(s, training, epsilon, momentum, scale, bias,
                                                                       input_mean, input_var, running_mean,
                                                                       running_var, mean, var, mul, add);
  APART_CUDA_CHECK(cudaGetLastError());
  const int64_t total = s.n * s.channels * s.inner;
  if (total == 0) return;
  batch_norm_apply_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(s, x, mul, add, y);
  APART_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_border_copy(const BorderCopy& c, const T* src, T* dst, cudaStream_t stream) {
  const int64_t total = c.outer * c.dst[0] * c.dst[1] * c.dst[2];
  if (total == 0) return;
  border_copy_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(c, src, dst);
  APART_CUDA_CHECK(cudaGetLastError());
}

#define APART_CONV_KERNELS_FOR(T)                                                                                 \
  template void launch_pool_forward<T>(const PoolShape&, bool, bool, const T*, T*, cudaStream_t);                 \
  template void launch_max_pool_grad<T>(const PoolShape&, const T*, const T*, int32_t*, T*, cudaStream_t);        \
  template void launch_average_pool_grad<T>(const PoolShape&, bool, const T*, T*, cudaStream_t);                  \
  template void launch_global_pool<T>(int64_t, int64_t, bool, const T*, T*, cudaStream_t);                        \
  template void launch_batch_norm<T>(const BatchNormShape&, bool, double, double, const T*, const T*, const T*,   \
                                     const T*, const T*, T*, T*, T*, void*, cudaStream_t);                        \
  template void launch_border_copy<T>(const BorderCopy&, const T*, T*, cudaStream_t);
APART_CONV_KERNELS_FOR(float)
APART_CONV_KERNELS_FOR(double)
#undef APART_CONV_KERNELS_FOR

}  // namespace apart::cuda
