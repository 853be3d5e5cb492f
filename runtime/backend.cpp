// The backend registry and what every backend shares (host copies, zeroing, the optimizer's constants); the CPU
// backend is runtime/cpu/cpu_backend.cpp, the CUDA backend runtime/cuda/.
#include "runtime/backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "graph/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cuda/cuda_entry.h"

namespace apart {

std::string_view backend_name(BackendKind kind) { return kind == BackendKind::kCuda ? "cuda" : "cpu"; }

BackendKind parse_backend(std::string_view text) {
  if (text == "cpu") return BackendKind::kCpu;
  if (text == "cuda" || text == "gpu") return BackendKind::kCuda;
  throw InvalidArgument("--backend: unknown backend '" + std::string(text) + "' (use cpu or cuda)");
}

Tensor Backend::empty(DType dtype, std::vector<int64_t> shape) {
  if (host_memory()) return Tensor(dtype, std::move(shape));
  Tensor probe = Tensor::over(dtype, shape, nullptr, false);
  auto data = allocate(probe.bytes());
  Tensor t = Tensor::over(dtype, std::move(shape), std::move(data), false);
  fill_zero_bytes(t);
  return t;
}

void Backend::fill_zero_bytes(Tensor& t) {
  if (t.bytes() == 0) return;
  if (host_memory()) {
    std::memset(t.raw(), 0, static_cast<size_t>(t.bytes()));
    return;
  }
  // Through a host buffer: rare (tensors made once), and every backend has the copy.
  std::vector<std::byte> zeros(static_cast<size_t>(t.bytes()));
  copy_to_device(zeros.data(), t.raw(), t.bytes());
}

void Backend::copy(const Tensor& from, Tensor& to) {
  APART_CHECK(from.bytes() == to.bytes(), "Backend::copy between tensors of different sizes");
  if (from.bytes() == 0 || from.raw() == to.raw()) return;
  if (from.on_host() && to.on_host()) std::memcpy(to.raw(), from.raw(), static_cast<size_t>(from.bytes()));
  else if (from.on_host()) copy_to_device(from.raw(), to.raw(), from.bytes());
  else if (to.on_host()) copy_to_host(from.raw(), to.raw(), from.bytes());
  else copy_on_device(from.raw(), to.raw(), from.bytes());
}

Tensor Backend::to_device(const Tensor& host) {
  APART_CHECK(host.on_host(), "to_device of a tensor that is not in host memory");
  if (host_memory()) return host;
  Tensor t = Tensor::over(host.dtype(), host.shape(), allocate(host.bytes()), false);
  if (host.bytes() > 0) copy_to_device(host.raw(), t.raw(), host.bytes());
  return t;
}

Tensor Backend::to_host(const Tensor& tensor) {
  if (tensor.on_host()) return tensor;
  Tensor t(tensor.dtype(), tensor.shape());
  if (t.bytes() > 0) copy_to_host(tensor.raw(), t.raw(), t.bytes());
  return t;
}

OptimizerConstants optimizer_constants(const OptimizerUpdate& u) {
  OptimizerConstants c;
  c.lr = static_cast<float>(u.lr);
  c.weight_decay = static_cast<float>(u.weight_decay);
  c.momentum = static_cast<float>(u.momentum);
  c.eps = static_cast<float>(u.eps);
  c.decay = 1.0f - c.lr * c.weight_decay;
  // Bias corrections as torch computes them (in double, from the step count).
  const double t = static_cast<double>(u.step);
  const double bias1 = 1.0 - std::pow(u.beta1, t);
  const double bias2 = 1.0 - std::pow(u.beta2, t);
  c.step_size = static_cast<float>(u.lr / bias1);
  c.bias2_sqrt = static_cast<float>(std::sqrt(bias2));
  // 1 − β in double, then rounded (as torch passes them to its kernels): 1.0f − 0.999f is 1.3e-5 off.
  c.one_minus_beta1 = static_cast<float>(1.0 - u.beta1);
  c.beta2 = static_cast<float>(u.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - u.beta2);
  return c;
}

#if APART_HAVE_CUDA
bool cuda_built() { return true; }
int cuda_device_count() { return cuda::visible_device_count(); }
#else
bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
// The NCCL communicator is runtime/cuda/nccl_communicator.cpp's, built with APART_CUDA only.
std::unique_ptr<Communicator> cuda::make_nccl_communicator(Communicator&, Backend&, const CommOptions&) {
  throw Unsupported("the NCCL communicator: this apart was built without the CUDA backend; rebuild with "
                    "`cmake --preset gpu` (needs the CUDA toolkit, cuDNN and NCCL under /usr/local/cuda)");
}
cuda::GemmMeasurement cuda::measure_best_bf16_gemm(Backend&, int64_t, int64_t, int64_t, int, int) {
  throw Unsupported("measuring cuBLASLt's GEMM: this apart was built without the CUDA backend");
}
#endif

DType gemm_operand_dtype(const BackendOptions& options) {
  if (options.precision != Precision::kMixed) return DType::kFloat32;
  return options.half == HalfFormat::kFp16 ? DType::kFloat16 : DType::kBFloat16;
}

std::unique_ptr<Backend> make_backend(BackendKind kind, const BackendOptions& options) {
  if (kind == BackendKind::kCpu) return make_cpu_backend(gemm_operand_dtype(options));
#if APART_HAVE_CUDA
  return cuda::make_cuda_backend(options);
#else
  (void)options;
  throw Unsupported("--backend cuda: this apart was built without the CUDA backend; rebuild with `cmake --preset gpu` "
                    "(needs the CUDA toolkit, cuDNN and NCCL under /usr/local/cuda)");
#endif
}

}  // namespace apart
