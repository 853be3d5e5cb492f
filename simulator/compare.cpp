// Predicted (a replay) against measured (a timeline), stage by stage (see compare.h).
#include "simulator/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "graph/error.h"
#include "graph/statistics.h"
#include "graph/units.h"

namespace apart::sim {
namespace {

// One process's figures in one step, before the medians over steps and replicas.
struct Tally {
  double forward = 0, backward = 0, comm = 0, allreduce = 0, step = 0;
  int64_t forwards = 0, backwards = 0;
};

std::string ratio_text(double predicted, double measured) {
  if (predicted <= 0) return measured > 0 ? "-" : "1.00";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", measured / predicted);
  return buf;
}

bool misses(double predicted, double measured) {
  return predicted > 0 && std::abs(measured / predicted - 1) > kFidelityTolerance;
}

std::string miss_text(const char* what, double predicted, double measured) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s %s predicted, %s measured (%+.1f %%)", what, format_seconds(predicted).c_str(),
                format_seconds(measured).c_str(), (measured / predicted - 1) * 100);
  return buf;
}

}  // namespace

Comparison compare_with_timeline(const SimPlan& plan, const SimResult& predicted, const Timeline& measured,
                                 const std::string& trace_source) {
  const int stages = static_cast<int>(plan.stages.size());
  // Steps: a run's 1-based steps, or the replay's one iteration (step 0).
  std::map<int64_t, std::pair<double, double>> span;  // step → (first start, last end) over every process
  std::map<std::pair<int, int64_t>, Tally> tallies;   // (process, step)
  std::map<int, int> stage_of;                        // process → stage
  std::set<int64_t> steps;
  for (const TimelineEvent& e : measured.events) steps.insert(e.step);
  // A run's first step warms caches and allocators up: leave it out when later steps are there.
  const bool skip_first = steps.size() > 1 && *steps.begin() == 1;
  for (const TimelineEvent& e : measured.events) {
    if (skip_first && e.step == 1) continue;
    if (e.stage >= stages)
      throw InvalidArgument(trace_source + " has events of stage " + std::to_string(e.stage) + " but the plan " + plan.source +
                            " has " + std::to_string(stages) + " stages: compare a trace of this plan (apart run " +
                            "PLAN --trace FILE)");
    auto [it, fresh] = span.emplace(e.step, std::pair{e.start_s, e.end_s});
    if (!fresh) it->second = {std::min(it->second.first, e.start_s), std::max(it->second.second, e.end_s)};
    stage_of[e.process] = e.stage;
    Tally& t = tallies[{e.process, e.step}];
    const double d = e.end_s - e.start_s;
    switch (e.kind) {
      case TimelineKind::kForward: t.forward += d; ++t.forwards; break;
      case TimelineKind::kBackward: t.backward += d; ++t.backwards; break;
      case TimelineKind::kBackwardWeight: t.backward += d; break;  // ZB-H1's W: the rest of that backward
      case TimelineKind::kSend:
      case TimelineKind::kRecv: t.comm += d; break;
      case TimelineKind::kAllReduce: t.allreduce += d; break;
      case TimelineKind::kStep: t.step += d; break;
    }
  }
  Comparison c;
  c.trace = trace_source;
  c.generator = measured.generator;
  c.steps = static_cast<int>(span.size());
  c.first_step_left_out = skip_first;
  std::vector<double> iterations;
  for (const auto& [step, s] : span) iterations.push_back(s.second - s.first);
  c.measured_iteration_s = median(iterations);
  c.mean_iteration_s = mean(iterations);
  c.predicted_iteration_s = predicted.iteration_s;
  for (int s = 0; s < stages; ++s) {
    StageComparison row;
    row.stage = s;
    const StageStats& p = predicted.stages[static_cast<size_t>(s)];
    row.predicted = {p.forward_s, p.backward_s, p.busy_s, p.send_s + p.recv_s, p.allreduce_s, p.step_s, p.idle_s};
    // One sample per (process, step) of the stage: the figures are their medians.
    std::vector<double> forward, backward, busy, comm, allreduce, step;
    std::set<int> processes;
    // Interleaved: a micro-batch is v chunk ops on each device (the predicted figures are the stage's, all chunks').
    const double chunks = predicted.schedule == Schedule::kInterleaved ? std::max(1, predicted.virtual_stages) : 1;
    for (const auto& [key, t] : tallies) {
      if (stage_of[key.first] != s || t.forwards == 0 || t.backwards == 0) continue;
      processes.insert(key.first);
      forward.push_back(t.forward * chunks / static_cast<double>(t.forwards));
      backward.push_back(t.backward * chunks / static_cast<double>(t.backwards));
      busy.push_back(t.forward + t.backward);
      comm.push_back(t.comm);
      allreduce.push_back(t.allreduce);
      step.push_back(t.step);
    }
    if (forward.empty())
      throw InvalidArgument(trace_source + " has no forward and backward of stage " + std::to_string(s) + " (the plan " +
                            plan.source + " has " + std::to_string(stages) + "): compare a trace of this plan");
    row.replicas = static_cast<int>(processes.size());
    StageFigures& m = row.measured;
    m.forward_s = median(forward);
    m.backward_s = median(backward);
    m.busy_s = median(busy);
    m.comm_s = median(comm);
    m.allreduce_s = median(allreduce);
    m.step_s = median(step);
    m.idle_s = std::max(0.0, c.measured_iteration_s - m.busy_s - m.allreduce_s - m.step_s);
    if (misses(row.predicted.forward_s, m.forward_s))
      row.misses.push_back(miss_text("forward", row.predicted.forward_s, m.forward_s));
    if (misses(row.predicted.backward_s, m.backward_s))
      row.misses.push_back(miss_text("backward", row.predicted.backward_s, m.backward_s));
    if (misses(row.predicted.busy_s, m.busy_s)) row.misses.push_back(miss_text("busy", row.predicted.busy_s, m.busy_s));
    c.stages.push_back(std::move(row));
  }
  return c;
}

