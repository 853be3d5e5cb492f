// The stage graph of a plan: nodes = stages (plus the model's inputs and outputs), edges = boundary values with
// bytes. Written as Graphviz DOT or as JSON (schema apart.stagegraph/1) by `apart viz`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/units.h"

#include "report/report_plan.h"

namespace apart::report {

struct StageNode {
  std::string id;     // "stage 0", "inputs", "outputs"
  std::string kind;   // "stage", "input" or "output"
  int stage = -1;     // plan stage id; -1 for inputs/outputs
  int64_t tasks = 0;
  std::optional<int64_t> batch_tasks;  // when plan.json records it
  int64_t param_bytes = 0;
  int replicas = 0;
  std::vector<int> devices;
  double forward_s = 0;   // per micro-batch
  double backward_s = 0;  // per micro-batch, as the plan writes it
  double allreduce_s = 0;
  int64_t memory_bytes = 0;
  std::string first_layer;
  std::string last_layer;
};

struct StageEdge {
  std::string from;  // node ids
  std::string to;
  std::vector<std::string> values;
  double bytes = 0;  // Σ bytes of the values, per micro-batch of one replica of the receiving stage
};

struct StageGraph {
  std::string plan;  // plan.json path
  std::vector<StageNode> nodes;
  std::vector<StageEdge> edges;
};

StageGraph stage_graph(const ReportPlan& plan);
std::string stage_graph_dot(const StageGraph& graph);
nlohmann::ordered_json stage_graph_json(const StageGraph& graph);

// Formatting: graph/units.h (format_bytes, format_count, format_seconds).
using apart::format_bytes;
using apart::format_count;
using apart::format_seconds;

}  // namespace apart::report
