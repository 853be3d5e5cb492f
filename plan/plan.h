// The plan document: what plan.json (schema apart.plan/1) holds, as typed data, with its one writer and one reader.
// partition/ fills it, codegen/ writes it, simulator/, report/ and the runtime read it; none parses plan.json itself.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/training.h"

namespace apart {

inline constexpr const char* kPlanSchema = "apart.plan/1";

struct PlanModel {
  std::string path;  // as given to apart partition: relative to where it ran
  // Where the model is seen from the plan folder (`../gpt.onnx`), and its absolute path when the plan was made: what
  // locate_plan_model (plan/model_location.h) tries first, so that a plan folder copied with its model beside it
  // runs from any working directory. Absent in plans before them, and in a plan written to no folder.
  std::optional<std::string> relative_path;
  std::optional<std::string> absolute_path;
  std::string sha256;
  int64_t tasks = 0;
  int64_t params = 0;  // parameter elements
  int64_t param_bytes = 0;
  // Whether Constant nodes that feed weight slots were imported as params (ImportOptions::constants_as_params):
  // written when the plan was made with --constants-as-params off, or when some did; absent: on.
  std::optional<bool> constants_as_params;
  // The loss `--loss cross_entropy[_shifted] --labels NAME` appended to a logits-only model (importer/added_loss.h):
  // its form's name and the labels input. Absent: the model's own loss. Every reader of the model adds the same.
  struct AddedLoss {
    std::string form;
    std::string labels;
  };
  std::optional<AddedLoss> added_loss;
  // The symbolic dims `--dim NAME=N` bound when the plan was made, but the batch (each reader binds its own
  // micro-batch): every later reader of the model (apart check, apart run) binds the same. Empty: none.
  std::map<std::string, int64_t> dims;
  // What MFU counts (plan/plan_summary.h): the sequence length of the model's token input (its first integer input
  // with more than one element per sample), absent for models without one; and the cost model's forward + backward
  // FLOPs of one sample. Absent in plans before them.
  std::optional<int64_t> tokens_per_sample;
  std::optional<double> flops_per_sample;
};

// The cluster as the plan records it: the names and figures the plan was made for. The simulator turns it into
// link figures (the device preset's, or these bandwidths); the full device model stays in profiler/.
struct PlanCluster {
  int devices = 1;
  std::optional<std::string> device;            // preset name
  std::optional<int> devices_per_node;          // absent: all devices in one node
  std::optional<int64_t> memory_bytes;          // what a plan may fill per device (the device's less the reserve)
  std::optional<int64_t> device_memory_bytes;   // the device's memory before the reserve
  std::optional<int64_t> memory_reserve_bytes;
  std::optional<std::string> memory_reserve;    // as given: "2GiB+5%"
  std::optional<double> intra_node_bandwidth;   // bytes/s the plan was made with
  std::optional<double> inter_node_bandwidth;
  std::optional<std::string> layout;            // "stage-major" or "pipeline-major"
};

struct PlanTraining {
  std::optional<int64_t> global_batch;
  int64_t microbatches = 1;
  std::optional<int64_t> microbatch_size;
  Schedule schedule = Schedule::k1F1B;
  std::optional<int> virtual_stages;  // interleaved: chunks per device
  Optimizer optimizer = Optimizer::kAdam;
  Precision precision = Precision::kFp32;
  AttentionKernel attention = AttentionKernel::kFused;  // the kernel the costs priced; absent in plan.json: flash
  bool recompute = false;
  std::optional<bool> overlap_allreduce;
};

// The options the plan was searched with, as resolved (`auto` where the search chose).
struct PlanOptions {
  std::string method;
  int64_t stages = 0;
  std::optional<int64_t> replicas;  // nullopt: "auto"
  int64_t microbatches = 0;
  Schedule schedule = Schedule::k1F1B;
  std::string recompute;            // recompute_summary: "off", "on", "selective" or "3 of 8 stages"
  std::optional<int64_t> blocks;    // nullopt: "auto"
  double balance_cap = 0;
  double time_limit_s = 0;
  std::optional<std::string> zero;  // --zero as given: "1".."3" or "auto"; absent: 0
  std::optional<std::string> tp;    // --tp as given: "2".."8" or "auto"; absent: 1
};

struct PlanInput {
  std::string value;
  int from_stage = -1;  // -1: a model input
  double bytes = 0;     // per micro-batch of one replica of the receiving stage
};
struct PlanOutput {
  std::string value;
  std::vector<int> to_stages;  // empty: only a model output
  double bytes = 0;
};

struct PlanStageRecord {
  int id = 0;
  int replicas = 1;
  // Tensor-parallel degree (kTpDegrees): each replica is a group of tp devices of one node; absent in the file: 1.
  // Its collectives and split work are already in forward_s and backward_s; memory and param_bytes are one device's.
  int tp = 1;
  std::vector<int> devices;  // replicas × tp, replica by replica (replica j: devices[j·tp, (j+1)·tp))
  std::vector<std::string> tasks;  // task names (graph/), topological order; constant tasks may repeat across stages
  std::optional<int64_t> batch_tasks;
  std::optional<int64_t> microbatch_size;  // samples per replica per micro-batch
  double forward_s = 0;
  double backward_s = 0;  // includes the recomputed forward when recompute
  // ZB-H1 plans: the weight-gradient part of backward_s (never the recomputed forward), which ZB-H1 runs as its own
  // W pass (docs/cost-model.md §2). Absent: 0, and ZB-H1 replays as 1F1B.
  std::optional<double> backward_weight_s;
  bool recompute = false;
  // What it recomputes when recompute (plan/training.h): absent in the file, full (plans before selective recomputation).
  RecomputeScope recompute_scope = RecomputeScope::kNone;
  // The part of backward_s that re-runs forward work: forward_s under full recomputation, the attention cores'
  // forward under selective; absent in the file: forward_s when recompute, else 0.
  std::optional<double> recompute_forward_s;
  // Sequence parallelism (tp > 1): the replicated work between the tensor-parallel regions (norms, residuals,
  // dropouts) and the stage boundaries run sharded along the sequence across the TP group, whose all-reduces become
  // reduce-scatter + all-gather (docs/cost-model.md "Tensor parallelism"); absent in the file: false.
  bool sequence_parallel = false;
  // ZeRO stage 0..kMaxZeroStage its replicas shard with (plan/training.h); absent in the file: 0. Its collectives and
  // sharded optimizer step are already in forward_s, backward_s, allreduce_s and optimizer_s (docs/plan.md).
  int zero = 0;
  std::optional<double> comm_s;
  std::optional<double> allreduce_s;
  std::optional<double> allreduce_exposed_s;  // the part of the all-reduce not hidden behind the last backward
  std::optional<double> step_s;
  std::optional<double> optimizer_s;  // the optimizer step after the all-reduce (absent in plans before it)
  std::optional<int64_t> param_bytes;
  std::optional<int64_t> memory_bytes;        // the peak estimate for one device of this stage
  std::optional<double> memory_static_bytes;  // finer memory fields (docs/simulator.md §Memory); optional
  std::optional<double> activation_bytes_per_microbatch;
  std::vector<PlanInput> inputs;
  std::vector<PlanOutput> outputs;
};

// Interleaved plans (training.schedule "interleaved"): one of the P·v virtual stages (chunks) the devices run, in
// pipeline order. Chunk `id` runs on the devices of stages[id mod P] (Megatron-LM's layout: stage k's devices hold
// chunks k, k + P, …, k + (v − 1)·P); its inputs come from earlier chunks (or -1, a model input) and its outputs go
// to later ones. The chunks cut the model's batch tasks, in the order the stages list them, into P·v runs, each
// with about 1/v of its stage's forward + backward time (what the simulator gives it): docs/plan.md.
struct PlanVirtualStage {
  int id = 0;
  int stage = 0;  // the stage whose devices run it: id mod P
  std::vector<std::string> tasks;  // topological order; constant tasks may repeat across chunks
  std::vector<PlanInput> inputs;   // from_stage: a virtual stage id, -1 a model input
  std::vector<PlanOutput> outputs; // to_stages: virtual stage ids
};

struct PlanPrediction {
  std::optional<double> iteration_s;
  std::optional<int> bottleneck_stage;
  std::optional<double> bubble_fraction;
  std::optional<double> samples_per_s;
  std::optional<int64_t> peak_memory_bytes;
  std::optional<double> pipeline_s;
  std::optional<double> compute_lower_bound_s;
  std::optional<std::string> source;  // "simulated"
  std::optional<double> estimate_iteration_s;
  // In the vocabulary of Megatron-LM's users (plan/plan_summary.h utilization); absent in plans before them.
  std::optional<double> mfu;                // model FLOP/s over every device's peak at the plan's precision
  std::optional<std::string> mfu_flops;     // what it counts: "6N per token" or "model FLOPs"
  std::optional<double> tokens_per_s;       // sequence models
  std::optional<double> tflops_per_device;  // model TFLOP/s per device
};

struct PlanSearch {
  double seconds = 0;  // the only field that differs between identical runs
  int64_t atomic_components = 0;
  int64_t blocks = 0;
  int64_t coarsening_levels = 0;
  int64_t refinement_moves = 0;
  int64_t candidates = 0;
  int64_t candidates_placed = 0;
  int64_t simulated = 0;
  int64_t pruned_by_bound = 0;
  int64_t not_simulated = 0;
  std::string chosen_split;
  bool stopped_by_time_limit = false;
};

// One tensor-parallel region partition/ found in the model (partition/tensor_parallel.h), as plan.json lists it.
struct PlanTpRegion {
  TpRegionKind kind = TpRegionKind::kMlp;
  std::string name;                 // the region's node-name scope ("/blocks.3/attn")
  int64_t tasks = 0;                // tasks in it
  std::vector<int> degrees;         // the TP degrees (of kTpDegrees) it allows
  std::string bounded_by;           // what the degrees divide: "12 heads", "3072 ffn features"
  std::string end_value;            // the value all-reduced (all-gathered, or fed to the vocabulary-parallel loss) at its end
  double end_bytes_per_sample = 0;  // what that collective carries per sample
  // What codegen needs to shard a stage holding the region (codegen/tensor_parallel_shard.h); absent in plans before
  // `apart run` executed tensor-parallel stages (such a plan runs with tp 1 only):
  std::vector<std::string> column_tasks;   // the column-split linears (node names)
  std::vector<std::string> row_tasks;      // the row-split linear
  std::vector<std::string> inputs;         // the replicated values the column linears read (backward all-reduce)
  std::vector<std::string> sliced_inputs;  // params/constants read sliced along the split axis (a column's bias)
  struct SplitValue {
    std::string value;
    int axis = 0;
    bool operator==(const SplitValue&) const = default;
  };
  std::vector<SplitValue> split_values;    // every value each rank holds 1/tp of, with the axis split
  bool has_shard_layout() const { return !column_tasks.empty(); }
};
struct PlanTensorParallel {
  std::string summary;  // "12 attention, 12 MLP, embedding, LM head"
  std::vector<PlanTpRegion> regions;  // topological
};

// `apart partition --target ENGINE` (plan/engine.h): the engine the search was restricted to, and the plan the
// unrestricted search finds on the same inputs, both simulated: what the restriction costs.
struct PlanTarget {
  std::string engine;                   // engine_name: "megatron", …
  double unrestricted_iteration_s = 0;  // the unrestricted plan's simulated iteration
  std::string unrestricted_layout;      // its plan_summary_line ("TP 8 · PP 16 · DP 8 · …")
};

struct PlanDocument {
  std::optional<PlanModel> model;
  PlanCluster cluster;
  PlanTraining training;
  std::optional<PlanOptions> options;
  std::vector<PlanStageRecord> stages;
  std::optional<PlanPrediction> predicted;
  std::optional<PlanSearch> search;
  std::optional<PlanTensorParallel> tensor_parallel;  // absent in plans before it
  std::vector<PlanVirtualStage> virtual_stages;  // interleaved: the P·v chunks; empty under every other schedule
  std::optional<PlanTarget> target;              // made with --target; absent otherwise
};

// Devices (processes) the plan runs on: Σ over stages of replicas × tp, the length of every stages[k].devices.
int plan_devices(const PlanDocument& plan);

// "off", "on" (every stage's whole forward), "selective" (every stage's attention cores) or "3 of 8 stages" (where a
// stage needs it; "3 of 8 stages (2 selective)" when some recompute their attention cores only).
std::string recompute_summary(const PlanDocument& plan);

// An interleaved plan's pipeline of chunks as a plan of its own, what the runtime and schedule/ run: stage record c
// is virtual stage c (its tasks, inputs and outputs) with the replicas, devices, tp, ZeRO stage and recomputation of
// stages[c mod P] and 1/v of its times; each device then sits in v stages. InvalidModel when the plan lists no
// virtual stages (a plan written before `apart run` executed interleaving: re-run apart partition).
PlanDocument virtual_stage_view(const PlanDocument& plan);
// Whether `plan` is such a view (its stages are its virtual stages).
bool is_virtual_stage_view(const PlanDocument& plan);
// The ONNX file of stage record `stage` in the plan folder: stage_K.onnx, or in a virtual-stage view chunk_K.onnx.
std::string stage_file_name(const PlanDocument& plan, int stage);

// The one writer: fields in the documented order, optional ones when present. What `apart partition` writes.
nlohmann::ordered_json plan_to_json(const PlanDocument& plan);

// The one reader. Checks every field (JsonReader's ranges) and the plan's consistency: stage ids in order, each
// device in one stage, replicas = devices listed, inputs from earlier stages, outputs to later ones, at most
// training.global_batch micro-batches, backward_s ≥ forward_s when recomputing. Throws InvalidModel naming
// `source` and the field ("p.json: stages[2].forward_s is missing ...").
PlanDocument plan_from_json(const nlohmann::json& j, const std::string& source = "plan.json");
// A plan directory (DIR/plan.json) or a plan.json file. InvalidArgument when `path` is neither (naming what to
// run), SystemError when unreadable, InvalidModel when malformed.
PlanDocument read_plan(const std::filesystem::path& path);
// The plan.json `path` names: DIR/plan.json for a directory, `path` for a file (InvalidArgument otherwise).
std::filesystem::path plan_json_path(const std::filesystem::path& path);

}  // namespace apart
