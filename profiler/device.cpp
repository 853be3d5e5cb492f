// Device presets with their datasheet sources and the cluster description with its link rules.
#include "profiler/device.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "graph/atomic_file.h"
#include "graph/checked.h"
#include "graph/error.h"
#include "graph/text.h"
#include "profiler/cpu_probe.h"

namespace apart {
namespace {

constexpr double kT = 1e12;  // TFLOP/s
constexpr double kG = 1e9;   // GB/s
constexpr int64_t kMiB = 1024 * 1024;

// GPU figures are dense (no sparsity) peaks from NVIDIA's datasheets; memory is the capacity nvidia-smi
// reports (memory.total, in MiB: the "80GB" of an A100-80GB is 80 GiB = 81920 MiB); link bandwidths are
// per direction per device. What a plan may fill is that minus the memory reserve (MemoryReserve).
std::vector<Device> gpu_presets() {
  std::vector<Device> d;
  // NVIDIA Tesla V100 datasheet (SXM2 32 GB): FP32 15.7 TFLOPS, Tensor (FP16) 125 TFLOPS, no TF32
  // or BF16, HBM2 900 GB/s; NVLink 2: 300 GB/s total = 150 GB/s per direction. DGX-1: 4× EDR
  // InfiniBand (100 Gb/s) per 8 GPUs = 6.25 GB/s per GPU.
  d.push_back({"v100-32gb", 32510 * kMiB, 15.7 * kT, 15.7 * kT, 125 * kT, 900 * kG, 5e-6,
               {150 * kG, 3e-6}, {6.25 * kG, 10e-6}, false, true});
  // NVIDIA A100 Tensor Core GPU datasheet (SXM4 40 GB): FP32 19.5, TF32 156, FP16/BF16 312 TFLOPS
  // (dense), HBM2 1,555 GB/s; NVLink 3: 600 GB/s total = 300 per direction. DGX A100: one HDR
  // InfiniBand (200 Gb/s = 25 GB/s) per GPU.
  d.push_back({"a100-40gb", 40536 * kMiB, 19.5 * kT, 156 * kT, 312 * kT, 1555 * kG, 5e-6,
               {300 * kG, 3e-6}, {25 * kG, 10e-6}, false, true});
  // Same datasheet, SXM4 80 GB: HBM2e 2,039 GB/s.
  d.push_back({"a100-80gb", 81920 * kMiB, 19.5 * kT, 156 * kT, 312 * kT, 2039 * kG, 5e-6,
               {300 * kG, 3e-6}, {25 * kG, 10e-6}, false, true});
  // NVIDIA H100 Tensor Core GPU datasheet (SXM5 80 GB): FP32 67 TFLOPS, TF32 989 and FP16/BF16
  // 1,979 TFLOPS with sparsity (half dense: 494.5 and 989.5), HBM3 3.35 TB/s; NVLink 4: 900 GB/s
  // total = 450 per direction. DGX H100: one NDR InfiniBand (400 Gb/s = 50 GB/s) per GPU.
  d.push_back({"h100-80gb", 81559 * kMiB, 67 * kT, 494.5 * kT, 989.5 * kT, 3350 * kG, 5e-6,
               {450 * kG, 3e-6}, {50 * kG, 10e-6}, false, true});
  // NVIDIA H200 Tensor Core GPU datasheet (SXM 141 GB): same compute as H100 SXM, HBM3e 4.8 TB/s,
  // NVLink 900 GB/s; DGX H200 networking as DGX H100.
  d.push_back({"h200-141gb", 143771 * kMiB, 67 * kT, 494.5 * kT, 989.5 * kT, 4800 * kG, 5e-6,
               {450 * kG, 3e-6}, {50 * kG, 10e-6}, false, true});
  return d;
}

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

Device cpu_from_probe(const CpuProbe& p) {
  Device d;
  d.name = "cpu";
  d.memory_bytes = physical_memory_bytes();
  d.peak_fp32_flops = d.peak_tf32_flops = d.peak_fp16_flops = p.fp32_flops;  // fp32 everywhere
  d.memory_bandwidth = p.bandwidth;
  d.kernel_overhead_s = 2e-6;
  // Ranks of one node exchange through shared memory (a copy: half the copy bandwidth); nodes over
  // 10 Gb Ethernet with MPI's typical TCP latency. Override with --cluster for a real network.
  d.intra_node = {p.bandwidth / 2, 1e-6};
  d.inter_node = {1.25 * kG, 50e-6};
  d.measured = true;
  return d;
}

bool finite_positive(double x) { return std::isfinite(x) && x > 0; }

}  // namespace

double Device::matmul_peak(Precision p) const {
  switch (p) {
    case Precision::kFp32: return peak_fp32_flops;
    case Precision::kTf32: return peak_tf32_flops;
    case Precision::kMixed: return peak_fp16_flops;
  }
  return peak_fp32_flops;
}

Precision default_precision(const Device& device) {
  return device.measured || device.name == "cpu" ? Precision::kFp32 : Precision::kMixed;
}

Precision resolve_precision(std::string_view flag, const Device& device) {
  return flag == "auto" ? default_precision(device) : parse_precision(flag);
}

std::vector<std::string> device_preset_names() {
  std::vector<std::string> names;
  for (const auto& d : gpu_presets()) names.push_back(d.name);
  names.push_back("cpu");
  return names;
}

const std::vector<DevicePresetInfo>& device_preset_infos() {
  // The presets are the SXM parts of each datasheet (the DGX/HGX boards): what a short name means. A PCIe or NVL
  // card has other clocks, memory and links; describe it in a --cluster JSON file.
  static const std::vector<DevicePresetInfo> infos = {
      {"v100-32gb", "NVIDIA V100 SXM2 32 GB, DGX-1 links", {"v100", "v100-sxm2"}},
      {"a100-40gb", "NVIDIA A100 SXM4 40 GB, DGX A100 links", {"a100-sxm4-40gb"}},
      {"a100-80gb", "NVIDIA A100 SXM4 80 GB, DGX A100 links", {"a100-sxm4-80gb"}},
      {"h100-80gb", "NVIDIA H100 SXM5 80 GB, DGX H100 links", {"h100", "h100-sxm", "h100-sxm5"}},
      {"h200-141gb", "NVIDIA H200 SXM 141 GB, DGX H200 links", {"h200", "h200-sxm"}},
      {"cpu", "this machine's CPU, measured by a probe (cached; --refresh on apart costs)", {}},
  };
  return infos;
}

std::string device_preset_name(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::vector<std::string> names;
  for (const DevicePresetInfo& info : device_preset_infos()) {
    if (lower == info.name) return info.name;
    for (const std::string& alias : info.aliases)
      if (lower == alias) return info.name;
    names.push_back(info.name);
  }
  std::string known;
  for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
  if (lower == "a100")
    throw InvalidArgument("device 'a100' is ambiguous: a100-40gb or a100-80gb (`apart devices` lists the presets)");
  if (lower.find("pcie") != std::string::npos || lower.find("nvl") != std::string::npos)
    throw InvalidArgument("unknown device " + quote(name) + ": the presets are SXM parts (" + known +
                          "); describe a PCIe or NVL card in a --cluster JSON file");
  std::vector<std::string> spellings;  // names and aliases, each with the preset it means
  std::vector<std::string> means;
  for (const DevicePresetInfo& info : device_preset_infos())
    for (size_t k = 0; k <= info.aliases.size(); ++k) {
      spellings.push_back(k == 0 ? info.name : info.aliases[k - 1]);
      means.push_back(info.name);
    }
  std::string hint;
  if (const auto near = closest_match(lower, spellings)) {
    const size_t at = static_cast<size_t>(std::find(spellings.begin(), spellings.end(), *near) - spellings.begin());
    hint = "did you mean '" + means[at] + "'? ";
  }
  throw InvalidArgument("unknown device " + quote(name) + "; " + hint + "known devices: " + known +
                        " (`apart devices` lists their figures; or describe one in a --cluster JSON file)");
}

Device device_preset(std::string_view name) {
  const std::string preset = device_preset_name(name);
  if (preset == "cpu") return cpu_device();
  for (auto& d : gpu_presets())
    if (d.name == preset) return d;
  throw InvalidArgument("unknown device " + quote(name));  // unreachable: every info names a preset
}

CpuProbe run_cpu_probe() { return detail::measure_cpu(); }

std::filesystem::path cpu_cache_path() {
  if (const char* dir = std::getenv("APART_CACHE_DIR"); dir && *dir) return std::filesystem::path(dir) / "cpu.json";
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::filesystem::path(xdg) / "apart" / "cpu.json";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::filesystem::path(home) / ".cache" / "apart" / "cpu.json";
  return std::filesystem::temp_directory_path() / "apart" / "cpu.json";
}

Device cpu_device(bool refresh) {
  const auto path = cpu_cache_path();
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (!refresh) {
    std::ifstream in(path);
    if (in) {
      const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.value("schema", "") == "apart.cpu_probe/1" && j.value("threads", 0) == threads) {
        CpuProbe p;
        p.fp32_flops = j.value("fp32_flops", 0.0);
        p.bandwidth = j.value("bandwidth_bytes_per_s", 0.0);
        p.threads = threads;
        if (finite_positive(p.fp32_flops) && finite_positive(p.bandwidth)) return cpu_from_probe(p);
      }
    }
  }
  const CpuProbe p = run_cpu_probe();
  // Cache it; a read-only home only costs a re-probe next time.
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  const nlohmann::json cache = {{"schema", "apart.cpu_probe/1"}, {"fp32_flops", p.fp32_flops},
                                {"bandwidth_bytes_per_s", p.bandwidth}, {"threads", p.threads},
                                {"probe_seconds", p.seconds}};
  try {
    write_file_atomically(path, cache.dump(2) + "\n");
  } catch (const SystemError&) {
  }
  return cpu_from_probe(p);
}

