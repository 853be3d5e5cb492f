// What `apart simulate` prints and writes: the text table, apart.simulation/1 JSON and a Chrome/Perfetto trace.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "graph/atomic_file.h"
#include "simulator/simulate.h"

namespace apart::sim {

std::string simulation_report(const SimPlan& plan, const SimResult& result);
nlohmann::ordered_json simulation_to_json(const SimPlan& plan, const SimResult& result);

// Chrome trace event format (also opens in https://ui.perfetto.dev): one process per stage (pid = its first
// device), threads compute (tid 0), send (1), recv (2); complete events in µs; flow arrows send → receive;
// a memory counter per stage.
nlohmann::ordered_json simulation_trace(const SimPlan& plan, const SimResult& result);
using apart::write_file_atomically;  // graph/atomic_file.h

}  // namespace apart::sim
