// apart::compile: the whole compile path (import → bind batch → costs → partition → baselines → plan files).
#include "driver/compile.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <future>
#include <map>

#include "codegen/stage_graphs.h"
#include "codegen/tensor_parallel_shard.h"
#include "graph/atomic_file.h"
#include "graph/error.h"
#include "graph/text.h"
#include "importer/fold.h"
#include "importer/model_proto.h"
#include "partition/plan_document.h"
#include "partition/tensor_parallel.h"
#include "plan/cluster_json.h"
#include "partition/virtual_stages.h"
#include "plan/costs_json.h"
#include "plan/model_location.h"
#include "plan/plan_summary.h"

namespace apart {
namespace {

// Runs `phase`, adding its wall-clock and CPU seconds to `time`.
template <class Phase>
void timed(PhaseTime& time, Phase&& phase) {
  const auto wall_start = std::chrono::steady_clock::now();
  const std::clock_t cpu_start = std::clock();
  phase();
  time.cpu_s += static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  time.wall_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
}

void tell(const CompileOptions& options, CompileMessage kind, const std::string& text) {
  if (options.on_message) options.on_message(kind, text);
}

// The --dim bindings plan.json keeps for its later readers: all but the batch's, which each binds at its micro-batch.
std::map<std::string, int64_t> planned_dims(const ImportOptions& import, const ImportedModel& model) {
  std::map<std::string, int64_t> dims = import.dims;
  dims.erase(model.batch_dim);
  return dims;
}

// The regions --tp may split that apart run's shard pass refuses to cut (codegen's tp_refused_regions, the one test
// both share), at each degree the search may give them: their seeds banned from the search, each named in a note.
std::vector<std::string> tp_banned_seeds(const CompileOptions& options, const PartitionOptions& partition,
                                         const ImportedModel& model) {
  if (partition.stage.tp && *partition.stage.tp <= 1) return {};
  const TensorParallelRegions found = find_tensor_parallel_regions(model.graph);
  if (found.regions.empty()) return {};
  std::vector<TpShardRegion> regions;
  for (const TpRegion& r : found.regions) regions.push_back(tp_shard_region(plan_tp_region(r, model.graph, true)));
  onnx::ModelProto proto = load_model_proto(options.model, options.import);
  // The --dim bindings but the batch's written into the graph inputs, as stage files hold them (the pass reads the
  // model at batch 1 and knows no flags).
  const std::map<std::string, int64_t> dims = planned_dims(options.import, model);
  for (onnx::ValueInfoProto& in : *proto.mutable_graph()->mutable_input())
    for (auto& d : *in.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim())
      if (const auto it = dims.find(d.dim_param()); d.has_dim_param() && it != dims.end()) d.set_dim_value(it->second);
  // Each degree under sequence parallelism where the search would use it there (stage_cost.cpp).
  std::vector<std::pair<int, TpSequence>> degrees;
  for (int degree : kTpDegrees)
    if (degree > 1 &&
        (partition.stage.tp ? *partition.stage.tp == degree : degree <= partition.cluster.devices_per_node))
      degrees.emplace_back(degree, partition.training.sequence_parallel && tp_sequence_fits(found.sequence, degree)
                                       ? TpSequence::kSharded
                                       : TpSequence::kWhole);
  std::map<std::string, std::string> refused;  // region → why
  for (const TpRefusal& r : tp_refused_regions(proto, regions, degrees))
    refused.emplace(r.region, "at --tp " + std::to_string(r.degree) + ": " + r.why);
  std::vector<std::string> banned;
  for (const TpRegion& r : found.regions) {
    const auto why = refused.find(r.name);
    if (why == refused.end()) continue;
    tell(options, CompileMessage::kNote,
         "tensor-parallel region " + quote(r.name) + " stays whole on every TP rank (" + why->second + ")");
    for (TaskId t : tp_region_seeds(r)) banned.push_back(model.graph.task(t).name);
  }
  return banned;
}

}  // namespace

CompileResult compile(const CompileOptions& options) {
  CompileResult r;
  // ---- Options: the cluster and the search's options, checked before anything is read ----
  r.cluster = resolve_cluster(options.cluster);
  PartitionOptions partition = resolve_partition_options(options, r.cluster);

  // ---- Import: the model at batch 1 by the importer's batch rule; a refused -o costs no search ----
  tell(options, CompileMessage::kProgress, "reading the model");
  timed(r.times.import, [&] { r.model = import_for_plan(options.model, options.import); });
  if (const std::string note = constant_params_note(r.model.constant_params); !note.empty())
    tell(options, CompileMessage::kNote, note);
  if (options.output) check_plan_directory(options.output->directory, compile_inputs(options, r.model), options.output->force);

  // ---- What the plan files need of the model (its hash, the stage files' batch dims): beside the search ----
  // On a thread of its own when there are two: stage_shapes imports the model a second time. Its notes are told
  // once it is done, so that every message reaches on_message from this thread. (A std::async future waits for
  // its thread when destroyed, so an exception here never leaves it running.)
  const int threads = partition.search_threads();
  const bool stage_models = options.output && options.output->stage_models;
  std::vector<std::string> shape_notes;
  StageShapes shapes;
  auto describe = [&] {
    CompileOptions noting = options;
    noting.on_message = [&](CompileMessage, const std::string& note) { shape_notes.push_back(note); };
    r.info = describe_model(r.model.graph, options.model);
    if (stage_models) shapes = stage_shapes(noting, r.model);
  };
  std::future<void> described;
  if (threads > 1) described = std::async(std::launch::async, describe);
  else describe();
  auto wait_described = [&] {
    if (described.valid()) described.get();
    for (const auto& note : shape_notes) tell(options, CompileMessage::kNote, note);
    shape_notes.clear();
  };

  // ---- Costs: analytic at two micro-batch sizes, or the measured profile ----
  tell(options, CompileMessage::kProgress, "costs of " + std::to_string(r.model.graph.num_tasks()) + " tasks");
  timed(r.times.costs, [&] { r.costs = plan_costs(options, partition, r.model, r.cluster); });
  partition.atomic.graph_batch = r.costs.options.reference_batch;
  timed(r.times.partition, [&] { partition.atomic.tp_banned_seeds = tp_banned_seeds(options, partition, r.model); });

  // ---- Partition: atomic → blocks → stage DP → the candidate the simulator finds fastest (partition/) ----
  // With baselines.json, the baseline rows too (apart's search evaluates their splits already).
  ProgressFn progress;
  if (options.on_message) progress = [&](const std::string& line) { tell(options, CompileMessage::kProgress, line); };
  // ---- Baselines: every method on the same inputs, sharing the splits apart's search evaluates ----
  const CostTable* other = r.costs.at_other_size ? &*r.costs.at_other_size : nullptr;
  if (partition.method == Method::kApart && options.baselines && !partition.stage.target) {
    PhaseTime both;
    PlanWithBaselines searched;
    timed(both, [&] { searched = partition_with_baselines(r.model.graph, r.costs.table, partition, other, progress); });
    r.plan = std::move(searched.plan);
    r.baselines = std::move(searched.baselines);
    // The baselines' share of the wall and CPU time, in proportion to their wall seconds.
    const double share = both.wall_s > 0 ? std::min(1.0, searched.baselines_s / both.wall_s) : 0.0;
    r.times.baselines = {both.wall_s * share, both.cpu_s * share};
    r.times.partition = {both.wall_s - r.times.baselines.wall_s, both.cpu_s - r.times.baselines.cpu_s};
  } else {
    timed(r.times.partition,
          [&] { r.plan = partition_by_method(r.model.graph, r.costs.table, partition, other, progress); });
  }

  // ---- --target: the unrestricted search on the same inputs, for what the restriction costs ----
  std::optional<Plan> unrestricted;
  if (partition.stage.target) {
    PartitionOptions free = partition;
    free.stage.target.reset();
    tell(options, CompileMessage::kProgress, "the unrestricted plan, to compare --target with");
    PhaseTime free_time;
    timed(free_time, [&] { unrestricted = partition_by_method(r.model.graph, r.costs.table, free, other, progress); });
    r.times.baselines = free_time;
  }

  // ---- Interleaved: the chunks each device runs (Megatron-LM's layout), cut by the tasks' costs ----
  r.plan.chunks = cut_virtual_stages(r.plan, r.model.graph, r.costs.table);

  // ---- Plan files: written as one folder or not at all ----
  wait_described();
  if (!options.import.constants_as_params) r.info.constants_as_params = false;
  else if (r.model.constant_params.count > 0) r.info.constants_as_params = true;
  r.info.added_loss = added_loss_record(options.import.loss);
  r.info.dims = planned_dims(options.import, r.model);
  describe_work(r.model, r.costs.table, r.info);
  if (options.output) record_model_location(r.info, options.model, options.output->directory);
  r.document = plan_document(r.plan, r.model.graph, r.info);
  if (unrestricted) {
    unrestricted->chunks = cut_virtual_stages(*unrestricted, r.model.graph, r.costs.table);
    r.document.target =
        PlanTarget{std::string(engine_name(*partition.stage.target)), unrestricted->simulated.iteration_s,
                   plan_summary_line(plan_document(*unrestricted, r.model.graph, r.info))};
  }
  for (const std::string& warning : plan_warnings(r.document)) tell(options, CompileMessage::kWarning, warning);
  if (options.output) {
    tell(options, CompileMessage::kProgress, "writing the plan files");
    timed(r.times.files, [&] { write_plan_files(r, options, *options.output, shapes); });
  }
  return r;
}

Cluster resolve_cluster(const ClusterChoice& choice) {
  Cluster cluster = choice.file.empty() ? make_cluster(device_preset(choice.device), choice.devices, choice.devices_per_node)
                                        : load_cluster_json(choice.file);
  if (choice.memory_reserve) {
    cluster.reserve = *choice.memory_reserve;
    cluster.validate();
  }
  return cluster;
}

PartitionOptions resolve_partition_options(const CompileOptions& options, const Cluster& cluster) {
  PartitionOptions o = options.partition;
  o.training.precision = options.precision ? *options.precision : default_precision(cluster.device);
  o.cluster = cluster;
  o.validate();
  return o;
}

ImportedModel import_for_plan(const std::filesystem::path& model, const ImportOptions& import) {
  // The plan scales every cost with the micro-batch, so batch 1 suffices unless --dim/--shape bind the batch dim.
  ImportOptions at_batch = import;
  if (at_batch.batch == 0) at_batch.batch = 1;
  ImportedModel imported = import_model(model, at_batch);
  // An input with a 0-sized dim is legal ONNX (an empty tensor) but gives every task zero work: a plan of 0 s whose
  // ratios divide by zero. Planning refuses it, naming the input.
  for (ValueId v : imported.graph.graph_inputs()) {
    const Value& value = imported.graph.value(v);
    if (value.kind != ValueKind::kInput || !value.shape_known) continue;
    for (size_t axis = 0; axis < value.shape.size(); ++axis)
      if (value.shape[axis] == 0)
        throw InvalidModel(model.string() + ": graph input " + quote(value.name) + " has a 0-sized dim (axis " +
                           std::to_string(axis) + " of " + shape_string(value.shape) +
                           "), an empty tensor: there is no work to partition; export the model with that dim >= 1");
  }
  return imported;
}

PlanCosts plan_costs(const CompileOptions& options, const PartitionOptions& partition, const ImportedModel& model,
                     const Cluster& cluster) {
  PlanCosts costs;
  costs.options.precision = partition.training.precision;
  costs.options.attention = partition.training.attention;
  // The importer's batch rule says what batch the shapes are bound at; a model without a batch dim is one sample.
  costs.options.reference_batch = model.bound_samples();
  if (!options.profile.empty()) {
    // A measured profile is used as given (times ∝ micro-batch size).
    costs.table = read_costs_json(options.profile, model.graph);
    if (costs.table.device != cluster.device.name) {
      const std::string profile = options.profile.string();
      if (options.profile_device_mismatch == ProfileDeviceMismatch::kError)
        throw InvalidArgument("--profile " + profile + " was measured on device '" + costs.table.device +
                              "', but the cluster's device is '" + cluster.device.name + "': its times do not hold there; "
                              "measure on '" + cluster.device.name + "' (apart costs/profile --device), or pass "
                              "--profile-device-mismatch ok to use them anyway");
      tell(options, CompileMessage::kWarning,
           "--profile " + profile + " is from device '" + costs.table.device + "', the cluster's is '" +
               cluster.device.name + "' (--profile-device-mismatch ok)");
    }
    return costs;
  }
  // Two micro-batch sizes around the plausible ones, so per-kernel overheads stay fixed (an affine fit).
  const int64_t u1 = std::max<int64_t>(1, partition.training.global_batch / std::max(1, partition.cluster.devices));
  CostOptions at_u1 = costs.options;
  at_u1.microbatch_size = u1;
  costs.table = estimate_costs(model.graph, cluster.device, at_u1);
  CostOptions at_4u1 = costs.options;
  at_4u1.microbatch_size = 4 * u1;
  costs.at_other_size = estimate_costs(model.graph, cluster.device, at_4u1);
  for (const auto& warning : costs.table.warnings) tell(options, CompileMessage::kWarning, warning);
  if (!model.unknown_shape_values.empty())  // the plan is made, but train and run will refuse the model: say so now
    tell(options, CompileMessage::kWarning, unknown_shapes_warning(model.graph, model.unknown_shape_values));
  return costs;
}

void describe_work(const ImportedModel& model, const CostTable& costs, PlanModel& info) {
  const int64_t samples = model.bound_samples();
  for (ValueId v : model.graph.graph_inputs()) {
    const Value& value = model.graph.value(v);
    const bool integer = value.dtype == DType::kInt64 || value.dtype == DType::kInt32;
    if (value.kind != ValueKind::kInput || !integer || !value.shape_known || value.shape.size() < 2) continue;
    if (value.elements % samples != 0 || value.elements / samples < 2) continue;
    info.tokens_per_sample = value.elements / samples;
    break;
  }
  if (costs.microbatch_size < 1 || costs.tasks.size() != model.graph.num_tasks()) return;
  double flops = 0;
  for (uint32_t t = 0; t < model.graph.num_tasks(); ++t)
    if (!model.graph.task(TaskId(t)).constant) flops += costs.tasks[t].flops + costs.tasks[t].backward_flops;
  if (flops > 0) info.flops_per_sample = flops / static_cast<double>(costs.microbatch_size);
}

CostTable costs_at_plan_size(const CompileResult& result) {
  if (!result.costs.at_other_size)
    return rescale_costs(result.costs.table, result.model.graph, result.plan.microbatch_size);
  CostOptions at_plan = result.costs.options;
  at_plan.microbatch_size = result.plan.microbatch_size;
  return estimate_costs(result.model.graph, result.cluster.device, at_plan);
}

StageShapes stage_shapes(const CompileOptions& options, const ImportedModel& model) {
  // Static when the user pinned the shapes, the model has no dynamic batch, or it does not import at another batch
  // size (a note says so). Otherwise the model imported again at another batch shows which dims scale with it.
  if (!model.batch_from_flag || model.batch < 1) return {};
  // An unnamed batch dim gets the conventional name in the stage files.
  const std::string symbol = model.batch_dim.ends_with("[0]") ? std::string(kBatchDimNames[0]) : model.batch_dim;
  ImportOptions probe = options.import;
  const int64_t probe_batch = 2 * model.batch + 1;
  probe.batch = probe_batch;
  try {
    StageShapes shapes = symbolic_batch_shapes(model.graph, model.batch, import_model(options.model, probe).graph,
                                               probe_batch, symbol);
    for (const auto& note : shapes.notes) tell(options, CompileMessage::kNote, "stage files: " + note);
    return shapes;
  } catch (const Error& e) {
    tell(options, CompileMessage::kNote,
         "stage files keep static shapes: the model does not import at " + symbol + "=" + std::to_string(probe_batch) +
             ": " + e.what());
    return {};
  }
}

std::vector<InputFile> model_files(const std::filesystem::path& path, const ImportedModel& model) {
  std::vector<InputFile> inputs{{"the model", path}};
  for (const auto& file : model.external_data_files) inputs.push_back({"an external-data file of the model", file});
  return inputs;
}

std::vector<InputFile> compile_inputs(const CompileOptions& options, const ImportedModel& model) {
  std::vector<InputFile> inputs = model_files(options.model, model);
  if (!options.profile.empty()) inputs.push_back({"the --profile costs file", options.profile});
  if (!options.cluster.file.empty()) inputs.push_back({"the cluster file", options.cluster.file});
  return inputs;
}

void write_plan_files(const CompileResult& result, const CompileOptions& options, const PlanFiles& output,
                      std::optional<StageShapes> shapes) {
  PlanOutputs outputs;
  outputs.inputs = compile_inputs(options, result.model);
  outputs.force = output.force;
  outputs.dot_detail = output.dot_detail;
  outputs.stage_models = output.stage_models;
  outputs.threads = result.plan.options.search_threads();
  if (outputs.stage_models) outputs.stage_shapes = shapes ? std::move(*shapes) : stage_shapes(options, result.model);
  outputs.extra = [&](const std::filesystem::path& dir) {
    write_costs_json(dir / "costs.json", result.model.graph, costs_at_plan_size(result));
    if (!result.baselines.empty())
      write_file_atomically(dir / "baselines.json", baselines_json(result.baselines, result.plan.options.training.global_batch,
                                                                   result.plan.options.cluster.devices));
  };
  write_plan_directory(output.directory, result.document, result.model.graph, options.model, outputs);
}

}  // namespace apart
