// A Plan as one line of text: what every method chose on a small model, so a refactor of the search can be checked
// against what the code gave before it (tests/partition/methods_test.cpp).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "partition/partition.h"
#include "test_cluster.h"

namespace apart::testing {

inline std::string plan_fingerprint(const Plan& plan) {
  auto number = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.12g", x);  // not the last bits: Debug and Release may round apart
    return std::string(buf);
  };
  std::string line = plan.search.chosen_split + " m=" + std::to_string(plan.microbatches) + " " +
                     std::string(schedule_name(plan.schedule)) + (plan.recompute ? " recompute" : "") + " stages";
  for (const PlanStage& s : plan.stages) {
    line += " " + std::to_string(s.tasks.size()) + "x" + std::to_string(s.replicas) + "@" +
            std::to_string(s.devices.empty() ? -1 : s.devices.front()) + (s.recompute ? "r" : "") + "[" +
            std::to_string(s.inputs.size()) + "," + std::to_string(s.outputs.size()) + "]";
  }
  line += " blocks=" + std::to_string(plan.search.blocks) + " solved=" + std::to_string(plan.search.candidates) +
          " placed=" + std::to_string(plan.search.candidates_placed) +
          " simulated=" + std::to_string(plan.search.simulated) + " pruned=" + std::to_string(plan.search.pruned) +
          " iteration=" + number(plan.simulated.iteration_s) + " estimate=" + number(plan.estimate.iteration_s) +
          " peak=" + std::to_string(plan.peak_memory_bytes);
  return line;
}

// Small models and clusters on which every method's plan is fingerprinted: multi-node (pipeline-major), tight memory
// (recomputation where needed), coarsened blocks, pinned choices.
struct MethodCase {
  uint32_t seed = 0;
  int tasks = 8;
  bool chain = true;
  int devices = 4;
  int devices_per_node = 2;
  int64_t batch = 16;
  int64_t memory = 1'000'000'000;
  Recompute recompute = Recompute::kAuto;
  int blocks = 0;          // 0: automatic
  int stages = 0;          // 0: free
  int64_t microbatches = 0;  // 0: free
};

inline std::vector<MethodCase> method_cases() {
  return {
      {.seed = 90, .tasks = 12, .chain = true, .devices = 4, .devices_per_node = 2, .batch = 16},
      {.seed = 91, .tasks = 14, .chain = false, .devices = 8, .devices_per_node = 4, .batch = 32},
      {.seed = 92, .tasks = 10, .chain = true, .devices = 6, .devices_per_node = 2, .batch = 8, .memory = 3'400'000},
      {.seed = 93, .tasks = 16, .chain = false, .devices = 3, .devices_per_node = 4, .batch = 16,
       .recompute = Recompute::kOn},
      {.seed = 94, .tasks = 13, .chain = false, .devices = 16, .devices_per_node = 8, .batch = 64, .blocks = 5},
      {.seed = 95, .tasks = 11, .chain = true, .devices = 8, .devices_per_node = 4, .batch = 16, .stages = 2,
       .microbatches = 4},
      {.seed = 96, .tasks = 9, .chain = false, .devices = 2, .devices_per_node = 2, .batch = 4, .memory = 10},
      {.seed = 97, .tasks = 12, .chain = false, .devices = 8, .devices_per_node = 2, .batch = 32, .memory = 2'200'000},
      {.seed = 98, .tasks = 14, .chain = true, .devices = 12, .devices_per_node = 4, .batch = 24, .memory = 1'900'000},
  };
}

inline PartitionOptions method_case_options(const MethodCase& c, Method method) {
  PartitionOptions o;
  o.method = method;
  o.cluster = test_cluster(c.devices, c.devices_per_node, c.memory);
  o.training.global_batch = c.batch;
  o.stage.recompute = c.recompute;
  o.block.blocks = c.blocks;
  if (c.stages) o.stage.stages = c.stages;
  if (c.microbatches) o.stage.microbatches = c.microbatches;
  return o;
}

}  // namespace apart::testing
