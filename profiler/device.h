// Devices (presets and the measured CPU) and the one cluster type with its link rules.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>


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
  // Runs chains of elementwise, normalisation and softmax ops as fused kernels (GPU presets: what Megatron-LM's
  // kernels and torch.compile do); the cpu device runs every op as its own kernel, as `apart run` does. Costs:
  // profiler/fusion.h.
  bool fuses_elementwise = false;

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
// What each preset is (the datasheet's part and board) and the short names that mean it ("h100" → h100-80gb, the SXM5
// part), in device_preset_names' order: for `apart devices` and --device's help.
struct DevicePresetInfo {
  std::string name;
  std::string part;
  std::vector<std::string> aliases;
};
const std::vector<DevicePresetInfo>& device_preset_infos();
// The preset a --device value names: a preset's name or an alias, case ignored. Throws InvalidArgument naming the
// value with the nearest preset ("did you mean"), or saying why ("a100" is ambiguous, a PCIe card is not a preset).
std::string device_preset_name(std::string_view name);
// A preset by name or alias; "cpu" runs (or reads the cache of) the CPU probe. Throws InvalidArgument.
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

// The machines a plan runs on: one device type, how many, how they group into nodes, and the two links between
// them. The one cluster type of the tree: partition plans with it, the simulator replays over it, and every rule
// that asks which link two devices share asks it (DESIGN.md: "the one Cluster with its link rules").
struct Cluster {
  Device device;
  int devices = 1;
  int devices_per_node = 1;
  Link intra_node;
  Link inter_node;
  MemoryReserve reserve = default_memory_reserve();

  int64_t reserved_bytes() const { return reserve.bytes(device.memory_bytes); }
  // What a plan may fill on one device: device.memory_bytes − reserve; validate() keeps it positive.
  int64_t usable_memory_bytes() const { return device.memory_bytes - reserved_bytes(); }

  void validate() const;  // throws InvalidArgument
  int node_of(int device_index) const { return device_index / devices_per_node; }
  bool same_node(int a, int b) const { return node_of(a) == node_of(b); }
  // Every device of the cluster inside one node: no transfer or ring ever leaves it.
  bool fits_one_node() const { return devices <= devices_per_node; }
  const Link& link_between(int a, int b) const { return same_node(a, b) ? intra_node : inter_node; }
  // Between two stages' device groups: replica i of one talks to replica i of the other (indices modulo each
  // group's size), so the transfer stays inside a node only if every such pair does; an empty group: inter-node.
  const Link& link_between_groups(std::span<const int> a, std::span<const int> b) const;
  // The link a ring among `group` (a stage's replicas all-reducing) runs over: inside a node only if all of them are.
  // `stride`: the ring is every stride-th device of `group` (each tensor-parallel group's first).
  const Link& link_among(std::span<const int> group, size_t stride = 1) const;
};

// `--devices N --device NAME --devices-per-node K`; the links are the device's defaults.
Cluster make_cluster(const Device& device, int devices, int devices_per_node);
// The apart.cluster/1 file's reader and writer: plan/cluster_json.h.

// The cluster a plan names by its device: `devices` devices of the preset (the cpu device from its probe cache)
// with its links; for a name no preset has, a device of that name only, with documented default links (A100/DGX:
// 300 GB/s + 3 µs inside a node, 25 GB/s + 10 µs between nodes). Not validated: a plan reader checks what it uses.
struct NamedCluster {
  Cluster cluster;
  std::string links_source;  // where the link figures came from, for reports ("profiler preset a100-80gb", …)
};
NamedCluster cluster_for_device_name(const std::string& device, int devices, int devices_per_node);

}  // namespace apart
