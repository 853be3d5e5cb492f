// Executor: runs an imported TaskGraph step by step in topological order on a backend (runtime/backend.h: the CPU
// by default), with activations in one arena of that backend planned before the first step.
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
#include "runtime/half_precision.h"
#include "runtime/kernel.h"
#include "runtime/memory_plan.h"
#include "runtime/random.h"
#include "runtime/tensor.h"

namespace onnx {
class ModelProto;
}

namespace apart {

class Communicator;

struct ExecutorOptions {
  // Run constant tasks that do not read params (Constant nodes, shape arithmetic) once at load.
  // Tasks reading params run every step, so that training can update params in place.
  bool precompute_constants = true;
  // ...but not a constant of more bytes than this: it is computed in each run where the graph reads it, and freed
  // after, instead of held for good (a param-sized zero tensor a gradient scatters into).
  int64_t precompute_max_bytes = INT64_MAX;
  bool time_tasks = false;  // record per-task seconds (for measured profiles)
  // Where tensors live and kernels run (runtime/backend.h); nullptr: the CPU backend. The arena is one allocation of
  // the backend. Each task runs the backend's kernel or, where it has none (decided at load), the CPU kernel; a value
  // lives where its producer ran. On a device backend: float params are uploaded at load; precomputed constants and
  // integer initializers stay on the host, with one backend copy made at load for those a backend kernel reads; a
  // backend task's host inputs (graph inputs, CPU-fallback outputs) and a fallback's device inputs are copied once
  // per step (from the backend's pool); outputs handed to backend kernels are zeroed with fill_zero_bytes.
  Backend* backend = nullptr;
  // run() returns graph outputs in the backend's memory (copies from the backend's pool) instead of host copies,
  // so that gradients stay on the device for the optimizer.
  bool outputs_on_backend = false;
  // false: no arena; each value a step computes gets storage of its own and is freed after its last reader, so that
  // what a run holds at any moment is what its graph needs then, not an arena's whole peak from start to end (`apart
  // run`: a stage's passes hold nothing between runs, and its backward's transients fill what the stash it consumes
  // frees). memory_plan() is still made: the arena it would have been.
  bool arena = true;
  // The tensor-parallel group (not owned) whose ranks run the other shards of this graph: ai.apart.TpAllReduce sums
  // over it (codegen/tensor_parallel_shard.h). nullptr: no group, the collectives are identities. It moves host
  // memory (MPI, in-process): the tasks that run on the CPU kernels over host memory use it.
  Communicator* tensor_parallel = nullptr;
  // The same group over a transport that moves a device backend's memory (NCCL under --backend cuda), or nullptr.
  // With it the TP collectives (is_tensor_parallel_collective) run on the backend, on its tensors, and so does any
  // backend kernel that reads the group; without it, on a device backend with a group, they run on host copies (a
  // CPU fallback over `tensor_parallel`).
  Communicator* tensor_parallel_on_backend = nullptr;
};

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Executor {
 public:
  // Reads params from the ONNX file at model.path (initializers, inline or external data). `model`
  // must outlive the executor. Throws Unsupported naming the first node whose op has no kernel.
  // Both constructors compute a float16/bfloat16 model in float32 (widen_half_precision, runtime/half_precision.h):
  // model() is then the widened graph, params are float32, and outputs come out float32.
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
  // omitted), host tensors or the backend's; an input the file declares half may be given in that dtype (widened here,
  // exactly) or in float32. Returns the graph outputs in graph order, in storage of their own: host
  // tensors, or the backend's with options.outputs_on_backend. Not reentrant.
  // `random` is the draw random kernels (Dropout) make: the same key gives the same masks.
  NamedTensors run(const std::map<std::string, Tensor>& inputs, const RandomKey& random = {});
  // As run(), and calls `on_output(name, tensor)` as soon as each graph output is computed, before the remaining
  // tasks run (the pipeline starts a gradient's all-reduce while the rest of the backward runs). The tensor is
  // valid only during the call: copy what must outlive it. With outputs_on_backend it is in the backend's memory.
  // The callback returns true when it took what it needs: run() then leaves that output out of what it returns and
  // frees it at once unless a later task reads it (a param gradient added into its accumulator holds no memory
  // beyond its call).
  using OutputCallback = std::function<bool(const std::string& name, const Tensor& value)>;
  NamedTensors run(const std::map<std::string, Tensor>& inputs, const RandomKey& random, const OutputCallback& on_output);
  // As above, and takes `inputs` over (the map is left empty): each is freed after its last reader instead of when
  // the run returns (a backward's stash shrinks as the backward consumes it).
  NamedTensors run(std::map<std::string, Tensor>&& inputs, const RandomKey& random, const OutputCallback& on_output);

  // Makes this executor's params the same tensors as `other`'s (shared storage, by name), so that a stage's
  // forward and backward executors read one copy that the optimizer updates. Params `other` lacks stay as loaded.
  // Throws Internal when a shared param's shape or dtype differs.
  void share_params(Executor& other);

  // ZeRO-3: where a param whose tensor is empty (Tensor() in its param() slot) comes from. Each task reading such a
  // param asks `source(name)` for it just before it runs and drops it when it returns, so that a run holds one task's
  // params at a time (the planner's zero_gathered_bytes). Without a source an empty param is a missing input.
  using ParamSource = std::function<Tensor(const std::string& name)>;
  void set_param_source(ParamSource source) { param_source_ = std::move(source); }

  const MemoryPlan& memory_plan() const { return plan_; }
  int64_t param_bytes() const { return param_bytes_; }
  // Per-task seconds of the last run (when options.time_tasks), indexed by TaskId.
  const std::vector<double>& task_seconds() const { return task_seconds_; }
  // A param's tensor, where the executor keeps it: on a device backend a float param is the backend's tensor (copy it
  // with Backend::to_host to read it; the optimizer updates it in place there), other params are host tensors.
  Tensor* param(const std::string& name);
  // Ops (as "Conv", "ai.apart.ConvGrad") of the tasks that run each step on the CPU kernel because the backend has
  // none, sorted; empty on the CPU backend. The CLI prints them once, so a slow fallback is never silent.
  const std::vector<std::string>& fallback_ops() const { return fallback_ops_; }
  Backend& backend() const { return *backend_; }
  // The imported graph the executor runs (shapes, value kinds).
  const ImportedModel& model() const { return *model_; }
  // What widening a half-precision model changed (nothing for a float32 one).
  const HalfWidening& half_widening() const { return widened_; }

 private:
  void execute(size_t task_index, std::vector<Tensor>& slots, bool planned, const RandomKey& random);
  // run()'s body; `taken_over`: the inputs' map (the same as `inputs`), emptied once the slots hold them.
  NamedTensors run_graph(const std::map<std::string, Tensor>& inputs, const RandomKey& random,
                         const OutputCallback& on_output, std::map<std::string, Tensor>* taken_over);
  void load(const onnx::ModelProto& proto, const std::filesystem::path& base_dir);

  // A graph output as run() returns it: a host clone, or (outputs_on_backend) a copy in the backend's memory.
  Tensor output_copy(const Tensor& t) const;

  std::unique_ptr<ImportedModel> owned_model_;  // the in-memory constructor's import, or a widened half model's graph
  const ImportedModel* model_ = nullptr;        // owned_model_, or the model given
  HalfWidening widened_;                        // what the half-precision pass changed (runtime/half_precision.h)
  ExecutorOptions options_;
  Backend* backend_ = nullptr;  // options_.backend, or the CPU backend; never null after load
  bool device_ = false;         // the backend's memory is not the host's: values are copied between the two
  int64_t opset_ = 0;
  std::vector<KernelFn> kernels_;      // by task: what a step runs (the backend's kernel, or the CPU's)
  std::vector<KernelFn> cpu_kernels_;  // by task: the CPU kernel (precomputing constants at load, on the host)
  std::vector<bool> on_backend_;       // by task: kernels_ is the backend's (false: a CPU fallback on host copies)
  std::vector<Tensor> backend_device_copy_;  // by value: the backend copy of a host constant a backend kernel reads
  std::vector<Tensor> other_side_;     // by value, during run(): this step's copy of a value on the other side
  std::vector<std::string> fallback_ops_;
  std::vector<std::vector<std::pair<std::string, Tensor>>> tensor_attrs_;  // by task
  std::vector<Tensor> persistent_;  // by value: params and precomputed constants
  std::vector<bool> run_each_step_;  // by task
  // By task: its output is a view of its input (the kernel program's views, codegen/kernel_program.h): no kernel runs.
  std::vector<bool> alias_;
  // By task: a Transpose folded into its MatMuls (the program's `folded`, on host memory): no kernel runs; its output
  // slot holds its input, and holds_untransposed_ (by value, set each run) tells the MatMuls to set their flag.
  std::vector<bool> fold_;
  std::vector<bool> holds_untransposed_;
  // By task: its CPU kernel writes every element of its outputs (OutputWrites::kEvery): they are not zero-filled first.
  std::vector<bool> writes_every_;
  std::vector<size_t> run_order_;    // the tasks a step runs, in the order it runs them
  std::vector<int64_t> last_use_;    // by value: last step reading it
  std::vector<bool> is_graph_output_;  // by value
  MemoryPlan plan_;
  std::shared_ptr<std::byte> arena_;  // none without options_.arena
  std::byte* arena_base_ = nullptr;
  ParamSource param_source_;
  int64_t param_bytes_ = 0;
  std::vector<double> task_seconds_;
};

// Ops the CPU runtime has kernels for (default ONNX domain), sorted.
std::vector<std::string> runtime_supported_ops();

}  // namespace apart
