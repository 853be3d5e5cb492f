// apart.cluster/1 reader and writer (see cluster_json.h).
#include "plan/cluster_json.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "graph/checked.h"
#include "graph/error.h"
#include "graph/json_reader.h"

namespace apart {
namespace {

// Reads an apart.cluster/1 object; every field is optional except the device and falls back to `fallback`.
JsonReader cluster_reader(const std::string& source) {
  return JsonReader(source, "apart.cluster/1", "docs/cost-model.md", JsonReader::Null::kInvalid,
                    ErrorKind::kInvalidArgument, "");
}

double positive_or(const JsonReader& r, const nlohmann::json& j, const std::string& path, const char* key,
                   double max, double fallback) {
  return j.contains(key) ? r.positive(j, path, key, max) : fallback;
}

Link link_from_json(const JsonReader& r, const nlohmann::json& j, const char* key, Link fallback) {
  if (!j.contains(key)) return fallback;
  const nlohmann::json& l = r.object(j, "", key);
  const std::string path = std::string(key) + ".";
  return {positive_or(r, l, path, "bandwidth_bytes_per_s", limits::kMaxRate, fallback.bandwidth),
          r.optional_seconds(l, path, "latency_s").value_or(fallback.latency_s)};
}

nlohmann::json link_to_json(const Link& l) { return {{"bandwidth_bytes_per_s", l.bandwidth}, {"latency_s", l.latency_s}}; }

}  // namespace

nlohmann::json device_to_json(const Device& d) {
  return {{"name", d.name},
          {"memory_bytes", d.memory_bytes},
          {"peak_flops", {{"fp32", d.peak_fp32_flops}, {"tf32", d.peak_tf32_flops}, {"fp16", d.peak_fp16_flops}}},
          {"memory_bandwidth_bytes_per_s", d.memory_bandwidth},
          {"kernel_overhead_s", d.kernel_overhead_s},
          {"measured", d.measured},
          {"fuses_elementwise", d.fuses_elementwise}};
}

Cluster cluster_from_json(const nlohmann::json& j, const std::string& source) {
  const JsonReader r = cluster_reader(source);
  if (!j.is_object()) r.fail("the document", "must be a JSON object");
  if (j.contains("schema") && r.string(j, "", "schema") != "apart.cluster/1") r.fail("schema", "must be \"apart.cluster/1\"");
  Device dev;
  const nlohmann::json& dj = r.member(j, "", "device");
  if (dj.is_string()) {
    dev = device_preset(dj.get<std::string>());
  } else if (dj.is_object()) {
    // A custom device: start from "base" (a preset) when given, then override any figure.
    if (const auto base = r.optional_string(dj, "device.", "base")) dev = device_preset(*base);
    dev.name = r.optional_string(dj, "device.", "name").value_or(dev.name.empty() ? std::string("custom") : dev.name);
    if (dj.contains("memory_bytes"))
      dev.memory_bytes = std::llround(r.positive(dj, "device.", "memory_bytes", limits::kMaxBytes));  // ≤ 2^60: exact
    if (dj.contains("peak_flops")) {
      const nlohmann::json& p = r.object(dj, "device.", "peak_flops");
      const std::string path = "device.peak_flops.";
      dev.peak_fp32_flops = positive_or(r, p, path, "fp32", limits::kMaxRate, dev.peak_fp32_flops);
      dev.peak_tf32_flops = positive_or(r, p, path, "tf32", limits::kMaxRate,
                                        dev.peak_tf32_flops > 0 ? dev.peak_tf32_flops : dev.peak_fp32_flops);
      dev.peak_fp16_flops = positive_or(r, p, path, "fp16", limits::kMaxRate,
                                        dev.peak_fp16_flops > 0 ? dev.peak_fp16_flops : dev.peak_fp32_flops);
    }
    dev.memory_bandwidth =
        positive_or(r, dj, "device.", "memory_bandwidth_bytes_per_s", limits::kMaxRate, dev.memory_bandwidth);
    dev.kernel_overhead_s = r.optional_seconds(dj, "device.", "kernel_overhead_s").value_or(dev.kernel_overhead_s);
    // A datasheet device is costed as the GPU presets are, fused kernels included, unless the file says otherwise.
    dev.fuses_elementwise = r.boolean(dj, "device.", "fuses_elementwise", dj.contains("base") ? dev.fuses_elementwise : true);
  } else {
    r.fail("device", "must be a preset name or an object");
  }
  Cluster c;
  c.device = dev;
  c.devices = static_cast<int>(r.optional_integer(j, "", "devices", 1, limits::kMaxDevices).value_or(1));
  c.devices_per_node =
      static_cast<int>(r.optional_integer(j, "", "devices_per_node", 1, limits::kMaxDevices).value_or(c.devices));
  c.intra_node = link_from_json(r, j, "intra_node", dev.intra_node);
  c.inter_node = link_from_json(r, j, "inter_node", dev.inter_node);
  if (j.contains("memory_reserve")) {
    if (!j["memory_reserve"].is_string())
      throw InvalidArgument("cluster JSON: 'memory_reserve' must be a string like \"2GiB+5%\"");
    c.reserve = parse_memory_reserve(j["memory_reserve"].get<std::string>());
  }
  c.validate();
  return c;
}

Cluster load_cluster_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw SystemError("cannot read cluster file '" + path.string() + "'");
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw InvalidArgument("cluster file '" + path.string() + "' is not valid JSON");
  try {
    return cluster_from_json(j, "cluster file '" + path.string() + "'");
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    if (what.rfind("cluster file", 0) == 0) throw;
    throw InvalidArgument("cluster file '" + path.string() + "': " + what);  // a preset name or validate()
  }
}

nlohmann::json cluster_to_json(const Cluster& c) {
  return {{"schema", "apart.cluster/1"},
          {"device", device_to_json(c.device)},
          {"devices", c.devices},
          {"devices_per_node", c.devices_per_node},
          {"memory_reserve", c.reserve.text()},
          {"intra_node", link_to_json(c.intra_node)},
          {"inter_node", link_to_json(c.inter_node)}};
}

}  // namespace apart
