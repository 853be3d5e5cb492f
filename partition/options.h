// Options of `apart partition`: one struct per phase, defaults in the class, validate() at the boundary.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "plan/training.h"

namespace apart {

// apart: the paper's algorithm. The rest are baselines on the same cost model (docs/partitioning.md):
// uniform (Megatron even split), params (DeepSpeed parameter balance), gpipe-balance (torchgpipe
// balance_by_time), pipedream (PipeDream's replication DP), metis (METIS k-way + cycle repair + stage DP).
enum class Method : uint8_t { kApart, kUniform, kParams, kGpipeBalance, kPipeDream, kMetis };
enum class Recompute : uint8_t { kAuto, kOn, kOff };

std::string_view method_name(Method m);
std::string_view recompute_name(Recompute r);
// Parsers throw InvalidArgument naming the accepted spellings.
Method parse_method(std::string_view text);
Recompute parse_recompute(std::string_view text);

// The machines: what the profiler's device and cluster presets describe, as plain numbers.
struct ClusterSpec {
  std::string device = "a100-80gb";
  int devices = 1;
  int devices_per_node = 8;
  int64_t memory_bytes = 80'000'000'000;  // usable bytes of one device: its memory less the reserve
  int64_t device_memory_bytes = 0;         // the device's memory (0: memory_bytes, no reserve known)
  int64_t memory_reserve_bytes = 0;        // kept free (profiler/device.h MemoryReserve)
  std::string memory_reserve = "0";        // as given: "2GiB+5%"
  double intra_node_bandwidth = 300e9;     // bytes/s one device can send inside a node (NVLink)
  double inter_node_bandwidth = 25e9;      // bytes/s one device can send across nodes (IB HDR)
  double intra_node_latency_s = 5e-6;
  double inter_node_latency_s = 10e-6;
};

struct TrainingSpec {
  int64_t global_batch = 1;
  Optimizer optimizer = Optimizer::kAdam;
  Precision precision = Precision::kFp32;
  // Gradients all-reduce in buckets while the last micro-batch's backward still runs (PyTorch DDP, Megatron's
  // --overlap-grad-reduce): only the part that does not fit behind that backward, and at least the last bucket's
  // share, is exposed. Off: the whole all-reduce follows the pipeline.
  bool overlap_allreduce = true;
};

// Atomic level (paper §IV-A).
struct AtomicOptions {
  // Batch size the graph's value shapes were bound at (bytes of a value ∝ this); 0 = the cost table's.
  int64_t graph_batch = 0;
};

// Block level (paper §IV-B): multilevel coarsening to about `blocks` blocks.
struct BlockOptions {
  int blocks = 0;              // k; 0 = automatic (docs/partitioning.md, "Choice of k")
  double balance_cap = 1.5;    // a block may weigh at most balance_cap × total / k
  int refinement_passes = 2;   // boundary-move passes per uncoarsening level
};

// Stage level (paper §IV-C): the DP and the final choice.
struct StageOptions {
  std::optional<int> stages;        // --stages S (pinned) or automatic
  std::optional<int> replicas;      // --replicas R: every stage gets R replicas
  std::optional<int> microbatches;  // --microbatches N
  std::optional<Schedule> schedule; // --schedule; nullopt = auto
  Recompute recompute = Recompute::kAuto;
  double time_limit_s = 0;          // 0 = no limit; the search stops early and keeps the best plan so far
  int max_stages = 0;               // 0 = min(blocks, devices)
  bool spend_leftover_devices = true;  // after the DP, give unused devices to stages while the estimate improves
  bool include_baselines = true;  // --method apart also evaluates the uniform, params and gpipe-balance splits
  int max_simulations = 1024;     // the final choice replays at most this many candidates (0 = all; select.h)
};

struct PartitionOptions {
  Method method = Method::kApart;
  ClusterSpec cluster;
  TrainingSpec training;
  AtomicOptions atomic;
  BlockOptions block;
  StageOptions stage;
  bool progress = false;  // a progress line on stderr during long searches

  // Throws InvalidArgument naming the offending option and what it accepts.
  void validate() const;
};

}  // namespace apart
