// `apart partition`: plan pipeline stages × data-parallel replicas for a model on a cluster, write plan/.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>

#include "cli/cli_common.h"
#include "cli/command_registry.h"
#include "codegen/plan_writer.h"
#include "graph/error.h"
#include "graph/text.h"
#include "importer/importer.h"
#include "partition/baselines.h"
#include "partition/partition.h"
#include "profiler/cost_model.h"
#include "profiler/costs_json.h"
#include "profiler/device.h"

namespace apart::cli {
namespace {

struct PartitionArgs {
  std::string model;
  ModelFlags model_flags;
  int devices = 1;
  std::string device = "a100-80gb";
  std::string cluster;
  int devices_per_node = 8;
  std::string memory_reserve;  // "" = the cluster file's, else default_memory_reserve()
  int64_t batch = 0;
  std::string optimizer = "adam";
  std::string precision = "auto";
  std::string schedule = "auto";
  std::string microbatches = "auto";
  std::string stages = "auto";
  std::string replicas = "auto";
  std::string recompute = "auto";
  std::string overlap_allreduce = "on";
  std::string profile;
  std::string profile_device_mismatch = "error";
  double time_limit = 0;
  std::string method = "apart";
  int blocks = 0;
  bool dot_detail = false;
  bool no_stage_models = false;
  bool no_baselines = false;
  std::string output;
  bool force = false;
};

// stage_K.onnx keeps the batch dim symbolic when partition bound it itself (the batch rule, not --dim/--shape):
// the model imported again at another batch size shows which dims scale with it. Static when the user pinned
// the shapes, the model has no dynamic batch, or it does not import at another batch size (a note says so).
StageShapes stage_shapes(const std::string& model_path, const ModelFlags& flags, const ImportedModel& model) {
  if (!model.batch_from_flag || model.batch < 1) return {};
  // An unnamed batch dim gets the conventional name in the stage files.
  const std::string symbol = model.batch_dim.ends_with("[0]") ? std::string(kBatchDimNames[0]) : model.batch_dim;
  ImportOptions probe = import_options(flags);
  const int64_t probe_batch = 2 * model.batch + 1;
  probe.batch = probe_batch;
  try {
    StageShapes shapes = symbolic_batch_shapes(model.graph, model.batch, import_model(model_path, probe).graph,
                                               probe_batch, symbol);
    for (const auto& note : shapes.notes) std::fprintf(stderr, "apart: note: stage files: %s\n", printable(note).c_str());
    return shapes;
  } catch (const Error& e) {
    std::fprintf(stderr, "apart: note: stage files keep static shapes: the model does not import at %s=%lld: %s\n",
                 printable(symbol).c_str(), static_cast<long long>(probe_batch), printable(e.what()).c_str());
    return {};
  }
}

std::optional<int64_t> auto_or_int(const std::string& flag, const std::string& text) {
  if (text == "auto") return std::nullopt;
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  throw InvalidArgument(flag + " " + text + ": expected a positive integer or auto");
}

void run_partition(const PartitionArgs& a) {
  if (a.batch < 1) throw InvalidArgument("--batch is required and must be positive");
  if (a.profile_device_mismatch != "error" && a.profile_device_mismatch != "ok")
    throw InvalidArgument("--profile-device-mismatch " + a.profile_device_mismatch + ": expected error or ok");
  PartitionOptions o;
  o.method = parse_method(a.method);
  o.training.global_batch = a.batch;
  o.training.optimizer = profiler::parse_optimizer(a.optimizer);
  if (a.schedule != "auto") o.stage.schedule = parse_schedule(a.schedule);
  if (auto m = auto_or_int("--microbatches", a.microbatches)) o.stage.microbatches = *m;
  if (auto s = auto_or_int("--stages", a.stages)) o.stage.stages = static_cast<int>(*s);
  if (auto r = auto_or_int("--replicas", a.replicas)) o.stage.replicas = static_cast<int>(*r);
  o.stage.recompute = parse_recompute(a.recompute);
  if (a.overlap_allreduce != "on" && a.overlap_allreduce != "off")
    throw InvalidArgument("--overlap-allreduce must be on or off, not '" + a.overlap_allreduce + "'");
  o.training.overlap_allreduce = a.overlap_allreduce == "on";
  o.stage.time_limit_s = a.time_limit;
  o.block.blocks = a.blocks;

  Cluster cluster = a.cluster.empty() ? make_cluster(device_preset(a.device), a.devices, a.devices_per_node)
                                      : load_cluster_json(a.cluster);
  if (!a.memory_reserve.empty()) {
    cluster.reserve = parse_memory_reserve(a.memory_reserve);
    cluster.validate();
  }
  o.training.precision = resolve_precision(a.precision, cluster.device);
  o.cluster.device = cluster.device.name;
  o.cluster.devices = cluster.devices;
  o.cluster.devices_per_node = cluster.devices_per_node;
  o.cluster.memory_bytes = cluster.usable_memory_bytes();
  o.cluster.device_memory_bytes = cluster.device.memory_bytes;
  o.cluster.memory_reserve_bytes = cluster.reserve.bytes(cluster.device.memory_bytes);
  o.cluster.memory_reserve = cluster.reserve.text();
  o.cluster.intra_node_bandwidth = cluster.intra_node.bandwidth;
  o.cluster.inter_node_bandwidth = cluster.inter_node.bandwidth;
  o.cluster.intra_node_latency_s = cluster.intra_node.latency_s;
  o.cluster.inter_node_latency_s = cluster.inter_node.latency_s;
  o.validate();

  // The plan scales every cost with the micro-batch, so the model is read at batch 1 (the importer's batch
  // rule) unless --dim/--shape bind its batch dim; the global batch (--batch) is the plan's, not the import's.
  ImportOptions import = import_options(a.model_flags);
  import.batch = 1;
  const ImportedModel model = import_model(a.model, import);
  std::vector<InputFile> inputs = model_inputs(a.model, model);
  if (!a.profile.empty()) inputs.push_back({"the --profile costs file", a.profile});
  if (!a.cluster.empty()) inputs.push_back({"the cluster file", a.cluster});
  check_plan_directory(a.output, inputs, a.force);  // before the search: a refused -o costs nothing
  CostOptions cost_options;
  cost_options.precision = o.training.precision;
  cost_options.reference_batch = model.batch > 0 ? model.batch : bound_batch_size(model.graph);
  o.atomic.graph_batch = cost_options.reference_batch;

  // Costs at two micro-batch sizes around the plausible ones, so per-kernel overheads stay fixed (affine fit);
  // a measured profile is used as given (times ∝ micro-batch size).
  CostTable primary, secondary;
  const CostTable* other = nullptr;
  if (!a.profile.empty()) {
    primary = read_costs_json(a.profile, model.graph);
    if (primary.device != cluster.device.name) {
      if (a.profile_device_mismatch == "error")
        throw InvalidArgument("--profile " + a.profile + " was measured on device '" + primary.device +
                              "', but the cluster's device is '" + cluster.device.name + "': its times do not hold there; "
                              "measure on '" + cluster.device.name + "' (apart costs/profile --device), or pass "
                              "--profile-device-mismatch ok to use them anyway");
      std::fprintf(stderr, "apart: warning: --profile %s is from device '%s', the cluster's is '%s' (--profile-device-mismatch ok)\n",
                   a.profile.c_str(), primary.device.c_str(), cluster.device.name.c_str());
    }
  } else {
    const int64_t u1 = std::max<int64_t>(1, a.batch / std::max(1, o.cluster.devices));
    cost_options.microbatch_size = u1;
    primary = estimate_costs(model.graph, cluster.device, cost_options);
    cost_options.microbatch_size = 4 * u1;
    secondary = estimate_costs(model.graph, cluster.device, cost_options);
    other = &secondary;
    for (const auto& w : primary.warnings) std::fprintf(stderr, "apart: warning: %s\n", printable(w).c_str());
  }

  const bool tty = ::isatty(STDERR_FILENO);
  ProgressFn progress;
  if (tty)
    progress = [](const std::string& line) {
      std::fprintf(stderr, "\r\033[K%s", line.c_str());
      std::fflush(stderr);
    };
  const Plan plan = partition_graph(model.graph, primary, o, other, progress);
  if (tty) std::fprintf(stderr, "\r\033[K");

  // --method apart: every method on the same inputs, for plan/baselines.json (apart's own row is this plan).
  std::vector<MethodResult> comparison;
  const bool baselines = o.method == Method::kApart && !a.no_baselines;
  if (baselines) {
    if (tty) std::fprintf(stderr, "partition: running the baselines for baselines.json (--no-baselines skips)");
    comparison = compare_methods(model.graph, primary, o, other, &plan);
    if (tty) std::fprintf(stderr, "\r\033[K");
  }

  const ModelInfo info = describe_model(model.graph, a.model);
  PlanOutputs outputs;
  outputs.inputs = inputs;
  outputs.force = a.force;
  outputs.dot_detail = a.dot_detail;
  outputs.stage_models = !a.no_stage_models;
  if (outputs.stage_models) outputs.stage_shapes = stage_shapes(a.model, a.model_flags, model);
  outputs.extra = [&](const std::filesystem::path& dir) {
    // costs.json at the plan's micro-batch size, as the plan's stages see it.
    if (!a.profile.empty()) {
      write_costs_json(dir / "costs.json", model.graph, rescale_costs(primary, model.graph, plan.microbatch_size));
    } else {
      CostOptions at_plan = cost_options;
      at_plan.microbatch_size = plan.microbatch_size;
      write_costs_json(dir / "costs.json", model.graph, estimate_costs(model.graph, cluster.device, at_plan));
    }
    if (baselines)
      write_file_atomically(dir / "baselines.json", baselines_json(comparison, o.training.global_batch,
                                                                   o.cluster.devices));
  };
  write_plan_directory(a.output, plan, model.graph, a.model, info, outputs);
  std::cout << plan_report(plan, model.graph, info) << "wrote " << a.output << (a.output.ends_with('/') ? "" : "/") << " (plan.json, plan.dot, report.txt"
            << (outputs.stage_models ? ", stage_K.onnx" : "") << ", costs.json" << (baselines ? ", baselines.json" : "")
            << ")\n";
  if (baselines) {
    std::cout << "\nmethod              iteration  × apart  stages  devices\n";
    for (const MethodResult& r : comparison) {
      if (!r.feasible) {
        std::printf("%-15s  infeasible\n", std::string(method_name(r.method)).c_str());
        continue;
      }
      std::printf("%-15s  %12s  %7.3f  %6d  %7d\n", std::string(method_name(r.method)).c_str(),
                  format_seconds(r.iteration_s).c_str(),
                  r.iteration_s / plan.simulated.iteration_s, r.stages, r.devices_used);
    }
  }
}

const bool kRegistered = register_command({"partition", 50, [](CLI::App& app) {
  auto a = std::make_shared<PartitionArgs>();
  CLI::App* cmd = app.add_subcommand("partition",
      "Split a model into pipeline stages with data-parallel replicas (Tanaka et al., IPDPS 2021) and write a plan");
  cmd->add_option("model", a->model, "ONNX model file")->required();
  add_model_flags(*cmd, a->model_flags);
  cmd->add_option("--devices", a->devices, "Number of devices")->capture_default_str();
  cmd->add_option("--device", a->device, "Device preset: v100-32gb, a100-40gb, a100-80gb, h100-80gb, h200-141gb, cpu")
      ->capture_default_str();
  cmd->add_option("--devices-per-node", a->devices_per_node, "Devices per node")->capture_default_str();
  cmd->add_option("--memory-reserve", a->memory_reserve,
                  "Memory kept free on every device for the CUDA context, NCCL buffers and fragmentation: a size, a "
                  "percentage of the device or both (0, 4GiB, 10%, 2GiB+5%); default 2GiB+5% (or the --cluster file's)");
  cmd->add_option("--cluster", a->cluster, "Cluster JSON (apart.cluster/1); replaces --device/--devices/--devices-per-node");
  cmd->add_option("--batch", a->batch,
                  "Global batch size (samples per iteration); the model itself is read at batch 1 (its batch dim: "
                  "a dim named batch, batch_size or N, else the first input's leading dim) unless --dim/--shape bind it")
      ->required();
  cmd->add_option("--optimizer", a->optimizer, "adam, momentum or sgd")->capture_default_str();
  cmd->add_option("--precision", a->precision, kPrecisionHelp)->capture_default_str();
  cmd->add_option("--schedule", a->schedule, "1f1b, gpipe or auto")->capture_default_str();
  cmd->add_option("--microbatches", a->microbatches, "Micro-batches per iteration, or auto")->capture_default_str();
  cmd->add_option("--stages", a->stages, "Pipeline stages, or auto")->capture_default_str();
  cmd->add_option("--replicas", a->replicas, "Replicas of every stage, or auto (per stage, any count)")->capture_default_str();
  cmd->add_option("--recompute", a->recompute, "Activation recomputation: auto, on or off")->capture_default_str();
  cmd->add_option("--overlap-allreduce", a->overlap_allreduce,
                  "on: gradients all-reduce in 25 MB buckets during the last backward (as PyTorch DDP); off: after it")
      ->capture_default_str();
  cmd->add_option("--profile", a->profile, "Per-task costs from apart.costs/1 JSON (apart costs/profile) instead of the analytic model");
  cmd->add_option("--profile-device-mismatch", a->profile_device_mismatch,
                  "error: refuse a --profile measured on another device than the cluster's; ok: use it with a warning")
      ->capture_default_str();
  cmd->add_option("--time-limit", a->time_limit, "Stop searching after this many seconds and keep the best plan so far");
  cmd->add_option("--method", a->method,
                  "apart, or a baseline on the same cost model: uniform (even task split), params (parameter-balanced), "
                  "gpipe-balance (torchgpipe balance_by_time), pipedream (PipeDream's DP), metis (METIS k-way)")
      ->capture_default_str();
  cmd->add_flag("--no-baselines", a->no_baselines, "With --method apart: skip plan/baselines.json (every method compared)");
  cmd->add_option("--blocks", a->blocks, "Blocks k for the stage DP (default automatic)");
  cmd->add_flag("--dot-detail", a->dot_detail, "plan.dot with every task instead of one node per stage");
  cmd->add_flag("--no-stage-models", a->no_stage_models, "Skip writing stage_K.onnx");
  cmd->add_option("-o,--output", a->output,
                  "Plan directory (written as a whole or not at all); an existing one is replaced only when apart "
                  "wrote it, or is empty")->required();
  cmd->add_flag("--force", a->force,
                "Replace an existing -o folder apart did not write (never the working folder, one above it, one "
                "holding an input, or a symlink)");
  cmd->callback([a] { run_partition(*a); });
}});

}  // namespace
}  // namespace apart::cli