// The default reserve, 2 GiB + 5 %:
// - fixed 2 GiB: a CUDA 12 context with PyTorch's kernels loaded takes 0.3-1 GiB per GPU (PyTorch's
//   "CUDA semantics" notes; lazy module loading keeps it near the low end), NCCL allocates
//   NCCL_BUFFSIZE = 4 MiB per channel and peer for send and receive (NCCL environment docs; with 16-32
//   channels that is a few hundred MiB per communicator), and cuBLAS keeps a workspace per stream
//   (CUBLAS_WORKSPACE_CONFIG, up to tens of MiB); 2 GiB covers them with room for a second communicator.
// - 5 %: the caching allocator's fragmentation (memory reserved but not allocated); PyTorch's memory
//   snapshots of transformer training typically show 3-10 %, and Megatron/DeepSpeed users tune to
//   about 90-95 % of the device. --memory-reserve 0 plans to the last byte, as before.
MemoryReserve default_memory_reserve() { return {2 * 1024 * kMiB, 0.05}; }

int64_t MemoryReserve::bytes(int64_t device_memory_bytes) const {
  return fixed_bytes + static_cast<int64_t>(std::llround(fraction * static_cast<double>(device_memory_bytes)));
}

std::string MemoryReserve::text() const {
  std::string out;
  if (fixed_bytes > 0) {
    constexpr int64_t kGiB = 1024 * kMiB;
    out = fixed_bytes % kGiB == 0   ? std::to_string(fixed_bytes / kGiB) + "GiB"
          : fixed_bytes % kMiB == 0 ? std::to_string(fixed_bytes / kMiB) + "MiB"
                                    : std::to_string(fixed_bytes) + "B";
  }
  if (fraction > 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g%%", fraction * 100);
    out += (out.empty() ? "" : "+") + std::string(buf);
  }
  return out.empty() ? "0" : out;
}

