// The apart.costs/1 file (DESIGN.md): what `apart costs` writes and `--profile` reads.
#pragma once

#include <filesystem>

#include <nlohmann/json_fwd.hpp>

#include "graph/task_graph.h"
#include "profiler/cost_table.h"

namespace apart {

nlohmann::json costs_to_json(const TaskGraph& g, const CostTable& table);
// Writes through a temporary file and a rename: no partial file on failure. Throws SystemError.
void write_costs_json(const std::filesystem::path& path, const TaskGraph& g, const CostTable& table);

// Reads a costs file for graph `g`: rows are matched to tasks by name, every task must have one.
// Throws InvalidArgument (wrong schema, unknown or missing task, bad numbers) or SystemError.
CostTable costs_from_json(const nlohmann::json& j, const TaskGraph& g);
CostTable read_costs_json(const std::filesystem::path& path, const TaskGraph& g);

}  // namespace apart
