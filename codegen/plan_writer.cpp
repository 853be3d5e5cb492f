// plan.json, plan.dot and report.txt from a Plan, and the all-or-nothing plan directory.
#include "codegen/plan_writer.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "codegen/sha256.h"
#include "graph/error.h"
#include "graph/units.h"
#include "graph/text.h"

namespace apart {
namespace {

// "off", "on" (every stage) or "3 of 8 stages" (recomputation where a stage needs it).
std::string recompute_summary(const Plan& plan) {
  size_t n = 0;
  for (const PlanStage& s : plan.stages) n += s.recompute ? 1 : 0;
  if (n == 0) return "off";
  if (n == plan.stages.size()) return "on";
  return std::to_string(n) + " of " + std::to_string(plan.stages.size()) + " stages";
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string human_params(double n) {
  const char* unit[] = {"", "K", "M", "B", "T"};
  int u = 0;
  while (n >= 1000 && u < 4) { n /= 1000; ++u; }
  return fixed(n, u == 0 ? 0 : 2) + unit[u];
}

}  // namespace

ModelInfo describe_model(const TaskGraph& graph, const std::filesystem::path& model_path) {
  ModelInfo m;
  m.path = model_path.string();
  m.sha256 = sha256_file_hex(model_path);
  for (const Value& v : graph.values())
    if (v.kind == ValueKind::kParam) {
      m.params += v.elements;
      m.param_bytes += v.bytes;
    }
  return m;
}

nlohmann::ordered_json plan_to_json(const Plan& plan, const TaskGraph& graph, const ModelInfo& model) {
  using json = nlohmann::ordered_json;
  const PartitionOptions& o = plan.options;
  json j;
  j["schema"] = "apart.plan/1";
  j["model"] = {{"path", model.path}, {"sha256", model.sha256}, {"tasks", graph.num_tasks()},
                {"params", model.params}, {"param_bytes", model.param_bytes}};
  j["cluster"] = {{"devices", o.cluster.devices}, {"device", o.cluster.device},
                  {"devices_per_node", o.cluster.devices_per_node}, {"memory_bytes", o.cluster.memory_bytes},
                  {"device_memory_bytes", o.cluster.device_memory_bytes > 0 ? o.cluster.device_memory_bytes : o.cluster.memory_bytes},
                  {"memory_reserve_bytes", o.cluster.memory_reserve_bytes}, {"memory_reserve", o.cluster.memory_reserve},
                  {"intra_node_bandwidth", o.cluster.intra_node_bandwidth},
                  {"inter_node_bandwidth", o.cluster.inter_node_bandwidth},
                  {"layout", layout_name(plan.layout)}};
  j["training"] = {{"global_batch", o.training.global_batch}, {"microbatches", plan.microbatches},
                   {"microbatch_size", plan.microbatch_size}, {"schedule", schedule_name(plan.schedule)},
                   {"optimizer", optimizer_name(o.training.optimizer)},
                   {"precision", precision_name(o.training.precision)}, {"recompute", plan.recompute},
                   {"overlap_allreduce", o.training.overlap_allreduce}};
  json options = {{"method", method_name(o.method)},
                  {"stages", plan.stages.size()},
                  {"replicas", o.stage.replicas ? json(*o.stage.replicas) : json("auto")},
                  {"microbatches", plan.microbatches},
                  {"schedule", schedule_name(plan.schedule)},
                  {"recompute", recompute_summary(plan)},
                  {"blocks", o.block.blocks > 0 ? json(o.block.blocks) : json("auto")},
                  {"balance_cap", o.block.balance_cap},
                  {"time_limit_s", o.stage.time_limit_s}};
  j["options"] = options;
  json stages = json::array();
  for (const PlanStage& s : plan.stages) {
    json st;
    st["id"] = s.id;
    st["replicas"] = s.replicas;
    st["devices"] = s.devices;
    json tasks = json::array();
    for (TaskId t : s.tasks) tasks.push_back(graph.task(t).name);
    st["tasks"] = tasks;
    st["batch_tasks"] = s.batch_tasks;
    st["microbatch_size"] = s.cost.microbatch;
    st["forward_s"] = s.cost.forward_s;
    st["backward_s"] = s.cost.backward_s;
    st["recompute"] = s.recompute;
    st["comm_s"] = s.cost.comm_s;
    st["allreduce_s"] = s.cost.allreduce_s;
    st["allreduce_exposed_s"] = s.cost.allreduce_exposed_s;
    st["step_s"] = s.cost.step_s;
    st["param_bytes"] = s.cost.param_bytes;
    st["memory_bytes"] = s.cost.memory_bytes;
    json inputs = json::array();
    for (const StageInput& in : s.inputs)
      inputs.push_back({{"value", graph.value(in.value).name}, {"from_stage", in.from_stage},
                        {"bytes", static_cast<int64_t>(in.bytes)}});
    st["inputs"] = inputs;
    json outputs = json::array();
    for (const StageOutput& out : s.outputs)
      outputs.push_back({{"value", graph.value(out.value).name}, {"to_stages", out.to_stages},
                         {"bytes", static_cast<int64_t>(out.bytes)}});
    st["outputs"] = outputs;
    stages.push_back(st);
  }
  j["stages"] = stages;
  // The prediction is the event-level replay of this plan (what chose it); the analytic estimate rides along.
  j["predicted"] = {{"iteration_s", plan.simulated.iteration_s},
                    {"bottleneck_stage", plan.simulated.bottleneck_stage},
                    {"bubble_fraction", plan.simulated.bubble_fraction},
                    {"samples_per_s", plan.samples_per_s},
                    {"peak_memory_bytes", plan.peak_memory_bytes},
                    {"pipeline_s", plan.simulated.pipeline_s},
                    {"compute_lower_bound_s", plan.compute_lower_bound_s},
                    {"source", "simulated"},
                    {"estimate_iteration_s", plan.estimate.iteration_s}};
  j["search"] = {{"seconds", plan.search.seconds},
                 {"atomic_components", plan.search.atomic_components},
                 {"blocks", plan.search.blocks},
                 {"coarsening_levels", plan.search.coarsening_levels},
                 {"refinement_moves", plan.search.refinement_moves},
                 {"candidates", plan.search.candidates},
                 {"candidates_placed", plan.search.candidates_placed},
                 {"simulated", plan.search.simulated},
                 {"pruned_by_bound", plan.search.pruned},
                 {"not_simulated", plan.search.not_simulated},
                 {"chosen_split", plan.search.chosen_split},
                 {"stopped_by_time_limit", plan.search.stopped_by_time_limit}};
  return j;
}

std::string plan_to_dot(const Plan& plan, const TaskGraph& graph, bool detail) {
  std::ostringstream out;
  out << "digraph plan {\n  rankdir=TB;\n  node [shape=box, fontsize=10];\n";
  std::vector<int> stage_of(graph.num_tasks(), -1);
  for (const PlanStage& s : plan.stages)
    for (TaskId t : s.tasks)
      if (!graph.task(t).constant) stage_of[t.value()] = s.id;
  for (const PlanStage& s : plan.stages) {
    out << "  subgraph " << dot_quote("cluster_stage_" + std::to_string(s.id)) << " {\n";
    out << "    label=" << dot_quote("stage " + std::to_string(s.id) + " ×" + std::to_string(s.replicas) + "  " +
                                     format_seconds(s.cost.step_s) + " per micro-batch") << ";\n";
    if (detail) {
      for (TaskId t : s.tasks)
        if (!graph.task(t).constant)
          out << "    " << dot_quote(graph.task(t).name) << " [label=" << dot_quote(graph.task(t).name + "\n" + graph.task(t).op_type) << "];\n";
    } else {
      out << "    " << dot_quote("stage " + std::to_string(s.id)) << " [label="
          << dot_quote("stage " + std::to_string(s.id) + "\n" + format_task_counts(s.tasks.size(), s.batch_tasks) + "\n" +
                       format_bytes(static_cast<double>(s.cost.memory_bytes))) << "];\n";
    }
    out << "  }\n";
  }
  if (detail) {
    for (uint32_t t = 0; t < graph.num_tasks(); ++t) {
      if (stage_of[t] < 0) continue;
      for (TaskId succ : graph.successors(TaskId(t)))
        if (stage_of[succ.value()] >= 0)
          out << "  " << dot_quote(graph.task(TaskId(t)).name) << " -> " << dot_quote(graph.task(succ).name)
              << (stage_of[succ.value()] != stage_of[t] ? " [color=red]" : "") << ";\n";
    }
  } else {
    for (const PlanStage& s : plan.stages)
      for (const StageOutput& o : s.outputs)
        for (int to : o.to_stages)
          out << "  " << dot_quote("stage " + std::to_string(s.id)) << " -> " << dot_quote("stage " + std::to_string(to))
              << " [label=" << dot_quote(graph.value(o.value).name) << "];\n";
  }
  out << "}\n";
  return out.str();
}

namespace {
// "3", "0-7", or "0-56/8" (every 8th device: a pipeline-major stage).
std::string device_range(const std::vector<int>& d) {
  if (d.empty()) return "-";
  if (d.size() == 1) return std::to_string(d.front());
  const int step = d[1] - d[0];
  for (size_t i = 1; i < d.size(); ++i)
    if (d[i] - d[i - 1] != step) {
      std::string list;
      for (int x : d) list += (list.empty() ? "" : ",") + std::to_string(x);
      return list;
    }
  return std::to_string(d.front()) + "-" + std::to_string(d.back()) + (step == 1 ? "" : "/" + std::to_string(step));
}
}  // namespace

std::string plan_report(const Plan& plan, const TaskGraph& graph, const ModelInfo& model) {
  const PartitionOptions& o = plan.options;
  std::ostringstream r;
  r << "apart plan for " << model.path << " (" << format_task_counts(graph.num_tasks(), graph.num_tasks() - graph.num_constant_tasks())
    << ", " << human_params(model.params) << " params)\n";
  const int64_t device_memory = o.cluster.device_memory_bytes > 0 ? o.cluster.device_memory_bytes : o.cluster.memory_bytes;
  r << o.cluster.devices << " × " << o.cluster.device << " (" << o.cluster.devices_per_node << " per node, "
    << format_bytes(static_cast<double>(device_memory)) << " each, " << format_bytes(static_cast<double>(o.cluster.memory_bytes))
    << " usable: --memory-reserve " << o.cluster.memory_reserve << "), precision " << precision_name(o.training.precision)
    << ", batch " << o.training.global_batch << " = " << plan.microbatches << " micro-batch"
    << (plan.microbatches == 1 ? "" : "es") << " of " << plan.microbatch_size << " (split among a stage's replicas), "
    << schedule_name(plan.schedule) << ", " << optimizer_name(o.training.optimizer) << ", recompute "
    << recompute_summary(plan) << ", method " << method_name(o.method) << "\n\n";
  char line[320];
  std::snprintf(line, sizeof line, "%5s  %-32s %9s %10s %10s %10s  %-22s %8s %s\n", "stage", "tasks", "params",
                "compute", "comm", "allreduce", "memory / usable", "replicas", "devices");
  r << line;
  const std::string limit = format_bytes(static_cast<double>(o.cluster.memory_bytes));
  for (const PlanStage& s : plan.stages) {
    const std::string mem = format_bytes(static_cast<double>(s.cost.memory_bytes)) + " / " + limit;
    const std::string devices = device_range(s.devices);
    std::snprintf(line, sizeof line, "%5d  %-32s %9s %10s %10s %10s  %-22s %8d %s%s\n", s.id,
                  format_task_counts(s.tasks.size(), s.batch_tasks).c_str(),
                  human_params(static_cast<double>(s.cost.param_bytes) / 4).c_str(), format_seconds(s.cost.compute_s).c_str(),
                  format_seconds(s.cost.comm_s).c_str(), format_seconds(s.cost.allreduce_s).c_str(), mem.c_str(), s.replicas,
                  devices.c_str(), s.id == plan.simulated.bottleneck_stage ? "  ← bottleneck" : "");
    r << line;
  }
  int used = 0;
  for (const PlanStage& s : plan.stages) used += s.replicas;
  r << "\n";
  r << "predicted iteration  " << format_seconds(plan.simulated.iteration_s) << "   (simulated: pipeline "
    << format_seconds(plan.simulated.pipeline_s) << ", then all-reduce; analytic estimate "
    << format_seconds(plan.estimate.iteration_s) << ")\n";
  r << "samples/s            " << format_significant(plan.samples_per_s, 4) << "\n";
  r << "bubble fraction      " << fixed(plan.simulated.bubble_fraction, 3) << "\n";
  r << "compute lower bound  " << format_seconds(plan.compute_lower_bound_s)
    << "   (total forward+backward work / " << o.cluster.devices << " devices); plan is "
    << fixed(plan.compute_lower_bound_s > 0 ? plan.simulated.iteration_s / plan.compute_lower_bound_s : 0, 2)
    << "× the bound\n";
  r << "devices used         " << used << " of " << o.cluster.devices << ", " << layout_name(plan.layout) << "\n";
  r << "peak memory          " << format_bytes(static_cast<double>(plan.peak_memory_bytes)) << " of " << limit
    << " usable (" << format_bytes(static_cast<double>(device_memory)) << " less "
    << format_bytes(static_cast<double>(o.cluster.memory_reserve_bytes)) << " reserved)\n";
  r << "search               " << plan.search.atomic_components << " atomic components → " << plan.search.blocks
    << " blocks, " << plan.search.candidates << " (S, m) candidates, " << plan.search.simulated << " of "
    << plan.search.candidates_placed << " placed plans simulated (" << plan.search.pruned
    << " ruled out by a lower bound), chosen split: " << plan.search.chosen_split << ", "
    << fixed(plan.search.seconds, 2) << " s" << (plan.search.stopped_by_time_limit ? " (stopped by --time-limit)" : "")
    << "\n";
  return r.str();
}


void write_plan_directory(const std::filesystem::path& directory, const Plan& plan, const TaskGraph& graph,
                          const std::filesystem::path& model_path, const ModelInfo& model, const PlanOutputs& outputs) {
  namespace fs = std::filesystem;
  const fs::path target = directory.has_filename() ? directory : directory.parent_path();
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (fs::exists(target) && !fs::is_directory(target))
    throw SystemError(target.string() + " exists and is not a directory");
  const std::string suffix = std::to_string(::getpid());
  const fs::path tmp = parent / ("." + target.filename().string() + ".tmp" + suffix);
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec) || ec) throw SystemError("cannot create " + tmp.string());
  try {
    write_file_atomically(tmp / "plan.json", plan_to_json(plan, graph, model).dump(2) + "\n");
    write_file_atomically(tmp / "plan.dot", plan_to_dot(plan, graph, outputs.dot_detail));
    write_file_atomically(tmp / "report.txt", plan_report(plan, graph, model));
    if (outputs.stage_models) write_stage_models(plan, graph, model_path, tmp, outputs.stage_shapes);
    if (outputs.extra) outputs.extra(tmp);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  // Publish: move an older plan aside, rename the new one in, then drop the old one.
  const fs::path old = parent / ("." + target.filename().string() + ".old" + suffix);
  if (fs::exists(target)) {
    fs::rename(target, old, ec);
    if (ec) {
      fs::remove_all(tmp, ec);
      throw SystemError("cannot replace " + target.string() + ": " + ec.message());
    }
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    std::error_code ignore;
    if (fs::exists(old)) fs::rename(old, target, ignore);
    fs::remove_all(tmp, ignore);
    throw SystemError("cannot rename " + tmp.string() + " to " + target.string() + ": " + ec.message());
  }
  fs::remove_all(old, ec);
}

}  // namespace apart
