// Devices (presets and the measured CPU) and clusters: links, point-to-point and all-reduce times.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "plan/training.h"

namespace apart {

// One direction of a link between two devices.
struct Link {
  double bandwidth = 0;  // bytes/s
  double latency_s = 0;
};

struct Device {
  std::string name;
  int64_t memory_bytes = 0;
  double peak_fp32_flops = 0;  // FP32 without tensor cores (vector units)
  double peak_tf32_flops = 0;  // TF32 tensor cores, dense; = fp32 where there are none
  double peak_fp16_flops = 0;  // FP16/BF16 tensor cores, dense (no sparsity)
  double memory_bandwidth = 0; // bytes/s
  double kernel_overhead_s = 0;  // launch + tail per kernel
  Link intra_node;  // default link between two devices of one node (NVLink, shared memory)
  Link inter_node;  // default link between nodes (InfiniBand per device, Ethernet)
  bool measured = false;  // figures from the CPU probe, not a datasheet

  // Peak used for matrix products at this precision.
  double matmul_peak(Precision p) const;
};

// --precision's default on a device: mixed (bf16 math, fp32 master weights, how every GPU model of a
// billion parameters trains) on GPUs, fp32 on the cpu device (its kernels are fp32).
Precision default_precision(const Device& device);
// "auto" → default_precision(device); anything else → parse_precision.
Precision resolve_precision(std::string_view flag, const Device& device);
inline constexpr const char* kPrecisionHelp =
    "auto, fp32, tf32 or mixed (bf16/fp16 math, fp32 master weights); auto: mixed on GPU devices, fp32 on cpu";

std::vector<std::string> device_preset_names();  // v100-32gb … h200-141gb, cpu
// A preset by name; "cpu" runs (or reads the cache of) the CPU probe. Throws InvalidArgument.
Device device_preset(std::string_view name);

// The CPU probe: a small sgemm loop and a streaming copy on every hardware thread (< 1 s).
struct CpuProbe {
  double fp32_flops = 0;  // all threads together
  double bandwidth = 0;   // bytes/s, read + write
  int threads = 0;
  double seconds = 0;     // how long the probe took
};
CpuProbe run_cpu_probe();
// $APART_CACHE_DIR/cpu.json, else $XDG_CACHE_HOME/apart/cpu.json, else ~/.cache/apart/cpu.json.
std::filesystem::path cpu_cache_path();
// The cpu device: from the cache when present and valid, else probed now and cached (best effort).
Device cpu_device(bool refresh = false);

// Memory a plan leaves free on every device: a fixed part for what the framework holds outside the
// tensors the cost model counts (CUDA context and kernel images, NCCL buffers, cuBLAS/cuDNN workspaces)
// plus a fraction of the device for the caching allocator's fragmentation. --memory-reserve; sources and
// the default's reasoning in device.cpp and docs/cost-model.md.
struct MemoryReserve {
  int64_t fixed_bytes = 0;
  double fraction = 0;  // of the device's memory, in [0, 1)

  int64_t bytes(int64_t device_memory_bytes) const;  // fixed + fraction × device
  std::string text() const;                         // "2GiB+5%", "0"
};
MemoryReserve default_memory_reserve();  // 2 GiB + 5 %
// "0", "4GiB", "512MiB", "3GB" (decimal), "10%", "2GiB+5%"; a bare number is bytes. Throws InvalidArgument
// naming --memory-reserve and the accepted forms (fraction below 100 %, fixed part at most 2^50 bytes).
MemoryReserve parse_memory_reserve(std::string_view text);

struct Cluster {
  Device device;
  int devices = 1;
  int devices_per_node = 1;
  Link intra_node;
  Link inter_node;
  MemoryReserve reserve = default_memory_reserve();

  // What a plan may fill on one device: device.memory_bytes − reserve; validate() keeps it positive.
  int64_t usable_memory_bytes() const { return device.memory_bytes - reserve.bytes(device.memory_bytes); }

  void validate() const;  // throws InvalidArgument
  int node_of(int device_index) const { return device_index / devices_per_node; }
  const Link& link_between(int a, int b) const;
};

// `--devices N --device NAME --devices-per-node K`; the links are the device's defaults.
Cluster make_cluster(const Device& device, int devices, int devices_per_node);
// The apart.cluster/1 JSON file (docs/cost-model.md §5). Throws InvalidArgument naming `source` and the field with
// its range (devices and devices_per_node integers in [1, 2^20], rates in (0, 1e18], times in [0, 3.2e7] s,
// memory in (0, 2^60] bytes), or SystemError.
Cluster load_cluster_json(const std::filesystem::path& path);
Cluster cluster_from_json(const nlohmann::json& j, const std::string& source = "cluster JSON");
nlohmann::json cluster_to_json(const Cluster& c);
nlohmann::json device_to_json(const Device& d);

// latency + bytes / bandwidth over the link a and b share; 0 when a == b.
double p2p_time(const Cluster& c, int a, int b, double bytes);
// Ring all-reduce among `ranks` over one link: 2(r−1)/r · bytes / bw + 2(r−1) · latency.
double ring_allreduce_time(int ranks, double bytes, const Link& link);
// Ring all-reduce among the given devices, over the slowest link the ring crosses.
double allreduce_time(const Cluster& c, std::span<const int> devices, double bytes);
// Same for the contiguous devices first .. first+count−1.
double allreduce_time(const Cluster& c, int first, int count, double bytes);

}  // namespace apart
