// Small plan documents built in code for the schedule tests (and the simulator's agreement with them).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "plan/plan.h"

namespace apart::testing {

// Stage s has replicas[s] replicas on consecutive devices (stage 0 first); values flow along `edges` (from, to),
// by default the chain s → s + 1; stage 0 reads the model input. Each micro-batch holds `samples` samples.
inline PlanDocument pipeline_plan(const std::vector<int>& replicas, int64_t microbatches, Schedule schedule,
                                  int64_t samples = 6, std::vector<std::pair<int, int>> edges = {}) {
  const int stages = static_cast<int>(replicas.size());
  if (edges.empty())
    for (int s = 0; s + 1 < stages; ++s) edges.push_back({s, s + 1});
  PlanDocument plan;
  plan.training.microbatches = microbatches;
  plan.training.global_batch = samples * microbatches;
  plan.training.schedule = schedule;
  int device = 0;
  for (int s = 0; s < stages; ++s) {
    PlanStageRecord stage;
    stage.id = s;
    stage.replicas = replicas[static_cast<size_t>(s)];
    for (int j = 0; j < stage.replicas; ++j) stage.devices.push_back(device++);
    stage.forward_s = 1.0 + 0.25 * s;
    stage.backward_s = 2.0 + 0.5 * s;
    stage.memory_bytes = 1000;
    if (s == 0) stage.inputs.push_back({"input", -1, 64.0});
    plan.stages.push_back(stage);
  }
  for (const auto& [from, to] : edges) {
    const std::string value = "v" + std::to_string(from) + "_" + std::to_string(to);
    plan.stages[static_cast<size_t>(to)].inputs.push_back({value, from, 128.0});
    plan.stages[static_cast<size_t>(from)].outputs.push_back({value, {to}, 128.0});
  }
  plan.cluster.devices = device;
  return plan;
}

}  // namespace apart::testing
