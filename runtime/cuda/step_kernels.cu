// CudaBackend's vector operations of a step on device tensors: fill, accumulate, scale, the clip norm's Σx² (a fixed
// block reduction in double: the same sum every run), the finiteness check, and the optimizer update as one
// multi-tensor launch whose float arithmetic is runtime/backend.cpp's, operation for operation.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <vector>

#include "graph/error.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/multi_tensor.h"

namespace apart::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;  // grid-stride beyond this: enough blocks to fill an H200 several times

int grid_for(int64_t n) { return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks)); }

__global__ void add_into_kernel(float* accumulator, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    accumulator[i] = __fadd_rn(accumulator[i], x[i]);
}

__global__ void scale_kernel(float* x, float factor, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = __fmul_rn(x[i], factor);
}

// Block b: Σ x² of chunk b in double, each thread over a fixed stride, then a fixed tree: partials[b].
__global__ void chunk_sum_of_squares_kernel(const MultiTensorChunk* table, double* partials) {
  __shared__ double sums[kThreads];
  const MultiTensorChunk chunk = table[blockIdx.x];
  double sum = 0;
  for (int64_t i = threadIdx.x; i < chunk.count; i += kThreads) {
    const double v = chunk.data[0][i];
    sum = __fma_rn(v, v, sum);
  }
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) sums[threadIdx.x] = __dadd_rn(sums[threadIdx.x], sums[threadIdx.x + width]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

// One block: the partials in the same fixed order.
__global__ void sum_partials_kernel(const double* partials, int64_t count, double* total) {
  __shared__ double sums[kThreads];
  double sum = 0;
  for (int64_t i = threadIdx.x; i < count; i += kThreads) sum = __dadd_rn(sum, partials[i]);
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) sums[threadIdx.x] = __dadd_rn(sums[threadIdx.x], sums[threadIdx.x + width]);
    __syncthreads();
  }
  if (threadIdx.x == 0) *total = sums[0];
}

__global__ void chunk_all_finite_kernel(const MultiTensorChunk* table, int* any_not_finite) {
  const MultiTensorChunk chunk = table[blockIdx.x];
  for (int64_t i = threadIdx.x; i < chunk.count; i += kThreads)
    if (!isfinite(chunk.data[0][i])) *any_not_finite = 1;  // every writer writes 1: no race on the value
}

// runtime/backend.cpp's CpuBackend::optimizer_step, element for element. The _rn intrinsics are IEEE float ops that
// nvcc never fuses into an FMA, so each expression rounds where the host's does (x86-64 SSE, no contraction).
enum class StepKind : int { kSgd, kMomentum, kAdam, kAdamW };
struct StepArgs {
  StepKind kind;
  OptimizerConstants c;
  bool nesterov;
  bool first_step;
};

__global__ void chunk_optimizer_kernel(const MultiTensorChunk* table, StepArgs args) {
  const MultiTensorChunk chunk = table[blockIdx.x];
  float* p = chunk.data[0];
  const float* g = chunk.data[1];
  float* s0 = chunk.data[2];
  float* s1 = chunk.data[3];
  const OptimizerConstants& c = args.c;
  for (int64_t j = threadIdx.x; j < chunk.count; j += kThreads) {
    switch (args.kind) {
      case StepKind::kSgd:
        // p -= lr · (g + wd · p)
        p[j] = __fsub_rn(p[j], __fmul_rn(c.lr, __fadd_rn(g[j], __fmul_rn(c.weight_decay, p[j]))));
        break;
      case StepKind::kMomentum: {
        const float d = __fadd_rn(g[j], __fmul_rn(c.weight_decay, p[j]));
        const float buf = args.first_step ? d : __fadd_rn(__fmul_rn(c.momentum, s0[j]), d);
        s0[j] = buf;
        const float update = args.nesterov ? __fadd_rn(d, __fmul_rn(c.momentum, buf)) : buf;
        p[j] = __fsub_rn(p[j], __fmul_rn(c.lr, update));
        break;
      }
      case StepKind::kAdam:
      case StepKind::kAdamW: {
        float d = g[j];
        float pj = p[j];
        if (args.kind == StepKind::kAdamW) pj = __fmul_rn(pj, c.decay);
        else d = __fadd_rn(d, __fmul_rn(c.weight_decay, pj));
        const float m = __fadd_rn(s0[j], __fmul_rn(__fsub_rn(d, s0[j]), c.one_minus_beta1));  // torch's lerp_
        const float v = __fadd_rn(__fmul_rn(s1[j], c.beta2), __fmul_rn(__fmul_rn(c.one_minus_beta2, d), d));
        s0[j] = m;
        s1[j] = v;
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bias2_sqrt), c.eps);
        p[j] = __fsub_rn(pj, __fmul_rn(c.step_size, __fdiv_rn(m, denom)));
        break;
      }
    }
  }
}

