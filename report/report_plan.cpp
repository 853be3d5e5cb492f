// plan.json (+ baselines.json, costs.json) → ReportPlan: every field checked, every error names the file and field.
#include "report/report_plan.h"

#include <cctype>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "graph/error.h"
#include "graph/checked.h"
#include "graph/json_reader.h"

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

bool is_indexed(const std::string& component) {
  // "h.3", "layers.12", "3", "block_2": ends in digits after a separator, or is all digits.
  size_t i = component.size();
  while (i > 0 && std::isdigit(static_cast<unsigned char>(component[i - 1]))) --i;
  if (i == component.size()) return false;
  return i == 0 || component[i - 1] == '.' || component[i - 1] == '_';
}

void read_plan_fields(const json& j, const Reader& r, ReportPlan& p) {
  if (r.string(j, "", "schema") != "apart.plan/1") r.fail("schema", "must be \"apart.plan/1\"");
  if (j.contains("model")) {
    const json& m = r.object(j, "", "model");
    p.model_path = r.optional_string(m, "model.", "path").value_or("");
    p.model_tasks = r.optional_integer(m, "model.", "tasks", 0).value_or(0);
    p.model_params = r.optional_integer(m, "model.", "params", 0, limits::kMaxByteCount).value_or(0);
    p.model_param_bytes = r.optional_integer(m, "model.", "param_bytes", 0, limits::kMaxByteCount).value_or(0);
  }
  const json& c = r.object(j, "", "cluster");
  p.devices = static_cast<int>(r.integer(c, "cluster.", "devices", 0, limits::kMaxDevices));
  p.device = r.optional_string(c, "cluster.", "device").value_or("");
  p.devices_per_node = static_cast<int>(r.optional_integer(c, "cluster.", "devices_per_node", 0, limits::kMaxDevices).value_or(p.devices));
  p.device_memory_bytes = r.optional_integer(c, "cluster.", "memory_bytes", 0, limits::kMaxByteCount).value_or(0);
  p.device_total_bytes = r.optional_integer(c, "cluster.", "device_memory_bytes", 0, limits::kMaxByteCount);
  p.memory_reserve = r.optional_string(c, "cluster.", "memory_reserve").value_or("");

  const json& t = r.object(j, "", "training");
  p.global_batch = r.optional_integer(t, "training.", "global_batch", 0, limits::kMaxBatch).value_or(0);
  p.microbatches = r.integer(t, "training.", "microbatches", 0, limits::kMaxBatch);
  p.microbatch_size = r.optional_integer(t, "training.", "microbatch_size", 0, limits::kMaxBatch).value_or(0);
  p.schedule = r.optional_string(t, "training.", "schedule").value_or("1f1b");
  p.optimizer = r.optional_string(t, "training.", "optimizer").value_or("");
  p.precision = r.optional_string(t, "training.", "precision").value_or("");
  if (j.contains("options") && j["options"].is_object()) p.method = r.optional_string(j["options"], "options.", "method").value_or("");

  const json& stages = r.array(j, "", "stages");
  if (stages.empty()) r.fail("stages", "must hold at least one stage");
  for (size_t i = 0; i < stages.size(); ++i) {
    const std::string path = "stages[" + std::to_string(i) + "].";
    const json& s = stages[i];
    if (!s.is_object()) r.fail("stages[" + std::to_string(i) + "]", "must be an object");
    ReportStage st;
    st.id = static_cast<int>(r.integer(s, path, "id", 0, limits::kMaxDevices));
    st.replicas = static_cast<int>(r.integer(s, path, "replicas", 0, limits::kMaxDevices));
    for (size_t d = 0; d < r.array(s, path, "devices").size(); ++d)
      st.devices.push_back(static_cast<int>(
          r.integer_at(s["devices"][d], path + "devices[" + std::to_string(d) + "]", 0, limits::kMaxDevices - 1)));
    const json& tasks = r.array(s, path, "tasks");
    for (size_t k = 0; k < tasks.size(); ++k) {
      if (!tasks[k].is_string()) r.fail(path + "tasks[" + std::to_string(k) + "]", "must be a string");
      st.tasks.push_back(tasks[k].get<std::string>());
    }
    st.batch_tasks = r.optional_integer(s, path, "batch_tasks", 0);
    st.param_bytes = r.optional_integer(s, path, "param_bytes", 0, limits::kMaxByteCount);
    st.forward_s = r.seconds(s, path, "forward_s");
    st.backward_s = r.seconds(s, path, "backward_s");
    st.allreduce_s = r.optional_seconds(s, path, "allreduce_s").value_or(0);
    st.comm_s = r.optional_seconds(s, path, "comm_s");
    st.recompute = r.boolean(s, path, "recompute", false);
    st.memory_bytes = r.optional_integer(s, path, "memory_bytes", 0, limits::kMaxByteCount).value_or(0);
    p.stages.push_back(std::move(st));
  }

  if (j.contains("predicted")) {
    const json& pr = r.object(j, "", "predicted");
    p.iteration_s = r.optional_seconds(pr, "predicted.", "iteration_s").value_or(0);
    p.samples_per_s = r.optional_number(pr, "predicted.", "samples_per_s", limits::kMaxRate).value_or(0);
    p.bubble_fraction = r.optional_number(pr, "predicted.", "bubble_fraction", 1.0).value_or(0);
    p.bottleneck_stage =
        static_cast<int>(r.optional_integer(pr, "predicted.", "bottleneck_stage", 0, limits::kMaxDevices).value_or(-1));
    p.peak_memory_bytes = r.optional_integer(pr, "predicted.", "peak_memory_bytes", 0, limits::kMaxByteCount).value_or(0);
    p.pipeline_s = r.optional_seconds(pr, "predicted.", "pipeline_s");
    p.compute_lower_bound_s = r.optional_seconds(pr, "predicted.", "compute_lower_bound_s");
  }
  if (j.contains("search") && j["search"].is_object()) p.search_s = r.optional_seconds(j["search"], "search.", "seconds");
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

// Per-task forward time and parameter bytes from costs.json, by task name.
struct TaskCost {
  double forward_s = 0;
  int64_t param_bytes = 0;
  bool constant = false;
};
std::map<std::string, TaskCost> read_costs(const fs::path& file) {
  const json j = read_json(file, "costs");
  const Reader r = reader(file, "apart.costs/1");
  if (!j.is_object()) r.fail("(top level)", "must be an object");
  std::map<std::string, TaskCost> out;
  const json& tasks = r.array(j, "", "tasks");
  int64_t total_param_bytes = 0;  // layers sum them: the total stays within limits::kMaxByteCount, so no overflow
  for (size_t i = 0; i < tasks.size(); ++i) {
    const std::string path = "tasks[" + std::to_string(i) + "].";
    const json& t = tasks[i];
    if (!t.is_object()) r.fail("tasks[" + std::to_string(i) + "]", "must be an object");
    TaskCost c;
    c.forward_s = r.optional_seconds(t, path, "forward_s").value_or(0);
    c.param_bytes = r.optional_integer(t, path, "param_bytes", 0, limits::kMaxByteCount).value_or(0);
    total_param_bytes += c.param_bytes;
    if (total_param_bytes > limits::kMaxByteCount) r.fail(path + "param_bytes", "brings the tasks' total past 2^60 bytes");
    c.constant = r.boolean(t, path, "constant", false);
    out.emplace(r.string(t, path, "name"), c);
  }
  return out;
}

std::vector<LayerRun> group_layers(const std::vector<std::string>& tasks, const std::map<std::string, TaskCost>& costs) {
  std::vector<LayerRun> runs;
  for (const std::string& task : tasks) {
    // Constant tasks (shape arithmetic, weight casts) are replicated into every stage that reads them: they say
    // nothing about where a layer went, so they are left out when costs.json tells which they are.
    const auto cost = costs.find(task);
    if (cost != costs.end() && cost->second.constant) continue;
    const std::string layer = layer_of(task);
    if (runs.empty() || runs.back().layer != layer) runs.push_back(LayerRun{layer});
    LayerRun& run = runs.back();
    ++run.tasks;
    if (cost != costs.end()) {
      run.forward_s += cost->second.forward_s;
      run.param_bytes += cost->second.param_bytes;
    }
  }
  return runs;
}

}  // namespace

