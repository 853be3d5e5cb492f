// Flags and formatting shared by the subcommands that read a model.
#include "cli/cli_common.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>

#include "graph/error.h"

namespace apart::cli {

void add_model_flags(CLI::App& cmd, ModelFlags& flags) {
  cmd.add_option("--shape", flags.shapes,
                 "Static shape of a graph input, trtexec style: NAME:D0xD1x… (e.g. input:8x3x224x224); repeatable")
      ->take_last()
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd.add_option("--dim", flags.dims, "Bind a symbolic dim everywhere it appears: NAME=N (e.g. batch=8); repeatable")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

ImportOptions import_options(const ModelFlags& flags) {
  ImportOptions o;
  for (const auto& s : flags.shapes) {
    auto parsed = parse_shape_flag(s);
    for (const auto& existing : o.input_shapes)
      if (existing.first == parsed.first) throw InvalidArgument("--shape is given twice for input '" + parsed.first + "'");
    o.input_shapes.push_back(std::move(parsed));
  }
  for (const auto& d : flags.dims) {
    auto [name, value] = parse_dim_flag(d);
    auto [it, inserted] = o.dims.emplace(name, value);
    if (!inserted && it->second != value) throw InvalidArgument("--dim " + name + " is given twice with different values");
  }
  return o;
}

namespace {
std::string scaled(double v, const char* const* units, int n, double step, const char* suffix) {
  int i = 0;
  while (std::fabs(v) >= step && i + 1 < n) {
    v /= step;
    ++i;
  }
  return i == 0 && std::floor(v) == v ? fmt::format("{:.0f}{}{}", v, units[i], suffix) : fmt::format("{:.2f}{}{}", v, units[i], suffix);
}
}  // namespace

std::vector<InputFile> model_inputs(const std::string& path, const ImportedModel& model) {
  std::vector<InputFile> inputs{{"the model", path}};
  for (const auto& file : model.external_data_files) inputs.push_back({"an external-data file of the model", file});
  return inputs;
}

std::vector<InputFile> plan_inputs(const std::string& plan) {
  std::error_code ec;
  const std::filesystem::path file =
      std::filesystem::is_directory(plan, ec) ? std::filesystem::path(plan) / "plan.json" : std::filesystem::path(plan);
  const std::filesystem::path dir = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  return {{"the plan", file}, {"the plan's costs", dir / "costs.json"}, {"the plan's baselines", dir / "baselines.json"}};
}

std::string human_count(double n) {
  static const char* const units[] = {"", "K", "M", "B", "T"};
  return scaled(n, units, 5, 1000.0, "");
}
std::string human_bytes(double bytes) {
  static const char* const units[] = {" B", " KB", " MB", " GB", " TB", " PB"};
  return scaled(bytes, units, 6, 1000.0, "");
}
std::string human_flops(double flops) {
  static const char* const units[] = {" ", " K", " M", " G", " T", " P", " E"};
  return scaled(flops, units, 7, 1000.0, "FLOP");
}

}  // namespace apart::cli
