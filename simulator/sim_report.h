// What `apart simulate` prints and writes: the text table, apart.simulation/1 JSON and a Chrome/Perfetto trace.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "graph/atomic_file.h"
#include "plan/trace.h"
#include "simulator/simulate.h"

namespace apart::sim {

std::string simulation_report(const SimPlan& plan, const SimResult& result);
nlohmann::ordered_json simulation_to_json(const SimPlan& plan, const SimResult& result);

// The replay as a timeline: one process per stage (pid = its first device, replica -1: the stage stands for all its
// replicas), each transfer as the sender's send and the receiver's receive over the same interval, a memory counter
// per stage; simulation_trace is it in plan/trace.h's Chrome trace format (timeline_to_chrome_trace).
Timeline simulation_timeline(const SimPlan& plan, const SimResult& result);
nlohmann::ordered_json simulation_trace(const SimPlan& plan, const SimResult& result);
using apart::write_file_atomically;  // graph/atomic_file.h

}  // namespace apart::sim
