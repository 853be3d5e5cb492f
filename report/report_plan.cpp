// plan.json (+ baselines.json, costs.json) → ReportPlan: every field checked, every error names the file and field.
#include "report/report_plan.h"

#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "graph/error.h"

namespace apart::report {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Field access with errors that name the file and the field ("stages[1].tasks[3] must be a string").
class Reader {
 public:
  Reader(std::string source, std::string schema) : source_(std::move(source)), schema_(std::move(schema)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw InvalidModel(source_ + ": " + field + " " + what + " (schema " + schema_ +
                       ", docs/report.md; re-run `apart partition` to regenerate the plan)");
  }
  const json& member(const json& obj, const std::string& path, const char* key) const {
    if (!obj.is_object() || !obj.contains(key)) fail(path + key, "is missing");
    return obj[key];
  }
  const json& object(const json& obj, const std::string& path, const char* key) const {
    const json& v = member(obj, path, key);
    if (!v.is_object()) fail(path + key, "must be an object");
    return v;
  }
  const json& array(const json& obj, const std::string& path, const char* key) const {
    const json& v = member(obj, path, key);
    if (!v.is_array()) fail(path + key, "must be an array");
    return v;
  }
  std::string string(const json& obj, const std::string& path, const char* key, std::optional<std::string> fallback) const {
    if (!obj.contains(key) || (fallback && obj[key].is_null())) {
      if (fallback) return *fallback;
      fail(path + key, "is missing");
    }
    if (!obj[key].is_string()) fail(path + key, "must be a string");
    return obj[key].get<std::string>();
  }
  std::optional<double> number(const json& obj, const std::string& path, const char* key, bool required) const {
    if (!obj.contains(key) || obj[key].is_null()) {
      if (required) fail(path + key, "is missing");
      return std::nullopt;
    }
    const json& v = obj[key];
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      fail(path + key, "must be a finite non-negative number");
    return v.get<double>();
  }
  std::optional<int64_t> integer(const json& obj, const std::string& path, const char* key, bool required) const {
    const std::optional<double> d = number(obj, path, key, required);
    if (!d) return std::nullopt;
    if (std::floor(*d) != *d || *d > 9.0e15) fail(path + key, "must be an integer");
    return static_cast<int64_t>(*d);
  }
  bool boolean(const json& obj, const std::string& path, const char* key, bool fallback) const {
    if (!obj.contains(key)) return fallback;
    if (!obj[key].is_boolean()) fail(path + key, "must be true or false");
    return obj[key].get<bool>();
  }

 private:
  std::string source_;
  std::string schema_;
};

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
  if (r.string(j, "", "schema", std::nullopt) != "apart.plan/1") r.fail("schema", "must be \"apart.plan/1\"");
  if (j.contains("model")) {
    const json& m = r.object(j, "", "model");
    p.model_path = r.string(m, "model.", "path", "");
    p.model_tasks = r.integer(m, "model.", "tasks", false).value_or(0);
    p.model_params = r.integer(m, "model.", "params", false).value_or(0);
    p.model_param_bytes = r.integer(m, "model.", "param_bytes", false).value_or(0);
  }
  const json& c = r.object(j, "", "cluster");
  p.devices = static_cast<int>(r.integer(c, "cluster.", "devices", true).value_or(1));
  p.device = r.string(c, "cluster.", "device", "");
  p.devices_per_node = static_cast<int>(r.integer(c, "cluster.", "devices_per_node", false).value_or(p.devices));
  p.device_memory_bytes = r.integer(c, "cluster.", "memory_bytes", false).value_or(0);

  const json& t = r.object(j, "", "training");
  p.global_batch = r.integer(t, "training.", "global_batch", false).value_or(0);
  p.microbatches = r.integer(t, "training.", "microbatches", true).value_or(1);
  p.microbatch_size = r.integer(t, "training.", "microbatch_size", false).value_or(0);
  p.schedule = r.string(t, "training.", "schedule", "1f1b");
  p.optimizer = r.string(t, "training.", "optimizer", "");
  p.precision = r.string(t, "training.", "precision", "");
  if (j.contains("options") && j["options"].is_object()) p.method = r.string(j["options"], "options.", "method", "");

