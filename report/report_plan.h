// The report's reading of a plan directory: plan.json (apart.plan/1), and baselines.json / costs.json when present.
// plan.json is read by plan/'s one reader; this adds what the report derives (layers, baselines, per-layer costs).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "simulator/sim_plan.h"

namespace apart::report {

// One run of consecutive tasks of a stage that belong to the same layer (see layer_of).
struct LayerRun {
  std::string layer;
  int64_t tasks = 0;
  double forward_s = 0;  // Σ task forward time from costs.json; 0 when it is absent
  int64_t param_bytes = 0;
};

struct ReportStage {
  int id = 0;
  int replicas = 1;
  int tp = 1;  // each replica a tensor-parallel group of tp devices
  std::vector<int> devices;
  std::vector<std::string> tasks;  // onnx node names, topological order
  std::optional<int64_t> batch_tasks;
  std::optional<int64_t> param_bytes;
  double forward_s = 0;
  double backward_s = 0;  // as plan.json writes it (includes the recomputed forward when recompute)
  double allreduce_s = 0;
  std::optional<double> comm_s;
  bool recompute = false;
  bool selective = false;  // recompute: its attention cores only (plan.json's recompute_scope)
  int64_t memory_bytes = 0;
  // The stage's tasks grouped into runs of one layer, in order; constant tasks left out when costs.json marks them.
  std::vector<LayerRun> layers;
};

struct Baseline {
  std::string method;
  bool feasible = true;
  std::optional<double> iteration_s;
  std::optional<double> samples_per_s;
  std::optional<double> planning_s;
  std::optional<double> peak_memory_bytes;
};

struct ReportPlan {
  std::filesystem::path dir;   // the plan directory
  std::string source;          // plan.json's path, for messages
  std::string model_path;
  int64_t model_tasks = 0;
  int64_t model_params = 0;
  int64_t model_param_bytes = 0;
  int devices = 0;
  std::string device;
  int devices_per_node = 1;
  int64_t device_memory_bytes = 0;  // what a plan may fill per device (cluster.memory_bytes); 0: unknown
  std::optional<int64_t> device_total_bytes;  // the device's memory before the reserve (cluster.device_memory_bytes)
  std::string memory_reserve;                 // cluster.memory_reserve, e.g. "2GiB+5%"; "" in older plans
  int64_t global_batch = 0;
  int64_t microbatches = 1;
  int64_t microbatch_size = 0;
  Schedule schedule = Schedule::k1F1B;
  Optimizer optimizer = Optimizer::kAdam;
  Precision precision = Precision::kFp32;
  std::string method;  // options.method, "" when absent
  std::vector<ReportStage> stages;
  // predicted.*
  double iteration_s = 0;
  double samples_per_s = 0;
  double bubble_fraction = 0;
  int bottleneck_stage = -1;
  int64_t peak_memory_bytes = 0;
  std::optional<double> pipeline_s;
  std::optional<double> compute_lower_bound_s;
  std::optional<double> search_s;
  bool have_costs = false;                // costs.json was present and used for per-layer times
  std::optional<std::vector<Baseline>> baselines;  // nullopt: baselines.json not recorded
  PlanDocument document;                  // plan.json as plan/ reads it
  sim::SimPlan sim;                       // what the simulator replays of it
};

// The layer a task belongs to, from its ONNX node name: the path up to and including the first indexed component
// ("/h.3/attn/qkv/MatMul" → "h.3", "/model/layers.12/mlp/fc1/MatMul" → "model/layers.12",
// "/blocks.0/mlp/0/Add" → "blocks.0"); without one, the first component ("/wte/Gather" → "wte"); a name without a
// scope ("/Constant", "MatMul_7") → "(top level)".
std::string layer_of(const std::string& task_name);

// The first/last layer of a stage, preferring named layers over "(top level)"; "-" without tasks.
std::string first_layer(const ReportStage& stage);
std::string last_layer(const ReportStage& stage);

// `path` is a plan directory (with plan.json) or a plan.json file. InvalidArgument when it is neither (a directory
// without plan.json names what to run), SystemError when unreadable, InvalidModel naming the field when malformed
// (plan.json, baselines.json or costs.json).
ReportPlan load_report_plan(const std::filesystem::path& path);

}  // namespace apart::report
