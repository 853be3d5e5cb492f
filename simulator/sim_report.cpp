// Text, JSON and trace renderings of a SimResult.
#include "simulator/sim_report.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "graph/error.h"
#include "graph/units.h"

namespace apart::sim {
namespace {

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string devices_text(const std::vector<int>& d) {
  if (d.empty()) return "-";
  if (d.size() == 1) return std::to_string(d.front());
  return std::to_string(d.front()) + "-" + std::to_string(d.back());
}

}  // namespace

std::string simulation_report(const SimPlan& plan, const SimResult& r) {
  std::ostringstream out;
  out << "apart simulate: " << plan.source << "\n";
  out << plan.stages.size() << " stages, " << r.microbatches << " micro-batches, schedule " << schedule_name(r.schedule);
  if (r.schedule == Schedule::kInterleaved) out << " (" << r.virtual_stages << " virtual stages per device)";
  out << ", recompute " << (r.recompute ? "on" : "off") << "\nlinks: " << r.links_source << "\n\n";
  char line[256];
  std::snprintf(line, sizeof line, "%5s %8s %10s %10s %10s %10s %10s %10s %10s %10s %12s\n", "stage", "devices", "forward",
                "backward", "busy", "idle", "allreduce", "send", "recv", "in-flight", "peak memory");
  out << line;
  auto t = [](double seconds) { return format_seconds(seconds); };
  for (const StageStats& s : r.stages) {
    std::snprintf(line, sizeof line, "%5d %8s %10s %10s %10s %10s %10s %10s %10s %10lld %12s\n", s.stage,
                  devices_text(s.devices).c_str(), t(s.forward_s).c_str(), t(s.backward_s).c_str(), t(s.busy_s).c_str(),
                  t(s.idle_s).c_str(), t(s.allreduce_s).c_str(), t(s.send_s).c_str(), t(s.recv_s).c_str(),
                  static_cast<long long>(s.peak_in_flight), format_bytes(static_cast<double>(s.peak_memory_bytes)).c_str());
    out << line;
  }
  out << "\niteration        " << format_seconds(r.iteration_s) << "  (pipeline " << format_seconds(r.pipeline_s)
      << " + all-reduce + step)\n";
  out << "bubble fraction  " << fixed(r.bubble_fraction, 4) << "\n";
  // plan.json's predicted.iteration_s is partition's own event-level replay (predicted.source "simulated").
  if (plan.predicted_iteration_s && *plan.predicted_iteration_s > 0)
    out << "plan predicted   " << format_seconds(*plan.predicted_iteration_s) << "  (partition's simulated prediction; "
        << fixed((r.iteration_s / *plan.predicted_iteration_s - 1) * 100, 1) << "% difference)\n";
  out << "memory           " << r.memory_note << "\n";
  out << "critical path    " << r.critical_path.size() << " events: ";
  const size_t n = r.critical_path.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 24 && i == 10) {
      out << " … ";
      i = n - 10;
    } else if (i > 0) {
      out << " → ";
    }
    out << r.events[static_cast<size_t>(r.critical_path[i])].name();
  }
  out << "\n";
  return out.str();
}

