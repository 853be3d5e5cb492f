// `apart simulate`: event-level replay of one training iteration of a plan (docs/simulator.md).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>

#include "cli/cli_common.h"
#include "plan/plan_summary.h"
#include "cli/command_registry.h"
#include "graph/checked.h"
#include "graph/error.h"
#include "plan/cluster_json.h"
#include "profiler/device.h"
#include "plan/trace.h"
#include "simulator/compare.h"
#include "simulator/sim_plan.h"
#include "simulator/sim_report.h"
#include "simulator/simulate.h"

namespace apart::cli {
namespace {

struct SimulateArgs {
  std::string plan;
  std::string schedule = "plan";
  int64_t virtual_stages = 0;
  std::string recompute = "plan";
  std::optional<double> optimizer_step_ms;
  std::string cluster;
  bool no_comm = false;
  std::string trace;
  std::string compare;
  bool json = false;
};

void run_simulate(const SimulateArgs& a) {
  sim::SimPlan plan = sim::load_plan(a.plan);
  if (!a.compare.empty() && a.json) throw InvalidArgument("--compare prints a table; drop --json");
  // Read before the replay: a bad trace fails fast, with nothing written.
  const Timeline measured = a.compare.empty() ? Timeline{} : read_timeline(a.compare);
  if (!a.trace.empty()) {
    std::vector<InputFile> inputs = plan_inputs(a.plan);
    if (!a.cluster.empty()) inputs.push_back({"the cluster file", a.cluster});
    check_output_file(a.trace, inputs, "--trace");
  }
  if (!a.cluster.empty()) {
    const Cluster c = load_cluster_json(a.cluster);
    plan.cluster.intra_node = c.intra_node;
    plan.cluster.inter_node = c.inter_node;
    plan.cluster.devices_per_node = c.devices_per_node;
    plan.links_source = "cluster file " + a.cluster;
  }
  sim::SimOptions options;
  if (a.schedule != "plan") options.schedule = parse_schedule(a.schedule);
  options.virtual_stages =
      checked_int(a.virtual_stages, 0, limits::kMaxVirtualStages, "--virtual-stages (chunks per device; 0: default)");
  if (a.recompute == "on") options.recompute = true;
  else if (a.recompute == "off") options.recompute = false;
  else if (a.recompute != "plan") throw InvalidArgument("--recompute " + a.recompute + ": expected plan, on or off");
  if (a.optimizer_step_ms) {
    checked_number(*a.optimizer_step_ms, 0, limits::kMaxSeconds * 1e3, "--optimizer-step-ms");
    options.optimizer_step_s = *a.optimizer_step_ms / 1e3;
  }
  options.communication = !a.no_comm;
  const sim::SimResult result = sim::simulate(plan, options);
  std::optional<sim::Comparison> comparison;
  if (!a.compare.empty()) comparison = sim::compare_with_timeline(plan, result, measured, a.compare);
  // The trace first: a failed write leaves no file and prints no table (exit code 6).
  if (!a.trace.empty()) sim::write_file_atomically(a.trace, sim::simulation_trace(plan, result).dump() + "\n");
  if (comparison) {
    // The replay's table first: what the comparison is against.
    std::cout << sim::simulation_report(plan, result) << "\n" << sim::comparison_report(*comparison);
  } else if (a.json) {
    std::cout << sim::simulation_to_json(plan, result).dump(1) << "\n";
  } else {
    // What was planned, in its launcher's words (plan/plan_summary.h), above what the replay found.
    std::cout << "plan: " << plan_summary_line(read_plan(a.plan)) << "\n" << sim::simulation_report(plan, result);
  }
  std::cout.flush();
  if (!a.trace.empty())
    std::fprintf(stderr, "apart: wrote %zu events to %s (open in https://ui.perfetto.dev)\n", result.events.size(),
                 a.trace.c_str());
}

const bool kRegistered = register_command({"simulate", 60, [](CLI::App& app) {
  auto args = std::make_shared<SimulateArgs>();
  CLI::App* cmd = app.add_subcommand("simulate", "Replay one training iteration of a plan event by event (schedules, trace)");
  cmd->add_option("plan", args->plan, "Plan directory (written by `apart partition`) or its plan.json")->required();
  cmd->add_option("--schedule", args->schedule, "plan, gpipe, 1f1b, interleaved or zb-h1")->capture_default_str();
  cmd->add_option("--virtual-stages", args->virtual_stages, "Chunks per device for --schedule interleaved (default 2)");
  cmd->add_option("--recompute", args->recompute, "plan, on or off")->capture_default_str();
  cmd->add_option("--optimizer-step-ms", args->optimizer_step_ms,
                  "Optimizer step time after the all-reduce on every stage (default: each stage's optimizer_s)");
  cmd->add_option("--cluster", args->cluster, "Cluster JSON (apart.cluster/1) whose links replace the plan's");
  cmd->add_flag("--no-comm", args->no_comm, "Transfers take no time (what-if)");
  cmd->add_option("--trace", args->trace, "Write a Chrome/Perfetto trace JSON here");
  cmd->add_option("--compare", args->compare,
                  "A measured timeline (apart run --trace FILE): print predicted vs measured per stage, and each miss > 10 %");
  cmd->add_flag("--json", args->json, "Print apart.simulation/1 JSON instead of the table");
  cmd->callback([args] { run_simulate(*args); });
}});

}  // namespace
}  // namespace apart::cli
