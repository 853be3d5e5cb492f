// The CUDA backend's entry points for code that includes no CUDA header (runtime/backend.cpp): how many GPUs this
// process sees, the backend on one of them, and the NCCL communicator over it.
#pragma once

#include <memory>

#include "runtime/backend.h"
#include "runtime/communicator.h"

namespace apart::cuda {
int visible_device_count();  // 0 when the driver or the device is missing (never throws)
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);  // Unsupported without a GPU
// A Communicator over NCCL for buffers in `cuda_backend`'s device memory (runtime/cuda/nccl_communicator.h says
// what differs from MPI). Collective over `bootstrap` (MPI or in-process), which carries rank 0's unique id and
// must outlive the result, as must the backend. InvalidArgument unless `cuda_backend` is the CUDA backend; without
// APART_CUDA (communicator.cpp's stub) Unsupported.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, Backend& cuda_backend,
                                                     const CommOptions& options);

// cuBLASLt's best plain GEMM C = A·B (bf16 operands and output, fp32 accumulation, A transposed: the TN layout
// cuBLAS is fastest in) of m×k by k×n on random data: every algorithm of the heuristic's top `candidates` is
// timed with CUDA events over `repeats` runs after two warm-ups, on the backend's compute stream. The yardstick
// of the GPU benchmark (bench/gpu_layers_bench.cpp). Unsupported without APART_CUDA.
struct GemmMeasurement {
  double seconds = 0;  // mean of one GEMM, best algorithm
  double flops_per_s = 0;  // 2·m·n·k / seconds
  int algorithms_tried = 0;
};
GemmMeasurement measure_best_bf16_gemm(Backend& cuda_backend, int64_t m, int64_t n, int64_t k, int repeats = 20,
                                       int candidates = 8);
}  // namespace apart::cuda
