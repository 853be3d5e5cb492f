// Flags and formatting shared by the subcommands that read a model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

std::string human_count(double n);     // 124.4M
std::string human_bytes(double bytes);  // 497.6 MB (decimal units, like the frameworks' summaries)
std::string human_flops(double flops);  // 1.23 GFLOP

}  // namespace apart::cli
