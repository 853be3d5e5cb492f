// Aggregates a CostTable per model and per op type, and the one-device training memory.
#include "profiler/cost_summary.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "graph/dtype.h"
#include "graph/units.h"

namespace apart {
namespace {

std::string fmt_scaled(double x, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P", "E"};
  int i = 0;
  while (x >= 1000 && i < 6) x /= 1000, ++i;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f %s%s", x, prefixes[i], unit);
  return buf;
}

}  // namespace

int64_t trainable_param_bytes(const TaskGraph& g) {
  int64_t b = 0;
  for (const Value& v : g.values())
    if (v.kind == ValueKind::kParam && is_floating(v.dtype) && v.shape_known) b += v.bytes;
  return b;
}
int64_t trainable_param_count(const TaskGraph& g) {
  int64_t n = 0;
  for (const Value& v : g.values())
    if (v.kind == ValueKind::kParam && is_floating(v.dtype) && v.shape_known) n += v.elements;
  return n;
}

CostSummary summarize_costs(const TaskGraph& g, const CostTable& table, const Device& device) {
  CostSummary s;
  s.device = table.device;
  s.device_memory_bytes = device.memory_bytes;
  s.usable_memory_bytes = device.memory_bytes - default_memory_reserve().bytes(device.memory_bytes);
  s.microbatch_size = table.microbatch_size;
  s.precision = table.precision;
  s.tasks = static_cast<int64_t>(g.num_tasks());
  s.constant_tasks = static_cast<int64_t>(g.num_constant_tasks());
  s.params = trainable_param_count(g);
  s.param_bytes = trainable_param_bytes(g);
  s.warnings = table.warnings;
  std::map<std::string, OpTypeCost> by_op;
  for (uint32_t i = 0; i < g.num_tasks() && i < table.tasks.size(); ++i) {
    const TaskCost& c = table.tasks[i];
    s.forward_s += c.forward_s;
    s.backward_s += c.backward_s;
    s.flops += c.flops;
    s.backward_flops += c.backward_flops;
    s.saved_bytes += c.saved_bytes;
    s.max_workspace_bytes = std::max(s.max_workspace_bytes, c.workspace_bytes);
    OpTypeCost& o = by_op[g.task(TaskId(i)).op_type];
    o.op = g.task(TaskId(i)).op_type;
    ++o.tasks;
    o.forward_s += c.forward_s;
    o.backward_s += c.backward_s;
    o.flops += c.flops;
    o.backward_flops += c.backward_flops;
    o.saved_bytes += c.saved_bytes;
  }
  for (auto& [op, row] : by_op) s.by_op.push_back(row);
  std::stable_sort(s.by_op.begin(), s.by_op.end(), [](const OpTypeCost& a, const OpTypeCost& b) {
    return a.forward_s + a.backward_s > b.forward_s + b.backward_s;
  });
  const Precision precision = parse_precision(table.precision);
  for (auto opt : {Optimizer::kSgd, Optimizer::kMomentum, Optimizer::kAdam}) {
    StageMemoryInput in;
    in.param_bytes = s.param_bytes;
    in.saved_bytes_per_microbatch = s.saved_bytes;
    in.max_workspace_bytes = s.max_workspace_bytes;
    in.in_flight = 1;
    in.optimizer = opt;
    in.precision = precision;
    TrainingMemoryRow row{opt, precision, stage_memory(in), false};
    row.fits = row.memory.total <= s.usable_memory_bytes;
    s.memory.push_back(row);
  }
  return s;
}

CostSummary cost_summary(const TaskGraph& g, const Device& device, const CostOptions& options) {
  return summarize_costs(g, estimate_costs(g, device, options), device);
}

std::string format_cost_summary(const CostSummary& s, int top_ops) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "Costs on %s, micro-batch %lld, %s (analytic roofline, docs/cost-model.md)\n",
                s.device.c_str(), static_cast<long long>(s.microbatch_size), s.precision.c_str());
  out += line;
  out += "  forward   " + format_seconds(s.forward_s) + "   " + fmt_scaled(s.flops, "FLOP") + "\n";
  out += "  backward  " + format_seconds(s.backward_s) + "   " + fmt_scaled(s.backward_flops, "FLOP") + "\n";
  out += "  saved activations " + format_bytes(static_cast<double>(s.saved_bytes)) + ", largest working set " +
         format_bytes(static_cast<double>(s.max_workspace_bytes)) + "\n";
  std::snprintf(line, sizeof line, "  %-22s %6s %11s %11s %13s %12s\n", "op", "tasks", "forward", "backward", "FLOPs",
                "saved");
  out += line;
  int shown = 0;
  for (const auto& o : s.by_op) {
    if (shown++ >= top_ops) break;
    std::snprintf(line, sizeof line, "  %-22s %6lld %11s %11s %13s %12s\n", o.op.substr(0, 22).c_str(),
                  static_cast<long long>(o.tasks), format_seconds(o.forward_s).c_str(), format_seconds(o.backward_s).c_str(),
                  fmt_scaled(o.flops, "").c_str(), format_bytes(static_cast<double>(o.saved_bytes)).c_str());
    out += line;
  }
  if (static_cast<int>(s.by_op.size()) > top_ops)
    out += "  … " + std::to_string(s.by_op.size() - static_cast<size_t>(top_ops)) + " more op types\n";
  out += "  training memory on one device (" + format_bytes(static_cast<double>(s.device_memory_bytes)) + ", " +
         format_bytes(static_cast<double>(s.usable_memory_bytes)) + " usable after the default --memory-reserve " +
         default_memory_reserve().text() + "):\n";
  for (const auto& r : s.memory) {
    std::snprintf(line, sizeof line, "    %-9s %-6s %12s  (weights+grads+state %s, activations %s)%s\n",
                  std::string(optimizer_name(r.optimizer)).c_str(),
                  std::string(precision_name(r.precision)).c_str(),
                  format_bytes(static_cast<double>(r.memory.total)).c_str(),
                  format_bytes(static_cast<double>(r.memory.weights + r.memory.gradients + r.memory.optimizer_state)).c_str(),
                  format_bytes(static_cast<double>(r.memory.activations)).c_str(), r.fits ? "" : "  does not fit");
    out += line;
  }
  for (const auto& w : s.warnings) out += "  warning: " + w + "\n";
  return out;
}