float* device_floats(const Tensor& t, const char* op) {
  if (t.dtype() != DType::kFloat32 || t.on_host())
    throw Error(ErrorKind::kInternal, std::string("cuda backend ") + op + ": float32 device tensors only, got a " +
                                          std::string(dtype_name(t.dtype())) + (t.on_host() ? " host" : " device") +
                                          " tensor");
  return const_cast<float*>(t.data<float>());
}

int64_t align_up(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// Uploads the chunk table into the backend's scratch block, followed by `extra_bytes` (256-aligned) for the launch's
// outputs; returns the table's device address and sets `extra` to the rest. Scratch stays valid until the next
// scratch() call, and every use is on the compute stream, so a later launch's upload waits for this one's kernel.
MultiTensorChunk* upload_table(CudaBackend& backend, const std::vector<MultiTensorChunk>& table, int64_t extra_bytes,
                               std::byte** extra) {
  APART_CHECK(table.size() <= static_cast<size_t>(INT32_MAX), "cuda step kernels: too many chunks for one launch");
  const int64_t table_bytes = align_up(static_cast<int64_t>(table.size() * sizeof(MultiTensorChunk)));
  auto* base = static_cast<std::byte*>(backend.scratch(table_bytes + align_up(extra_bytes)));
  APART_CUDA_CHECK(cudaMemcpyAsync(base, table.data(), table.size() * sizeof(MultiTensorChunk), cudaMemcpyHostToDevice,
                                   backend.compute_stream()));
  *extra = base + table_bytes;
  return reinterpret_cast<MultiTensorChunk*>(base);
}

std::vector<MultiTensorChunk> single_slot_table(std::span<const Tensor* const> xs, const char* op) {
  std::vector<std::array<float*, kChunkSlots>> slots;
  std::vector<int64_t> sizes;
  for (const Tensor* x : xs) {
    slots.push_back({device_floats(*x, op), nullptr, nullptr, nullptr});
    sizes.push_back(x->elements());
  }
  return build_chunk_table(slots, sizes);
}

}  // namespace

void CudaBackend::fill_zero(Tensor& x) {
  float* p = device_floats(x, "fill_zero");
  if (x.elements() == 0) return;
  APART_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<size_t>(x.bytes()), compute_));
}

void CudaBackend::fill_zero_bytes(Tensor& t) {
  if (t.bytes() == 0) return;
  APART_CHECK(!t.on_host(), "CudaBackend::fill_zero_bytes of a host tensor");
  APART_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, static_cast<size_t>(t.bytes()), compute_));
}

void CudaBackend::add_into(Tensor& accumulator, const Tensor& x) {
  float* a = device_floats(accumulator, "add_into");
  const float* b = device_floats(x, "add_into");
  APART_CHECK(accumulator.elements() == x.elements(), "add_into: element counts differ");
  const int64_t n = x.elements();
  if (n == 0) return;
  add_into_kernel<<<grid_for(n), kThreads, 0, compute_>>>(a, b, n);
  APART_CUDA_CHECK(cudaGetLastError());
}

