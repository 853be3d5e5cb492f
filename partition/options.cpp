// Names, parsers and validation of the partition options.
#include "partition/options.h"

#include <algorithm>

#include "graph/checked.h"
#include "graph/error.h"
#include "graph/threads.h"

namespace apart {

std::string_view method_name(Method m) {
  switch (m) {
    case Method::kApart: return "apart";
    case Method::kUniform: return "uniform";
    case Method::kParams: return "params";
    case Method::kGpipeBalance: return "gpipe-balance";
    case Method::kPipeDream: return "pipedream";
    case Method::kMetis: return "metis";
  }
  return "?";
}
std::string_view recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kAuto: return "auto";
    case Recompute::kOn: return "on";
    case Recompute::kOff: return "off";
    case Recompute::kSelective: return "selective";
  }
  return "?";
}

Method parse_method(std::string_view t) {
  if (t == "apart") return Method::kApart;
  if (t == "uniform") return Method::kUniform;
  if (t == "params") return Method::kParams;
  if (t == "gpipe-balance") return Method::kGpipeBalance;
  if (t == "pipedream") return Method::kPipeDream;
  if (t == "metis") return Method::kMetis;
  throw InvalidArgument("--method " + std::string(t) +
                        ": expected apart, uniform, params, gpipe-balance, pipedream or metis");
}
Recompute parse_recompute(std::string_view t) {
  if (t == "auto") return Recompute::kAuto;
  if (t == "on") return Recompute::kOn;
  if (t == "off") return Recompute::kOff;
  if (t == "selective") return Recompute::kSelective;
  throw InvalidArgument("--recompute " + std::string(t) + ": expected auto, on, selective or off");
}

std::optional<int> parse_zero(std::string_view t) {
  if (t == "auto") return std::nullopt;
  if (t.size() == 1 && t[0] >= '0' && t[0] <= '0' + kMaxZeroStage) return t[0] - '0';
  throw InvalidArgument("--zero " + std::string(t) + ": expected 0, 1, 2, 3 or auto (the ZeRO stage every stage with "
                        "replicas shards with; auto: the planner chooses per stage)");
}

std::string zero_option_name(std::optional<int> zero) { return zero ? std::to_string(*zero) : "auto"; }

std::optional<int> parse_tp(std::string_view t) {
  if (t == "auto") return std::nullopt;
  for (int tp : kTpDegrees)
    if (t == std::to_string(tp)) return tp;
  throw InvalidArgument("--tp " + std::string(t) + ": expected 1, 2, 4, 8 or auto (the tensor-parallel degree of every "
                        "stage; auto: the planner chooses per stage)");
}

std::string tp_option_name(std::optional<int> tp) { return tp ? std::to_string(*tp) : "auto"; }

