// `apart report`: one self-contained HTML page about a plan (no network: inline CSS, JS and SVG only): the stage
// layout over the model's layers, the simulated pipeline timeline of one iteration, the summary, and the
// comparison with the baselines when plan/baselines.json is there.
#pragma once

#include <filesystem>
#include <string>

#include "report/report_plan.h"
#include "simulator/simulate.h"

namespace apart::report {

struct HtmlOptions {
  size_t max_timeline_events = 40000;  // beyond this the timeline draws compute and all-reduce only
};

std::string html_report(const ReportPlan& plan, const sim::SimResult& result, const HtmlOptions& options = {});

// Loads the plan, simulates it with its own schedule and writes the page to `out` via temp + rename.
// Errors as load_report_plan; SystemError when `out` cannot be written (nothing is left behind).
void write_html_report(const std::filesystem::path& plan, const std::filesystem::path& out,
                       const HtmlOptions& options = {});

}  // namespace apart::report
