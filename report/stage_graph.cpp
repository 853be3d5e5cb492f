// Stage graph of a plan → DOT and apart.stagegraph/1 JSON.
#include "report/stage_graph.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "graph/text.h"

namespace apart::report {
namespace {

std::string devices_text(const std::vector<int>& d) {
  if (d.empty()) return "-";
  if (d.size() == 1) return std::to_string(d.front());
  return std::to_string(d.front()) + "-" + std::to_string(d.back());
}

std::string node_id(int stage) { return stage < 0 ? "inputs" : "stage " + std::to_string(stage); }

}  // namespace

StageGraph stage_graph(const ReportPlan& plan) {
  StageGraph g;
  g.plan = plan.source;
  bool has_inputs = false;
  bool has_outputs = false;
  for (const sim::SimStage& s : plan.sim.stages) {
    for (const sim::SimInput& in : s.inputs) has_inputs |= in.from_stage < 0;
    for (const sim::SimOutput& out : s.outputs) has_outputs |= out.to_stages.empty();
  }
  auto endpoint = [](const char* id, const char* kind) {
    StageNode n;
    n.id = id;
    n.kind = kind;
    return n;
  };
  auto new_edge = [](std::string from, std::string to) {
    StageEdge e;
    e.from = std::move(from);
    e.to = std::move(to);
    return e;
  };
  if (has_inputs) g.nodes.push_back(endpoint("inputs", "input"));
  for (const ReportStage& s : plan.stages) {
    StageNode n;
    n.id = node_id(s.id);
    n.kind = "stage";
    n.stage = s.id;
    n.tasks = static_cast<int64_t>(s.tasks.size());
    n.batch_tasks = s.batch_tasks;
    n.param_bytes = s.param_bytes.value_or(0);
    n.replicas = s.replicas;
    n.devices = s.devices;
    n.forward_s = s.forward_s;
    n.backward_s = s.backward_s;
    n.allreduce_s = s.allreduce_s;
    n.memory_bytes = s.memory_bytes;
    if (!s.layers.empty()) {
      n.first_layer = first_layer(s);
      n.last_layer = last_layer(s);
    }
    g.nodes.push_back(std::move(n));
  }
  if (has_outputs) g.nodes.push_back(endpoint("outputs", "output"));

  // One edge per (producer, consumer) pair, the consumer's view of the bytes (what crosses the link).
  std::map<std::pair<int, int>, size_t> edge_of;
  for (const sim::SimStage& s : plan.sim.stages) {
    for (const sim::SimInput& in : s.inputs) {
      const auto key = std::make_pair(in.from_stage, s.id);
      auto [it, inserted] = edge_of.emplace(key, g.edges.size());
      if (inserted) g.edges.push_back(new_edge(node_id(in.from_stage), node_id(s.id)));
      g.edges[it->second].values.push_back(in.value);
      g.edges[it->second].bytes += in.bytes;
    }
  }
  for (const sim::SimStage& s : plan.sim.stages) {
    for (const sim::SimOutput& out : s.outputs) {
      if (!out.to_stages.empty()) continue;
      const auto key = std::make_pair(s.id, -2);
      auto [it, inserted] = edge_of.emplace(key, g.edges.size());
      if (inserted) g.edges.push_back(new_edge(node_id(s.id), "outputs"));
      g.edges[it->second].values.push_back(out.value);
      g.edges[it->second].bytes += out.bytes;
    }
  }
  return g;
}

std::string stage_graph_dot(const StageGraph& g) {
  std::ostringstream out;
  out << "// apart viz: stage graph of " << g.plan << " (nodes = stages, edges = boundary values, bytes per micro-batch)\n";
  out << "digraph \"apart_stages\" {\n  rankdir=LR;\n  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", "
         "fillcolor=\"#e8f0fe\"];\n  edge [fontname=\"Helvetica\", fontsize=10];\n";
  for (const StageNode& n : g.nodes) {
    std::string label;
    if (n.kind == "stage") {
      label = n.id + "\n" +
              (n.batch_tasks ? format_task_counts(static_cast<size_t>(n.tasks), static_cast<size_t>(*n.batch_tasks))
                             : std::to_string(n.tasks) + " tasks") +
              ", " + format_bytes(static_cast<double>(n.param_bytes)) + " params\n×" + std::to_string(n.replicas) + " (devices " + devices_text(n.devices) + ")\nF+B " +
              format_seconds(n.forward_s + n.backward_s) + " per micro-batch";
      if (!n.first_layer.empty())
        label += "\n" + (n.first_layer == n.last_layer ? n.first_layer : n.first_layer + " … " + n.last_layer);
      out << "  " << dot_quote(n.id) << " [label=" << dot_quote(label) << "];\n";
    } else {
      out << "  " << dot_quote(n.id) << " [label=" << dot_quote("model " + n.id)
          << ", shape=ellipse, fillcolor=\"#f1f3f4\"];\n";
    }
  }
  for (const StageEdge& e : g.edges) {
    std::string label = e.values.size() == 1 ? e.values.front() : std::to_string(e.values.size()) + " values";
    label += "\n" + format_bytes(e.bytes);
    out << "  " << dot_quote(e.from) << " -> " << dot_quote(e.to) << " [label=" << dot_quote(label) << "];\n";
  }
  out << "}\n";
  return out.str();
}

nlohmann::ordered_json stage_graph_json(const StageGraph& g) {
  using json = nlohmann::ordered_json;
  json j;
  j["schema"] = "apart.stagegraph/1";
  j["plan"] = g.plan;
  j["nodes"] = json::array();
  for (const StageNode& n : g.nodes) {
    json node = {{"id", n.id}, {"kind", n.kind}};
    if (n.kind == "stage") {
      node["stage"] = n.stage;
      node["tasks"] = n.tasks;
      if (n.batch_tasks) node["batch_tasks"] = *n.batch_tasks;
      node["param_bytes"] = n.param_bytes;
      node["replicas"] = n.replicas;
      node["devices"] = n.devices;
      node["forward_s"] = n.forward_s;
      node["backward_s"] = n.backward_s;
      node["time_s"] = n.forward_s + n.backward_s;
      node["allreduce_s"] = n.allreduce_s;
      node["memory_bytes"] = n.memory_bytes;
      node["first_layer"] = n.first_layer;
      node["last_layer"] = n.last_layer;
    }
    j["nodes"].push_back(std::move(node));
  }
  j["edges"] = json::array();
  for (const StageEdge& e : g.edges)
    j["edges"].push_back({{"from", e.from}, {"to", e.to}, {"values", e.values}, {"bytes", e.bytes}});
  return j;
}

}  // namespace apart::report