MemoryReserve parse_memory_reserve(std::string_view text) {
  const std::string all(text);
  auto fail = [&](const std::string& why) -> MemoryReserve {
    throw InvalidArgument("--memory-reserve " + all + ": " + why +
                          "; expected a size (0, 512MiB, 4GiB, 3GB), a percentage of the device (10%) or both (2GiB+5%)");
  };
  MemoryReserve r;
  bool have_fixed = false, have_fraction = false;
  size_t start = 0;
  while (start <= all.size()) {
    const size_t plus = all.find('+', start);
    const std::string part = all.substr(start, plus == std::string::npos ? std::string::npos : plus - start);
    if (part.empty()) return fail("empty term");
    size_t used = 0;
    double value = 0;
    try {
      value = std::stod(part, &used);
    } catch (const std::exception&) {
      return fail("'" + part + "' does not start with a number");
    }
    if (!std::isfinite(value) || value < 0) return fail("'" + part + "' must be a finite non-negative number");
    const std::string unit = part.substr(used);
    if (unit == "%") {
      if (have_fraction) return fail("two percentages");
      if (value >= 100) return fail("the percentage must be below 100");
      r.fraction = value / 100;
      have_fraction = true;
    } else {
      static const std::pair<const char*, double> units[] = {
          {"", 1}, {"B", 1}, {"KiB", 1024.0}, {"MiB", 1024.0 * 1024}, {"GiB", 1024.0 * 1024 * 1024},
          {"TiB", 1024.0 * 1024 * 1024 * 1024}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}};
      const auto* u = std::find_if(std::begin(units), std::end(units), [&](const auto& p) { return unit == p.first; });
      if (u == std::end(units)) return fail("unknown unit '" + unit + "'");
      if (have_fixed) return fail("two sizes");
      const double bytes = value * u->second;
      if (bytes > static_cast<double>(int64_t{1} << 50)) return fail("more than 1 PiB");
      r.fixed_bytes = static_cast<int64_t>(std::llround(bytes));
      have_fixed = true;
    }
    if (plus == std::string::npos) break;
    start = plus + 1;
    if (start == all.size()) return fail("empty term");
  }
  return r;
}

