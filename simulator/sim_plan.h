// What the simulator replays of a plan: plan/'s document (the one reader of plan.json) with the figures the replay
// derives (link figures, backward without the recomputed forward). partition/ builds one per candidate.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "plan/plan.h"
#include "plan/training.h"
#include "profiler/device.h"

namespace apart::sim {

// A stage's boundary values, as plan.json holds them (plan/plan.h): from_stage -1 is a model input (loaded
// locally, no transfer); bytes are per micro-batch of one replica of the receiving stage; empty to_stages: only a
// model output.
using SimInput = PlanInput;
using SimOutput = PlanOutput;

struct SimStage {
  int id = 0;
  int replicas = 1;
  int tp = 1;  // tensor-parallel degree (plan.json's stages[].tp): its collectives are in the times
  std::vector<int> devices;  // replicas × tp
  double forward_s = 0;
  double backward_s = 0;  // without the recomputed forward (plan.json's backward_s includes it when recompute)
  // The forward work each backward runs again first (plan.json's recompute_forward_s; absent: forward_s when
  // recompute): all of the forward under full recomputation, the attention cores under selective.
  double recompute_s = 0;
  // The weight-gradient part of backward_s (plan.json's optional backward_weight_s, docs/cost-model.md): ZB-H1 runs
  // it as W passes of its own, the other schedules inside the backward. 0: ZB-H1 replays as 1F1B.
  double backward_weight_s = 0;
  bool recompute = false;
  int zero = 0;  // ZeRO stage (plan.json's stages[].zero): its collectives are in the times; shards the state memory
  double allreduce_s = 0;
  // The part of the all-reduce not hidden behind the last backward (overlapped bucketed all-reduce); absent: all.
  std::optional<double> allreduce_exposed_s;
  double optimizer_s = 0;    // the optimizer step after the all-reduce; 0 in plans that predate it
  int64_t memory_bytes = 0;  // the plan's peak estimate for one device of this stage
  int64_t tasks = 0;         // tasks the plan lists for this stage (0: it lists none); caps virtual stages
  std::optional<int64_t> param_bytes;
  // Optional finer memory fields; when absent the simulator derives them (docs/simulator.md §Memory).
  std::optional<double> memory_static_bytes;
  std::optional<double> activation_bytes_per_microbatch;
  std::vector<SimInput> inputs;
  std::vector<SimOutput> outputs;
};

struct SimTraining {
  int64_t microbatches = 1;
  Schedule schedule = Schedule::k1F1B;
  int virtual_stages = 1;  // optional training.virtual_stages
  Optimizer optimizer = Optimizer::kAdam;
  Precision precision = Precision::kFp32;
};

struct SimPlan {
  std::string source;  // file it came from (for messages)
  Cluster cluster;           // cluster.device.name: the device as the plan wrote it
  std::string links_source;  // where the link figures came from, for the report
  SimTraining training;
  std::vector<SimStage> stages;
  std::optional<double> predicted_iteration_s;
  std::optional<double> predicted_bubble_fraction;
};

// The replay's view of a plan document (read and validated by plan/plan.h).
SimPlan sim_plan(const PlanDocument& plan, const std::string& source = "plan.json");
// sim_plan(apart::plan_from_json(j, source)): InvalidModel naming the field (e.g. "stages[2].forward_s").
SimPlan plan_from_json(const nlohmann::json& j, const std::string& source = "plan.json");
// sim_plan(read_plan(path)): a plan directory (DIR/plan.json) or a plan.json file; InvalidArgument when it is
// neither, SystemError if unreadable, InvalidModel if malformed.
SimPlan load_plan(const std::filesystem::path& path);

}  // namespace apart::sim
