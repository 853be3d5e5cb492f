// The cluster partition's tests plan for, built in code: the profiler's Cluster with round figures.
#pragma once

#include <cstdint>

#include "profiler/device.h"

namespace apart::testing {

// `devices` devices, `devices_per_node` a node, `memory_bytes` usable on each (no reserve), 300 GB/s + 5 µs inside a
// node and 25 GB/s + 10 µs between nodes: the figures partition's tests have always planned with.
inline Cluster test_cluster(int devices, int devices_per_node = 8, int64_t memory_bytes = 80'000'000'000) {
  Cluster c;
  c.device.name = "test";
  c.device.memory_bytes = memory_bytes;
  c.device.peak_fp32_flops = c.device.peak_tf32_flops = c.device.peak_fp16_flops = 1e12;
  c.device.memory_bandwidth = 1e12;
  c.devices = devices;
  c.devices_per_node = devices_per_node;
  c.intra_node = {300e9, 5e-6};
  c.inter_node = {25e9, 10e-6};
  c.reserve = {};
  return c;
}

}  // namespace apart::testing
