// CPU kernel interface: a context per task execution, a registry by op type, and shared helpers.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "graph/error.h"
#include "graph/task_graph.h"
#include "runtime/random.h"
#include "runtime/tensor.h"

namespace apart {

class Backend;
class Communicator;

// Where a kernel's outputs go: the executor hands out arena slices sized by the memory plan.
using OutputAllocator = std::function<Tensor(size_t output_index, DType dtype, const std::vector<int64_t>& shape)>;

class KernelContext {
 public:
  KernelContext(const Task& task, int64_t opset, std::vector<const Tensor*> inputs,
                const std::vector<std::pair<std::string, Tensor>>& tensor_attributes, std::vector<Tensor>& outputs,
                OutputAllocator allocate, uint64_t random_stream = 0)
      : task_(task), opset_(opset), inputs_(std::move(inputs)), tensor_attributes_(tensor_attributes),
        outputs_(outputs), allocate_(std::move(allocate)), random_stream_(random_stream) {}

  const Task& task() const { return task_; }
  int64_t opset() const { return opset_; }
  size_t num_inputs() const { return inputs_.size(); }
  bool has_input(size_t i) const { return i < inputs_.size() && inputs_[i] != nullptr; }
  const Tensor& input(size_t i) const;
  size_t num_outputs() const { return outputs_.size(); }
  bool wants_output(size_t i) const { return i < task_.outputs.size() && task_.outputs[i].valid(); }
  // Allocates output i (zero-filled) and returns it for the kernel to fill.
  Tensor& output(size_t i, DType dtype, std::vector<int64_t> shape);
  // A TENSOR attribute (Constant.value, ConstantOfShape.value), or nullptr.
  const Tensor* tensor_attr(std::string_view name) const;

  int64_t attr_int(std::string_view n, int64_t fallback) const { return task_.attr_int(n, fallback); }
  double attr_float(std::string_view n, double fallback) const { return task_.attr_float(n, fallback); }
  std::string attr_string(std::string_view n, std::string fallback = "") const { return task_.attr_string(n, fallback); }
  std::vector<int64_t> attr_ints(std::string_view n, std::vector<int64_t> fallback = {}) const {
    return task_.attr_ints(n, std::move(fallback));
  }
  bool has_attr(std::string_view n) const { return task_.attr(n) != nullptr; }
  // This execution's random stream (random.h): a function of the run's RandomKey and the node only.
  uint64_t random_stream() const { return random_stream_; }

  // The backend the kernel runs on (runtime/backend.h); cpu_backend() unless the executor set another.
  Backend& backend() const;
  // Input i in host memory: the input itself on a host-memory backend, else a host copy the executor makes (or
  // keeps, for constants) — for the small integer inputs a device kernel must read on the host (Reshape's shape,
  // Slice's starts, Split's sizes). Valid during the kernel call.
  using HostInputFn = std::function<const Tensor&(size_t input_index)>;
  const Tensor& host_input(size_t i) const;
  void set_backend(Backend* backend, HostInputFn host_input) {
    backend_ = backend;
    host_input_ = std::move(host_input);
  }

  // Whether input i is given as the tensor a folded Transpose reads (codegen/kernel_program.h): the operand is that
  // tensor with its last two axes swapped, which a GEMM reads through its operand flag. Only MatMul's inputs are.
  bool input_transposed(size_t i) const { return i < transposed_.size() && transposed_[i]; }
  void set_transposed_inputs(std::vector<bool> transposed) { transposed_ = std::move(transposed); }

  // The tensor-parallel group the executor runs a shard in (ExecutorOptions::tensor_parallel), or nullptr.
  Communicator* tensor_parallel_group() const { return tensor_parallel_; }
  void set_tensor_parallel_group(Communicator* group) { tensor_parallel_ = group; }

  // Errors naming the task and op.
  [[noreturn]] void unsupported(const std::string& what) const;
  [[noreturn]] void invalid(const std::string& what) const;

