// `apart partition`: plan pipeline stages × data-parallel replicas for a model on a cluster, write plan/.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "cli/cli_common.h"
#include "cli/command_registry.h"
#include "driver/compile.h"
#include "graph/checked.h"
#include "graph/error.h"
#include "graph/text.h"
#include "graph/threads.h"

namespace apart::cli {
namespace {

struct PartitionArgs {
  std::string model;
  ModelFlags model_flags;
  LossFlags loss;
  int64_t devices = 1;
  std::string device = "a100-80gb";
  std::string cluster;
  int64_t devices_per_node = 8;
  std::string memory_reserve;  // "" = the cluster file's, else default_memory_reserve()
  int64_t batch = 0;
  std::string optimizer = "adamw";  // as apart train; apart run takes the plan's
  std::string precision = "auto";
  std::string attention = "flash";
  std::string schedule = "1f1b";
  int64_t virtual_stages = 0;  // 0: kDefaultVirtualStages under --schedule interleaved
  std::string microbatches = "auto";
  int64_t micro_batch_size = 0;  // 0: not given (--microbatches decides)
  std::string stages = "auto";
  std::string replicas = "auto";
  std::string recompute = "auto";
  std::string zero = "0";
  std::string target;
  std::string tp = "1";
  std::string overlap_allreduce = "on";
  std::string sequence_parallel = "on";
  std::string profile;
  std::string profile_device_mismatch = "error";
  double time_limit = 0;
  std::string method = "apart";
  int64_t blocks = 0;
  bool dot_detail = false;
  bool no_stage_models = false;
  bool no_baselines = false;
  std::string output;
  bool force = false;
  int64_t threads = 0;  // 0: APART_NUM_THREADS, OMP_NUM_THREADS or the cores
  bool quiet = false;
};

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

// --micro-batch-size u (samples per GPU per micro-batch, Megatron-LM's) as the micro-batch count it means:
// m = batch / (replicas × u), so it needs the replicas (--dp) and u must divide the per-replica batch.
int microbatches_for(const PartitionArgs& a, std::optional<int> replicas) {
  const int64_t u = checked_integer(a.micro_batch_size, 1, a.batch, "--micro-batch-size");
  if (a.microbatches != "auto")
    throw InvalidArgument("--micro-batch-size and --microbatches " + a.microbatches + " both set the micro-batch: give "
                          "one (micro-batches = batch / (replicas × micro-batch size))");
  if (!replicas)
    throw InvalidArgument("--micro-batch-size " + std::to_string(u) + " needs --dp N: the samples per GPU are the "
                          "per-replica batch (--batch / --dp) split into micro-batches; with --dp auto give "
                          "--microbatches instead");
  if (a.batch % *replicas != 0)
    throw InvalidArgument("--batch " + std::to_string(a.batch) + " does not split evenly among --dp " +
                          std::to_string(*replicas) + " replicas; pick a --dp that divides it");
  const int64_t per_replica = a.batch / *replicas;
  if (per_replica % u != 0)
    throw InvalidArgument("--micro-batch-size " + std::to_string(u) + " does not divide the per-replica batch " +
                          std::to_string(per_replica) + " (--batch " + std::to_string(a.batch) + " / --dp " +
                          std::to_string(*replicas) + "); use a divisor of " + std::to_string(per_replica));
  return static_cast<int>(per_replica / u);
}

// Flags → CompileOptions (every parse error names its flag, every number is range-checked).
CompileOptions compile_options(const PartitionArgs& a) {
  checked_integer(a.batch, 1, limits::kMaxBatch, "--batch");
  if (a.profile_device_mismatch != "error" && a.profile_device_mismatch != "ok")
    throw InvalidArgument("--profile-device-mismatch " + a.profile_device_mismatch + ": expected error or ok");
  CompileOptions c;
  PartitionOptions& o = c.partition;
  o.method = parse_method(a.method);
  o.training.global_batch = a.batch;
  o.training.optimizer = parse_optimizer(a.optimizer);
  o.stage.schedule = a.schedule == "auto" ? std::nullopt : std::optional<Schedule>(parse_schedule(a.schedule));
  // Range-checked here against the type's range; PartitionOptions::validate checks it against the schedule.
  o.stage.virtual_stages = checked_int(a.virtual_stages, 0, limits::kMaxVirtualStages,
                                       "--virtual-stages (chunks per device under --schedule interleaved; 0: default)");
  if (auto m = auto_or_int("--microbatches", a.microbatches, a.batch)) o.stage.microbatches = *m;
  if (auto s = auto_or_int("--stages", a.stages, limits::kMaxDevices)) o.stage.stages = static_cast<int>(*s);
  if (auto r = auto_or_int("--replicas", a.replicas, limits::kMaxDevices)) o.stage.replicas = static_cast<int>(*r);
  if (a.micro_batch_size != 0) o.stage.microbatches = microbatches_for(a, o.stage.replicas);
  o.stage.recompute = parse_recompute(a.recompute);
  o.stage.zero = parse_zero(a.zero);
  o.stage.tp = parse_tp(a.tp);
  if (!a.target.empty()) o.stage.target = parse_engine(a.target, "--target");
  if (a.overlap_allreduce != "on" && a.overlap_allreduce != "off")
    throw InvalidArgument("--overlap-allreduce must be on or off, not '" + a.overlap_allreduce + "'");
  o.training.overlap_allreduce = a.overlap_allreduce == "on";
  if (a.sequence_parallel != "on" && a.sequence_parallel != "off")
    throw InvalidArgument("--sequence-parallel must be on or off, not '" + a.sequence_parallel + "'");
  o.training.sequence_parallel = a.sequence_parallel == "on";
  o.training.attention = parse_attention_kernel(a.attention);
  o.stage.time_limit_s = checked_number(a.time_limit, 0, limits::kMaxSeconds, "--time-limit (seconds; 0: none)");
  o.block.blocks = checked_int(a.blocks, 0, limits::kMaxBatch, "--blocks (0: automatic)");
  o.threads = checked_int(a.threads, 0, kMaxThreads, "--threads (0: APART_NUM_THREADS, OMP_NUM_THREADS or the cores)");

  c.model = a.model;
  c.import = import_options(a.model_flags);
  apply_loss_flags(a.loss, LossFlagUse::kFormOnly, c.import.loss);
  c.cluster.device = a.device;
  c.cluster.devices = checked_int(a.devices, 1, limits::kMaxDevices, "--devices");
  c.cluster.devices_per_node = checked_int(a.devices_per_node, 1, limits::kMaxDevices, "--devices-per-node");
  c.cluster.file = a.cluster;
  if (!a.memory_reserve.empty()) c.cluster.memory_reserve = parse_memory_reserve(a.memory_reserve);
  if (a.precision != "auto") c.precision = parse_precision(a.precision);
  c.profile = a.profile;
  c.profile_device_mismatch = a.profile_device_mismatch == "ok" ? ProfileDeviceMismatch::kWarn : ProfileDeviceMismatch::kError;
  c.baselines = !a.no_baselines;
  c.output = PlanFiles{a.output, a.force, !a.no_stage_models, a.dot_detail};
  return c;
}

// Runs shorter than this print no progress lines.
constexpr double kQuietSeconds = 2;

void run_partition(const PartitionArgs& a) {
  CompileOptions options = compile_options(a);
  // Warnings and notes as they come; progress lines (the phase, candidates, the best so far) once the run has taken
  // kQuietSeconds, none under -q: on a terminal one line rewritten in place, in a log one every 10 s.
  Progress progress("partition");
  const auto start = std::chrono::steady_clock::now();
  options.on_message = [&](CompileMessage kind, const std::string& text) {
    if (kind == CompileMessage::kProgress) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!a.quiet && elapsed >= kQuietSeconds) progress(text);
      return;
    }
    progress.finish();
    std::fprintf(stderr, "apart: %s: %s\n", kind == CompileMessage::kWarning ? "warning" : "note", printable(text).c_str());
  };
  const CompileResult r = compile(options);
  progress.finish();

