// Options of `apart partition`: one struct per phase, defaults in the class, validate() at the boundary.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "plan/engine.h"
#include "plan/training.h"
#include "profiler/device.h"

namespace apart {

// apart: the paper's algorithm. The rest are baselines on the same cost model (docs/partitioning.md):
// uniform (Megatron even split), params (DeepSpeed parameter balance), gpipe-balance (torchgpipe
// balance_by_time), pipedream (PipeDream's replication DP), metis (METIS k-way + cycle repair + stage DP).
enum class Method : uint8_t { kApart, kUniform, kParams, kGpipeBalance, kPipeDream, kMetis };
// --recompute: auto (the DP chooses per stage among none, selective and full, recomputing only what memory needs),
// on (every stage recomputes its whole forward), selective (every stage recomputes its attention cores), off.
enum class Recompute : uint8_t { kAuto, kOn, kOff, kSelective };

std::string_view method_name(Method m);
std::string_view recompute_name(Recompute r);
// Parsers throw InvalidArgument naming the accepted spellings.
Method parse_method(std::string_view text);
Recompute parse_recompute(std::string_view text);
// --zero: "0", "1", "2", "3" or "auto" (nullopt).
std::optional<int> parse_zero(std::string_view text);
std::string zero_option_name(std::optional<int> zero);  // "0".."3" or "auto"
// --tp: "1", "2", "4", "8" or "auto" (nullopt).
std::optional<int> parse_tp(std::string_view text);
std::string tp_option_name(std::optional<int> tp);  // "1".."8" or "auto"

struct TrainingSpec {
  int64_t global_batch = 1;
  Optimizer optimizer = Optimizer::kAdamW;  // as apart train (adamw plans as adam)
  Precision precision = Precision::kFp32;
  // Gradients all-reduce in buckets while the last micro-batch's backward still runs (PyTorch DDP, Megatron's
  // --overlap-grad-reduce): only the part that does not fit behind that backward, and at least the last bucket's
  // share, is exposed. Off: the whole all-reduce follows the pipeline.
  bool overlap_allreduce = true;
  // --sequence-parallel on|off: stages with a tensor-parallel degree > 1 run the replicated work between the regions
  // and their boundaries sharded along the sequence (Korthikanti et al., MLSys'23 §4.2.2; stage_cost.cpp).
  bool sequence_parallel = true;
  // --attention flash|materialized: the attention kernel the costs price (plan/training.h); plan.json records it.
  AttentionKernel attention = AttentionKernel::kFused;
};

// Atomic level (paper §IV-A).
struct AtomicOptions {
  // Batch size the graph's value shapes were bound at (bytes of a value ∝ this); 0 = the cost table's.
  int64_t graph_batch = 0;
  // Tasks that never seed a tensor-parallel region (column linears, embedding Gathers), by name: the regions apart
  // run's shard pass refuses to cut (codegen's tp_refused_regions, asked by driver/compile.cpp before the search).
  std::vector<std::string> tp_banned_seeds;
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
  // --schedule; nullopt = auto: the stage DP plans 1F1B and every pipelined candidate is offered again under ZB-H1
  // and the interleaved order (phases.h schedule_variants). 1F1B (the default) is what `apart run` executes today.
  std::optional<Schedule> schedule = Schedule::k1F1B;
  // --virtual-stages V: chunks per device under --schedule interleaved (2..limits::kMaxVirtualStages); 0 = the
  // default, kDefaultVirtualStages (auto: every count in kAutoVirtualStages). The DP still plans one contiguous
  // stage per device group; each runs as V chunks.
  int virtual_stages = 0;
  Recompute recompute = Recompute::kAuto;
  // --zero 0|1|2|3|auto: the ZeRO stage (Rajbhandari et al., SC20) every stage with replicas shards its optimizer
  // state (1), gradients (2) and weights (3) with across them; nullopt = auto, the stage DP chooses per stage.
  // 0 (the default) is plain data parallelism.
  std::optional<int> zero = 0;
  // --tp 1|2|4|8|auto: the tensor-parallel degree (Megatron-LM's, Shoeybi et al. 2019) of every stage, each replica a
  // group of that many devices of one node splitting the model's attention, MLP and vocabulary regions
  // (partition/tensor_parallel.h); nullopt = auto, the stage DP chooses per stage among the degrees dividing the
  // node's devices. 1 (the default) splits nothing: the runtime does not execute tensor-parallel stages yet.
  std::optional<int> tp = 1;
  double time_limit_s = 0;          // 0 = no limit; the search stops early and keeps the best plan so far
  int max_stages = 0;               // 0 = min(blocks, devices)
  bool spend_leftover_devices = true;  // after the DP, give unused devices to stages while the estimate improves
  bool include_baselines = true;  // --method apart also evaluates every baseline's candidates (uniform, params,
                                  // gpipe-balance, pipedream, metis), so none of them can plan faster
  int max_simulations = 1024;     // the final choice replays at most this many candidates (0 = all; select.h)
  // --target ENGINE: only plans the engine expresses exactly (partition/target.h): one TP degree and replica count
  // on every stage, whole-layer cuts, the engine's schedules, ZeRO stages and recomputation. nullopt: any plan.
  std::optional<Engine> target;
};

// Chunks per device a schedule runs: interleaved, `virtual_stages` (0: kDefaultVirtualStages); the others, 1.
int schedule_chunks(Schedule schedule, int virtual_stages);
// The chunk counts --schedule auto offers the interleaved order at when --virtual-stages does not pin one:
// Megatron-LM's usual range (more chunks shrink the bubble by 1/v but add v − 1 transfers per micro-batch).
inline constexpr int kAutoVirtualStages[] = {2, 3, 4};

struct PartitionOptions {
  Method method = Method::kApart;
  // The machines, the profiler's own type (no copy of its fields): the DP fills usable_memory_bytes() of a device
  // and prices links by its rules; plan.json's cluster section prints it.
  Cluster cluster;
  TrainingSpec training;
  AtomicOptions atomic;
  BlockOptions block;
  StageOptions stage;
  bool progress = false;  // a progress line on stderr during long searches
  // Threads the search runs its independent DPs and simulations on (--threads); 0: graph/threads.h
  // default_thread_count. The plan is the same for every count: results are gathered in a fixed order.
  int threads = 0;

  // Throws InvalidArgument naming the offending option and what it accepts.
  void validate() const;
  // threads, or the environment's default (InvalidArgument for a bad APART_NUM_THREADS/OMP_NUM_THREADS).
  int search_threads() const;
};

}  // namespace apart
