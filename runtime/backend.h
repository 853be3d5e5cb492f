// Where tensors live and kernels run. The CPU backend (host memory, the kernels of cpu/, BLAS) is the reference and
// always built; the CUDA backend (cuda/: one GPU per process, cuBLASLt, cuDNN, kernels of its own) is built with
// APART_CUDA (`cmake --preset gpu`). The executor asks its backend for one arena per executor, planned ahead by the
// static memory planner (no allocation per step), the kernel of each op, and copies; the trainer and the pipeline
// ask it for the few vector operations a step needs outside the graph (accumulate, scale, norms, optimizer step).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "plan/training.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace apart {

enum class BackendKind : uint8_t { kCpu, kCuda };
std::string_view backend_name(BackendKind kind);  // "cpu", "cuda"
BackendKind parse_backend(std::string_view text);  // InvalidArgument listing "cpu, cuda"

// One optimizer update of a list of params, as ParamOptimizer computes it (train/optimizer.h owns the state and
// the schedule; the backend owns the arithmetic, so that the GPU runs it as one multi-tensor kernel on device
// tensors). `states[i]` holds ParamOptimizer::slots(kind) tensors of params[i]'s shape, zero on the first step.
struct OptimizerUpdate {
  Optimizer kind = Optimizer::kAdamW;
  double lr = 0, weight_decay = 0, momentum = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  bool nesterov = false;
  int64_t step = 1;  // 1-based: Adam's bias corrections
};
// The float constants of one update, computed once on the host as torch does (bias corrections in double from the
// step count, 1 − β in double then rounded) and used by every backend's arithmetic, so that CPU and GPU agree.
struct OptimizerConstants {
  float lr = 0, weight_decay = 0, momentum = 0, eps = 0;
  float decay = 1;             // AdamW's 1 − lr·wd
  float step_size = 0;         // lr / (1 − β1ᵗ)
  float bias2_sqrt = 1;        // √(1 − β2ᵗ)
  float one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;
};
OptimizerConstants optimizer_constants(const OptimizerUpdate& update);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  // One line for logs: "cpu (OpenBLAS Zen, 2 threads)", "cuda:0 NVIDIA H200, 139.8 GiB, sm_90, CUDA 13.0, cuDNN 9.x".
  virtual std::string describe() const = 0;
  // Whether tensors of this backend are host memory a CPU kernel may read (the CPU backend; tests' host devices).
  virtual bool host_memory() const = 0;

  // `bytes` of this backend's memory, 256-byte aligned, uninitialised; freed when the last reference goes. One call
  // per executor arena or per long-lived tensor (params, gradients, optimizer state), never per step. Throws
  // Infeasible naming the bytes and the memory free when the device has too little.
  virtual std::shared_ptr<std::byte> allocate(int64_t bytes) = 0;
  // A zero-filled tensor in this backend's memory.
  Tensor empty(DType dtype, std::vector<int64_t> shape);

  // The kernel of `op` ("Conv"; other domains as "ai.apart.ConvGrad") on this backend, or nullptr: the executor then
  // runs the CPU kernel on host copies of the inputs (and says so once per op under `-v`).
  virtual KernelFn find_kernel(std::string_view op) const = 0;

  // Copies `bytes` between host memory and this backend's memory; ordered after the kernels already launched, and
  // complete when the call returns.
  virtual void copy_to_device(const std::byte* host, std::byte* device, int64_t bytes) = 0;
  virtual void copy_to_host(const std::byte* device, std::byte* host, int64_t bytes) = 0;
  virtual void copy_on_device(const std::byte* from, std::byte* to, int64_t bytes) = 0;
  // Waits until every kernel launched so far has finished (CUDA: the compute stream).
  virtual void synchronize() = 0;
  // What MatMul's and Gemm's float32 operands are rounded to before a product accumulated in float32: float32 itself
  // (fp32; tf32 on a GPU's tensor cores, computed as fp32 on the CPU), or bfloat16/float16 under --precision mixed
  // (the GPU converts them for cuBLASLt; the CPU rounds them to nearest even and multiplies the rounded values, so
  // that it computes what the GPU computes up to the order of the sums).
  virtual DType gemm_operands() const { return DType::kFloat32; }

  // --- The vector operations of a step (float32 tensors of this backend, equal element counts) ---
  virtual void fill_zero(Tensor& x) = 0;
  virtual void add_into(Tensor& accumulator, const Tensor& x) = 0;  // accumulator += x
  virtual void scale(Tensor& x, double factor) = 0;                 // x *= factor
  // Σ x² over all of `xs`, accumulated in double in order (the clip norm), and whether every element is finite.
  virtual double sum_of_squares(std::span<const Tensor* const> xs) = 0;
  virtual bool all_finite(std::span<const Tensor* const> xs) = 0;
  // params[i] -= update(grads[i], states[i]) for every i, as one launch where the backend can.
  virtual void optimizer_step(const OptimizerUpdate& update, std::span<Tensor* const> params,
                              std::span<Tensor* const> grads, std::span<Tensor* const> states) = 0;

  // Host ↔ backend tensors (same dtype and shape): `to_host` of a host-memory tensor shares it (no copy), as does
  // `to_device` on a host-memory backend.
  Tensor to_device(const Tensor& host);
  Tensor to_host(const Tensor& tensor);
  // Zeroes every byte of a tensor of this backend (any dtype). The executor calls it for each output it hands a
  // backend kernel (outputs start zero, as on the CPU): a device backend overrides it with an asynchronous memset
  // (CUDA: cudaMemsetAsync on the compute stream); the default goes through a host buffer.
  virtual void fill_zero_bytes(Tensor& t);
  // Copies `from` into `to` (same byte count), each a host tensor or this backend's: the step's few copies into
  // existing tensors (BatchNorm statistics into their params, a checkpoint's values into device params).
  void copy(const Tensor& from, Tensor& to);
};

// The CPU backend (process-wide; stateless).
Backend& cpu_backend();
// Whether this build has the CUDA backend (APART_CUDA), and how many GPUs the process sees (0 without CUDA or
// without a usable driver).
bool cuda_built();
int cuda_device_count();

struct BackendOptions {
  int device = 0;  // which GPU (under mpirun: LOCAL_RANK, else the node-local rank, modulo the GPUs seen)
  Precision precision = Precision::kFp32;  // GEMMs: fp32, tf32, or mixed (16-bit operands, fp32 accumulation)
  HalfFormat half = HalfFormat::kBf16;     // mixed's 16-bit format: bfloat16, or float16 (--precision fp16)
};
// The 16-bit operand type `options` asks for: kFloat32 unless precision is mixed, then kBFloat16 or kFloat16.
DType gemm_operand_dtype(const BackendOptions& options);
// A backend of `kind`: kCuda, one GPU; kCpu, the CPU backend whose GEMMs round their operands as `options` say (the
// reduced-precision emulation; cpu_backend() is the float32 one). kCuda is Unsupported when apart was built without
// CUDA ("rebuild with `cmake --preset gpu`") or no GPU is visible (naming CUDA's error string).
std::unique_ptr<Backend> make_backend(BackendKind kind, const BackendOptions& options = {});

}  // namespace apart
