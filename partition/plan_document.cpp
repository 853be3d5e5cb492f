// Plan (TaskIds, ValueIds, StageCost) → PlanDocument (names and figures, as plan.json holds them).
#include "partition/plan_document.h"

#include <algorithm>

#include "partition/tensor_parallel.h"
#include "plan/plan_summary.h"

namespace apart {

PlanDocument plan_document(const Plan& plan, const TaskGraph& graph, const PlanModel& model) {
  const PartitionOptions& o = plan.options;
  PlanDocument d;
  d.model = model;
  d.model->tasks = graph.num_tasks();

  PlanCluster& c = d.cluster;
  c.devices = o.cluster.devices;
  c.device = o.cluster.device.name;
  c.devices_per_node = o.cluster.devices_per_node;
  c.memory_bytes = o.cluster.usable_memory_bytes();
  c.device_memory_bytes = o.cluster.device.memory_bytes;
  c.memory_reserve_bytes = o.cluster.reserved_bytes();
  c.memory_reserve = o.cluster.reserve.text();
  c.intra_node_bandwidth = o.cluster.intra_node.bandwidth;
  c.inter_node_bandwidth = o.cluster.inter_node.bandwidth;
  c.layout = std::string(layout_name(plan.layout));

  PlanTraining& t = d.training;
  t.global_batch = o.training.global_batch;
  t.microbatches = plan.microbatches;
  t.microbatch_size = plan.microbatch_size;
  t.schedule = plan.schedule;
  if (plan.schedule == Schedule::kInterleaved) t.virtual_stages = plan.virtual_stages;
  t.optimizer = o.training.optimizer;
  t.precision = o.training.precision;
  t.attention = o.training.attention;
  t.recompute = plan.recompute;
  t.overlap_allreduce = o.training.overlap_allreduce;

  auto input_records = [&](const PlanStage& s) {  // plan.json numbers stages from 0 and a model input's source -1
    std::vector<PlanInput> inputs;
    for (const StageInput& in : s.inputs)
      inputs.push_back({graph.value(in.value).name, in.from_stage.valid() ? static_cast<int>(in.from_stage.value()) : -1,
                        in.bytes});
    return inputs;
  };
  auto output_records = [&](const PlanStage& s) {
    std::vector<PlanOutput> outputs;
    for (const StageOutput& out : s.outputs) {
      std::vector<int> to;
      for (StageId t : out.to_stages) to.push_back(static_cast<int>(t.value()));
      outputs.push_back({graph.value(out.value).name, std::move(to), out.bytes});
    }
    return outputs;
  };
  for (const PlanStage& s : plan.stages) {
    PlanStageRecord r;
    r.id = static_cast<int>(s.id.value());
    r.replicas = s.replicas;
    r.tp = s.cost.tp;
    r.devices = s.devices;
    for (TaskId task : s.tasks) r.tasks.push_back(graph.task(task).name);
    r.batch_tasks = static_cast<int64_t>(s.batch_tasks);
    r.microbatch_size = s.cost.microbatch;
    r.forward_s = s.cost.forward_s;
    r.backward_s = s.cost.backward_s;
    // Only ZB-H1 runs it apart; the other schedules' plans keep their bytes.
    if (plan.schedule == Schedule::kZbH1) r.backward_weight_s = s.cost.backward_weight_s;
    r.recompute = s.recompute;
    r.recompute_scope = s.cost.recompute;
    // Written only where it is not forward_s (selective), so full-recomputation plans read as before.
    if (s.cost.recompute == RecomputeScope::kSelective) r.recompute_forward_s = s.cost.recompute_s;
    r.sequence_parallel = s.cost.sequence_parallel;
    r.zero = s.cost.zero;
    r.comm_s = s.cost.comm_s;
    r.allreduce_s = s.cost.allreduce_s;
    r.allreduce_exposed_s = s.cost.allreduce_exposed_s;
    r.step_s = s.cost.step_s;
    r.optimizer_s = s.cost.optimizer_s;
    r.param_bytes = s.cost.param_bytes;
    r.memory_bytes = s.cost.memory_bytes;
    r.inputs = input_records(s);
    r.outputs = output_records(s);
    d.stages.push_back(std::move(r));
  }
  for (const PlanStage& chunk : plan.chunks) {  // interleaved only
    PlanVirtualStage& c = d.virtual_stages.emplace_back();
    c.id = static_cast<int>(chunk.id.value());
    c.stage = c.id % static_cast<int>(plan.stages.size());
    for (TaskId task : chunk.tasks) c.tasks.push_back(graph.task(task).name);
    c.inputs = input_records(chunk);
    c.outputs = output_records(chunk);
  }

  PlanOptions options;
  options.method = std::string(method_name(o.method));
  options.stages = static_cast<int64_t>(plan.stages.size());
  if (o.stage.replicas) options.replicas = *o.stage.replicas;
  options.microbatches = plan.microbatches;
  options.schedule = plan.schedule;
  options.recompute = recompute_summary(d);
  if (o.block.blocks > 0) options.blocks = o.block.blocks;
  options.balance_cap = o.block.balance_cap;
  options.time_limit_s = o.stage.time_limit_s;
  if (o.stage.zero != 0) options.zero = zero_option_name(o.stage.zero);
  if (o.stage.tp != 1) options.tp = tp_option_name(o.stage.tp);
  d.options = options;

  // The prediction is the event-level replay of this plan (what chose it); the analytic estimate rides along.
  PlanPrediction p;
  p.iteration_s = plan.simulated.iteration_s;
  p.bottleneck_stage = plan.simulated.bottleneck_stage;
  p.bubble_fraction = plan.simulated.bubble_fraction;
  p.samples_per_s = plan.samples_per_s;
  p.peak_memory_bytes = plan.peak_memory_bytes;
  p.pipeline_s = plan.simulated.pipeline_s;
  p.compute_lower_bound_s = plan.compute_lower_bound_s;
  p.source = "simulated";
  p.estimate_iteration_s = plan.estimate.iteration_s;
  // MFU over the cluster's devices at their peak for the plan's precision (plan/plan_summary.h, its one home).
  if (const auto u = utilization({model.params, model.tokens_per_sample, model.flops_per_sample, plan.samples_per_s,
                                  o.cluster.devices, o.cluster.device.matmul_peak(o.training.precision)})) {
    p.mfu = u->mfu;
    p.mfu_flops = u->flops;
    p.tokens_per_s = u->tokens_per_s;
    p.tflops_per_device = u->tflops_per_device;
  }
  d.predicted = p;

  const SearchStatistics& s = plan.search;
  d.search = PlanSearch{s.seconds,    static_cast<int64_t>(s.atomic_components), s.blocks,      s.coarsening_levels,
                        s.refinement_moves, s.candidates,  s.candidates_placed,  s.simulated,   s.pruned,
                        s.not_simulated,    s.chosen_split, s.stopped_by_time_limit};

  // The tensor-parallel regions the model holds, as the atomic level found them. Written only where there are
  // some, so the plans of models without any stay as they were.
  if (plan.tensor_parallel && !plan.tensor_parallel->regions.empty()) {
    const TensorParallelRegions& found = *plan.tensor_parallel;
    PlanTensorParallel& tp = d.tensor_parallel.emplace();
    tp.summary = found.summary();
    // The shard layout `apart run` splits a stage by (codegen/tensor_parallel_shard.h): written when a stage is
    // tensor-parallel, so that plans without one stay as they were.
    const bool split = std::any_of(d.stages.begin(), d.stages.end(), [](const PlanStageRecord& st) { return st.tp > 1; });
    for (const TpRegion& r : found.regions) tp.regions.push_back(plan_tp_region(r, graph, split));
  }
  return d;
}

PlanTpRegion plan_tp_region(const TpRegion& r, const TaskGraph& graph, bool layout) {
  PlanTpRegion region{r.kind,
                      r.name,
                      static_cast<int64_t>(r.tasks.size()),
                      r.degrees,
                      r.bounded_by,
                      graph.value(r.end_value).name,
                      r.end_bytes_per_sample};
  if (!layout) return region;
  auto task_names = [&](const std::vector<TaskId>& tasks) {
    std::vector<std::string> names;
    for (TaskId t : tasks) names.push_back(graph.task(t).name);
    return names;
  };
  auto value_names = [&](const std::vector<ValueId>& values) {
    std::vector<std::string> names;
    for (ValueId v : values) names.push_back(graph.value(v).name);
    return names;
  };
  region.column_tasks = task_names(r.column_tasks);
  region.row_tasks = task_names(r.row_tasks);
  region.inputs = value_names(r.inputs);
  region.sliced_inputs = value_names(r.sliced_inputs);
  for (const auto& [value, axis] : r.split_values) region.split_values.push_back({graph.value(value).name, axis});
  return region;
}

}  // namespace apart
