// `apart report`: one self-contained HTML page about a plan (docs/report.md).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/cli_common.h"
#include "cli/command_registry.h"
#include "report/html_report.h"

namespace apart::cli {
namespace {

struct ReportArgs {
  std::string plan;
  std::string out;
};

void run_report(const ReportArgs& a) {
  std::filesystem::path out = a.out;
  if (out.empty()) {
    std::error_code ec;
    out = std::filesystem::is_directory(a.plan, ec) ? std::filesystem::path(a.plan) / "report.html"
                                                    : std::filesystem::path(a.plan).parent_path() / "report.html";
  }
  // A missing plan gets load_report_plan's own message; otherwise the output is checked before the work.
  std::error_code ec;
  if (std::filesystem::exists(a.plan, ec)) check_output_file(out, plan_inputs(a.plan), "-o");
  report::write_html_report(a.plan, out);
  std::fprintf(stderr, "apart: wrote %s (open it in a browser; it needs no network)\n", out.string().c_str());
}

const bool kRegistered = register_command({"report", 70, [](CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand("report", "Write a self-contained HTML report of a plan (layout, timeline, baselines)");
  cmd->add_option("plan", args->plan, "Plan directory (written by `apart partition`) or its plan.json")->required();
  cmd->add_option("-o,--output", args->out, "HTML file to write (default: PLAN/report.html)");
  cmd->callback([args] { run_report(*args); });
}});

}  // namespace
}  // namespace apart::cli
