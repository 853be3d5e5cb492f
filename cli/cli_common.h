// Flags and formatting shared by the subcommands that read a model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/output_path.h"
#include "importer/importer.h"

namespace CLI {
class App;
}

namespace apart::cli {

// --shape NAME:D0xD1x… (repeatable) and --dim NAME=N (repeatable).
struct ModelFlags {
  std::vector<std::string> shapes;
  std::vector<std::string> dims;
};
void add_model_flags(CLI::App& cmd, ModelFlags& flags);
// Parses the flags; throws InvalidArgument naming the bad flag.
ImportOptions import_options(const ModelFlags& flags);

// What a command that read this model must not overwrite: the model file and its external-data files.
std::vector<InputFile> model_inputs(const std::string& path, const ImportedModel& model);
// What a command that reads a plan (a plan folder or its plan.json) must not overwrite: plan.json and the
// costs.json and baselines.json beside it.
std::vector<InputFile> plan_inputs(const std::string& plan);

std::string human_count(double n);     // 124.4M
std::string human_bytes(double bytes);  // 497.6 MB (decimal units, like the frameworks' summaries)
std::string human_flops(double flops);  // 1.23 GFLOP

}  // namespace apart::cli
