// `apart export`: a plan as the configuration of Megatron-LM, torchtitan, torch.distributed.pipelining or DeepSpeed
// (docs/export.md). The work is export/'s; this parses the flags, writes the files and prints what it wrote.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/cli_common.h"
#include "cli/command_registry.h"
#include "export/export.h"
#include "graph/atomic_file.h"
#include "graph/error.h"
#include "graph/output_path.h"
#include "plan/engine.h"

namespace apart::cli {
namespace {

struct ExportArgs {
  std::string plan;
  std::string format;
  std::string out;
};

void run_export(const ExportArgs& a) {
  const Engine engine = parse_engine(a.format, "--format");
  namespace fs = std::filesystem;
  const fs::path out(a.out);
  check_output_directory_writable(out, "-o");
  for (const InputFile& input : plan_inputs(a.plan))
    if (contains_path(out, input.path) || same_file(out, input.path))
      throw InvalidArgument("-o " + out.string() + " would hold " + input.role + " (" + input.path.string() +
                            "): export to a folder of its own");
  // Everything is made (or refused) before the first file is written.
  const ExportFiles files = export_plan(a.plan, engine);
  fs::create_directories(out);
  std::string names;
  for (const auto& [name, contents] : files.files) {
    write_file_atomically(out / name, contents);
    names += (names.empty() ? "" : ", ") + name;
  }
  const auto& snap = files.summary["snapping"];
  std::printf("apart export: wrote %s/ (%s) for %s: %d layers in %zu pipeline parts", out.string().c_str(),
              names.c_str(), a.format.c_str(), files.summary["layers"]["count"].get<int>(),
              files.summary["parts"].size());
  if (snap["moved_tasks"].get<int>() > 0)
    std::printf("; cuts snapped to layers: %d tasks moved, simulated %.4g s against the plan's %.4g s (%+.2f %%)",
                snap["moved_tasks"].get<int>(), snap["snapped_iteration_s"].get<double>(),
                snap["plan_iteration_s"].get<double>(), 100 * snap["cost_fraction"].get<double>());
  else
    std::printf("; the plan's cuts are layer boundaries (exact)");
  std::printf("\n");
}

const bool kRegistered = register_command(
    {"export", 65, [](CLI::App& app) {
       auto args = std::make_shared<ExportArgs>();
       CLI::App* cmd = app.add_subcommand(
           "export",
           "Write a plan as Megatron-LM flags, a torchtitan config, a torch.distributed.pipelining fragment or a "
           "DeepSpeed config, with export.json (layer map, snapped cuts and their simulated cost)");
       cmd->add_option("plan", args->plan, "Plan directory (written by `apart partition`) or its plan.json")
           ->required();
       cmd->add_option("--format", args->format, "megatron, torchtitan, torch-pipelining or deepspeed")->required();
       cmd->add_option("-o,--output", args->out, "Folder to write the files to (created if missing)")->required();
       cmd->callback([args] { run_export(*args); });
     }});

}  // namespace
}  // namespace apart::cli
