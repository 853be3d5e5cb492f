// The CUDA backend's entry points for code that includes no CUDA header (runtime/backend.cpp): how many GPUs this
// process sees, and the backend on one of them.
#pragma once

#include <memory>

#include "runtime/backend.h"

namespace apart::cuda {
int visible_device_count();  // 0 when the driver or the device is missing (never throws)
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);  // Unsupported without a GPU
}  // namespace apart::cuda
