// `apart inspect`: what is in a model, in a summary a person reads in five seconds (or --json).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/cli_common.h"
#include "cli/command_registry.h"
#include "graph/text.h"
#include "importer/importer.h"
#include "profiler/cost_summary.h"
#include "profiler/device.h"
#include "profiler/op_work.h"

namespace apart::cli {

namespace {

struct InspectArgs {
  std::string model;
  ModelFlags model_flags;
  bool json = false;
  int top = 5;
  std::string device;  // --device: add the cost model's summary (profiler/cost_summary.h)
};

struct Summary {
  size_t tasks = 0, batch_tasks = 0, constant_tasks = 0, opaque_tasks = 0;
  int64_t params = 0, param_bytes = 0;
  int64_t activation_bytes = 0;
  double flops = 0;
  bool flops_complete = true;
  int64_t batch = 0;  // samples in the bound batch (0: unknown)
  std::map<std::string, size_t> ops;
  std::map<std::string, double> flops_by_op;
};

Summary summarize(const ImportedModel& m) {
  const TaskGraph& g = m.graph;
  Summary s;
  s.tasks = g.num_tasks();
  s.constant_tasks = g.num_constant_tasks();
  s.batch_tasks = s.tasks - s.constant_tasks;
  s.batch = m.batch;
  for (const Value& v : g.values()) {
    if (v.kind == ValueKind::kParam) {
      s.params += v.elements;
      s.param_bytes += v.bytes;
    } else if (v.kind == ValueKind::kActivation || v.kind == ValueKind::kOutput) {
      s.activation_bytes += v.bytes;
    }
  }
  for (size_t i = 0; i < g.num_tasks(); ++i) {
    const TaskId id(static_cast<uint32_t>(i));
    const Task& t = g.task(id);
    const std::string op = t.domain.empty() ? t.op_type : t.domain + "::" + t.op_type;
    ++s.ops[op];
    s.opaque_tasks += t.opaque;
    const OpWork w = forward_work(g, id);
    s.flops += w.flops;
    s.flops_by_op[op] += w.flops;
    if (!w.known) s.flops_complete = false;
  }
  return s;
}

nlohmann::json value_json(const TaskGraph& g, ValueId id) {
  const Value& v = g.value(id);
  nlohmann::json j{{"name", v.name}, {"dtype", std::string(dtype_name(v.dtype))}};
  j["shape"] = v.shape_known ? nlohmann::json(v.shape) : nlohmann::json(nullptr);
  j["bytes"] = v.bytes;
  return j;
}

nlohmann::json to_json(const ImportedModel& m, const Summary& s) {
  nlohmann::json j;
  j["model"] = m.path;
  j["ir_version"] = m.ir_version;
  j["opsets"] = m.opsets;
  j["producer"] = m.producer;
  j["tasks"] = s.tasks;
  j["batch_tasks"] = s.batch_tasks;
  j["constant_tasks"] = s.constant_tasks;
  j["opaque_tasks"] = s.opaque_tasks;
  j["params"] = s.params;
  j["param_bytes"] = s.param_bytes;
  j["flops"] = s.flops;
  j["flops_complete"] = s.flops_complete;
  j["batch"] = s.batch;
  j["flops_per_sample"] = s.batch > 0 ? s.flops / static_cast<double>(s.batch) : s.flops;
  j["activation_bytes"] = s.activation_bytes;
  j["activation_bytes_per_sample"] = s.batch > 0 ? s.activation_bytes / s.batch : s.activation_bytes;
  j["inputs"] = nlohmann::json::array();
  for (ValueId in : m.graph.graph_inputs()) j["inputs"].push_back(value_json(m.graph, in));
  j["outputs"] = nlohmann::json::array();
  for (ValueId out : m.graph.graph_outputs()) j["outputs"].push_back(value_json(m.graph, out));
  j["ops"] = s.ops;
  j["flops_by_op"] = s.flops_by_op;
  j["dims"] = nlohmann::json::array();
  for (const auto& b : m.bindings) j["dims"].push_back({{"dim", b.dim}, {"value", b.value}, {"source", b.source}});
  j["external_data_present"] = m.external_data_present;
  j["unknown_shape_values"] = m.unknown_shape_values;
  j["constant_params"] = {{"count", m.constant_params.count}, {"bytes", m.constant_params.bytes}};
  j["notes"] = m.notes;
  j["warnings"] = m.warnings;
  return j;
}

std::string value_line(const TaskGraph& g, ValueId id) {
  const Value& v = g.value(id);
  return fmt::format("{} {} [{}]", printable(v.name), dtype_name(v.dtype), v.shape_known ? shape_string(v.shape) : "?");
}

void print_text(const ImportedModel& m, const Summary& s, int top) {
  std::string opsets;
  for (const auto& [domain, version] : m.opsets) opsets += fmt::format("{}{}={}", opsets.empty() ? "" : " ", domain.empty() ? "ai.onnx" : domain, version);
  fmt::print("model       {}  (ir {}, {}{})\n", printable(m.path), m.ir_version, printable(opsets),
             m.producer.empty() ? "" : ", from " + printable(m.producer));
  fmt::print("tasks       {} ({} batch, {} constant{})\n", s.tasks, s.batch_tasks, s.constant_tasks,
             s.opaque_tasks ? fmt::format(", {} opaque", s.opaque_tasks) : "");
  fmt::print("params      {} ({}){}\n", format_count(s.params), format_bytes(s.param_bytes),
             m.external_data_present ? "" : "  [external data not present]");
  for (ValueId in : m.graph.graph_inputs()) fmt::print("input       {}\n", value_line(m.graph, in));
  for (ValueId out : m.graph.graph_outputs()) fmt::print("output      {}\n", value_line(m.graph, out));
  for (const auto& b : m.bindings) fmt::print("dim         {} = {}  ({})\n", printable(b.dim), b.value, printable(b.source));
  const double per = s.batch > 0 ? static_cast<double>(s.batch) : 1.0;
  fmt::print("batch       {}\n", s.batch > 0 ? std::to_string(s.batch) : "unknown (figures below are for the whole graph)");
  fmt::print("activations {} per sample ({} in all)\n", format_bytes(static_cast<int64_t>(s.activation_bytes / per)), format_bytes(s.activation_bytes));
  fmt::print("flops       {} forward per sample ({} in all{})\n", human_flops(s.flops / per), human_flops(s.flops),
             s.flops_complete ? "" : "; some ops could not be counted");
  std::vector<std::pair<std::string, double>> by_flops(s.flops_by_op.begin(), s.flops_by_op.end());
  std::stable_sort(by_flops.begin(), by_flops.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string top_ops;
  for (int i = 0; i < top && i < static_cast<int>(by_flops.size()) && by_flops[i].second > 0; ++i)
    top_ops += fmt::format("{}{} {:.1f}%", i ? ", " : "", printable(by_flops[i].first), s.flops > 0 ? 100.0 * by_flops[i].second / s.flops : 0.0);
  if (!top_ops.empty()) fmt::print("top ops     {}\n", top_ops);
  std::vector<std::pair<std::string, size_t>> by_count(s.ops.begin(), s.ops.end());
  std::stable_sort(by_count.begin(), by_count.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string hist;
  for (const auto& [op, n] : by_count) hist += fmt::format("{}{} {}", hist.empty() ? "" : ", ", printable(op), n);
  fmt::print("ops         {}\n", hist);
  for (const auto& n : m.notes) fmt::print("note        {}\n", printable(n));
  for (const auto& w : m.warnings) fmt::print(stderr, "warning: {}\n", printable(w));
}

}  // namespace

static const bool kRegistered = register_command({"inspect", 10, [](CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "Summarize an ONNX model: tasks, ops, params, shapes, activations, FLOPs");
  cmd->add_option("model", args->model, "Path of the .onnx model")->required();
  add_model_flags(*cmd, args->model_flags, /*default_batch=*/1);
  cmd->add_flag("--json", args->json, "Print one JSON object instead of the text summary");
  cmd->add_option("--top", args->top, "How many ops to list by FLOPs")->default_val(5);
  cmd->add_option("--device", args->device,
                  device_flag_help("Add forward/backward time, saved activations and training memory on this "
                                   "device, at its default precision (mixed on GPUs, fp32 on cpu)"));
  cmd->callback([args] {
    const ImportedModel m = import_model(args->model, import_options(args->model_flags));
    note_constant_params(m.constant_params);
    const Summary s = summarize(m);
    std::optional<CostSummary> costs;
    if (!args->device.empty()) {
      const Device device = device_preset(args->device);
      CostOptions options;
      options.reference_batch = m.bound_samples();
      options.precision = default_precision(device);
      costs = cost_summary(m.graph, device, options);
    }
    if (args->json) {
      nlohmann::json j = to_json(m, s);
      if (costs) j["costs"] = cost_summary_json(*costs);
      fmt::print("{}\n", j.dump(2));
    } else {
      print_text(m, s, args->top);
      if (costs) fmt::print("\n{}", format_cost_summary(*costs, std::max(args->top, 10)));
    }
  });
}});

}  // namespace apart::cli