  const json& stages = r.array(j, "", "stages");
  if (stages.empty()) r.fail("stages", "must hold at least one stage");
  for (size_t i = 0; i < stages.size(); ++i) {
    const std::string path = "stages[" + std::to_string(i) + "].";
    const json& s = stages[i];
    if (!s.is_object()) r.fail("stages[" + std::to_string(i) + "]", "must be an object");
    ReportStage st;
    st.id = static_cast<int>(r.integer(s, path, "id", true).value_or(0));
    st.replicas = static_cast<int>(r.integer(s, path, "replicas", true).value_or(1));
    for (size_t d = 0; d < r.array(s, path, "devices").size(); ++d) {
      const json& v = s["devices"][d];
      if (!v.is_number_integer() || v.get<int64_t>() < 0) r.fail(path + "devices[" + std::to_string(d) + "]", "must be a device index");
      st.devices.push_back(v.get<int>());
    }
    const json& tasks = r.array(s, path, "tasks");
    for (size_t k = 0; k < tasks.size(); ++k) {
      if (!tasks[k].is_string()) r.fail(path + "tasks[" + std::to_string(k) + "]", "must be a string");
      st.tasks.push_back(tasks[k].get<std::string>());
    }
    st.batch_tasks = r.integer(s, path, "batch_tasks", false);
    st.param_bytes = r.integer(s, path, "param_bytes", false);
    st.forward_s = *r.number(s, path, "forward_s", true);
    st.backward_s = *r.number(s, path, "backward_s", true);
    st.allreduce_s = r.number(s, path, "allreduce_s", false).value_or(0);
    st.comm_s = r.number(s, path, "comm_s", false);
    st.recompute = r.boolean(s, path, "recompute", false);
    st.memory_bytes = r.integer(s, path, "memory_bytes", false).value_or(0);
    p.stages.push_back(std::move(st));
  }

  if (j.contains("predicted")) {
    const json& pr = r.object(j, "", "predicted");
    p.iteration_s = r.number(pr, "predicted.", "iteration_s", false).value_or(0);
    p.samples_per_s = r.number(pr, "predicted.", "samples_per_s", false).value_or(0);
    p.bubble_fraction = r.number(pr, "predicted.", "bubble_fraction", false).value_or(0);
    p.bottleneck_stage = static_cast<int>(r.integer(pr, "predicted.", "bottleneck_stage", false).value_or(-1));
    p.peak_memory_bytes = r.integer(pr, "predicted.", "peak_memory_bytes", false).value_or(0);
    p.pipeline_s = r.number(pr, "predicted.", "pipeline_s", false);
    p.compute_lower_bound_s = r.number(pr, "predicted.", "compute_lower_bound_s", false);
  }
  if (j.contains("search") && j["search"].is_object()) p.search_s = r.number(j["search"], "search.", "seconds", false);
}

std::vector<Baseline> read_baselines(const fs::path& file) {
  const json j = read_json(file, "baselines");
  const Reader r(file.string(), "apart.baselines/1");
  if (!j.is_object()) r.fail("(top level)", "must be an object");
  if (r.string(j, "", "schema", std::nullopt) != "apart.baselines/1") r.fail("schema", "must be \"apart.baselines/1\"");
  std::vector<Baseline> out;
  const json& methods = r.array(j, "", "methods");
  for (size_t i = 0; i < methods.size(); ++i) {
    const std::string path = "methods[" + std::to_string(i) + "].";
    const json& m = methods[i];
    if (!m.is_object()) r.fail("methods[" + std::to_string(i) + "]", "must be an object");
    Baseline b;
    b.method = r.string(m, path, "method", std::nullopt);
    b.feasible = r.boolean(m, path, "feasible", true);
    b.iteration_s = r.number(m, path, "iteration_s", false);
    b.samples_per_s = r.number(m, path, "samples_per_s", false);
    b.planning_s = r.number(m, path, "planning_s", false);
    b.peak_memory_bytes = r.number(m, path, "peak_memory_bytes", false);
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
  const Reader r(file.string(), "apart.costs/1");
  if (!j.is_object()) r.fail("(top level)", "must be an object");
  std::map<std::string, TaskCost> out;
  const json& tasks = r.array(j, "", "tasks");
  for (size_t i = 0; i < tasks.size(); ++i) {
    const std::string path = "tasks[" + std::to_string(i) + "].";
    const json& t = tasks[i];
    if (!t.is_object()) r.fail("tasks[" + std::to_string(i) + "]", "must be an object");
    TaskCost c;
    c.forward_s = r.number(t, path, "forward_s", false).value_or(0);
    c.param_bytes = r.integer(t, path, "param_bytes", false).value_or(0);
    c.constant = r.boolean(t, path, "constant", false);
    out.emplace(r.string(t, path, "name", std::nullopt), c);
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
  const Reader r(p.source, "apart.plan/1");
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