  const bool baselines = !r.baselines.empty();
  std::cout << plan_report(r.document, r.model.graph, ReportFor::kTerminal) << "wrote " << a.output << (a.output.ends_with('/') ? "" : "/")
            << " (plan.json, plan.dot, report.txt" << (options.output->stage_models ? ", stage_K.onnx" : "")
            << ", costs.json" << (baselines ? ", baselines.json" : "") << ")\n";
  if (baselines) {
    std::cout << "\nmethod              iteration  × apart  stages  devices\n";
    for (const MethodResult& m : r.baselines) {
      if (!m.feasible) {
        std::printf("%-15s  infeasible\n", std::string(method_name(m.method)).c_str());
        continue;
      }
      std::printf("%-15s  %12s  %7.3f  %6d  %7d\n", std::string(method_name(m.method)).c_str(),
                  format_seconds(m.iteration_s).c_str(), m.iteration_s / r.plan.simulated.iteration_s, m.stages,
                  m.devices_used);
    }
  }
}

const bool kRegistered = register_command({"partition", 50, [](CLI::App& app) {
  auto a = std::make_shared<PartitionArgs>();
  CLI::App* cmd = app.add_subcommand("partition",
      "Split a model into pipeline stages with data-parallel replicas (Tanaka et al., IPDPS 2021) and write a plan");
  cmd->add_option("model", a->model, "ONNX model file")->required();
  add_model_flags(*cmd, a->model_flags);
  add_loss_flags(*cmd, a->loss, LossFlagUse::kFormOnly);
  cmd->add_option("--devices", a->devices, "Number of devices")->capture_default_str();
  cmd->add_option("--device", a->device, device_flag_help())->capture_default_str();
  cmd->add_option("--devices-per-node", a->devices_per_node, "Devices per node")->capture_default_str();
  cmd->add_option("--memory-reserve", a->memory_reserve,
                  "Memory kept free on every device for the CUDA context, NCCL buffers and fragmentation: a size, a "
                  "percentage of the device or both (0, 4GiB, 10%, 2GiB+5%); default 2GiB+5% (or the --cluster file's)");
  cmd->add_option("--cluster", a->cluster, "Cluster JSON (apart.cluster/1); replaces --device/--devices/--devices-per-node");
  cmd->add_option("--batch", a->batch,
                  "Global batch size (samples per iteration); the model itself is read at batch 1 (its batch dim: "
                  "a dim named batch, batch_size or N, else the first input's leading dim) unless --dim/--shape bind it")
      ->required();
  cmd->add_option("--optimizer", a->optimizer,
                  "sgd, momentum, adam or adamw: sizes the optimizer state (apart run trains with it)")
      ->capture_default_str();
  cmd->add_option("--precision", a->precision, kPrecisionHelp)->capture_default_str();
  cmd->add_option("--attention", a->attention, kAttentionHelp)->capture_default_str();
  cmd->add_option("--schedule", a->schedule,
                  "1f1b, gpipe, interleaved, zb-h1 or auto (auto: the fastest of 1f1b, zb-h1 and interleaved "
                  "at 2-4 chunks; apart run executes each of them)")
      ->capture_default_str();
  cmd->add_option("--virtual-stages", a->virtual_stages,
                  "Chunks per device under --schedule interleaved, 2 to 64 (0: 2; under auto 0: 2 to 4); m must be a "
                  "multiple of the stages")
      ->capture_default_str();
  cmd->add_option("--microbatches", a->microbatches,
                  "Micro-batches per iteration (gradient-accumulation steps), or auto")->capture_default_str();
  cmd->add_option("--micro-batch-size", a->micro_batch_size,
                  "Samples per GPU per micro-batch (Megatron-LM's --micro-batch-size), instead of --microbatches: "
                  "needs --dp N and must divide the per-replica batch --batch / --dp");
  cmd->add_option("--stages,--pp", a->stages, "Pipeline stages (pipeline-parallel degree), or auto")->capture_default_str();
  cmd->add_option("--replicas,--dp", a->replicas,
                  "Data-parallel replicas of every stage, or auto (per stage, any count)")->capture_default_str();
  cmd->add_option("--tp", a->tp,
                  "Tensor-parallel degree of every stage: 1, 2, 4 or 8 devices of one node per replica, or auto (per "
                  "stage, among the degrees dividing --devices-per-node); apart run executes them, the stages' degrees alike or not")
      ->capture_default_str();
  cmd->add_option("--recompute", a->recompute,
                  "Activation recomputation: auto (per stage: none, the attention cores or the whole forward, as "
                  "memory needs), on (every stage's whole forward), selective (every stage's attention cores) or off")
      ->capture_default_str();
  cmd->add_option(
         "--sequence-parallel", a->sequence_parallel,
         "on: stages with --tp > 1 shard the norms, residuals and dropouts between the tensor-parallel regions "
         "along the sequence (Megatron-LM's sequence parallelism); off: they "
         "run replicated")
      ->capture_default_str();
  cmd->add_option("--zero", a->zero,
                  "ZeRO stage of every stage with replicas: 0 (none), 1 (optimizer state), 2 (+ gradients), "
                  "3 (+ weights), or auto (per stage)")
      ->capture_default_str();
  cmd->add_option("--target", a->target,
                  "megatron, torchtitan, torch-pipelining or deepspeed: only plans that engine runs exactly (one TP "
                  "and DP degree on every stage, whole-layer cuts, its schedules, ZeRO stages and recomputation), for "
                  "apart export; report.txt compares it with the unrestricted plan");
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
  cmd->add_option("--threads", a->threads,
                  "Threads for the search and the plan files (the plan is the same for any count); default "
                  "APART_NUM_THREADS or OMP_NUM_THREADS, else the cores");
  cmd->add_flag("-q,--quiet", a->quiet, "No progress lines (they start once a run takes 2 s)");
  cmd->add_flag("--force", a->force,
                "Replace an existing -o folder apart did not write (never the working folder, one above it, one "
                "holding an input, or a symlink)");
  cmd->callback([a] { run_partition(*a); });
}});

}  // namespace
}  // namespace apart::cli