void Cluster::validate() const {
  checked_integer(devices, 1, limits::kMaxDevices, "--devices");
  checked_integer(devices_per_node, 1, limits::kMaxDevices, "--devices-per-node");
  for (const auto* l : {&intra_node, &inter_node})
    if (!finite_positive(l->bandwidth) || l->bandwidth > limits::kMaxRate || !std::isfinite(l->latency_s) ||
        l->latency_s < 0 || l->latency_s > limits::kMaxSeconds)
      throw InvalidArgument("cluster links need a bandwidth in (0, 1e18] bytes/s and a latency in [0, 3.2e7] s");
  if (!finite_positive(device.peak_fp32_flops) || !finite_positive(device.memory_bandwidth) || device.memory_bytes <= 0 ||
      device.memory_bytes > limits::kMaxByteCount ||
      !std::isfinite(device.kernel_overhead_s) || device.kernel_overhead_s < 0)
    throw InvalidArgument("device '" + device.name +
                          "' needs positive memory (at most 2^60 bytes), peak FLOP/s and bandwidth, and a non-negative kernel overhead");
  if (usable_memory_bytes() <= 0)
    throw InvalidArgument("--memory-reserve " + reserve.text() + " (" + std::to_string(reserved_bytes()) +
                          " bytes) leaves no memory on device '" + device.name + "' (" +
                          std::to_string(device.memory_bytes) + " bytes); give a smaller reserve");
}

const Link& Cluster::link_between_groups(std::span<const int> a, std::span<const int> b) const {
  if (a.empty() || b.empty()) return inter_node;
  const size_t pairs = std::max(a.size(), b.size());
  for (size_t i = 0; i < pairs; ++i)
    if (!same_node(a[i % a.size()], b[i % b.size()])) return inter_node;
  return intra_node;
}

const Link& Cluster::link_among(std::span<const int> group, size_t stride) const {
  if (group.empty()) return inter_node;
  for (size_t i = 0; i < group.size(); i += stride)
    if (!same_node(group[0], group[i])) return inter_node;
  return intra_node;
}

Cluster make_cluster(const Device& device, int devices, int devices_per_node) {
  Cluster c{device, devices, std::min(devices_per_node, std::max(devices, 1)), device.intra_node, device.inter_node};
  if (devices_per_node < 1) c.devices_per_node = devices_per_node;  // let validate() name it
  c.validate();
  return c;
}

NamedCluster cluster_for_device_name(const std::string& device, int devices, int devices_per_node) {
  NamedCluster named;
  Cluster& c = named.cluster;
  c.devices = devices;
  c.devices_per_node = devices_per_node;
  const auto names = device_preset_names();
  if (device == "cpu") {
    c.device = cpu_device();
    named.links_source = "profiler cpu device (probe cache)";
  } else if (std::find(names.begin(), names.end(), device) != names.end()) {
    c.device = device_preset(device);
    named.links_source = "profiler preset " + device;
  } else {
    c.device.name = device;
    c.device.intra_node = {300e9, 3e-6};
    c.device.inter_node = {25e9, 10e-6};
    named.links_source =
        "defaults for unknown device '" + device + "' (300 GB/s + 3 us in a node, 25 GB/s + 10 us between)";
  }
  c.intra_node = c.device.intra_node;
  c.inter_node = c.device.inter_node;
  return named;
}

}  // namespace apart
