// PlanDocument → SimPlan: link figures for the plan's device, backward without the recomputed forward.
#include "simulator/sim_plan.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "graph/error.h"

namespace apart::sim {

using json = nlohmann::json;

SimPlan sim_plan(const PlanDocument& document, const std::string& source) {
  SimPlan plan;
  plan.source = source;
  const PlanCluster& c = document.cluster;
  NamedCluster named = cluster_for_device_name(c.device.value_or("unknown"), c.devices, c.devices_per_node.value_or(c.devices));
  plan.cluster = std::move(named.cluster);
  plan.links_source = std::move(named.links_source);
  // partition/ writes the bandwidths it planned with; prefer them so both tools see the same links.
  if (c.intra_node_bandwidth) plan.cluster.intra_node.bandwidth = *c.intra_node_bandwidth;
  if (c.inter_node_bandwidth) plan.cluster.inter_node.bandwidth = *c.inter_node_bandwidth;
  if (c.intra_node_bandwidth || c.inter_node_bandwidth)
    plan.links_source = "plan.json bandwidths, latencies from " + plan.links_source;

  plan.training.microbatches = document.training.microbatches;
  plan.training.schedule = document.training.schedule;
  plan.training.virtual_stages = document.training.virtual_stages.value_or(1);
  plan.training.optimizer = document.training.optimizer;
  plan.training.precision = document.training.precision;

  for (const PlanStageRecord& s : document.stages) {
    SimStage stage;
    stage.id = s.id;
    stage.replicas = s.replicas;
    stage.tp = s.tp;
    stage.devices = s.devices;
    stage.forward_s = s.forward_s;
    // plan.json's backward_s includes the recomputed forward (partition/stage_cost.cpp); the replay runs it apart.
    stage.recompute_s = s.recompute ? std::clamp(s.recompute_forward_s.value_or(s.forward_s), 0.0, s.backward_s) : 0.0;
    stage.backward_s = s.backward_s - stage.recompute_s;
    stage.recompute = s.recompute;
    stage.backward_weight_s = std::min(s.backward_weight_s.value_or(0.0), stage.backward_s);
    stage.zero = s.zero;
    stage.allreduce_s = s.allreduce_s.value_or(0.0);
    stage.allreduce_exposed_s = s.allreduce_exposed_s;
    stage.optimizer_s = s.optimizer_s.value_or(0);
    stage.memory_bytes = s.memory_bytes.value_or(0);
    stage.tasks = static_cast<int64_t>(s.tasks.size());
    stage.param_bytes = s.param_bytes;
    stage.memory_static_bytes = s.memory_static_bytes;
    stage.activation_bytes_per_microbatch = s.activation_bytes_per_microbatch;
    stage.inputs = s.inputs;
    stage.outputs = s.outputs;
    plan.stages.push_back(std::move(stage));
  }
  if (document.predicted) {
    plan.predicted_iteration_s = document.predicted->iteration_s;
    plan.predicted_bubble_fraction = document.predicted->bubble_fraction;
  }
  return plan;
}

SimPlan plan_from_json(const json& j, const std::string& source) { return sim_plan(apart::plan_from_json(j, source), source); }

SimPlan load_plan(const std::filesystem::path& path) {
  const std::filesystem::path file = plan_json_path(path);
  return sim_plan(read_plan(file), file.string());
}

}  // namespace apart::sim
