// Every CUDA, cuBLAS(Lt), cuDNN and NCCL call goes through one of these: a failure throws CudaError naming the
// statement, file, line and the library's own error string ("cudaMalloc(&p, bytes) at runtime/cuda/pool.cpp:42:
// out of memory (cudaErrorMemoryAllocation)"). Header-only so .cu and .cpp files share it; includes no CUDA header
// itself: each macro's status function is declared in the library header the caller already includes (cuBLAS:
// cublasLt.h's, so that only libcublasLt is linked; the status codes are cuBLAS's).
#pragma once

#include <string>

#include "graph/error.h"

namespace apart::cuda {

// A failed CUDA-library call. kSystemError (exit code 6): the device, driver or a peer failed, not the input.
class CudaError : public Error {
 public:
  explicit CudaError(const std::string& m) : Error(ErrorKind::kSystemError, m) {}
};

[[noreturn]] void throw_cuda_error(const char* library, const char* statement, const char* file, int line,
                                   const std::string& status);

}  // namespace apart::cuda

#define APART_CUDA_CHECK(stmt)                                                                                  \
  do {                                                                                                          \
    const cudaError_t apart_status_ = (stmt);                                                                   \
    if (apart_status_ != cudaSuccess)                                                                           \
      ::apart::cuda::throw_cuda_error("CUDA", #stmt, __FILE__, __LINE__,                                         \
                                      std::string(cudaGetErrorString(apart_status_)) + " (" +                   \
                                          cudaGetErrorName(apart_status_) + ")");                               \
  } while (0)

#define APART_CUBLAS_CHECK(stmt)                                                                                \
  do {                                                                                                          \
    const cublasStatus_t apart_status_ = (stmt);                                                                \
    if (apart_status_ != CUBLAS_STATUS_SUCCESS)                                                                 \
      ::apart::cuda::throw_cuda_error("cuBLAS", #stmt, __FILE__, __LINE__,                                       \
                                      std::string(cublasLtGetStatusString(apart_status_)) + " (" +              \
                                          cublasLtGetStatusName(apart_status_) + ")");                          \
  } while (0)

#define APART_CUDNN_CHECK(stmt)                                                                                 \
  do {                                                                                                          \
    const cudnnStatus_t apart_status_ = (stmt);                                                                 \
    if (apart_status_ != CUDNN_STATUS_SUCCESS)                                                                  \
      ::apart::cuda::throw_cuda_error("cuDNN", #stmt, __FILE__, __LINE__, cudnnGetErrorString(apart_status_));  \
  } while (0)

#define APART_NCCL_CHECK(stmt)                                                                                  \
  do {                                                                                                          \
    const ncclResult_t apart_status_ = (stmt);                                                                  \
    if (apart_status_ != ncclSuccess && apart_status_ != ncclInProgress)                                        \
      ::apart::cuda::throw_cuda_error("NCCL", #stmt, __FILE__, __LINE__, ncclGetErrorString(apart_status_));    \
  } while (0)
