// apart::partition_graph, --method apart's search: atomic → block → stage DP → Plan (paper §IV); and the Plan.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "graph/task_graph.h"
#include "partition/atomic.h"
#include "partition/ids.h"
#include "partition/options.h"
#include "partition/stage_dp.h"
#include "profiler/cost_table.h"

namespace apart {

struct StageInput {
  ValueId value;
  StageId from_stage;  // invalid(): a model input (plan.json writes -1)
  double bytes = 0;     // per micro-batch of one replica of the receiving stage
};
struct StageOutput {
  ValueId value;
  std::vector<StageId> to_stages;  // empty: only a model output
  double bytes = 0;
};

struct PlanStage {
  StageId id;
  int replicas = 1;
  std::vector<int> devices;
  std::vector<TaskId> tasks;  // batch tasks and the constant tasks replicated into the stage, topological order
  size_t batch_tasks = 0;
  StageCost cost;
  bool recompute = false;
  std::vector<StageInput> inputs;
  std::vector<StageOutput> outputs;
};

struct SearchStatistics {
  double seconds = 0;  // the only field that differs between identical runs
  size_t atomic_components = 0;
  uint32_t blocks = 0;
  int coarsening_levels = 0;
  int refinement_moves = 0;
  int candidates = 0;  // (S, m, schedule, recompute, layout) combinations solved
  int candidates_placed = 0;  // solutions that fit, placed on devices: what the final choice is among
  int simulated = 0;          // of those, replayed by the simulator
  int pruned = 0;             // skipped because their lower bound could not beat the best simulated time
  int not_simulated = 0;      // skipped by --time-limit or the simulation cap (select.h)
  std::string chosen_split;   // which split the plan came from: "apart", "apart pipeline-major", "uniform", …
  bool stopped_by_time_limit = false;
};

struct Plan {
  PartitionOptions options;  // as given, with the chosen stages/replicas/microbatches/schedule/recompute filled in
  int64_t microbatches = 0;
  int64_t microbatch_size = 0;  // B / m, before it is split among a stage's replicas
  Schedule schedule = Schedule::k1F1B;
  int virtual_stages = 1;  // chunks per device: > 1 only interleaved (plan.json training.virtual_stages)
  bool recompute = false;
  Layout layout = Layout::kStageMajor;
  std::vector<PlanStage> stages;
  // Interleaved: the P·v chunks the devices run, in pipeline order, chunk c on stages[c mod P]'s devices
  // (cut_virtual_stages, partition/virtual_stages.h); empty under every other schedule.
  std::vector<PlanStage> chunks;
  PipelineEstimate estimate;   // the analytic estimate (stage_cost.h) of the chosen candidate
  PipelineEstimate simulated;  // its event-level replay (simulator/): what the plan predicts, and what chose it
  double samples_per_s = 0;
  int64_t peak_memory_bytes = 0;
  double compute_lower_bound_s = 0;  // Σ per-sample forward+backward × B / devices
  SearchStatistics search;
  std::shared_ptr<const TensorParallelRegions> tensor_parallel;  // the atomic level's regions (AtomicGraph's)
};

using ProgressFn = std::function<void(const std::string& line)>;

// --method apart as a script of the phases in phases.h: atomic → blocks → stage DP (with cut refinement and
// pipeline-major) → placed candidates, with every baseline's among them (StageOptions::include_baselines) →
// the candidate with the least simulated iteration time (select.h) → Plan. Throws Infeasible with what would make
// the request fit, InvalidArgument on bad options. `costs` are at one micro-batch size; `costs_at_other_size`
// (optional) makes times affine in it. options.method must be Method::kApart: partition_by_method (methods.h)
// runs the others.
Plan partition_graph(const TaskGraph& graph, const CostTable& costs, const PartitionOptions& options,
                     const CostTable* costs_at_other_size = nullptr, const ProgressFn& progress = {});

}  // namespace apart
