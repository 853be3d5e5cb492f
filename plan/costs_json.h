// The apart.costs/1 file (DESIGN.md): what `apart costs` writes and `--profile` reads.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "graph/task_graph.h"
#include "profiler/cost_table.h"

namespace apart {

nlohmann::json costs_to_json(const TaskGraph& g, const CostTable& table);
// Writes through a temporary file and a rename: no partial file on failure. Throws SystemError.
void write_costs_json(const std::filesystem::path& path, const TaskGraph& g, const CostTable& table);

// apart.costs/1 as the file holds it, before it is matched to a model: the header in `table` (device,
// microbatch_size, source, precision; no tasks) and one row per task name, in file order. What a reader without the
// model (the HTML report) uses; costs_from_json matches these rows to a graph.
struct CostsRow {
  std::string name;
  std::string op;
  bool constant = false;
  std::string scope;  // the module path of a task whose name carries none (Task::scope), else ""
  TaskCost cost;
};
struct CostsDocument {
  CostTable table;
  std::vector<CostsRow> rows;
};
// Throws InvalidArgument naming `source` and the field (ranges below), or SystemError when the file is unreadable.
CostsDocument costs_document_from_json(const nlohmann::json& j, const std::string& source = "costs file");
CostsDocument read_costs_document(const std::filesystem::path& path);

// Reads a costs file for graph `g`: rows are matched to tasks by name, every task must have one.
// Throws InvalidArgument (wrong schema, unknown or missing task, a field of the wrong type or out of its range:
// times in [0, a year], bytes in [0, 2^60], each byte field's total over tasks ≤ 2^60) naming `source` and the field,
// or SystemError.
CostTable costs_from_json(const nlohmann::json& j, const TaskGraph& g, const std::string& source = "costs file");
CostTable read_costs_json(const std::filesystem::path& path, const TaskGraph& g);

}  // namespace apart
