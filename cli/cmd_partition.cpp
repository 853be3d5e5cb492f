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
#include "graph/checked.h"
#include "graph/error.h"
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
  int64_t devices = 1;
  std::string device = "a100-80gb";
  std::string cluster;
  int64_t devices_per_node = 8;
  int64_t batch = 0;
  std::string optimizer = "adam";
  std::string precision = "fp32";
  std::string schedule = "auto";
  std::string microbatches = "auto";
  std::string stages = "auto";
  std::string replicas = "auto";
  std::string recompute = "auto";
  std::string overlap_allreduce = "on";
  std::string profile;
  double time_limit = 0;
  std::string method = "apart";
  int64_t blocks = 0;
  bool dot_detail = false;
  bool no_stage_models = false;
  bool no_baselines = false;
  std::string output;
};

// Names a batch dim goes by; with no --dim/--shape, partition binds the first one the model declares to 1.
constexpr const char* kBatchSymbols[] = {"batch", "batch_size", "N"};

// stage_K.onnx keeps a batch dim that partition bound itself symbolic: the model imported again with it bound
// to another size shows which dims scale with it. Static when the user pinned the shapes, the model has no
// symbolic batch, or it does not import at another batch size (then a note says so).
StageShapes stage_shapes(const std::string& model_path, const ModelFlags& flags, const ImportedModel& model,
                         const std::string& batch_symbol) {
  if (batch_symbol.empty()) return {};
  int64_t batch = 0;
  for (const auto& b : model.bindings)
    if (b.dim == batch_symbol) batch = b.value;
  ImportOptions probe = import_options(flags);
  const int64_t probe_batch = 2 * batch + 1;
  probe.dims[batch_symbol] = probe_batch;
  try {
    StageShapes shapes = symbolic_batch_shapes(model.graph, batch, import_model(model_path, probe).graph, probe_batch,
                                               batch_symbol);
    for (const auto& note : shapes.notes) std::fprintf(stderr, "apart: note: stage files: %s\n", note.c_str());
    return shapes;
  } catch (const Error& e) {
    std::fprintf(stderr, "apart: note: stage files keep static shapes: the model does not import at %s=%lld: %s\n",
                 batch_symbol.c_str(), static_cast<long long>(probe_batch), e.what());
    return {};
  }
}

std::optional<int64_t> auto_or_int(const std::string& flag, const std::string& text, int64_t max) {
  if (text == "auto") return std::nullopt;
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size()) return checked_integer(static_cast<int64_t>(v), 1, max, flag + " (or auto)");
  } catch (const std::logic_error&) {  // not a number, or past int64
  }
  throw InvalidArgument(flag + " " + text + ": expected an integer in [1, " + std::to_string(max) + "] or auto");
}