nlohmann::ordered_json simulation_to_json(const SimPlan& plan, const SimResult& r) {
  using json = nlohmann::ordered_json;
  json j;
  j["schema"] = "apart.simulation/1";
  j["plan"] = plan.source;
  j["schedule"] = schedule_name(r.schedule);
  j["virtual_stages"] = r.virtual_stages;
  j["microbatches"] = r.microbatches;
  j["recompute"] = r.recompute;
  j["iteration_s"] = r.iteration_s;
  j["pipeline_s"] = r.pipeline_s;
  j["bubble_fraction"] = r.bubble_fraction;
  j["predicted_iteration_s"] = plan.predicted_iteration_s ? json(*plan.predicted_iteration_s) : json(nullptr);
  j["links"] = r.links_source;
  j["memory_model"] = r.memory_note;
  json stages = json::array();
  for (const StageStats& s : r.stages) {
    json timeline = json::array();
    for (const auto& [t, bytes] : s.memory_timeline) timeline.push_back({t, bytes});
    stages.push_back({{"stage", s.stage}, {"devices", s.devices}, {"forward_s", s.forward_s},
                      {"backward_s", s.backward_s}, {"busy_s", s.busy_s}, {"idle_s", s.idle_s},
                      {"allreduce_s", s.allreduce_s}, {"step_s", s.step_s}, {"send_s", s.send_s},
                      {"recv_s", s.recv_s}, {"peak_in_flight", s.peak_in_flight},
                      {"memory_static_bytes", s.memory_static_bytes},
                      {"activation_bytes_per_microbatch", s.activation_bytes_per_microbatch},
                      {"peak_memory_bytes", s.peak_memory_bytes}, {"memory_timeline", timeline}});
  }
  j["stages"] = stages;
  json path = json::array();
  for (int e : r.critical_path) {
    const SimEvent& ev = r.events[static_cast<size_t>(e)];
    path.push_back({{"name", ev.name()}, {"stage", ev.stage}, {"start_s", ev.start_s}, {"end_s", ev.end_s}});
  }
  j["critical_path"] = path;
  return j;
}

Timeline simulation_timeline(const SimPlan& plan, const SimResult& r) {
  Timeline t;
  t.generator = "apart simulate";
  t.plan = plan.source;
  t.schedule = schedule_name(r.schedule);
  t.iteration_s = r.iteration_s;
  auto pid_of = [&](int stage) { return plan.stages[static_cast<size_t>(stage)].devices.front(); };
  for (const SimStage& s : plan.stages)
    t.processes.push_back({s.devices.front(),
                           "stage " + std::to_string(s.id) + " (device" + (s.devices.size() > 1 ? "s " : " ") +
                               devices_text(s.devices) + ")",
                           s.id});
  for (const SimEvent& e : r.events) {
    TimelineEvent ev;
    ev.process = pid_of(e.stage);
    ev.stage = e.stage;
    ev.virtual_stage = e.virtual_stage;
    ev.microbatch = e.microbatch;
    ev.start_s = e.start_s;
    ev.end_s = e.end_s;
    if (e.kind != EventKind::kTransfer) {
      ev.kind = e.kind == EventKind::kForward ? TimelineKind::kForward : e.kind == EventKind::kBackward ? TimelineKind::kBackward
                : e.kind == EventKind::kBackwardWeight ? TimelineKind::kBackwardWeight
                : e.kind == EventKind::kAllReduce ? TimelineKind::kAllReduce : TimelineKind::kStep;
      t.events.push_back(ev);
      continue;
    }
    // One transfer: the sender's send and the receiver's receive, over the same interval.
    ev.kind = TimelineKind::kSend;
    ev.bytes = e.bytes;
    ev.gradient = e.gradient;
    ev.peer_stage = e.peer_stage;
    ev.peer_virtual_stage = e.peer_virtual_stage;
    ev.peer_process = pid_of(e.peer_stage);
    TimelineEvent recv = ev;
    recv.kind = TimelineKind::kRecv;
    std::swap(recv.process, recv.peer_process);
    std::swap(recv.stage, recv.peer_stage);
    std::swap(recv.virtual_stage, recv.peer_virtual_stage);
    t.events.push_back(ev);
    t.events.push_back(recv);
  }
  for (const StageStats& s : r.stages)
    for (const auto& [time, bytes] : s.memory_timeline) t.memory.push_back({pid_of(s.stage), time, bytes});
  return t;
}

nlohmann::ordered_json simulation_trace(const SimPlan& plan, const SimResult& r) {
  return timeline_to_chrome_trace(simulation_timeline(plan, r));
}

}  // namespace apart::sim
