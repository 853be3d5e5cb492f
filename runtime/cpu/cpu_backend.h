// The CPU backend (runtime/backend.h's cpu_backend() is its float32 instance): host memory, the kernels of cpu/ and
// BLAS. Reached through backend.h (make_backend, cpu_backend); this header is for backend.cpp.
#pragma once

#include <memory>

#include "runtime/backend.h"

namespace apart {

// A CPU backend whose GEMMs round their float32 operands to `gemm_operands` (kFloat32: none; kBFloat16/kFloat16:
// the reduced-precision emulation of --precision mixed).
std::unique_ptr<Backend> make_cpu_backend(DType gemm_operands);

}  // namespace apart