void run_partition(const PartitionArgs& a) {
  checked_integer(a.batch, 1, limits::kMaxBatch, "--batch");
  PartitionOptions o;
  o.method = parse_method(a.method);
  o.training.global_batch = a.batch;
  o.training.optimizer = parse_optimizer(a.optimizer);
  o.training.precision = parse_precision(a.precision);
  if (a.schedule != "auto") o.stage.schedule = parse_schedule(a.schedule);
  if (auto m = auto_or_int("--microbatches", a.microbatches, a.batch)) o.stage.microbatches = *m;
  if (auto s = auto_or_int("--stages", a.stages, limits::kMaxDevices)) o.stage.stages = static_cast<int>(*s);
  if (auto r = auto_or_int("--replicas", a.replicas, limits::kMaxDevices)) o.stage.replicas = static_cast<int>(*r);
  o.stage.recompute = parse_recompute(a.recompute);
  if (a.overlap_allreduce != "on" && a.overlap_allreduce != "off")
    throw InvalidArgument("--overlap-allreduce must be on or off, not '" + a.overlap_allreduce + "'");
  o.training.overlap_allreduce = a.overlap_allreduce == "on";
  o.stage.time_limit_s = checked_number(a.time_limit, 0, limits::kMaxSeconds, "--time-limit (seconds; 0: none)");
  o.block.blocks = checked_int(a.blocks, 0, limits::kMaxBatch, "--blocks (0: automatic)");

  const Cluster cluster = a.cluster.empty()
                              ? make_cluster(device_preset(a.device), checked_int(a.devices, 1, limits::kMaxDevices, "--devices"),
                                             checked_int(a.devices_per_node, 1, limits::kMaxDevices, "--devices-per-node"))
                              : load_cluster_json(a.cluster);
  o.cluster.device = cluster.device.name;
  o.cluster.devices = cluster.devices;
  o.cluster.devices_per_node = cluster.devices_per_node;
  o.cluster.memory_bytes = cluster.device.memory_bytes;
  o.cluster.intra_node_bandwidth = cluster.intra_node.bandwidth;
  o.cluster.inter_node_bandwidth = cluster.inter_node.bandwidth;
  o.cluster.intra_node_latency_s = cluster.intra_node.latency_s;
  o.cluster.inter_node_latency_s = cluster.inter_node.latency_s;
  o.validate();

  // The plan scales every cost with the micro-batch, so a model with a symbolic batch dim needs no flag:
  // it is bound to 1 unless --dim/--shape say otherwise. `batch_symbol` is the dim bound here, if any.
  std::string batch_symbol;
  ImportedModel model = [&] {
    if (a.model_flags.dims.empty() && a.model_flags.shapes.empty())
      for (const char* symbol : kBatchSymbols) {
        ImportOptions import = import_options(a.model_flags);
        import.dims[symbol] = 1;
        try {
          ImportedModel m = import_model(a.model, import);
          batch_symbol = symbol;
          return m;
        } catch (const InvalidArgument&) {
        }
      }
    return import_model(a.model, import_options(a.model_flags));  // as given, or report the model's own complaint
  }();
  CostOptions cost_options;
  cost_options.precision = o.training.precision;
  cost_options.reference_batch = bound_batch_size(model.graph);
  for (const auto& b : model.bindings)
    if (std::find(std::begin(kBatchSymbols), std::end(kBatchSymbols), b.dim) != std::end(kBatchSymbols))
      cost_options.reference_batch = b.value;
  o.atomic.graph_batch = cost_options.reference_batch;

  // Costs at two micro-batch sizes around the plausible ones, so per-kernel overheads stay fixed (affine fit);
  // a measured profile is used as given (times ∝ micro-batch size).
  CostTable primary, secondary;
  const CostTable* other = nullptr;
  if (!a.profile.empty()) {
    primary = read_costs_json(a.profile, model.graph);
  } else {
    const int64_t u1 = std::max<int64_t>(1, a.batch / std::max(1, o.cluster.devices));
    cost_options.microbatch_size = u1;
    primary = estimate_costs(model.graph, cluster.device, cost_options);
    cost_options.microbatch_size = 4 * u1;
    secondary = estimate_costs(model.graph, cluster.device, cost_options);
    other = &secondary;
    for (const auto& w : primary.warnings) std::fprintf(stderr, "apart: warning: %s\n", w.c_str());
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
  outputs.dot_detail = a.dot_detail;
  outputs.stage_models = !a.no_stage_models;
  if (outputs.stage_models) outputs.stage_shapes = stage_shapes(a.model, a.model_flags, model, batch_symbol);
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
    std::cout << "\nmethod           iteration ms  × apart  stages  devices\n";
    for (const MethodResult& r : comparison) {
      if (!r.feasible) {
        std::printf("%-15s  infeasible\n", std::string(method_name(r.method)).c_str());
        continue;
      }
      std::printf("%-15s  %12.3f  %7.3f  %6d  %7d\n", std::string(method_name(r.method)).c_str(), r.iteration_s * 1e3,
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
  cmd->add_option("--cluster", a->cluster, "Cluster JSON (apart.cluster/1); replaces --device/--devices/--devices-per-node");
  cmd->add_option("--batch", a->batch, "Global batch size (samples per iteration)")->required();
  cmd->add_option("--optimizer", a->optimizer, "adam, momentum or sgd")->capture_default_str();
  cmd->add_option("--precision", a->precision, "fp32, tf32 or mixed (fp16/bf16 math, fp32 master weights)")->capture_default_str();
  cmd->add_option("--schedule", a->schedule, "1f1b, gpipe or auto")->capture_default_str();
  cmd->add_option("--microbatches", a->microbatches, "Micro-batches per iteration, or auto")->capture_default_str();
  cmd->add_option("--stages", a->stages, "Pipeline stages, or auto")->capture_default_str();
  cmd->add_option("--replicas", a->replicas, "Replicas of every stage, or auto (per stage, any count)")->capture_default_str();
  cmd->add_option("--recompute", a->recompute, "Activation recomputation: auto, on or off")->capture_default_str();
  cmd->add_option("--overlap-allreduce", a->overlap_allreduce,
                  "on: gradients all-reduce in 25 MB buckets during the last backward (as PyTorch DDP); off: after it")
      ->capture_default_str();
  cmd->add_option("--profile", a->profile, "Per-task costs from apart.costs/1 JSON (apart costs/profile) instead of the analytic model");
  cmd->add_option("--time-limit", a->time_limit, "Stop searching after this many seconds and keep the best plan so far");
  cmd->add_option("--method", a->method,
                  "apart, or a baseline on the same cost model: uniform (even task split), params (parameter-balanced), "
                  "gpipe-balance (torchgpipe balance_by_time), pipedream (PipeDream's DP), metis (METIS k-way)")
      ->capture_default_str();
  cmd->add_flag("--no-baselines", a->no_baselines, "With --method apart: skip plan/baselines.json (every method compared)");
  cmd->add_option("--blocks", a->blocks, "Blocks k for the stage DP (default automatic)");
  cmd->add_flag("--dot-detail", a->dot_detail, "plan.dot with every task instead of one node per stage");
  cmd->add_flag("--no-stage-models", a->no_stage_models, "Skip writing stage_K.onnx");
  cmd->add_option("-o,--output", a->output, "Plan directory (written as a whole or not at all)")->required();
  cmd->callback([a] { run_partition(*a); });
}});

}  // namespace
}  // namespace apart::cli