void PartitionOptions::validate() const {
  // The documented limits (graph/checked.h, README "Limits"): every count, time, size and rate in range.
  cluster.validate();
  checked_integer(training.global_batch, 1, limits::kMaxBatch, "--batch");
  if (stage.stages) checked_integer(*stage.stages, 1, limits::kMaxDevices, "--stages (or auto)");
  if (stage.schedule == Schedule::kInterleaved || !stage.schedule) {
    // One chunk is 1F1B; more than kMaxVirtualStages only add transfers (graph/checked.h).
    if (stage.virtual_stages != 0)
      checked_integer(stage.virtual_stages, 2, limits::kMaxVirtualStages,
                      "--virtual-stages (chunks per device under --schedule interleaved; 0: " +
                          std::to_string(kDefaultVirtualStages) + ")");
  } else if (stage.virtual_stages != 0) {
    throw InvalidArgument("--virtual-stages " + std::to_string(stage.virtual_stages) +
                          " needs --schedule interleaved or auto (gpipe, 1f1b and zb-h1 run one chunk per device)");
  }
  if (stage.replicas) checked_integer(*stage.replicas, 1, limits::kMaxDevices, "--replicas (or auto)");
  // A micro-batch holds at least one sample.
  if (stage.microbatches) checked_integer(*stage.microbatches, 1, training.global_batch, "--microbatches (at most --batch, or auto)");
  if (stage.zero) checked_integer(*stage.zero, 0, kMaxZeroStage, "--zero (0, 1, 2, 3 or auto)");
  if (stage.zero.value_or(1) > 0 && stage.replicas == 1)
    throw InvalidArgument("--zero " + zero_option_name(stage.zero) +
                          " shards across a stage's data-parallel replicas, and --replicas 1 leaves each stage one; "
                          "give stages replicas (--replicas N > 1 or auto) or use --zero 0");
  if (stage.tp) {
    if (tp_degree_index(*stage.tp) < 0)
      throw InvalidArgument("--tp " + std::to_string(*stage.tp) + ": expected 1, 2, 4, 8 or auto");
    // A tensor-parallel group is devices of one node, and groups tile the node.
    if (cluster.devices_per_node % *stage.tp != 0 || *stage.tp > cluster.devices)
      throw InvalidArgument("--tp " + std::to_string(*stage.tp) + ": a tensor-parallel group is " +
                            std::to_string(*stage.tp) + " devices of one node, and the cluster has " +
                            std::to_string(cluster.devices) + " devices, " + std::to_string(cluster.devices_per_node) +
                            " per node; use a degree dividing the devices per node (or --tp auto)");
  }
  if (stage.target) {
    const EngineCapabilities& can = engine_capabilities(*stage.target);
    const std::string target = "--target " + std::string(engine_name(*stage.target));
    auto offers = [](const auto& list, auto value) { return std::find(list.begin(), list.end(), value) != list.end(); };
    if (method != Method::kApart) throw InvalidArgument(target + " restricts --method apart's search; drop --method");
    if (stage.schedule && stage.stages != 1 && !offers(can.schedules, *stage.schedule))
      throw InvalidArgument(target + ": the engine does not run --schedule " +
                            std::string(schedule_name(*stage.schedule)) + "; use --schedule auto");
    if (stage.zero && !offers(can.zero_stages, *stage.zero))
      throw InvalidArgument(target + ": the engine does not run ZeRO-" + std::to_string(*stage.zero) +
                            " with pipeline parallelism; use --zero auto");
    if (stage.tp && !offers(can.tp_degrees, *stage.tp))
      throw InvalidArgument(target + ": the engine has no tensor parallelism of its own; use --tp 1");
    const RecomputeScope asked = stage.recompute == Recompute::kOn          ? RecomputeScope::kFull
                                 : stage.recompute == Recompute::kSelective ? RecomputeScope::kSelective
                                                                            : RecomputeScope::kNone;
    if (stage.recompute != Recompute::kAuto && !offers(can.recompute, asked))
      throw InvalidArgument(target + ": the engine does not offer --recompute " +
                            std::string(recompute_name(stage.recompute)) + "; use --recompute auto");
  }
  checked_number(stage.time_limit_s, 0, limits::kMaxSeconds, "--time-limit (seconds; 0: none)");
  checked_integer(block.blocks, 0, limits::kMaxBatch, "--blocks (0: automatic)");
  if (!(block.balance_cap >= 1 && block.balance_cap <= 1e6)) throw InvalidArgument("the block balance cap must be in [1, 1e6]");
  checked_integer(threads, 0, kMaxThreads, "--threads (0: APART_NUM_THREADS, OMP_NUM_THREADS or the cores)");
}

int schedule_chunks(Schedule schedule, int virtual_stages) {
  if (schedule != Schedule::kInterleaved) return 1;
  return virtual_stages > 0 ? virtual_stages : kDefaultVirtualStages;
}

int PartitionOptions::search_threads() const { return threads > 0 ? threads : default_thread_count(); }

}  // namespace apart
