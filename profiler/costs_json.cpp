// apart.costs/1 writer and reader.
#include "profiler/costs_json.h"


#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "graph/atomic_file.h"
#include "graph/error.h"

namespace apart {

nlohmann::json costs_to_json(const TaskGraph& g, const CostTable& table) {
  APART_CHECK(table.tasks.size() == g.num_tasks(), "cost table has " + std::to_string(table.tasks.size()) +
                                                       " rows for " + std::to_string(g.num_tasks()) + " tasks");
  nlohmann::json tasks = nlohmann::json::array();
  for (uint32_t i = 0; i < g.num_tasks(); ++i) {
    const Task& t = g.task(TaskId(i));
    const TaskCost& c = table.tasks[i];
    tasks.push_back({{"name", t.name},
                     {"op", t.op_type},
                     {"constant", t.constant},
                     {"flops", c.flops},
                     {"forward_s", c.forward_s},
                     {"backward_s", c.backward_s},
                     {"param_bytes", c.param_bytes},
                     {"saved_bytes", c.saved_bytes},
                     {"output_bytes", c.output_bytes},
                     {"bytes_accessed", c.bytes_accessed},
                     {"backward_flops", c.backward_flops},
                     {"backward_bytes", c.backward_bytes},
                     {"workspace_bytes", c.workspace_bytes},
                     {"known", c.known}});
  }
  return {{"schema", "apart.costs/1"},  {"device", table.device},     {"microbatch_size", table.microbatch_size},
          {"source", table.source},     {"precision", table.precision}, {"warnings", table.warnings},
          {"tasks", std::move(tasks)}};
}

void write_costs_json(const std::filesystem::path& path, const TaskGraph& g, const CostTable& table) {
  const std::string text = costs_to_json(g, table).dump(1) + "\n";
  write_file_atomically(path, text);
}

namespace {
double num(const nlohmann::json& row, const char* key, const std::string& task) {
  if (!row.contains(key)) return 0;
  const auto& v = row[key];
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
    throw InvalidArgument("costs file: task '" + task + "': '" + key + "' must be a finite non-negative number");
  return v.get<double>();
}
}  // namespace

CostTable costs_from_json(const nlohmann::json& j, const TaskGraph& g) {
  if (!j.is_object() || j.value("schema", "") != "apart.costs/1")
    throw InvalidArgument("costs file: schema must be \"apart.costs/1\"");
  if (!j.contains("tasks") || !j["tasks"].is_array()) throw InvalidArgument("costs file: 'tasks' must be an array");
  CostTable table;
  table.device = j.value("device", "");
  table.microbatch_size = j.value("microbatch_size", int64_t{0});
  table.source = j.value("source", "analytic");
  table.precision = j.value("precision", "fp32");
  if (table.microbatch_size <= 0) throw InvalidArgument("costs file: 'microbatch_size' must be positive");
  table.tasks.resize(g.num_tasks());
  std::vector<bool> seen(g.num_tasks(), false);
  for (const auto& row : j["tasks"]) {
    if (!row.is_object() || !row.contains("name") || !row["name"].is_string())
      throw InvalidArgument("costs file: every task needs a string 'name'");
    const std::string name = row["name"].get<std::string>();
    const auto id = g.find_task(name);
    if (!id) throw InvalidArgument("costs file: task '" + name + "' is not in the model (a costs file from another model?)");
    if (seen[id->value()]) throw InvalidArgument("costs file: task '" + name + "' appears twice");
    seen[id->value()] = true;
    TaskCost& c = table.tasks[id->value()];
    c.flops = num(row, "flops", name);
    c.forward_s = num(row, "forward_s", name);
    c.backward_s = num(row, "backward_s", name);
    c.param_bytes = std::llround(num(row, "param_bytes", name));
    c.saved_bytes = std::llround(num(row, "saved_bytes", name));
    c.output_bytes = std::llround(num(row, "output_bytes", name));
    c.bytes_accessed = num(row, "bytes_accessed", name);
    c.backward_flops = num(row, "backward_flops", name);
    c.backward_bytes = num(row, "backward_bytes", name);
    c.workspace_bytes = std::llround(num(row, "workspace_bytes", name));
    c.known = row.value("known", true);
  }
  for (uint32_t i = 0; i < g.num_tasks(); ++i)
    if (!seen[i]) throw InvalidArgument("costs file: no row for task '" + g.task(TaskId(i)).name + "'");
  return table;
}

CostTable read_costs_json(const std::filesystem::path& path, const TaskGraph& g) {
  std::ifstream in(path);
  if (!in) throw SystemError("cannot read costs file '" + path.string() + "'");
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw InvalidArgument("costs file '" + path.string() + "' is not valid JSON");
  try {
    return costs_from_json(j, g);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument("costs file '" + path.string() + "': " + e.what());
  }
}

}  // namespace apart
