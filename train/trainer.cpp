// The single-process training loop behind `apart train` (see trainer.h).
#include "train/trainer.h"

#include <onnx/onnx_pb.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "codegen/autodiff.h"
#include "graph/checked.h"
#include "graph/error.h"
#include "graph/text.h"
#include "graph/output_path.h"
#include "importer/added_loss.h"
#include "importer/constant_params.h"
#include "importer/model_proto.h"
#include "profiler/memory_model.h"
#include "train/checkpoint.h"
#include "runtime/executor.h"
#include "runtime/half_precision.h"
#include "train/preemption.h"

namespace apart {
namespace fs = std::filesystem;

ParamInit parse_param_init(std::string_view text) {
  if (text == "model") return ParamInit::kModel;
  if (text == "random") return ParamInit::kRandom;
  throw InvalidArgument("--init: unknown value '" + std::string(text) + "' (use random or model)");
}

void TrainingLoopOptions::validate() const {
  checked_integer(steps, 1, limits::kMaxSteps, "--steps");
  checked_integer(save_every, 0, limits::kMaxSteps, "--save-every (0: only at the end)");
  checked_integer(keep_last, 1, limits::kMaxSteps, "--keep-last");
  if (save_every > 0 && checkpoint_dir.empty()) throw InvalidArgument("--save-every needs --checkpoint-dir");
  checked_integer(schedule.warmup_steps, 0, limits::kMaxSteps, "--warmup-steps");
  checked_number(schedule.min_lr_ratio, 0, 1, "--min-lr-ratio");
  checked_integer(schedule.total_steps, 0, limits::kMaxSteps, "--lr-schedule-steps (0: --steps)");
  if (schedule.kind == LrScheduleKind::kConstant && schedule.warmup_steps > 0)
    throw InvalidArgument("--warmup-steps needs --lr-schedule cosine");
  optimizer.validate();
  if (loss_scale.enabled) loss_scale.validate();
}

void TrainOptions::validate() const {
  if (model.empty()) throw InvalidArgument("no model given");
  checked_integer(batch, 1, limits::kMaxBatch, "--batch");
  TrainingLoopOptions::validate();
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Every path train writes, checked before setup and step 1 (a run of hours must not fail at its end): the
// checkpoint folder is a writable folder whose checkpoint.apart, if any, is one of ours; --save-model (and the
// ".data" beside it) is a writable file path that is none of the run's inputs.
void check_outputs(const TrainOptions& options, const onnx::ModelProto& forward) {
  std::vector<InputFile> inputs{{"the model", options.model}};
  const fs::path model_dir = fs::path(options.model).parent_path();
  std::set<std::string> locations;
  for (const auto& init : forward.graph().initializer())
    if (init.data_location() == onnx::TensorProto::EXTERNAL)
      for (const auto& kv : init.external_data())
        if (kv.key() == "location" && locations.insert(kv.value()).second)
          inputs.push_back({"an external-data file of the model", model_dir / kv.value()});
  for (const auto& [name, file] : data_files(options.data.spec)) inputs.push_back({"a --data file", file});
  if (!options.checkpoint_dir.empty()) {
    check_output_directory_writable(options.checkpoint_dir, "--checkpoint-dir");
    const fs::path file = fs::path(options.checkpoint_dir) / kCheckpointFile;
    check_output_not_input(file, inputs, "--checkpoint-dir");  // the --resume checkpoint is meant to be replaced
    std::error_code ec;
    if (fs::exists(fs::symlink_status(file, ec))) {
      check_output_writable(file, "--checkpoint-dir");
      if (!is_checkpoint_file(file))
        throw InvalidArgument("--checkpoint-dir '" + options.checkpoint_dir + "' holds a " + kCheckpointFile +
                              " that apart did not write; apart will not replace it: choose another folder");
    }
  }
  if (!options.resume.empty()) {
    std::error_code ec;
    const fs::path resume = options.resume;
    inputs.push_back({"the --resume checkpoint", fs::is_directory(resume, ec) ? resume / kCheckpointFile : resume});
  }
  if (!options.save_model.empty()) {
    check_output_file(options.save_model, inputs, "--save-model");
    check_output_not_input(options.save_model + ".data", inputs, "--save-model (its external data)");
  }
}

// --keep-last: before DIR/checkpoint.apart is replaced, the one there (this run's, of `last_step`) stays as
// DIR/checkpoint.step_K.apart, a hard link (the replacement is still a rename over the old name); the oldest this run
// kept go once more than keep_last - 1 are. Only files this run wrote are deleted, each announced.
struct KeptCheckpoints {
  std::vector<fs::path> files;  // oldest first
  int64_t last_step = -1;       // of DIR/checkpoint.apart, when this run wrote it
};
void keep_previous_checkpoint(const TrainOptions& options, KeptCheckpoints& kept) {
  if (options.keep_last <= 1 || kept.last_step < 0) return;
  const fs::path dir(options.checkpoint_dir);
  const fs::path older = dir / ("checkpoint.step_" + std::to_string(kept.last_step) + ".apart");
  std::error_code ec;
  fs::remove(older, ec);
  fs::create_hard_link(dir / kCheckpointFile, older, ec);
  if (ec) throw SystemError("cannot keep the checkpoint of step " + std::to_string(kept.last_step) + " as " + older.string() +
                            ": " + ec.message() + " (--keep-last needs hard links in --checkpoint-dir)");
  kept.files.push_back(older);
  if (options.on_note) options.on_note("checkpoint of step " + std::to_string(kept.last_step) + " kept as " + older.string());
  while (static_cast<int64_t>(kept.files.size()) > options.keep_last - 1) {
    fs::remove(kept.files.front(), ec);
    if (options.on_note) options.on_note("checkpoint " + kept.files.front().string() + " deleted (--keep-last " +
                                         std::to_string(options.keep_last) + ")");
    kept.files.erase(kept.files.begin());
  }
}

const Tensor& output_named(NamedTensors& outputs, const std::string& name) {
  for (auto& [n, t] : outputs)
    if (n == name) return t;
  APART_CHECK(false, "training graph output missing: " + name);
  return outputs.front().second;
}

bool looks_like_norm_scale(const std::string& name) {
  auto ends_with = [&](std::string_view s) { return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
  return ends_with("weight") || ends_with("scale") || ends_with("gamma");
}

}  // namespace

// Seeded per name, so the values do not depend on initializer order (trainer.h).

void randomize_params(onnx::ModelProto& proto, uint64_t seed) {
  for (auto& init : *proto.mutable_graph()->mutable_initializer()) {
    // A half initializer gets float32 values (the float32 master weights of half-precision training).
    if (init.data_type() != onnx::TensorProto::FLOAT && !is_half(static_cast<DType>(init.data_type()))) continue;
    init.set_data_type(onnx::TensorProto::FLOAT);
    std::vector<int64_t> dims(init.dims().begin(), init.dims().end());
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    std::vector<float> values(static_cast<size_t>(n));
    if (dims.size() >= 2) {
      double std_dev = 0.02;
      if (dims.size() == 4) std_dev = std::sqrt(2.0 / static_cast<double>(std::max<int64_t>(1, dims[1] * dims[2] * dims[3])));
      std::mt19937_64 rng(seed ^ std::hash<std::string>{}(init.name()));
      std::normal_distribution<float> normal(0.0f, static_cast<float>(std_dev));
      for (float& v : values) v = normal(rng);
    } else {
      std::fill(values.begin(), values.end(), looks_like_norm_scale(init.name()) ? 1.0f : 0.0f);
    }
    init.clear_float_data();
    init.clear_int32_data();
    init.clear_external_data();
    init.clear_data_location();
    init.set_raw_data(values.data(), values.size() * sizeof(float));
  }
}

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  const long pages = sysconf(_SC_AVPHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

void check_training_memory(const TaskGraph& graph, const TrainOptions& options, int64_t available_bytes) {
  // Every float param is fp32 here: weights, gradients and the optimizer's state per param (the profiler's memory
  // model), plus each activation of the forward at this batch, kept for the backward.
  double params = 0, activations = 0;
  for (uint32_t v = 0; v < graph.num_values(); ++v) {
    const Value& value = graph.value(ValueId(v));
    if (value.kind == ValueKind::kParam && is_floating(value.dtype)) params += static_cast<double>(value.elements);
    // A float16/bfloat16 activation is computed in float32 (half_precision.h).
    if (value.kind == ValueKind::kActivation)
      activations += static_cast<double>(is_half(value.dtype) ? value.elements * dtype_size(DType::kFloat32) : value.bytes);
  }
  const double per_param = bytes_per_param(options.optimizer.kind, Precision::kFp32);
  const double needed = params * per_param + activations;
  if (available_bytes <= 0 || needed <= static_cast<double>(available_bytes)) return;
  auto gb = [](double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
    return std::string(buf);
  };
  throw Infeasible("training " + options.model + " needs about " + gb(needed) + " of memory (" +
                   std::to_string(static_cast<int64_t>(params)) + " params × " + std::to_string(static_cast<int>(per_param)) +
                   " bytes for fp32 weights, gradients and optimizer state, + " + gb(activations) +
                   " of activations at --batch " + std::to_string(options.batch) + "); this machine has " +
                   gb(static_cast<double>(available_bytes)) +
                   " available (MemAvailable): train a smaller model (apart zoo … --layers/--hidden), a smaller --batch, "
                   "or plan it for a cluster with `apart partition`");
}

int64_t resumed_lr_schedule_steps(const LrSchedule& schedule, int64_t steps, int64_t checkpoint_steps,
                                  const std::function<void(const std::string&)>& on_note) {
  const bool explicit_span = schedule.total_steps > 0;
  const int64_t span = explicit_span ? schedule.total_steps : checkpoint_steps;
  if (schedule.kind == LrScheduleKind::kConstant || !on_note) return span;
  if (explicit_span && span != checkpoint_steps)
    on_note("--lr-schedule-steps " + std::to_string(span) + " changes the learning-rate schedule of the resumed run: "
            "it now decays over " + std::to_string(span) + " steps (the checkpoint's run: " +
            std::to_string(checkpoint_steps) + "), so the rate jumps at the resumed step");
  else if (!explicit_span && span != steps)
    on_note("the resumed run keeps the checkpoint's learning-rate schedule, decaying over " + std::to_string(span) +
            " steps (this run's --steps: " + std::to_string(steps) + "; steps past it run at the minimum rate); pass "
            "--lr-schedule-steps " + std::to_string(steps) + " to stretch it instead");
  return span;
}

namespace {

// The forward model as training runs it: loaded, constants made params, the loss appended, checked early (weights
// present, memory enough) before autodiff and before a byte of weights is drawn, initialised, half widened. `import`
// is what the rest of the run imports with.
onnx::ModelProto prepare_forward(const TrainOptions& options, TrainResult& result, ImportOptions& import) {
  const fs::path model_path(options.model);
  onnx::ModelProto forward = load_model_proto(model_path);
  if (options.import.constants_as_params) {
    result.constant_params = constants_to_initializers(forward);
    const std::string note = constant_params_note(result.constant_params);
    if (!note.empty() && options.on_note) options.on_note(note);
  }
  append_loss(forward, options.import.loss);  // --loss cross_entropy: the same pass every command's reader runs
  check_outputs(options, forward);
  // --batch binds the batch dim by the importer's rule (importer.h kBatchDimNames); it was typed or is
  // train's documented default, so a --dim/--shape/static batch of another size is an error.
  import = options.import;
  import.loss = {};  // appended to `forward` above
  import.batch = options.batch;
  import.batch_explicit = true;
  {
    // Fail early, before autodiff and before a byte of weights is drawn: when the weights are not there (a
    // graph-only export), or when training would need more memory than the machine has.
    const ImportedModel imported =
        import_model_bytes(forward.SerializeAsString(), model_path.parent_path(), model_path.string(), import);
    if (options.init == ParamInit::kModel && !imported.missing_external_files.empty())
      throw InvalidModel("the weights of " + options.model + " are external data in " + quote(imported.missing_external_files.front()) +
                         (imported.missing_external_files.size() > 1 ? " (and " + std::to_string(imported.missing_external_files.size() - 1) + " more files)" : "") +
                         ", which is not present beside the model: copy it there to train from the model's weights, "
                         "or pass --init random to train from freshly initialized ones");
    check_training_memory(imported.graph, options, available_memory_bytes());
  }
  if (options.init == ParamInit::kRandom) randomize_params(forward, options.seed);
  // float16/bfloat16 storage, float32 compute: widened once here, by the reader of the user's file, so autodiff and
  // the executor see the float32 model the run computes (runtime/half_precision.h).
  result.half_widening = widen_half_precision(forward, model_path.parent_path());
  if (const std::string note = half_widening_note(result.half_widening); !note.empty() && options.on_note) options.on_note(note);
  return forward;
}

// --resume: the params, the optimizer's state and the loss scaler from the checkpoint (every checksum verified before
// a byte is used), the learning-rate schedule's span; returns the step it was written at.
int64_t resume_training(const TrainOptions& options, const std::vector<std::string>& names,
                        const std::vector<Tensor*>& params, Backend& backend, ParamOptimizer& optimizer,
                        LossScaler& scaler, LrSchedule& schedule) {
  Checkpoint ck = read_checkpoint(options.resume);
  const std::string where = "checkpoint " + options.resume;
  if (!ck.warning.empty() && options.on_warning) options.on_warning(ck.warning);
  const std::string saved_kind = ck.meta.value("optimizer", "");
  if (saved_kind != optimizer_name(options.optimizer.kind))
    throw InvalidArgument(where + " was written with --optimizer " + saved_kind + "; resume with the same optimizer");
  std::map<std::string, Tensor> by_name;
  std::vector<std::pair<std::string, Tensor>> state;
  for (auto& [name, t] : ck.tensors) {
    if (name.rfind("param/", 0) == 0)
      by_name[name.substr(6)] = std::move(t);
    else if (name.rfind("optim/", 0) == 0)
      state.emplace_back(name.substr(6), std::move(t));
  }
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = by_name.find(names[i]);
    if (it == by_name.end())
      throw InvalidArgument(where + " has no values for param '" + names[i] + "' (another model?)");
    if (it->second.shape() != params[i]->shape() || it->second.dtype() != params[i]->dtype())
      throw InvalidArgument(where + ": param '" + names[i] + "' is " + shape_string(it->second.shape()) +
                            ", the model's is " + shape_string(params[i]->shape()));
    backend.copy(it->second, *params[i]);
  }
  for (const auto& [name, t] : state) {
    const std::string param = name.substr(0, name.rfind('/'));
    const auto at = std::find(names.begin(), names.end(), param);
    if (at == names.end() || t.shape() != params[static_cast<size_t>(at - names.begin())]->shape())
      throw InvalidArgument(where + ": optimizer state '" + name + "' does not fit the model");
  }
  // Skipped steps (loss scaling) do not count as the optimizer's: Adam's t is its own count.
  optimizer.restore(ck.meta.value("optimizer_steps", ck.step), std::move(state));
  scaler.load(ck.meta);
  schedule.total_steps = resumed_lr_schedule_steps(
      options.schedule, options.steps, ck.meta.value("lr_schedule_steps", ck.meta.value("steps", options.steps)),
      options.on_note);
  return ck.step;
}

// --save-model: the trained weights (and BatchNorm's running statistics) written into a copy of the model.
void save_trained_model(const TrainOptions& options, const fs::path& model_path, const TrainingGraph& tg,
                        const std::vector<std::string>& names, const std::vector<Tensor*>& params, Executor& executor,
                        Backend& backend) {
  std::map<std::string, Tensor> host;  // the weights on the host (shared, not copied, on the CPU backend)
  for (size_t i = 0; i < names.size(); ++i) host[names[i]] = backend.to_host(*params[i]);
  for (const auto& [init, out] : tg.state_updates)
    if (const Tensor* t = executor.param(init)) host[init] = backend.to_host(*t);
  std::map<std::string, const Tensor*> values;
  for (const auto& [name, t] : host) values[name] = &t;
  write_trained_model(model_path, options.save_model, values);
}

}  // namespace

TrainResult train(const TrainOptions& options, const StepCallback& on_step) {
  options.validate();
  const auto setup_start = Clock::now();
  TrainResult result;
  const fs::path model_path(options.model);
  ImportOptions import;
  onnx::ModelProto forward = prepare_forward(options, result, import);

  TrainingGraphOptions tg_options;
  tg_options.loss = options.loss;
  tg_options.import = import;
  if (options.loss_scale.enabled) tg_options.loss_seed_input = kLossScaleInput;
  // Attention fused only where the backend runs the fused op (the CUDA backend has no kernel for it yet: it would fall
  // back to the CPU every step).
  Backend& backend = options.backend ? *options.backend : cpu_backend();
  tg_options.fuse_attention = backend.find_kernel("ai.apart.AttentionGrad") != nullptr;
  const TrainingGraph tg = build_training_graph(forward, tg_options);
  forward.Clear();
  ImportOptions exec_import;
  exec_import.require_external_data = true;
  ExecutorOptions exec_options;
  exec_options.backend = &backend;
  exec_options.outputs_on_backend = true;  // gradients stay where the optimizer runs
  Executor executor(tg.model, model_path.parent_path(), exec_options, exec_import);
  result.arena_bytes = executor.memory_plan().peak_bytes;
  result.backend = backend.describe();
  result.fallback_ops = executor.fallback_ops();

  std::vector<std::string> names;
  std::vector<Tensor*> params;
  for (const auto& [param, grad] : tg.gradients) {
    Tensor* p = executor.param(param);
    APART_CHECK(p != nullptr, "executor has no param " + param);
    if (p->dtype() != DType::kFloat32)
      throw Unsupported("param " + quote(param) + " is " + std::string(dtype_name(p->dtype())) + "; apart train updates float32 params only");
    names.push_back(param);
    params.push_back(p);
    result.params += p->elements();
  }
  result.param_tensors = static_cast<int64_t>(params.size());
  if (params.empty()) throw InvalidArgument(options.model + " has no float initializers to train");

  DataOptions data_options = options.data;
  data_options.seed = options.seed;
  const auto inputs = classify_inputs(executor.model().graph, {tg.loss_seed_input});  // the seed is fed below, not data
  std::unique_ptr<DataSource> data = make_data_source(data_options, inputs);
  result.data_description = data->describe();

  ParamOptimizer optimizer(options.optimizer, names, backend);
  LossScaler scaler(options.loss_scale);
  LrSchedule schedule = options.schedule;
  if (schedule.total_steps == 0) schedule.total_steps = options.steps;  // or, resumed, the checkpoint's (below)

  int64_t step = 0;
  if (!options.resume.empty()) step = resume_training(options, names, params, backend, optimizer, scaler, schedule);
  result.first_step = step;
  if (step > options.steps)
    throw InvalidArgument("checkpoint " + options.resume + " is at step " + std::to_string(step) + ", past --steps " +
                          std::to_string(options.steps));

  KeptCheckpoints kept;
  auto save_checkpoint = [&](int64_t at_step) {
    std::vector<std::pair<std::string, const Tensor*>> tensors;
    for (size_t i = 0; i < names.size(); ++i) tensors.emplace_back("param/" + names[i], params[i]);
    for (const auto& [name, t] : optimizer.state()) tensors.emplace_back("optim/" + name, t);
    nlohmann::json meta = {{"model", options.model},
                           {"optimizer", std::string(optimizer_name(options.optimizer.kind))},
                           {"batch", options.batch},
                           {"seed", options.seed},
                           {"data", options.data.spec},
                           {"steps", options.steps},
                           {"lr_schedule_steps", schedule.total_steps},
                           {"optimizer_steps", optimizer.steps_taken()}};
    scaler.save(meta);
    keep_previous_checkpoint(options, kept);
    write_checkpoint(options.checkpoint_dir, at_step, meta, tensors, backend);
    if (options.on_note) {
      const fs::path file = fs::path(options.checkpoint_dir) / kCheckpointFile;
      std::error_code ec;
      const auto bytes = fs::file_size(file, ec);
      options.on_note("checkpoint of step " + std::to_string(at_step) + " written: " + file.string() + " (" +
                      (ec ? std::string("?") : std::to_string(bytes)) + " bytes" +
                      (kept.last_step >= 0 && options.keep_last == 1 ? "; it replaces the previous one)" : ")"));
    }
    kept.last_step = at_step;
  };
  result.setup_seconds = seconds_since(setup_start);

  // --- Steps ---
  optimizer.prepare(params);  // the state now, not from blocks step 1's copies return to the backend's pool
  const auto run_start = Clock::now();
  std::vector<Tensor*> grads(params.size());
  std::vector<int64_t> seed_shape;  // the loss's: the seed input's
  if (scaler.enabled()) seed_shape = executor.model().graph.value(*executor.model().graph.find_value(tg.loss_seed_input)).shape;
  for (; step < options.steps; ++step) {
    const auto step_start = Clock::now();
    std::map<std::string, Tensor> batch = data->batch(step);
    if (scaler.enabled()) batch[tg.loss_seed_input] = scaler.seed(seed_shape);
    NamedTensors outputs = executor.run(batch, RandomKey{options.seed, static_cast<uint64_t>(step), 0});
    const double loss = backend.to_host(output_named(outputs, tg.loss_output)).scalar_as_double();
    if (!std::isfinite(loss) && !scaler.enabled())
      throw Infeasible("training diverged: loss is " + std::to_string(loss) + " at step " + std::to_string(step + 1) +
                       "; lower --lr or set --clip-grad-norm");
    for (size_t i = 0; i < params.size(); ++i) grads[i] = const_cast<Tensor*>(&output_named(outputs, tg.gradients[i].second));
    const double lr = schedule.lr_at(step, options.optimizer.lr);
    StepRecord record;
    if (scaler.enabled()) {
      // Loss scaling: the gradients are the scaled loss's; one with an inf/NaN skips the step (and backs the scale off).
      record.loss_scale = scaler.scale();
      const std::vector<const Tensor*> checked(grads.begin(), grads.end());
      const bool overflow = !std::isfinite(loss) || !backend.all_finite(checked);
      record.skipped = !scaler.update(overflow);
      if (!record.skipped)
        for (Tensor* g : grads) backend.scale(*g, 1.0 / record.loss_scale);
    }
    if (record.skipped) record.grad_norm = std::numeric_limits<double>::infinity();
    else record.grad_norm = optimizer.step(params, grads, lr);
    for (const auto& [init, out] : tg.state_updates) {  // BatchNorm running statistics
      Tensor* target = executor.param(init);
      const Tensor& value = output_named(outputs, out);
      if (target && target->bytes() == value.bytes()) backend.copy(value, *target);
    }
    record.step = step + 1;
    record.loss = loss;
    record.lr = lr;
    record.seconds = seconds_since(step_start);
    record.samples_per_s = static_cast<double>(options.batch) / std::max(record.seconds, 1e-9);
    record.tokens_per_s = record.samples_per_s * static_cast<double>(tokens_per_sample(batch));
    result.steps.push_back(record);
    if (on_step) on_step(record);
    const bool periodic = options.save_every > 0 && record.step % options.save_every == 0 && record.step < options.steps;
    // A stop request (train/preemption.h) ends the run after the step it came in, with that step checkpointed.
    const int stop = record.step < options.steps ? stop_requested() : 0;
    if (!options.checkpoint_dir.empty() && (periodic || stop)) save_checkpoint(record.step);
    if (stop) {
      result.stopped_by_signal = stop;
      break;
    }
  }
  result.seconds = seconds_since(run_start);
  if (!result.steps.empty())
    result.samples_per_s = static_cast<double>(options.batch * static_cast<int64_t>(result.steps.size())) / result.seconds;

  if (result.stopped_by_signal) return result;  // not trained to the end: no final checkpoint or model
  if (!options.checkpoint_dir.empty()) save_checkpoint(options.steps);
  if (!options.save_model.empty()) save_trained_model(options, model_path, tg, names, params, executor, backend);
  return result;
}

}  // namespace apart
