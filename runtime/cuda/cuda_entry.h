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
}  // namespace apart::cuda
