// The stage graph of a plan: nodes = stages (plus the model's inputs and outputs), edges = boundary values with
// bytes. Written as Graphviz DOT or as JSON (schema apart.stagegraph/1) by `apart viz`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/report_plan.h"

namespace apart::report {

struct StageNode {
  std::string id;     // "stage 0", "inputs", "outputs"
  std::string kind;   // "stage", "input" or "output"
  int stage = -1;     // plan stage id; -1 for inputs/outputs
  int64_t tasks = 0;
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

// Shared formatting (decimal units): "1.23 MB", "167.7K", "1.212 ms".
std::string format_bytes(double bytes);
std::string format_count(double n);
std::string format_seconds(double s);

}  // namespace apart::report
