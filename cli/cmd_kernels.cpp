// `apart kernels`: the kernel program of one training step (codegen/kernel_program.h) as the runtime launches it,
// per kernel and in totals, beside what the cost model prices for the same step.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/cli_common.h"
#include "cli/command_registry.h"
#include "codegen/autodiff.h"
#include "codegen/kernel_program.h"
#include "graph/error.h"
#include "graph/text.h"
#include "importer/added_loss.h"
#include "importer/importer.h"
#include "importer/model_proto.h"
#include "profiler/cost_model.h"
#include "profiler/device.h"

namespace apart::cli {
namespace {

struct KernelsArgs {
  std::string model;
  ModelFlags model_flags;
  LossFlags loss_flags;
  std::string device = "cpu";
  std::string precision = "auto";
  bool json = false;
};

std::string task_list(const TaskGraph& g, const ProgramKernel& k) {
  std::string s;
  for (TaskId t : k.tasks) s += (s.empty() ? "" : ", ") + g.task(t).name;
  return s;
}

void run_kernels(const KernelsArgs& a) {
  const Device device = device_preset(a.device);
  const Precision precision = resolve_precision(a.precision, device);
  ImportOptions import = import_options(a.model_flags);
  TrainingGraphOptions training;
  training.loss = apply_loss_flags(a.loss_flags, LossFlagUse::kFormOrOutput, import.loss);
  onnx::ModelProto forward = load_model_proto(a.model);
  append_loss(forward, import.loss);
  import.loss = {};
  import.require_external_data = false;  // shapes are all the program needs
  training.import = import;
  const TrainingGraph tg = build_training_graph(forward, training);
  forward.Clear();
  ImportOptions as_given;
  as_given.require_external_data = false;
  as_given.constants_as_params = false;
  const ImportedModel step = import_model_bytes(tg.model.SerializeAsString(), {}, a.model, as_given);
  const TaskGraph& g = step.graph;
  const KernelProgram program = lower_to_kernels(g, {device.fuses_elementwise});
  const StepPrice priced = price_training_step(g, device, precision);

  if (a.json) {
    nlohmann::json kernels = nlohmann::json::array();
    for (const ProgramKernel& k : program.kernels) {
      nlohmann::json tasks = nlohmann::json::array();
      for (TaskId t : k.tasks) tasks.push_back(g.task(t).name);
      kernels.push_back({{"name", k.name},
                         {"tasks", tasks},
                         {"dtype", std::string(dtype_name(k.dtype))},
                         {"flops", k.flops},
                         {"bytes_read", k.bytes_read},
                         {"bytes_written", k.bytes_written},
                         {"launch", k.launch}});
    }
    const KernelProgramTotals& t = program.totals;
    const nlohmann::json out = {{"model", a.model},
                                {"device", device.name},
                                {"precision", std::string(precision_name(precision))},
                                {"kernels", kernels},
                                {"totals",
                                 {{"launches", t.launches},
                                  {"bytes", t.bytes},
                                  {"flops", t.flops},
                                  {"largest_tensor_bytes", t.largest_tensor_bytes},
                                  {"fp32_activation_fraction", t.fp32_activation_fraction}}},
                                {"priced", {{"launches", priced.launches}, {"bytes", priced.bytes}}}};
    std::cout << out.dump(1) << "\n";
    return;
  }
  std::printf("%-40s %-8s %12s %12s %12s  %s\n", "kernel", "dtype", "GFLOP", "MB read", "MB written", "tasks");
  for (const ProgramKernel& k : program.kernels) {
    if (!k.launch) continue;
    std::printf("%-40s %-8s %12.4f %12.3f %12.3f  %s\n", printable(k.name).c_str(),
                std::string(dtype_name(k.dtype)).c_str(), k.flops / 1e9, k.bytes_read / 1e6, k.bytes_written / 1e6,
                printable(task_list(g, k)).c_str());
  }
  const KernelProgramTotals& t = program.totals;
  std::printf(
      "\ntotals: %lld launches (%zu views, no launch), %.3f GB moved, %.3f GFLOP, largest tensor %.3f MB, "
      "fp32 share of activations %.2f\n",
      static_cast<long long>(t.launches), program.kernels.size() - static_cast<size_t>(t.launches), t.bytes / 1e9,
      t.flops / 1e9, static_cast<double>(t.largest_tensor_bytes) / 1e6, t.fp32_activation_fraction);
  std::printf("priced (%s, %s): %lld launches, %.3f GB moved\n", device.name.c_str(),
              std::string(precision_name(precision)).c_str(), static_cast<long long>(priced.launches),
              priced.bytes / 1e9);
}

const bool kRegistered =
    register_command({"kernels", 45, [](CLI::App& app) {
                        auto args = std::make_shared<KernelsArgs>();
                        CLI::App* cmd = app.add_subcommand(
                            "kernels", "The kernels one training step launches, and what the cost model prices for it");
                        cmd->add_option("model", args->model, "ONNX model file")->required();
                        add_model_flags(*cmd, args->model_flags, /*default_batch=*/1);
                        add_loss_flags(*cmd, args->loss_flags, LossFlagUse::kFormOrOutput);
                        cmd->add_option("--device", args->device, device_flag_help())->capture_default_str();
                        cmd->add_option("--precision", args->precision, kPrecisionHelp)->capture_default_str();
                        cmd->add_flag("--json", args->json, "Print JSON: kernels, totals, priced");
                        cmd->callback([args] { run_kernels(*args); });
                      }});

}  // namespace
}  // namespace apart::cli
