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

// An interleaved plan of P = replicas.size() stages and v chunks per device: pipeline_plan's stages, with the P·v
// chunks as plan.json lists them (chunk c on stage c mod P, values along the chain c → c + 1, chunk 0 reading the
// model input, plus `skips` (from, to) between chunks).
inline PlanDocument interleaved_plan(const std::vector<int>& replicas, int chunks_per_device, int64_t microbatches,
                                     int64_t samples = 6, const std::vector<std::pair<int, int>>& skips = {}) {
  PlanDocument plan = pipeline_plan(replicas, microbatches, Schedule::kInterleaved, samples);
  plan.training.virtual_stages = chunks_per_device;
  const int p = static_cast<int>(replicas.size());
  const int chunks = p * chunks_per_device;
  for (int c = 0; c < chunks; ++c) {
    PlanVirtualStage chunk;
    chunk.id = c;
    chunk.stage = c % p;
    chunk.tasks = {"task" + std::to_string(c)};
    if (c == 0) chunk.inputs.push_back({"input", -1, 64.0});
    plan.virtual_stages.push_back(chunk);
  }
  std::vector<std::pair<int, int>> edges = skips;
  for (int c = 0; c + 1 < chunks; ++c) edges.push_back({c, c + 1});
  for (const auto& [from, to] : edges) {
    const std::string value = "c" + std::to_string(from) + "_" + std::to_string(to);
    plan.virtual_stages[static_cast<size_t>(to)].inputs.push_back({value, from, 128.0});
    plan.virtual_stages[static_cast<size_t>(from)].outputs.push_back({value, {to}, 128.0});
  }
  return plan;
}

}  // namespace apart::testing
