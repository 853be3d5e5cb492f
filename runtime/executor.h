// Forward executor: runs an imported TaskGraph on the CPU kernels, step by step in topological
// order, with activations in one arena planned before the first step.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "importer/importer.h"
#include "runtime/backend.h"
#include "runtime/kernel.h"
#include "runtime/memory_plan.h"
#include "runtime/random.h"
#include "runtime/tensor.h"

namespace onnx {
class ModelProto;
}

namespace apart {

struct ExecutorOptions {
  // Run constant tasks that do not read params (Constant nodes, shape arithmetic) once at load.
  // Tasks reading params run every step, so that training can update params in place.
  bool precompute_constants = true;
  bool time_tasks = false;  // record per-task seconds (for measured profiles)
  // Where tensors live and kernels run (runtime/backend.h); nullptr: the CPU backend. On a device backend params
  // and precomputed constants are uploaded at load, the arena is one allocation of the backend, each task runs the
  // backend's kernel or, where it has none, the CPU kernel on host copies; inputs may be host or device tensors.
  Backend* backend = nullptr;
  // run() returns graph outputs in the backend's memory (copies from the backend's pool) instead of host copies,
  // so that gradients stay on the device for the optimizer.
  bool outputs_on_backend = false;
};

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Executor {
 public:
  // Reads params from the ONNX file at model.path (initializers, inline or external data). `model`
  // must outlive the executor. Throws Unsupported naming the first node whose op has no kernel.
  explicit Executor(const ImportedModel& model, ExecutorOptions options = {});
  // Runs an in-memory model (e.g. a training graph from build_training_graph): imports it with
  // `import` (dims bound there), reads params from its initializers, inline or external data
  // resolved under `base_dir` (the folder of the file the model came from). Keeps its own copy of
  // the imported graph; `proto` may be dropped after construction.
  Executor(const onnx::ModelProto& proto, const std::filesystem::path& base_dir, ExecutorOptions options = {},
           const ImportOptions& import = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs one forward step. `inputs` by graph-input name (graph inputs with an initializer may be
  // omitted). Returns the graph outputs in graph order, in storage of their own. Not reentrant.
  // `random` is the draw random kernels (Dropout) make: the same key gives the same masks.
  NamedTensors run(const std::map<std::string, Tensor>& inputs, const RandomKey& random = {});
  // As run(), and calls `on_output(name, tensor)` as soon as each graph output is computed, before the remaining
  // tasks run (the pipeline starts a gradient's all-reduce while the rest of the backward runs). The tensor is
  // valid only during the call: copy what must outlive it.
  using OutputCallback = std::function<void(const std::string& name, const Tensor& value)>;
  NamedTensors run(const std::map<std::string, Tensor>& inputs, const RandomKey& random, const OutputCallback& on_output);

  // Makes this executor's params the same tensors as `other`'s (shared storage, by name), so that a stage's
  // forward and backward executors read one copy that the optimizer updates. Params `other` lacks stay as loaded.
  // Throws Internal when a shared param's shape or dtype differs.
  void share_params(Executor& other);

  const MemoryPlan& memory_plan() const { return plan_; }
  int64_t param_bytes() const { return param_bytes_; }
  // Per-task seconds of the last run (when options.time_tasks), indexed by TaskId.
  const std::vector<double>& task_seconds() const { return task_seconds_; }
  // A param's tensor (for checks and, later, optimizers).
  Tensor* param(const std::string& name);
  // The imported graph the executor runs (shapes, value kinds).
  const ImportedModel& model() const { return model_; }

 private:
  void execute(size_t task_index, std::vector<Tensor>& slots, bool planned, const RandomKey& random);
  void load(const onnx::ModelProto& proto, const std::filesystem::path& base_dir);

  std::unique_ptr<ImportedModel> owned_model_;  // set by the in-memory constructor; before model_
  const ImportedModel& model_;
  ExecutorOptions options_;
  int64_t opset_ = 0;
  std::vector<KernelFn> kernels_;  // by task
  std::vector<std::vector<std::pair<std::string, Tensor>>> tensor_attrs_;  // by task
  std::vector<Tensor> persistent_;  // by value: params and precomputed constants
  std::vector<bool> run_each_step_;  // by task
  std::vector<int64_t> last_use_;    // by value: last step reading it
  std::vector<bool> is_graph_output_;  // by value
  MemoryPlan plan_;
  std::shared_ptr<std::byte> arena_;
  std::byte* arena_base_ = nullptr;
  int64_t param_bytes_ = 0;
  std::vector<double> task_seconds_;
};

// Ops the CPU runtime has kernels for (default ONNX domain), sorted.
std::vector<std::string> runtime_supported_ops();

}  // namespace apart
