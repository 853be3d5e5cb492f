// APART_HOST_DEVICE: marks a plain function callable from CUDA kernels too (random.h's draws, cuda/index_map.h),
// so device code reuses it instead of a copy; empty for the host compiler.
#pragma once

#if defined(__CUDACC__)
#define APART_HOST_DEVICE __host__ __device__
#else
#define APART_HOST_DEVICE
#endif
