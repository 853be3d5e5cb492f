// apart.costs/1 writer and reader.
#include "plan/costs_json.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "graph/atomic_file.h"
#include "graph/checked.h"
#include "graph/error.h"
#include "graph/json_reader.h"

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
    // The module path of a task whose name carries none (the dynamo exporter's metadata): the report's layers.
    if (!t.scope.empty() && t.name.find('/') == std::string::npos) tasks.back()["scope"] = t.scope;
  }
  return {{"schema", "apart.costs/1"},  {"device", table.device},     {"microbatch_size", table.microbatch_size},
          {"source", table.source},     {"precision", table.precision}, {"warnings", table.warnings},
          {"tasks", std::move(tasks)}};
}

void write_costs_json(const std::filesystem::path& path, const TaskGraph& g, const CostTable& table) {
  const std::string text = costs_to_json(g, table).dump(1) + "\n";
  write_file_atomically(path, text);
}

CostsDocument costs_document_from_json(const nlohmann::json& j, const std::string& source) {
  const JsonReader r(source, "apart.costs/1", "docs/cost-model.md", JsonReader::Null::kInvalid,
                     ErrorKind::kInvalidArgument, "write it again with `apart costs` or `apart profile`");
  if (!j.is_object()) r.fail("the document", "must be a JSON object");
  if (r.string(j, "", "schema") != "apart.costs/1") r.fail("schema", "must be \"apart.costs/1\"");
  const nlohmann::json& rows = r.array(j, "", "tasks");
  CostsDocument doc;
  CostTable& table = doc.table;
  table.device = r.optional_string(j, "", "device").value_or("");
  table.microbatch_size = r.integer(j, "", "microbatch_size", 1, limits::kMaxBatch);
  table.source = r.optional_string(j, "", "source").value_or("analytic");
  table.precision = r.optional_string(j, "", "precision").value_or("fp32");
  doc.rows.reserve(rows.size());
  // Stages sum these over their tasks: each total stays within 2^60 bytes, so no sum overflows an int64.
  int64_t totals[4] = {0, 0, 0, 0};
  for (size_t i = 0; i < rows.size(); ++i) {
    const nlohmann::json& row = rows[i];
    if (!row.is_object()) r.fail("tasks[" + std::to_string(i) + "]", "must be an object");
    CostsRow out;
    out.name = r.string(row, "tasks[" + std::to_string(i) + "].", "name");
    const std::string path = "tasks[" + std::to_string(i) + "] ('" + out.name + "').";
    out.op = r.optional_string(row, path, "op").value_or("");
    out.constant = r.boolean(row, path, "constant", false);
    out.scope = r.optional_string(row, path, "scope").value_or("");
    TaskCost& c = out.cost;
    auto seconds = [&](const char* key) { return r.optional_seconds(row, path, key).value_or(0.0); };
    auto flops = [&](const char* key) { return r.optional_number(row, path, key, limits::kMaxFlops).value_or(0.0); };
    auto bytes = [&](const char* key) { return r.optional_bytes(row, path, key).value_or(0.0); };
    // Whole bytes; a measured file may carry fractions. ≤ 2^60, so llround is exact and defined.
    auto byte_count = [&](const char* key, int64_t& total) {
      const int64_t b = std::llround(bytes(key));
      total += b;
      if (total > limits::kMaxByteCount) r.fail(path + key, "brings the tasks' total past 2^60 bytes");
      return b;
    };
    c.flops = flops("flops");
    c.forward_s = seconds("forward_s");
    c.backward_s = seconds("backward_s");
    c.param_bytes = byte_count("param_bytes", totals[0]);
    c.saved_bytes = byte_count("saved_bytes", totals[1]);
    c.output_bytes = byte_count("output_bytes", totals[2]);
    c.bytes_accessed = bytes("bytes_accessed");
    c.backward_flops = flops("backward_flops");
    c.backward_bytes = bytes("backward_bytes");
    c.workspace_bytes = byte_count("workspace_bytes", totals[3]);
    c.known = r.boolean(row, path, "known", true);
    doc.rows.push_back(std::move(out));
  }
  return doc;
}

CostTable costs_from_json(const nlohmann::json& j, const TaskGraph& g, const std::string& source) {
  CostsDocument doc = costs_document_from_json(j, source);
  CostTable table = std::move(doc.table);
  table.tasks.resize(g.num_tasks());
  std::vector<bool> seen(g.num_tasks(), false);
  for (CostsRow& row : doc.rows) {
    const auto id = g.find_task(row.name);
    if (!id) throw InvalidArgument(source + ": task '" + row.name + "' is not in the model (a costs file from another model?)");
    if (seen[id->value()]) throw InvalidArgument(source + ": task '" + row.name + "' appears twice");
    seen[id->value()] = true;
    table.tasks[id->value()] = row.cost;
  }
  for (uint32_t i = 0; i < g.num_tasks(); ++i)
    if (!seen[i]) throw InvalidArgument(source + ": no row for task '" + g.task(TaskId(i)).name + "'");
  return table;
}

namespace {
nlohmann::json read_costs_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw SystemError("cannot read costs file '" + path.string() + "'");
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw InvalidArgument("costs file '" + path.string() + "' is not valid JSON");
  return j;
}
}  // namespace

CostsDocument read_costs_document(const std::filesystem::path& path) {
  return costs_document_from_json(read_costs_file(path), "costs file '" + path.string() + "'");
}

CostTable read_costs_json(const std::filesystem::path& path, const TaskGraph& g) {
  return costs_from_json(read_costs_file(path), g, "costs file '" + path.string() + "'");
}

}  // namespace apart