 private:
  const Task& task_;
  int64_t opset_;
  std::vector<const Tensor*> inputs_;
  const std::vector<std::pair<std::string, Tensor>>& tensor_attributes_;
  std::vector<Tensor>& outputs_;
  OutputAllocator allocate_;
  uint64_t random_stream_;
  Backend* backend_ = nullptr;
  HostInputFn host_input_;
  Communicator* tensor_parallel_ = nullptr;
  std::vector<bool> transposed_;
};

using KernelFn = void (*)(KernelContext&);

// What a kernel writes of the outputs it makes: kEvery, every element of every output (the executor then hands it
// storage that is not zero-filled first); kSome, possibly fewer (it may rely on zeros: scatters, accumulations).
enum class OutputWrites : uint8_t { kSome, kEvery };

// Op type → kernel, for one backend (the CPU's below, CUDA's in runtime/cuda/cuda_backend.cpp). Kernels are
// registered explicitly by `register_all` on the first lookup, not by static initialisers: objects of a static
// library that nothing references would otherwise be dropped by the linker.
class KernelRegistry {
 public:
  explicit KernelRegistry(void (*register_all)()) : register_all_(register_all) {}
  void add(std::string_view op_type, KernelFn fn, OutputWrites writes = OutputWrites::kSome) {  // register_all's
    kernels_.emplace(std::string(op_type), fn);
    if (writes == OutputWrites::kEvery) writes_every_.emplace(op_type);
  }
  KernelFn find(std::string_view op_type) const;  // nullptr when none
  bool writes_every_element(std::string_view op_type) const;  // registered with OutputWrites::kEvery
  std::vector<std::string> ops() const;           // every registered op type, sorted
  KernelRegistry(const KernelRegistry&) = delete;
  KernelRegistry& operator=(const KernelRegistry&) = delete;

 private:
  const std::map<std::string, KernelFn, std::less<>>& kernels() const;
  void (*register_all_)();
  mutable std::once_flag registered_;
  std::map<std::string, KernelFn, std::less<>> kernels_;
  std::set<std::string, std::less<>> writes_every_;
};

// The kernel for an op of the default ONNX domain ("Conv"), or of another domain as
// "<domain>.<op>" ("ai.apart.ConvGrad"), or nullptr. supported_ops() lists the default domain only.
KernelFn find_kernel(std::string_view op_type);
std::vector<std::string> supported_ops();
// Adds a kernel; the cpu/*.cpp families call it from their register_*_kernels() (cpu/families.h).
void register_kernel(std::string_view op_type, KernelFn fn, OutputWrites writes = OutputWrites::kSome);
// Whether the CPU kernel of `op_type` writes every element of its outputs (registered with OutputWrites::kEvery).
bool cpu_kernel_writes_every_element(std::string_view op_type);

// Whether `op` (as find_kernel names it) is one of the tensor-parallel collectives (ai.apart.TpCopy, TpAllReduce,
// TpScatter, TpAllGather, TpReduceScatter): backend-generic kernels that move bytes only through their backend's
// copies and the TP group's collectives (runtime/cpu/tensor_parallel.cpp), so the executor runs them on any backend
// whose memory the group moves (ExecutorOptions::tensor_parallel_on_backend).
bool is_tensor_parallel_collective(std::string_view op);

// --- Helpers shared by kernels ------------------------------------------------

// numpy broadcasting of two shapes; throws via ctx when incompatible.
std::vector<int64_t> broadcast_shapes(const KernelContext& ctx, const std::vector<int64_t>& a,
                                      const std::vector<int64_t>& b);
// Strides of `shape` aligned to the rank of `out`, 0 where `shape` broadcasts.
std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& shape, const std::vector<int64_t>& out);
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);
int64_t normalize_axis(const KernelContext& ctx, int64_t axis, int64_t rank);
int64_t product(const std::vector<int64_t>& shape, size_t begin = 0, size_t end = SIZE_MAX);

// Calls f(T{}) with T the C++ type of dtype: float, double, int64_t, int32_t, bool(uint8_t storage),
// plus the small ints where `with_small_ints`. Unsupported otherwise.
template <class F>
void dispatch(const KernelContext& ctx, DType dtype, F&& f, bool with_small_ints = false) {
  switch (dtype) {
    case DType::kFloat32: f(float{}); return;
    case DType::kFloat64: f(double{}); return;
    case DType::kInt64: f(int64_t{}); return;
    case DType::kInt32: f(int32_t{}); return;
    default: break;
  }
  if (with_small_ints) {
    switch (dtype) {
      case DType::kBool: f(bool{}); return;
      case DType::kUInt8: f(uint8_t{}); return;
      case DType::kInt8: f(int8_t{}); return;
      case DType::kInt16: f(int16_t{}); return;
      case DType::kUInt16: f(uint16_t{}); return;
      case DType::kUInt32: f(uint32_t{}); return;
      case DType::kUInt64: f(uint64_t{}); return;
      default: break;
    }
  }
  ctx.unsupported("dtype " + std::string(dtype_name(dtype)));
}
template <class F>
void dispatch_float(const KernelContext& ctx, DType dtype, F&& f) {
  if (dtype == DType::kFloat32) return f(float{});
  if (dtype == DType::kFloat64) return f(double{});
  ctx.unsupported("dtype " + std::string(dtype_name(dtype)));
}

// Copies `in` (any dtype) into `out`, which has as many elements (shape ops).
void copy_bytes(const Tensor& in, Tensor& out);

}  // namespace apart
