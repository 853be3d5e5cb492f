// Per-model and per-op-type cost summary for `apart inspect --device` (text and JSON).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "graph/task_graph.h"
#include "profiler/cost_model.h"
#include "profiler/memory_model.h"

namespace apart {

struct OpTypeCost {
  std::string op;
  int64_t tasks = 0;
  double forward_s = 0, backward_s = 0;
  double flops = 0, backward_flops = 0;
  int64_t saved_bytes = 0;
};

struct TrainingMemoryRow {
  Optimizer optimizer = Optimizer::kAdam;
  Precision precision = Precision::kFp32;
  StageMemory memory;  // one device holding the whole model, one micro-batch in flight
  bool fits = false;   // total ≤ device memory
};

struct CostSummary {
  std::string device;
  int64_t device_memory_bytes = 0;
  int64_t usable_memory_bytes = 0;  // less the default memory reserve (profiler/device.h), what `fits` compares with
  int64_t microbatch_size = 0;
  std::string precision;
  int64_t tasks = 0, constant_tasks = 0;
  int64_t params = 0, param_bytes = 0;  // distinct float params
  double forward_s = 0, backward_s = 0;
  double flops = 0, backward_flops = 0;
  int64_t saved_bytes = 0, max_workspace_bytes = 0;
  std::vector<OpTypeCost> by_op;  // most expensive (forward + backward) first
  std::vector<TrainingMemoryRow> memory;  // SGD, momentum, Adam at the table's precision (+ mixed)
  std::vector<std::string> warnings;
};

// Distinct float params of the graph (each initializer once, however many tasks read it).
int64_t trainable_param_bytes(const TaskGraph& g);
int64_t trainable_param_count(const TaskGraph& g);

CostSummary summarize_costs(const TaskGraph& g, const CostTable& table, const Device& device);
// estimate_costs + summarize_costs.
CostSummary cost_summary(const TaskGraph& g, const Device& device, const CostOptions& options = {});
std::string format_cost_summary(const CostSummary& s, int top_ops = 10);
nlohmann::json cost_summary_json(const CostSummary& s);

}  // namespace apart