std::string layer_of(const std::string& task_name) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= task_name.size()) {
    const size_t slash = task_name.find('/', start);
    const size_t end = slash == std::string::npos ? task_name.size() : slash;
    if (end > start) parts.push_back(task_name.substr(start, end - start));
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  if (parts.size() < 2) return "(top level)";  // the last component is the op itself
  parts.pop_back();
  std::string layer;
  for (const std::string& part : parts) {
    layer += (layer.empty() ? "" : "/") + part;
    if (is_indexed(part)) return layer;
  }
  return parts.front();
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
  std::error_code ec;
  fs::path file;
  if (fs::is_directory(path, ec)) {
    file = path / "plan.json";
    if (!fs::exists(file, ec))
      throw InvalidArgument("'" + path.string() + "' holds no plan.json: give a plan directory written by "
                            "`apart partition MODEL ... -o DIR`, or its plan.json");
  } else if (fs::is_regular_file(path, ec)) {
    file = path;
  } else {
    throw InvalidArgument("'" + path.string() + "' does not exist: give a plan directory written by "
                          "`apart partition MODEL ... -o DIR`, or its plan.json");
  }
  const json j = read_json(file, "plan");
  ReportPlan p;
  p.dir = file.parent_path();
  p.source = file.string();
  const Reader r = reader(file, "apart.plan/1");
  if (!j.is_object()) r.fail("(top level)", "must be an object");
  read_plan_fields(j, r, p);
  p.sim = sim::plan_from_json(j, p.source);

  std::map<std::string, TaskCost> costs;
  if (fs::exists(p.dir / "costs.json", ec)) {
    costs = read_costs(p.dir / "costs.json");
    p.have_costs = true;
  }
  for (ReportStage& s : p.stages) s.layers = group_layers(s.tasks, costs);
  if (fs::exists(p.dir / "baselines.json", ec)) p.baselines = read_baselines(p.dir / "baselines.json");
  return p;
}

}  // namespace apart::report
