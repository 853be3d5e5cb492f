// The CUDA backend: one GPU per process, a compute stream and a communication stream, cuBLASLt and cuDNN handles,
// and a caching pool in front of cudaMalloc (blocks are reused by size class, so after the first step no call
// reaches cudaMalloc). Built only with APART_CUDA; nothing outside runtime/ includes it.
#pragma once

#include <cuda_runtime.h>
#include <cublasLt.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "plan/training.h"
#include "runtime/backend.h"
#include "runtime/device_pool.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_entry.h"

namespace apart::cuda {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options);
  ~CudaBackend() override;

  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string describe() const override;
  bool host_memory() const override { return false; }
  std::shared_ptr<std::byte> allocate(int64_t bytes) override;
  KernelFn find_kernel(std::string_view op) const override;
  void copy_to_device(const std::byte* host, std::byte* device, int64_t bytes) override;
  void copy_to_host(const std::byte* device, std::byte* host, int64_t bytes) override;
  void copy_on_device(const std::byte* from, std::byte* to, int64_t bytes) override;
  void synchronize() override;
  void fill_zero(Tensor& x) override;
  void fill_zero_bytes(Tensor& t) override;  // cudaMemsetAsync on the compute stream (any dtype)
  void add_into(Tensor& accumulator, const Tensor& x) override;
  void scale(Tensor& x, double factor) override;
  double sum_of_squares(std::span<const Tensor* const> xs) override;
  bool all_finite(std::span<const Tensor* const> xs) override;
  void optimizer_step(const OptimizerUpdate& update, std::span<Tensor* const> params, std::span<Tensor* const> grads,
                      std::span<Tensor* const> states) override;

  int device() const { return options_.device; }
  Precision precision() const { return options_.precision; }
  DType gemm_operands() const override { return gemm_operand_dtype(options_); }  // bf16 or fp16 under mixed
  cudaStream_t compute_stream() const { return compute_; }
  cudaStream_t comm_stream() const { return comm_; }
  cublasLtHandle_t cublaslt() const { return cublaslt_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  // The GEMM workspace (kGemmWorkspaceBytes, allocated once).
  void* gemm_workspace() const { return workspace_.get(); }
  static constexpr int64_t kGemmWorkspaceBytes = 64ll << 20;
  // A scratch block of at least `bytes` for one kernel's temporaries (reused: valid until the next call).
  void* scratch(int64_t bytes);
  const cudaDeviceProp& properties() const { return properties_; }
  DevicePool& pool() { return *pool_; }

 private:
  BackendOptions options_;
  cudaDeviceProp properties_{};
  cudaStream_t compute_ = nullptr;
  cudaStream_t comm_ = nullptr;
  cublasLtHandle_t cublaslt_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  std::unique_ptr<DevicePool> pool_;
  std::shared_ptr<std::byte> workspace_;
  std::shared_ptr<std::byte> scratch_;
  int64_t scratch_bytes_ = 0;
};

// The backend a CUDA kernel runs on (ctx.backend() is always the CudaBackend for kernels of the CUDA registry).
CudaBackend& backend_of(const KernelContext& ctx);

// The CUDA kernel registry, filled by the families' register_*() (families.h) on first lookup.
KernelFn find_cuda_kernel(std::string_view op);
void register_cuda_kernel(std::string_view op, KernelFn fn);

}  // namespace apart::cuda