std::string comparison_report(const Comparison& c) {
  std::ostringstream out;
  out << "predicted (apart simulate) vs measured (" << c.trace << ", " << (c.generator.empty() ? "?" : c.generator) << ", "
      << (c.steps == 1 ? "1 step" : "median of " + std::to_string(c.steps) + " steps") << (c.first_step_left_out ? ", step 1 left out: warm-up" : "")
      << ")\n";
  out << "times per micro-batch for forward and backward, per iteration otherwise; ratio = measured / predicted\n\n";
  const char* columns[] = {"forward", "backward", "busy", "comm", "all-reduce", "step", "idle"};
  char line[512];
  int at = std::snprintf(line, sizeof line, "%5s %4s", "stage", "reps");
  for (const char* col : columns) at += std::snprintf(line + at, sizeof line - static_cast<size_t>(at), " | %-25s", col);
  out << line << "\n";
  at = std::snprintf(line, sizeof line, "%5s %4s", "", "");
  for (size_t i = 0; i < std::size(columns); ++i)
    at += std::snprintf(line + at, sizeof line - static_cast<size_t>(at), " | %9s %9s %5s", "predicted", "measured", "ratio");
  out << line << "\n";
  for (const StageComparison& s : c.stages) {
    const StageFigures& p = s.predicted;
    const StageFigures& m = s.measured;
    const std::pair<double, double> cells[] = {{p.forward_s, m.forward_s},     {p.backward_s, m.backward_s},
                                               {p.busy_s, m.busy_s},           {p.comm_s, m.comm_s},
                                               {p.allreduce_s, m.allreduce_s}, {p.step_s, m.step_s},
                                               {p.idle_s, m.idle_s}};
    at = std::snprintf(line, sizeof line, "%5d %4d", s.stage, s.replicas);
    for (const auto& [pv, mv] : cells)
      at += std::snprintf(line + at, sizeof line - static_cast<size_t>(at), " | %9s %9s %5s", format_seconds(pv).c_str(),
                          format_seconds(mv).c_str(), ratio_text(pv, mv).c_str());
    out << line << "\n";
  }
  std::snprintf(line, sizeof line, "\niteration  %s predicted, %s measured, ratio %s", format_seconds(c.predicted_iteration_s).c_str(),
                format_seconds(c.measured_iteration_s).c_str(), ratio_text(c.predicted_iteration_s, c.measured_iteration_s).c_str());
  out << line;
  if (c.steps > 1) out << " (mean of the steps " << format_seconds(c.mean_iteration_s) << ")";
  if (misses(c.predicted_iteration_s, c.measured_iteration_s)) {
    std::snprintf(line, sizeof line, "  (misses by %+.1f %%)", (c.measured_iteration_s / c.predicted_iteration_s - 1) * 100);
    out << line;
  }
  out << "\n";
  int missing = 0;
  for (const StageComparison& s : c.stages)
    for (const std::string& m : s.misses) {
      out << "stage " << s.stage << " misses by more than 10 %: " << m << "\n";
      ++missing;
    }
  if (missing == 0) out << "every stage's forward, backward and busy time is within 10 % of the prediction\n";
  return out.str();
}

}  // namespace apart::sim
