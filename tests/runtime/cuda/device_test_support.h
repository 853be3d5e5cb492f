// What the GPU suites share: the skip where no GPU is visible (naming CUDA's reason), one CudaBackend per precision
// for the whole binary, running one kernel on a backend from host tensors, random data, and the normalised error.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "graph/task_graph.h"
#include "runtime/backend.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/kernel.h"

namespace apart::cuda::testing {

// "" when a GPU is visible, else why not ("no CUDA device: CUDA driver version is insufficient ...").
inline std::string why_no_gpu() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorString(status);
  }
  return count == 0 ? "no CUDA device: the driver reports 0 devices" : "";
}

#define APART_SKIP_WITHOUT_GPU()                                                     \
  do {                                                                               \
    if (const std::string why = ::apart::cuda::testing::why_no_gpu(); !why.empty()) \
      GTEST_SKIP() << why;                                                           \
  } while (0)

// The process's backend of `precision` on GPU 0, made on first use and kept (streams and handles cost ~100 ms).
inline CudaBackend& gpu(Precision precision = Precision::kFp32) {
  static std::map<Precision, std::unique_ptr<Backend>> backends;
  auto& b = backends[precision];
  if (!b) b = make_backend(BackendKind::kCuda, {0, precision});
  return dynamic_cast<CudaBackend&>(*b);
}

// A task of `op` with `attributes` and `outputs` valid outputs, for a KernelContext outside any graph.
inline Task make_task(std::string op, std::vector<Attribute> attributes = {}, size_t outputs = 1) {
  Task task;
  task.name = op + "_test";
  task.op_type = std::move(op);
  task.attributes = std::move(attributes);
  for (size_t i = 0; i < outputs; ++i) task.outputs.push_back(ValueId(static_cast<uint32_t>(i)));
  return task;
}
inline Attribute int_attr(std::string name, int64_t v) {
  Attribute a;
  a.name = std::move(name);
  a.type = Attribute::Type::kInt;
  a.i = v;
  return a;
}
inline Attribute float_attr(std::string name, double v) {
  Attribute a;
  a.name = std::move(name);
  a.type = Attribute::Type::kFloat;
  a.f = v;
  return a;
}

// Runs `kernel` on `backend` over `host_inputs` (uploaded to a device backend; an undefined tensor is a missing
// optional input) and returns its outputs as host tensors.
inline std::vector<Tensor> run_kernel(Backend& backend, KernelFn kernel, const Task& task,
                                      const std::vector<Tensor>& host_inputs) {
  std::vector<Tensor> inputs;
  std::vector<const Tensor*> pointers;
  inputs.reserve(host_inputs.size());
  for (const Tensor& t : host_inputs) {
    inputs.push_back(t.defined() ? backend.to_device(t) : Tensor());
    pointers.push_back(t.defined() ? &inputs.back() : nullptr);
  }
  std::vector<Tensor> outputs(task.outputs.size());
  const std::vector<std::pair<std::string, Tensor>> no_tensor_attributes;
  KernelContext ctx(task, 17, pointers, no_tensor_attributes, outputs,
                    [&](size_t, DType dtype, const std::vector<int64_t>& shape) { return backend.empty(dtype, shape); });
  ctx.set_backend(&backend, [&](size_t i) -> const Tensor& { return host_inputs.at(i); });
  kernel(ctx);
  backend.synchronize();
  std::vector<Tensor> host;
  for (const Tensor& t : outputs) host.push_back(t.defined() ? backend.to_host(t) : Tensor());
  return host;
}

inline Tensor random_tensor(std::vector<int64_t> shape, std::mt19937& rng, float low = -1, float high = 1) {
  Tensor t(DType::kFloat32, std::move(shape));
  std::uniform_real_distribution<float> dist(low, high);
  for (float& v : t.span<float>()) v = dist(rng);
  return t;
}

// max|got − want| / max|want| (0 for two empty or all-zero tensors); +inf when the shapes differ.
inline double normalised_error(const Tensor& got, const Tensor& want) {
  if (got.shape() != want.shape() || got.dtype() != DType::kFloat32 || want.dtype() != DType::kFloat32)
    return INFINITY;
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < want.elements(); ++i) {
    diff = std::max(diff, std::fabs(double(got.data<float>()[i]) - want.data<float>()[i]));
    scale = std::max(scale, std::fabs(double(want.data<float>()[i])));
  }
  return scale == 0 ? diff : diff / scale;
}

}  // namespace apart::cuda::testing