nlohmann::json cost_summary_json(const CostSummary& s) {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& o : s.by_op)
    ops.push_back({{"op", o.op}, {"tasks", o.tasks}, {"forward_s", o.forward_s}, {"backward_s", o.backward_s},
                   {"flops", o.flops}, {"backward_flops", o.backward_flops}, {"saved_bytes", o.saved_bytes}});
  nlohmann::json mem = nlohmann::json::array();
  for (const auto& r : s.memory)
    mem.push_back({{"optimizer", optimizer_name(r.optimizer)},
                   {"precision", precision_name(r.precision)},
                   {"total_bytes", r.memory.total},
                   {"weights_bytes", r.memory.weights},
                   {"gradients_bytes", r.memory.gradients},
                   {"optimizer_state_bytes", r.memory.optimizer_state},
                   {"activations_bytes", r.memory.activations},
                   {"workspace_bytes", r.memory.workspace},
                   {"fits", r.fits}});
  return {{"device", s.device},
          {"device_memory_bytes", s.device_memory_bytes},
          {"usable_memory_bytes", s.usable_memory_bytes},
          {"microbatch_size", s.microbatch_size},
          {"precision", s.precision},
          {"params", s.params},
          {"param_bytes", s.param_bytes},
          {"forward_s", s.forward_s},
          {"backward_s", s.backward_s},
          {"flops", s.flops},
          {"backward_flops", s.backward_flops},
          {"saved_bytes", s.saved_bytes},
          {"max_workspace_bytes", s.max_workspace_bytes},
          {"by_op", std::move(ops)},
          {"training_memory", std::move(mem)},
          {"warnings", s.warnings}};
}

}  // namespace apart
