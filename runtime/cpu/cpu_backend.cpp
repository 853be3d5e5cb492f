// The CPU backend: host memory, the kernels of cpu/, BLAS, the step's arithmetic in float32 as torch.optim's
// single-tensor loops compute it. Always built: the reference every other backend is tested against.
#include "runtime/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "graph/error.h"
#include "runtime/blas_info.h"
#include "runtime/kernel.h"

namespace apart {

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
           (gemm_operands_ == DType::kFloat32
                ? ""
                : ", GEMM operands rounded to " + std::string(dtype_name(gemm_operands_)));
  }
  DType gemm_operands() const override { return gemm_operands_; }
  bool host_memory() const override { return true; }

  std::shared_ptr<std::byte> allocate(int64_t bytes) override {
    constexpr size_t kAlign = 256;
    APART_CHECK(bytes >= 0, "allocate of a negative size");
    auto* block = static_cast<std::byte*>(
        std::aligned_alloc(kAlign, (static_cast<size_t>(bytes) + kAlign - 1) / kAlign * kAlign + kAlign));
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
          if (decoupled)
            p[j] *= decay;
          else
            d += wd * p[j];
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

std::unique_ptr<Backend> make_cpu_backend(DType gemm_operands) { return std::make_unique<CpuBackend>(gemm_operands); }

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace apart
