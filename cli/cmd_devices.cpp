// `apart devices`: the device presets --device accepts, their short names and the datasheet figures the cost model
// uses (or, with --json, the same as one JSON array).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command_registry.h"
#include "graph/units.h"
#include "profiler/device.h"

namespace apart::cli {
namespace {

struct DevicesArgs {
  bool json = false;
  bool with_cpu = true;
};

void run_devices(const DevicesArgs& a) {
  nlohmann::json all = nlohmann::json::array();
  std::printf(
      "%s", a.json
                ? ""
                : "preset          memory     FP32    TF32  BF16/FP16     HBM   in node  between  part (also called)\n"
                  "                         (dense TFLOP/s)             (GB/s)   (GB/s per direction)\n");
  for (const DevicePresetInfo& info : device_preset_infos()) {
    if (info.name == "cpu" && !a.with_cpu) continue;
    const Device d = device_preset(info.name);  // cpu: the probe's cache, or a probe (< 1 s)
    std::string aliases;
    for (const std::string& alias : info.aliases) aliases += (aliases.empty() ? "" : ", ") + alias;
    if (a.json) {
      all.push_back({{"name", info.name},
                     {"part", info.part},
                     {"aliases", info.aliases},
                     {"memory_bytes", d.memory_bytes},
                     {"peak_fp32_flops", d.peak_fp32_flops},
                     {"peak_tf32_flops", d.peak_tf32_flops},
                     {"peak_fp16_flops", d.peak_fp16_flops},
                     {"memory_bandwidth", d.memory_bandwidth},
                     {"intra_node_bandwidth", d.intra_node.bandwidth},
                     {"inter_node_bandwidth", d.inter_node.bandwidth},
                     {"measured", d.measured}});
      continue;
    }
    std::printf("%s\n",
                fmt::format("{:<11} {:>11} {:>8.3g} {:>7.4g} {:>10.4g} {:>7.4g} {:>9.4g} {:>8.3g}  {}{}", info.name,
                            format_bytes(static_cast<double>(d.memory_bytes)), d.peak_fp32_flops / 1e12,
                            d.peak_tf32_flops / 1e12, d.peak_fp16_flops / 1e12, d.memory_bandwidth / 1e9,
                            d.intra_node.bandwidth / 1e9, d.inter_node.bandwidth / 1e9, info.part,
                            aliases.empty() ? "" : " (" + aliases + ")")
                    .c_str());
  }
  if (a.json)
    std::printf("%s\n", all.dump(1).c_str());
  else
    std::printf(
        "\nA device outside this list (a PCIe or NVL card, another network): describe it in a --cluster JSON "
        "file (apart.cluster/1, docs/cost-model.md).\n");
}

const bool kRegistered = register_command(
    {"devices", 35, [](CLI::App& app) {
       auto args = std::make_shared<DevicesArgs>();
       CLI::App* cmd = app.add_subcommand("devices", "List the device presets --device accepts, with their figures");
       cmd->add_flag("--json", args->json, "Print one JSON array instead of the table");
       cmd->add_flag("!--no-cpu", args->with_cpu,
                     "Leave out the cpu row (which reads or runs this machine's CPU probe)");
       cmd->callback([args] { run_devices(*args); });
     }});

}  // namespace
}  // namespace apart::cli
