// `apart costs`: every task's analytic forward/backward time, FLOPs and memory, as apart.costs/1 JSON.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/cli_common.h"
#include "cli/command_registry.h"
#include "driver/compile.h"
#include "graph/checked.h"
#include "graph/error.h"
#include "graph/text.h"
#include "importer/importer.h"
#include "profiler/cost_model.h"
#include "plan/cluster_json.h"
#include "plan/costs_json.h"
#include "profiler/device.h"

namespace apart::cli {
namespace {

struct CostsArgs {
  std::string model;
  ModelFlags model_flags;
  std::string device = "a100-80gb";
  std::string cluster;
  std::string precision = "auto";
  std::string attention = "flash";
  int64_t microbatch = 0;
  std::string output;
};

void run_costs(const CostsArgs& a) {
  const Device device = a.cluster.empty() ? device_preset(a.device) : load_cluster_json(a.cluster).device;
  CostOptions options;
  options.precision = resolve_precision(a.precision, device);
  options.attention = parse_attention_kernel(a.attention);
  options.microbatch_size = checked_integer(a.microbatch, 0, limits::kMaxBatch, "--microbatch-size (0: the bound batch)");
  const ImportedModel m = import_model(a.model, import_options(a.model_flags));
  note_constant_params(m.constant_params);
  options.reference_batch = m.bound_samples();
  if (!a.output.empty()) {
    std::vector<InputFile> inputs = model_files(a.model, m);
    if (!a.cluster.empty()) inputs.push_back({"the cluster file", a.cluster});
    check_output_file(a.output, inputs, "-o");
  }
  const CostTable table = estimate_costs(m.graph, device, options);
  for (const auto& w : table.warnings) std::fprintf(stderr, "apart: warning: %s\n", printable(w).c_str());
  if (a.output.empty()) {
    std::cout << costs_to_json(m.graph, table).dump(1) << "\n";
  } else {
    write_costs_json(a.output, m.graph, table);
    std::fprintf(stderr, "apart: wrote %zu task costs to %s\n", table.tasks.size(), a.output.c_str());
  }
}

const bool kRegistered = register_command({"costs", 40, [](CLI::App& app) {
  auto args = std::make_shared<CostsArgs>();
  CLI::App* cmd = app.add_subcommand("costs", "Per-task forward/backward time, FLOPs and memory on a device (apart.costs/1 JSON)");
  cmd->add_option("model", args->model, "ONNX model file")->required();
  add_model_flags(*cmd, args->model_flags, /*default_batch=*/1);
  cmd->add_option("--device", args->device, device_flag_help())->capture_default_str();
  cmd->add_option("--cluster", args->cluster, "Cluster JSON (apart.cluster/1, docs/cost-model.md); its device wins over --device");
  cmd->add_option("--attention", args->attention, kAttentionHelp)->capture_default_str();
  cmd->add_option("--precision", args->precision, kPrecisionHelp)
      ->capture_default_str();
  cmd->add_option("--microbatch-size", args->microbatch, "Costs at this micro-batch size (default: the bound batch)");
  cmd->add_option("-o,--output", args->output, "Write the JSON here (temp file + rename); default stdout");
  cmd->callback([args] { run_costs(*args); });
}});

}  // namespace
}  // namespace apart::cli
