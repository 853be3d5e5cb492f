// The CUDA kernels behind cuda/conv.cpp's pools and batch norm (conv_kernels.cu): they follow the CPU kernels'
// rules exactly (cpu/conv.cpp, cpu/grad.cpp), which cuDNN's pooling (no dilation, no ceil_mode, its own tie rule,
// needs y for the backward) and batch norm (an unbiased running variance, ε ≥ 1e-5) do not. All float32/float64,
// int64 indexing, launched on `stream`; every launch is checked.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#ifdef __CUDACC__
#define APART_HOST_DEVICE __host__ __device__
#else
#define APART_HOST_DEVICE
#endif

namespace apart::cuda {

// A pooling window over 3 spatial dims (1-D and 2-D pools get leading dims of size 1, kernel 1, stride 1, pad 0).
struct PoolShape {
  int64_t planes = 0;  // N·C
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, kernel[3] = {1, 1, 1}, stride[3] = {1, 1, 1},
          dilation[3] = {1, 1, 1}, pad_begin[3] = {0, 0, 0}, pad_end[3] = {0, 0, 0};
  APART_HOST_DEVICE int64_t in_size() const { return in[0] * in[1] * in[2]; }
  APART_HOST_DEVICE int64_t out_size() const { return out[0] * out[1] * out[2]; }
};

// MaxPool / AveragePool: y[p, o] over the window's in-bounds positions (max ignores NaN as std::max does; average
// divides by the in-bounds count, or with include_pad by the positions before the end padding's edge).
template <class T>
void launch_pool_forward(const PoolShape& s, bool is_max, bool include_pad, const T* x, T* y, cudaStream_t stream);
// ai.apart.MaxPoolGrad: dY to the first maximum of each window (argmax: s.planes·s.out_size() int32 of scratch).
template <class T>
void launch_max_pool_grad(const PoolShape& s, const T* dy, const T* x, int32_t* argmax, T* dx, cudaStream_t stream);
// ai.apart.AveragePoolGrad: each window's dY/count to its in-bounds positions (count as the forward's, with the pad
// end as s.pad_end: the CPU gradient passes the begin pads there).
template <class T>
void launch_average_pool_grad(const PoolShape& s, bool include_pad, const T* dy, T* dx, cudaStream_t stream);
// GlobalAveragePool / GlobalMaxPool: one value per plane of `size` elements.
template <class T>
void launch_global_pool(int64_t planes, int64_t size, bool is_max, const T* x, T* y, cudaStream_t stream);

// BatchNormalization over x of shape [n, channels, inner...] (per-channel statistics over n·inner values).
struct BatchNormShape {
  int64_t n = 0, channels = 0, inner = 1;
  int blocks_per_channel = 1;  // partial sums per channel (batch_norm_blocks_per_channel)
};
int batch_norm_blocks_per_channel(int64_t channels, int64_t per_channel, int multiprocessors);
// Scratch doubles: partials (channels·blocks) and mean, var, mul, add (channels each).
int64_t batch_norm_scratch_bytes(const BatchNormShape& s);
// y = x·mul + add per channel, mul = scale/√(var+ε), add = bias − mean·mul. Training: mean/var are the batch's
// (population variance, two passes in double) and running_mean/var (when not null) = input·momentum +
// batch·(1−momentum); inference: mean/var are the inputs.
template <class T>
void launch_batch_norm(const BatchNormShape& s, bool training, double epsilon, double momentum, const T* x,
                       const T* scale, const T* bias, const T* input_mean, const T* input_var, T* y, T* running_mean,
                       T* running_var, void* scratch, cudaStream_t stream);

// Copies src [outer, src_dims] into dst [outer, dst_dims] with dst[i] = src[i − offset], zero outside src: a zero
// border around a convolution's input (offset = the extra begin pads) or its crop back (offset = −those pads).
struct BorderCopy {
  int64_t outer = 0;  // N·C
  int64_t src[3] = {1, 1, 1}, dst[3] = {1, 1, 1}, offset[3] = {0, 0, 0};
};
template <class T>
void launch_border_copy(const BorderCopy& c, const T* src, T* dst, cudaStream_t stream);

}  // namespace apart::cuda
