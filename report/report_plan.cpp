// plan.json (through plan/'s reader) + baselines.json, costs.json → ReportPlan: errors name the file and the field.
#include "report/report_plan.h"

#include <cctype>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "graph/error.h"
#include "graph/checked.h"
#include "graph/json_reader.h"
#include "graph/module_layers.h"
#include "plan/costs_json.h"

namespace apart::report {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Field access with errors that name the file and the field ("stages[1].tasks[3] must be a string"). Figures that
// partition could not compute are written as null: they read as absent.
using Reader = JsonReader;
Reader reader(const fs::path& file, const std::string& schema) {
  return Reader(file.string(), schema, "docs/report.md", Reader::Null::kAbsent);
}

json read_json(const fs::path& file, const std::string& what) {
  std::ifstream in(file);
  if (!in) throw SystemError("cannot read " + what + " '" + file.string() + "'");
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw InvalidModel(file.string() + ": not valid JSON (re-run `apart partition` to regenerate it)");
  return j;
}

// The report's view of the plan document: the figures it shows, absent ones as their documented defaults.
void fill_plan_fields(const PlanDocument& d, ReportPlan& p) {
  if (d.model) {
    p.model_path = d.model->path;
    p.model_tasks = d.model->tasks;
    p.model_params = d.model->params;
    p.model_param_bytes = d.model->param_bytes;
  }
  p.devices = d.cluster.devices;
  p.device = d.cluster.device.value_or("");
  p.devices_per_node = d.cluster.devices_per_node.value_or(p.devices);
  p.device_memory_bytes = d.cluster.memory_bytes.value_or(0);
  p.device_total_bytes = d.cluster.device_memory_bytes;
  p.memory_reserve = d.cluster.memory_reserve.value_or("");
  p.global_batch = d.training.global_batch.value_or(0);
  p.microbatches = d.training.microbatches;
  p.microbatch_size = d.training.microbatch_size.value_or(0);
  p.schedule = d.training.schedule;
  p.optimizer = d.training.optimizer;
  p.precision = d.training.precision;
  if (d.options) p.method = d.options->method;
  for (const PlanStageRecord& s : d.stages) {
    ReportStage st;
    st.id = s.id;
    st.replicas = s.replicas;
    st.tp = s.tp;
    st.devices = s.devices;
    st.tasks = s.tasks;
    st.batch_tasks = s.batch_tasks;
    st.param_bytes = s.param_bytes;
    st.forward_s = s.forward_s;
    st.backward_s = s.backward_s;
    st.allreduce_s = s.allreduce_s.value_or(0);
    st.comm_s = s.comm_s;
    st.recompute = s.recompute;
    st.selective = s.recompute_scope == RecomputeScope::kSelective;
    st.memory_bytes = s.memory_bytes.value_or(0);
    p.stages.push_back(std::move(st));
  }
  if (d.predicted) {
    const PlanPrediction& pr = *d.predicted;
    p.iteration_s = pr.iteration_s.value_or(0);
    p.samples_per_s = pr.samples_per_s.value_or(0);
    p.bubble_fraction = pr.bubble_fraction.value_or(0);
    p.bottleneck_stage = pr.bottleneck_stage.value_or(-1);
    p.peak_memory_bytes = pr.peak_memory_bytes.value_or(0);
    p.pipeline_s = pr.pipeline_s;
    p.compute_lower_bound_s = pr.compute_lower_bound_s;
  }
  if (d.search) p.search_s = d.search->seconds;
}

std::vector<Baseline> read_baselines(const fs::path& file) {
  const json j = read_json(file, "baselines");
  const Reader r = reader(file, "apart.baselines/1");
  if (!j.is_object()) r.fail("(top level)", "must be an object");
  if (r.string(j, "", "schema") != "apart.baselines/1") r.fail("schema", "must be \"apart.baselines/1\"");
  std::vector<Baseline> out;
  const json& methods = r.array(j, "", "methods");
  for (size_t i = 0; i < methods.size(); ++i) {
    const std::string path = "methods[" + std::to_string(i) + "].";
    const json& m = methods[i];
    if (!m.is_object()) r.fail("methods[" + std::to_string(i) + "]", "must be an object");
    Baseline b;
    b.method = r.string(m, path, "method");
    b.feasible = r.boolean(m, path, "feasible", true);
    b.iteration_s = r.optional_seconds(m, path, "iteration_s");
    b.samples_per_s = r.optional_number(m, path, "samples_per_s", limits::kMaxRate);
    b.planning_s = r.optional_seconds(m, path, "planning_s");
    b.peak_memory_bytes = r.optional_bytes(m, path, "peak_memory_bytes");
    out.push_back(std::move(b));
  }
  return out;
}

// Per-task forward time and parameter bytes from costs.json (plan/'s one apart.costs/1 reader), by task name.
std::map<std::string, CostsRow> read_costs(const fs::path& file) {
  std::map<std::string, CostsRow> out;
  for (CostsRow& row : read_costs_document(file).rows) out.emplace(row.name, std::move(row));
  return out;
}

std::vector<LayerRun> group_layers(const std::vector<std::string>& tasks, const std::map<std::string, CostsRow>& costs) {
  std::vector<LayerRun> runs;
  for (const std::string& task : tasks) {
    // Constant tasks (shape arithmetic, weight casts) are replicated into every stage that reads them: they say
    // nothing about where a layer went, so they are left out when costs.json tells which they are.
    const auto cost = costs.find(task);
    if (cost != costs.end() && cost->second.constant) continue;
    // A generic name (dynamo exporter: "node_MatMul_12") is read with the module path costs.json keeps for it.
    const bool scoped = cost != costs.end() && !cost->second.scope.empty();
    const std::string layer = layer_of(scoped ? cost->second.scope + "/" + task : task);
    if (runs.empty() || runs.back().layer != layer) runs.push_back(LayerRun{layer});
    LayerRun& run = runs.back();
    ++run.tasks;
    if (cost != costs.end()) {
      run.forward_s += cost->second.cost.forward_s;
      run.param_bytes += cost->second.cost.param_bytes;
    }
  }
  return runs;
}

}  // namespace

std::string layer_of(const std::string& task_name) {
  const std::string layer = layer_of_path(task_name);
  return layer.empty() ? "(top level)" : layer;
}

std::string first_layer(const ReportStage& stage) {
  for (const LayerRun& l : stage.layers)
    if (l.layer != "(top level)") return l.layer;
  return stage.layers.empty() ? "-" : stage.layers.front().layer;
}

std::string last_layer(const ReportStage& stage) {
  for (auto it = stage.layers.rbegin(); it != stage.layers.rend(); ++it)
    if (it->layer != "(top level)") return it->layer;
  return stage.layers.empty() ? "-" : stage.layers.back().layer;
}

ReportPlan load_report_plan(const fs::path& path) {
  const fs::path file = plan_json_path(path);
  ReportPlan p;
  p.dir = file.parent_path();
  p.source = file.string();
  p.document = read_plan(file);
  fill_plan_fields(p.document, p);
  p.sim = sim::sim_plan(p.document, p.source);

  std::error_code ec;
  std::map<std::string, CostsRow> costs;
  if (fs::exists(p.dir / "costs.json", ec)) {
    costs = read_costs(p.dir / "costs.json");
    p.have_costs = true;
  }
  for (ReportStage& s : p.stages) s.layers = group_layers(s.tasks, costs);
  if (fs::exists(p.dir / "baselines.json", ec)) p.baselines = read_baselines(p.dir / "baselines.json");
  return p;
}

}  // namespace apart::report
