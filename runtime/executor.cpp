// Executor: params from the ONNX file, constants precomputed, one arena for activations, each task on the backend's
// kernel or the CPU's (see executor.h).
#include "runtime/executor.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <set>

#include "codegen/kernel_program.h"
#include "graph/error.h"
#include "graph/text.h"
#include "importer/constant_params.h"
#include "importer/model_proto.h"
#include "runtime/half_precision.h"
#include "runtime/kernel.h"

namespace apart {

namespace fs = std::filesystem;

namespace {
// A model handed over in memory is run as it is: its Constant nodes stay nodes, so task and node indices agree.
ImportOptions as_given(ImportOptions import) {
  import.constants_as_params = false;
  return import;
}
}  // namespace

std::vector<std::string> runtime_supported_ops() { return supported_ops(); }

Executor::Executor(const ImportedModel& model, ExecutorOptions options) : model_(&model), options_(options) {
  const fs::path path(model.path);
  onnx::ModelProto proto = load_model_proto(path);
  if (model.constant_params.count > 0) constants_to_initializers(proto);  // as the import did: the same node indices
  widened_ = widen_half_precision(proto, path.parent_path());
  if (widened_.changed()) {  // the graph this executor computes: the imported one with each half value float32
    owned_model_ = std::make_unique<ImportedModel>(model);
    widen_half_values(owned_model_->graph);
    model_ = owned_model_.get();
  }
  load(proto, path.parent_path());
}

Executor::Executor(const onnx::ModelProto& proto, const fs::path& base_dir, ExecutorOptions options,
                   const ImportOptions& import)
    : options_(options) {
  std::optional<onnx::ModelProto> wide;  // a copy only for a half model
  if (has_half_precision(proto)) {
    wide = proto;
    widened_ = widen_half_precision(*wide, base_dir);
  }
  const onnx::ModelProto& computed = wide ? *wide : proto;
  owned_model_ = std::make_unique<ImportedModel>(import_model_bytes(
      computed.SerializeAsString(), base_dir,
      proto.graph().name().empty() ? std::string("<in-memory model>") : proto.graph().name(), as_given(import)));
  model_ = owned_model_.get();
  load(computed, base_dir);
}

void Executor::load(const onnx::ModelProto& proto, const fs::path& base_dir) {
  const ImportedModel& model = *model_;
  const TaskGraph& g = model.graph;
  APART_CHECK(g.finalized(), "the executor needs a finalized graph");
  if (auto it = model.opsets.find(""); it != model.opsets.end()) opset_ = it->second;

  // --- Kernels: every task needs a CPU kernel (the reference, and the fallback); the backend's where it has one ---
  backend_ = options_.backend ? options_.backend : &cpu_backend();
  device_ = !backend_->host_memory();
  kernels_.resize(g.num_tasks());
  cpu_kernels_.resize(g.num_tasks());
  writes_every_.clear();
  on_backend_.assign(g.num_tasks(), true);
  for (size_t t = 0; t < g.num_tasks(); ++t) {
    const Task& task = g.task(TaskId(static_cast<uint32_t>(t)));
    // Other domains register as "<domain>.<op>" (ai.apart's gradient ops, docs/autodiff.md).
    const std::string op = task.domain.empty() || task.domain == "ai.onnx" ? task.op_type : task.domain + "." + task.op_type;
    KernelFn fn = find_kernel(op);
    if (!fn)
      throw Unsupported("node " + quote(task.name) + ": op " + (task.domain.empty() ? "" : task.domain + ".") +
                        task.op_type + " has no CPU kernel in apart's runtime (docs/runtime.md lists the supported ops)");
    cpu_kernels_[t] = fn;
    writes_every_.push_back(cpu_kernel_writes_every_element(op));
    if (backend_ != &cpu_backend()) {
      if (is_tensor_parallel_collective(op)) {  // backend-generic: on the backend where the group moves its memory
        if (device_ && options_.tensor_parallel && !options_.tensor_parallel_on_backend) on_backend_[t] = false;
      } else if (KernelFn on_device = backend_->find_kernel(op)) {
        fn = on_device;
      } else {
        on_backend_[t] = false;
      }
    }
    kernels_[t] = fn;
  }

  // --- Params and TENSOR attributes, read from the proto (the importer keeps shapes only) ---
  persistent_.resize(g.num_values());
  for (const auto& init : proto.graph().initializer()) {
    auto id = g.find_value(init.name());
    if (!id) continue;
    persistent_[id->value()] = tensor_from_proto(init, base_dir);
    param_bytes_ += persistent_[id->value()].bytes();
  }
  if (proto.graph().sparse_initializer_size() > 0) throw Unsupported("sparse initializers are not supported by the runtime");
  tensor_attrs_.resize(g.num_tasks());
  for (size_t t = 0; t < g.num_tasks(); ++t) {
    const Task& task = g.task(TaskId(static_cast<uint32_t>(t)));
    if (task.onnx_node_index < 0 || task.onnx_node_index >= proto.graph().node_size()) continue;
    for (const auto& a : proto.graph().node(task.onnx_node_index).attribute()) {
      if (a.type() == onnx::AttributeProto::TENSOR || a.has_t()) tensor_attrs_[t].emplace_back(a.name(), tensor_from_proto(a.t(), base_dir));
      if (a.type() == onnx::AttributeProto::SPARSE_TENSOR)
        throw Unsupported("node " + quote(task.name) + ": sparse tensor attribute " + quote(a.name()));
    }
  }

  // --- The kernel program: which tasks run each step (precompute the rest: constant and free of params), and which
  // are views of their input (no kernel, no copy; on host memory, where a view is a Tensor over the same bytes) ---
  const KernelProgram program = lower_to_kernels(g);
  run_each_step_.assign(g.num_tasks(), true);
  alias_.assign(g.num_tasks(), false);
  fold_.assign(g.num_tasks(), false);
  holds_untransposed_.assign(g.num_values(), false);
  for (size_t t = 0; t < g.num_tasks(); ++t) {
    const Task& task = g.task(TaskId(static_cast<uint32_t>(t)));
    const ValueId out0 = task.outputs.empty() ? ValueId() : task.outputs[0];
    alias_[t] = program.alias[t] && !device_ && out0.valid() && g.value(out0).shape_known &&
                g.value(out0).kind != ValueKind::kOutput;
    fold_[t] = program.folded[t] && !device_;
    bool small = true;
    for (ValueId out : task.outputs) small = small && (!out.valid() || g.value(out).bytes <= options_.precompute_max_bytes);
    if (options_.precompute_constants && program.kernel_of[t] == KernelProgram::kNone && small) {
      bool inputs_ready = true;
      for (ValueId in : task.inputs) inputs_ready = inputs_ready && (!in.valid() || persistent_[in.value()].defined());
      if (inputs_ready) {
        execute(t, persistent_, false, RandomKey{});
        run_each_step_[t] = false;
      }
    }
  }

  // --- Liveness for releasing heap fallbacks; the arena plan ---
  last_use_.assign(g.num_values(), -1);
  for (size_t v = 0; v < g.num_values(); ++v)
    for (TaskId c : g.consumers(ValueId(static_cast<uint32_t>(v)))) last_use_[v] = std::max<int64_t>(last_use_[v], c.value());
  is_graph_output_.assign(g.num_values(), false);
  for (ValueId v : g.graph_outputs()) {
    last_use_[v.value()] = INT64_MAX;
    is_graph_output_[v.value()] = true;
  }
  // --- The order a step runs its tasks: the graph's, except that a task reading only params and constants (a tied
  // head's transposed weight, a zero tensor a gradient scatters into) runs just before its first reader, so that its
  // output is not held through the tasks in between. The liveness above stays sound: such a task's inputs are never
  // released, and its output's readers keep their places (the arena reserves the output from the graph's position).
  std::vector<std::pair<double, size_t>> keyed;
  for (size_t t = 0; t < g.num_tasks(); ++t) {
    if (!run_each_step_[t]) continue;
    const Task& task = g.task(TaskId(static_cast<uint32_t>(t)));
    bool reads_activations = false;
    for (ValueId in : task.inputs) reads_activations = reads_activations || (in.valid() && !persistent_[in.value()].defined());
    int64_t first_reader = INT64_MAX;
    for (ValueId out : task.outputs)
      if (out.valid())
        for (TaskId c : g.consumers(out)) first_reader = std::min<int64_t>(first_reader, c.value());
    const bool defer = !reads_activations && first_reader != INT64_MAX && first_reader > static_cast<int64_t>(t);
    keyed.emplace_back(defer ? static_cast<double>(first_reader) - 0.5 : static_cast<double>(t), t);
  }
  std::sort(keyed.begin(), keyed.end());
  run_order_.clear();
  for (const auto& [key, t] : keyed) run_order_.push_back(t);

  MemoryPlanOptions plan_options;
  plan_options.run_task = run_each_step_;
  plan_options.alias_task = alias_;  // a folded Transpose's readers read its input: held as a view's root is
  for (size_t t = 0; t < g.num_tasks(); ++t) plan_options.alias_task[t] = alias_[t] || fold_[t];
  // A graph output outlives the run (a stage's stash waits for its backward, gradients for the step): each run
  // allocates its own, so run() hands it over instead of copying it out of the arena.
  plan_options.outputs_in_arena = false;
  plan_ = plan_memory(g, plan_options);
  // One allocation of the backend for the whole plan (256-byte aligned, above the plan's 64).
  if (options_.arena) {
    arena_ = backend_->allocate(plan_.peak_bytes);
    arena_base_ = arena_.get();
  }

  // --- Placement on a device backend: float params move to the backend (the optimizer updates them there); the
  // other persistent values (precomputed constants, integer initializers) stay on the host, with one backend copy,
  // made here, for each that a backend kernel reads. Nothing persistent is copied per step, except params that a
  // CPU-fallback task reads (they change every step). ---
  if (!device_) return;
  backend_device_copy_.resize(g.num_values());
  for (size_t v = 0; v < g.num_values(); ++v) {
    Tensor& t = persistent_[v];
    if (t.defined() && g.value(ValueId(static_cast<uint32_t>(v))).kind == ValueKind::kParam && is_floating(t.dtype()))
      t = backend_->to_device(t);
  }
  std::set<std::string> fallback;
  for (size_t t = 0; t < g.num_tasks(); ++t) {
    if (!run_each_step_[t]) continue;
    const Task& task = g.task(TaskId(static_cast<uint32_t>(t)));
    if (!on_backend_[t]) {
      fallback.insert(task.domain.empty() || task.domain == "ai.onnx" ? task.op_type : task.domain + "." + task.op_type);
      continue;
    }
    for (ValueId in : task.inputs) {
      if (!in.valid()) continue;
      const Tensor& p = persistent_[in.value()];
      if (p.defined() && p.on_host() && !backend_device_copy_[in.value()].defined())
        backend_device_copy_[in.value()] = backend_->to_device(p);
    }
  }
  fallback_ops_.assign(fallback.begin(), fallback.end());
}

Executor::~Executor() = default;

Tensor* Executor::param(const std::string& name) {
  auto id = model_->graph.find_value(name);
  if (!id || model_->graph.value(*id).kind != ValueKind::kParam || !persistent_[id->value()].defined()) return nullptr;
  return &persistent_[id->value()];
}

void Executor::execute(size_t t, std::vector<Tensor>& slots, bool planned, const RandomKey& random) {
  const TaskGraph& g = model_->graph;
  const Task& task = g.task(TaskId(static_cast<uint32_t>(t)));
  // At load (planned false) every task runs its CPU kernel on the host; in a step, a task on a device backend runs
  // the backend's kernel on backend tensors, or the CPU kernel on host tensors, each input copied to its side.
  if (planned && (alias_[t] || fold_[t]) && slots[task.inputs[0].value()].defined()) {
    // A view: the same bytes in its shape. A folded Transpose: its input as it is, for its MatMuls' operand flags.
    const Tensor& in = slots[task.inputs[0].value()];
    slots[task.outputs[0].value()] = alias_[t] ? in.view(g.value(task.outputs[0]).shape) : in;
    holds_untransposed_[task.outputs[0].value()] = fold_[t];
    return;
  }
  for (ValueId out : task.outputs)
    if (out.valid() && planned) holds_untransposed_[out.value()] = false;
  const bool moves = device_ && planned;
  const bool on_device = moves && on_backend_[t];
  std::vector<const Tensor*> inputs;
  inputs.reserve(task.inputs.size());
  // ZeRO-3's params asked of the source for this task alone (set_param_source), dropped when it returns.
  std::vector<Tensor> sourced(param_source_ && planned ? task.inputs.size() : 0);
  auto slot_of = [&](size_t i) -> const Tensor& {
    return i < sourced.size() && sourced[i].defined() ? sourced[i] : slots[task.inputs[i].value()];
  };
  for (size_t i = 0; i < task.inputs.size(); ++i) {
    const ValueId in = task.inputs[i];
    if (!in.valid()) {
      inputs.push_back(nullptr);
      continue;
    }
    if (!sourced.empty() && !slots[in.value()].defined() && g.value(in).kind == ValueKind::kParam)
      sourced[i] = param_source_(g.value(in).name);
    const Tensor& s = slot_of(i);
    if (!s.defined())
      throw InvalidArgument("node " + quote(task.name) + " reads " + quote(g.value(in).name) + ", which has no data (a missing input?)");
    if (!moves || s.on_host() != on_device) {
      inputs.push_back(&s);
    } else if (on_device && backend_device_copy_[in.value()].defined() && s.raw() == persistent_[in.value()].raw() &&
               s.defined()) {
      inputs.push_back(&backend_device_copy_[in.value()]);  // a constant's copy made at load
    } else {
      // An activation (or a param read by a CPU-fallback task): one copy per step, shared by its later readers.
      Tensor& copy = other_side_[in.value()];
      if (!copy.defined()) copy = on_device ? backend_->to_device(s) : backend_->to_host(s);
      inputs.push_back(&copy);
    }
  }
  std::vector<Tensor> outputs(task.outputs.size());
  OutputAllocator allocate = [&](size_t i, DType dtype, const std::vector<int64_t>& shape) -> Tensor {
    const ValueId id = i < task.outputs.size() ? task.outputs[i] : ValueId();
    if (moves && !on_device) return Tensor(dtype, shape);  // a CPU fallback's outputs live on the host
    if (planned && arena_base_ && id.valid() && plan_.planned(id)) {
      const int64_t bytes = checked_element_count(shape).value_or(-1) * dtype_size(dtype);
      const int64_t planned_bytes = g.value(id).bytes;
      if (bytes >= 0 && bytes <= planned_bytes) {
        std::byte* p = arena_base_ + plan_.offset_of[id.value()];
        if (!on_device) {
          if (!writes_every_[t]) std::memset(p, 0, static_cast<size_t>(bytes));
          return Tensor::over(dtype, shape, std::shared_ptr<std::byte>(arena_, p));
        }
        Tensor slice = Tensor::over(dtype, shape, std::shared_ptr<std::byte>(arena_, p), false);
        backend_->fill_zero_bytes(slice);
        return slice;
      }
    }
    // Unplanned (unknown shape, or a shape inference disagreed with), or no arena.
    if (on_device) return backend_->empty(dtype, shape);
    return planned && writes_every_[t] ? Tensor::uninitialized(dtype, shape) : Tensor(dtype, shape);
  };
  KernelContext ctx(task, opset_, std::move(inputs), tensor_attrs_[t], outputs, allocate, random_stream(random, node_random_id(task.name.data(), task.name.size())));
  ctx.set_tensor_parallel_group(on_device ? options_.tensor_parallel_on_backend : options_.tensor_parallel);
  if (planned && !device_) {
    std::vector<bool> transposed(task.inputs.size(), false);
    bool any = false;
    for (size_t i = 0; i < task.inputs.size(); ++i)
      any = any || (transposed[i] = task.inputs[i].valid() && holds_untransposed_[task.inputs[i].value()]);
    if (any) ctx.set_transposed_inputs(std::move(transposed));
  }
  std::vector<Tensor> host_copies;  // host_input's copies of device inputs: kept until the task ends
  if (on_device) {
    host_copies.resize(task.inputs.size());
    ctx.set_backend(backend_, [&](size_t i) -> const Tensor& {
      const Tensor& s = slot_of(i);  // where the value lives: on the host unless a kernel made it
      if (s.on_host()) return s;
      if (!host_copies[i].defined()) host_copies[i] = backend_->to_host(s);
      return host_copies[i];
    });
  } else if (planned && !device_) {
    ctx.set_backend(backend_, {});  // a host-memory backend's settings (its GEMM operands) reach the CPU kernels
  }
  const bool timed = options_.time_tasks && planned;
  // A device kernel only starts when launched: wait for the work before it, and for it, so that the clock measures
  // this kernel alone (a no-op on the CPU).
  if (timed && device_) backend_->synchronize();
  const auto start = std::chrono::steady_clock::now();
  (planned ? kernels_[t] : cpu_kernels_[t])(ctx);
  if (timed) {
    if (device_) backend_->synchronize();
    task_seconds_[t] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  for (size_t i = 0; i < task.outputs.size(); ++i) {
    if (!task.outputs[i].valid()) continue;
    if (!outputs[i].defined())
      throw Unsupported("node " + quote(task.name) + " (" + task.op_type + "): the kernel does not produce output " + std::to_string(i));
    slots[task.outputs[i].value()] = std::move(outputs[i]);
  }
}

void Executor::share_params(Executor& other) {
  const TaskGraph& g = model_->graph;
  for (uint32_t v = 0; v < g.num_values(); ++v) {
    const Value& value = g.value(ValueId(v));
    if (value.kind != ValueKind::kParam || !persistent_[v].defined()) continue;
    Tensor* theirs = other.param(value.name);
    if (!theirs) continue;
    APART_CHECK(theirs->shape() == persistent_[v].shape() && theirs->dtype() == persistent_[v].dtype(),
                "share_params: param " + quote(value.name) + " differs between the two executors");
    param_bytes_ -= persistent_[v].bytes();
    persistent_[v] = *theirs;
  }
}

NamedTensors Executor::run(const std::map<std::string, Tensor>& inputs, const RandomKey& random) {
  return run(inputs, random, {});
}

NamedTensors Executor::run(const std::map<std::string, Tensor>& inputs, const RandomKey& random,
                           const OutputCallback& on_output) {
  return run_graph(inputs, random, on_output, nullptr);
}

NamedTensors Executor::run(std::map<std::string, Tensor>&& inputs, const RandomKey& random,
                           const OutputCallback& on_output) {
  return run_graph(inputs, random, on_output, &inputs);
}

NamedTensors Executor::run_graph(const std::map<std::string, Tensor>& inputs, const RandomKey& random,
                                 const OutputCallback& on_output, std::map<std::string, Tensor>* taken_over) {
  const TaskGraph& g = model_->graph;
  std::vector<bool> was_given(g.num_values(), false);  // graph inputs this run was given
  std::vector<Tensor> slots = persistent_;  // shares storage: params and constants are not copied
  for (ValueId v : g.graph_inputs()) {
    const Value& value = g.value(v);
    auto it = inputs.find(value.name);
    if (it == inputs.end()) {
      if (slots[v.value()].defined()) continue;  // an input with an initializer as its default
      throw InvalidArgument("input " + quote(value.name) + " was not given");
    }
    const Tensor& given = it->second;
    // A half input of the file's signature, widened by the model pass: converted here (exact).
    const auto stored = widened_.inputs.find(value.name);
    const bool widen = stored != widened_.inputs.end() && given.dtype() == stored->second;
    const Tensor t = widen ? widen_to_float32(given.on_host() ? given : backend_->to_host(given)) : given;
    if (value.dtype != DType::kUndefined && t.dtype() != value.dtype)
      throw InvalidArgument("input " + quote(value.name) + " has dtype " + std::string(dtype_name(t.dtype())) +
                            "; the model expects " + std::string(dtype_name(value.dtype)));
    if (value.shape_known && t.shape() != value.shape)
      throw InvalidArgument("input " + quote(value.name) + " has shape " + shape_string(t.shape()) +
                            "; the model was imported for " + shape_string(value.shape) + " (use --shape/--dim)");
    slots[v.value()] = t;
    was_given[v.value()] = true;
  }
  for (const auto& [name, t] : inputs)
    if (!g.find_value(name)) throw InvalidArgument("input " + quote(name) + " is not a value of the model");
  if (taken_over) taken_over->clear();  // `inputs` with it: the slots hold them now, until their last readers
  if (options_.time_tasks) task_seconds_.assign(g.num_tasks(), 0.0);
  if (device_) other_side_.assign(g.num_values(), Tensor());
  std::vector<bool> taken(on_output ? g.num_values() : 0, false);  // outputs the callback took
  for (size_t t : run_order_) {
    execute(t, slots, true, random);
    if (on_output)
      for (ValueId out : g.task(TaskId(static_cast<uint32_t>(t))).outputs)
        if (out.valid() && is_graph_output_[out.value()]) {
          const Tensor& value = slots[out.value()];
          // With outputs_on_backend the callback sees the backend's tensors, also of a CPU fallback's outputs.
          const bool took = device_ && options_.outputs_on_backend && value.on_host()
                                ? on_output(g.value(out).name, backend_->to_device(value))
                                : on_output(g.value(out).name, value);
          if (!took) continue;
          taken[out.value()] = true;
          if (g.consumers(out).empty() && !persistent_[out.value()].defined()) slots[out.value()] = Tensor();
        }
    // Release what no later task reads (heap fallbacks; arena slices are just references).
    for (ValueId in : g.task(TaskId(static_cast<uint32_t>(t))).inputs) {
      if (!in.valid() || last_use_[in.value()] != static_cast<int64_t>(t)) continue;
      if (!persistent_[in.value()].defined()) slots[in.value()] = Tensor();
      if (device_) other_side_[in.value()] = Tensor();  // back to the backend's pool
    }
  }
  NamedTensors outputs;
  for (ValueId v : g.graph_outputs()) {
    if (!taken.empty() && taken[v.value()]) continue;
    const Tensor& t = slots[v.value()];
    if (!t.defined()) throw InvalidModel("graph output " + quote(g.value(v).name) + " was not computed");
    // This run's own tensor (not an arena slice, a param, a constant or an input), where the caller wants it.
    const bool own = !plan_.planned(v) && !persistent_[v.value()].defined() && !was_given[v.value()] &&
                     (device_ ? options_.outputs_on_backend && !t.on_host() : true);
    outputs.emplace_back(g.value(v).name, own ? t : output_copy(t));
  }
  if (device_) other_side_.clear();
  return outputs;
}

Tensor Executor::output_copy(const Tensor& t) const {
  if (!device_) return t.clone();
  if (!options_.outputs_on_backend) return t.on_host() ? t.clone() : backend_->to_host(t);
  if (t.on_host()) return backend_->to_device(t);
  // Arena slices are overwritten by the next run: the caller gets a block of its own from the backend's pool.
  Tensor copy = Tensor::over(t.dtype(), t.shape(), backend_->allocate(t.bytes()), false);
  backend_->copy_on_device(t.raw(), copy.raw(), t.bytes());
  return copy;
}

}  // namespace apart