void CudaBackend::scale(Tensor& x, double factor) {
  float* p = device_floats(x, "scale");
  const int64_t n = x.elements();
  if (n == 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, compute_>>>(p, static_cast<float>(factor), n);
  APART_CUDA_CHECK(cudaGetLastError());
}

double CudaBackend::sum_of_squares(std::span<const Tensor* const> xs) {
  const std::vector<MultiTensorChunk> table = single_slot_table(xs, "sum_of_squares");
  if (table.empty()) return 0;
  const int64_t chunks = static_cast<int64_t>(table.size());
  std::byte* extra = nullptr;
  const MultiTensorChunk* device_table = upload_table(*this, table, (chunks + 1) * int64_t{sizeof(double)}, &extra);
  auto* partials = reinterpret_cast<double*>(extra);
  double* total = partials + chunks;
  chunk_sum_of_squares_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, compute_>>>(device_table, partials);
  APART_CUDA_CHECK(cudaGetLastError());
  sum_partials_kernel<<<1, kThreads, 0, compute_>>>(partials, chunks, total);
  APART_CUDA_CHECK(cudaGetLastError());
  double sum = 0;
  APART_CUDA_CHECK(cudaMemcpyAsync(&sum, total, sizeof sum, cudaMemcpyDeviceToHost, compute_));
  APART_CUDA_CHECK(cudaStreamSynchronize(compute_));
  return sum;
}

bool CudaBackend::all_finite(std::span<const Tensor* const> xs) {
  const std::vector<MultiTensorChunk> table = single_slot_table(xs, "all_finite");
  if (table.empty()) return true;
  std::byte* extra = nullptr;
  const MultiTensorChunk* device_table = upload_table(*this, table, sizeof(int), &extra);
  int* flag = reinterpret_cast<int*>(extra);
  APART_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), compute_));
  chunk_all_finite_kernel<<<static_cast<unsigned>(table.size()), kThreads, 0, compute_>>>(device_table, flag);
  APART_CUDA_CHECK(cudaGetLastError());
  int any_not_finite = 0;
  APART_CUDA_CHECK(cudaMemcpyAsync(&any_not_finite, flag, sizeof(int), cudaMemcpyDeviceToHost, compute_));
  APART_CUDA_CHECK(cudaStreamSynchronize(compute_));
  return any_not_finite == 0;
}

void CudaBackend::optimizer_step(const OptimizerUpdate& update, std::span<Tensor* const> params,
                                 std::span<Tensor* const> grads, std::span<Tensor* const> states) {
  const int n_slots = update.kind == Optimizer::kSgd ? 0 : update.kind == Optimizer::kMomentum ? 1 : 2;
  APART_CHECK(params.size() == grads.size() && states.size() == params.size() * static_cast<size_t>(n_slots),
              "optimizer_step: params, grads and state slots do not match");
  std::vector<std::array<float*, kChunkSlots>> slots;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < params.size(); ++i) {
    std::array<float*, kChunkSlots> s{device_floats(*params[i], "optimizer_step"),
                                      device_floats(*grads[i], "optimizer_step"), nullptr, nullptr};
    APART_CHECK(params[i]->elements() == grads[i]->elements(),
                "optimizer_step: a gradient's size differs from its param's");
    for (int k = 0; k < n_slots; ++k) {
      const Tensor& state = *states[i * static_cast<size_t>(n_slots) + static_cast<size_t>(k)];
      APART_CHECK(state.elements() == params[i]->elements(), "optimizer_step: a state's size differs from its param's");
      s[static_cast<size_t>(2 + k)] = device_floats(state, "optimizer_step");
    }
    slots.push_back(s);
    sizes.push_back(params[i]->elements());
  }
  const std::vector<MultiTensorChunk> table = build_chunk_table(slots, sizes);
  if (table.empty()) return;
  StepArgs args{};
  switch (update.kind) {
    case Optimizer::kSgd: args.kind = StepKind::kSgd; break;
    case Optimizer::kMomentum: args.kind = StepKind::kMomentum; break;
    case Optimizer::kAdam: args.kind = StepKind::kAdam; break;
    case Optimizer::kAdamW: args.kind = StepKind::kAdamW; break;
  }
  args.c = optimizer_constants(update);
  args.nesterov = update.nesterov;
  args.first_step = update.step == 1;  // torch's momentum buffer starts as a copy of the first gradient
  std::byte* extra = nullptr;
  const MultiTensorChunk* device_table = upload_table(*this, table, 0, &extra);
  chunk_optimizer_kernel<<<static_cast<unsigned>(table.size()), kThreads, 0, compute_>>>(device_table, args);
  APART_CUDA_CHECK(cudaGetLastError());
}

}  // namespace apart::cuda
