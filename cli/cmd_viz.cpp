// `apart viz`: the stage graph of a plan as Graphviz DOT or apart.stagegraph/1 JSON (docs/report.md).
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>

#include "cli/cli_common.h"
#include "cli/command_registry.h"
#include "graph/error.h"
#include "report/stage_graph.h"
#include "simulator/sim_report.h"

namespace apart::cli {
namespace {

struct VizArgs {
  std::string plan;
  std::string format = "dot";
  std::string out;
};

void run_viz(const VizArgs& a) {
  if (a.format != "dot" && a.format != "json") throw InvalidArgument("--format " + a.format + ": expected dot or json");
  const report::StageGraph graph = report::stage_graph(report::load_report_plan(a.plan));
  const bool to_file = !a.out.empty() && a.out != "-";
  if (to_file) check_output_file(a.out, plan_inputs(a.plan), "-o");
  const std::string text = a.format == "dot" ? report::stage_graph_dot(graph) : report::stage_graph_json(graph).dump(1) + "\n";
  if (!to_file) {
    std::cout << text;
    std::cout.flush();
  } else {
    sim::write_file_atomically(a.out, text);
  }
}

const bool kRegistered = register_command({"viz", 71, [](CLI::App& app) {
  auto args = std::make_shared<VizArgs>();
  CLI::App* cmd = app.add_subcommand("viz", "Print a plan's stage graph (stages, boundary values, bytes) as DOT or JSON");
  cmd->add_option("plan", args->plan, "Plan directory (written by `apart partition`) or its plan.json")->required();
  cmd->add_option("--format", args->format, "dot (Graphviz) or json (apart.stagegraph/1)")->capture_default_str();
  cmd->add_option("-o,--output", args->out, "File to write (default: standard output)");
  cmd->callback([args] { run_viz(*args); });
}});

}  // namespace
}  // namespace apart::cli
