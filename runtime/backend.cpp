// The backend registry and the CPU backend: host memory, the kernels of cpu/, the step's arithmetic in float32 as
// torch.optim's single-tensor loops compute it.
#include "runtime/backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "graph/error.h"
#include "runtime/blas_info.h"
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

namespace {

std::span<float> floats(Tensor& t) {
  APART_CHECK(t.dtype() == DType::kFloat32 && t.on_host(), "cpu backend: float32 host tensors only");
  return t.span<float>();
}
std::span<const float> floats(const Tensor& t) {
  APART_CHECK(t.dtype() == DType::kFloat32 && t.on_host(), "cpu backend: float32 host tensors only");
  return t.span<const float>();
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(DType gemm_operands = DType::kFloat32) : gemm_operands_(gemm_operands) {}
  BackendKind kind() const override { return BackendKind::kCpu; }
  std::string describe() const override {
    const std::string core = blas_core_name();
    return "cpu" + (core.empty() ? std::string() : " (OpenBLAS " + core + ")") +
           (gemm_operands_ == DType::kFloat32 ? "" : ", GEMM operands rounded to " + std::string(dtype_name(gemm_operands_)));
  }
  DType gemm_operands() const override { return gemm_operands_; }
  bool host_memory() const override { return true; }

  std::shared_ptr<std::byte> allocate(int64_t bytes) override {
    constexpr size_t kAlign = 256;
    APART_CHECK(bytes >= 0, "allocate of a negative size");
    auto* block = static_cast<std::byte*>(std::aligned_alloc(kAlign, (static_cast<size_t>(bytes) + kAlign - 1) / kAlign * kAlign + kAlign));
    if (!block) throw Infeasible("cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    track_tensor_bytes(bytes);
    return std::shared_ptr<std::byte>(block, [bytes](std::byte* p) {
      track_tensor_bytes(-bytes);
      std::free(p);
    });
  }
  KernelFn find_kernel(std::string_view op) const override { return apart::find_kernel(op); }

  void copy_to_device(const std::byte* host, std::byte* device, int64_t bytes) override { copy(host, device, bytes); }
  void copy_to_host(const std::byte* device, std::byte* host, int64_t bytes) override { copy(device, host, bytes); }
  void copy_on_device(const std::byte* from, std::byte* to, int64_t bytes) override { copy(from, to, bytes); }
  void synchronize() override {}

  void fill_zero(Tensor& x) override { std::fill(floats(x).begin(), floats(x).end(), 0.0f); }
  void add_into(Tensor& accumulator, const Tensor& x) override {
    auto a = floats(accumulator);
    auto b = floats(x);
    APART_CHECK(a.size() == b.size(), "add_into: element counts differ");
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  }
  void scale(Tensor& x, double factor) override {
    const float f = static_cast<float>(factor);
    for (float& v : floats(x)) v *= f;
  }
  double sum_of_squares(std::span<const Tensor* const> xs) override {
    double sum = 0;
    for (const Tensor* x : xs)
      for (float v : floats(*x)) sum += static_cast<double>(v) * v;
    return sum;
  }
  bool all_finite(std::span<const Tensor* const> xs) override {
    for (const Tensor* x : xs)
      for (float v : floats(*x))
        if (!std::isfinite(v)) return false;
    return true;
  }
  void optimizer_step(const OptimizerUpdate& u, std::span<Tensor* const> params, std::span<Tensor* const> grads,
                      std::span<Tensor* const> states) override;

 private:
  static void copy(const std::byte* from, std::byte* to, int64_t bytes) {
    if (bytes > 0 && from != to) std::memcpy(to, from, static_cast<size_t>(bytes));
  }
  DType gemm_operands_;
};

void CpuBackend::optimizer_step(const OptimizerUpdate& u, std::span<Tensor* const> params,
                                std::span<Tensor* const> grads, std::span<Tensor* const> states) {
  const int n_slots = u.kind == Optimizer::kSgd ? 0 : u.kind == Optimizer::kMomentum ? 1 : 2;
  APART_CHECK(params.size() == grads.size() && states.size() == params.size() * static_cast<size_t>(n_slots),
              "optimizer_step: params, grads and state slots do not match");
  const OptimizerConstants c = optimizer_constants(u);
  const float lr_f = c.lr, wd = c.weight_decay, step_size = c.step_size, bias2_sqrt = c.bias2_sqrt;
  const float one_minus_b1 = c.one_minus_beta1, b2 = c.beta2, one_minus_b2 = c.one_minus_beta2;
  const float eps = c.eps, mom = c.momentum;

  for (size_t i = 0; i < params.size(); ++i) {
    auto p = floats(*params[i]);
    auto g = floats(*static_cast<const Tensor*>(grads[i]));
    APART_CHECK(p.size() == g.size(), "optimizer_step: a gradient's size differs from its param's");
    const size_t n = p.size();
    switch (u.kind) {
      case Optimizer::kSgd:
        for (size_t j = 0; j < n; ++j) p[j] -= lr_f * (g[j] + wd * p[j]);
        break;
      case Optimizer::kMomentum: {
        auto buf = floats(*states[i]);
        const bool first = u.step == 1;
        for (size_t j = 0; j < n; ++j) {
          const float d = g[j] + wd * p[j];
          buf[j] = first ? d : mom * buf[j] + d;  // torch: the first step copies the gradient
          const float update = u.nesterov ? d + mom * buf[j] : buf[j];
          p[j] -= lr_f * update;
        }
        break;
      }
      case Optimizer::kAdam:
      case Optimizer::kAdamW: {
        auto m = floats(*states[2 * i]);
        auto v = floats(*states[2 * i + 1]);
        const bool decoupled = u.kind == Optimizer::kAdamW;
        const float decay = c.decay;
        for (size_t j = 0; j < n; ++j) {
          float d = g[j];
          if (decoupled) p[j] *= decay;
          else d += wd * p[j];
          m[j] += (d - m[j]) * one_minus_b1;  // torch's lerp_
          v[j] = v[j] * b2 + one_minus_b2 * d * d;
          const float denom = std::sqrt(v[j]) / bias2_sqrt + eps;
          p[j] -= step_size * (m[j] / denom);
        }
        break;
      }
    }
  }
}

}  // namespace

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

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
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
  if (kind == BackendKind::kCpu) return std::make_unique<CpuBackend>(gemm_operand_dtype(options));
#if APART_HAVE_CUDA
  return cuda::make_cuda_backend(options);
#else
  (void)options;
  throw Unsupported("--backend cuda: this apart was built without the CUDA backend; rebuild with `cmake --preset gpu` "
                    "(needs the CUDA toolkit, cuDNN and NCCL under /usr/local/cuda)");
#endif
}

}  // namespace apart
