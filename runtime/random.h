// Counter-based random numbers: a draw is a pure function of (seed, step, micro-batch, node, element), so a
// recomputed forward, another replica of the same micro-batch or a resumed run draws exactly the same bits. The
// functions are APART_HOST_DEVICE: the CUDA Dropout kernel draws the very bits the CPU kernel draws.
#pragma once

#include <cstdint>

#include "runtime/host_device.h"

namespace apart {

// Which draw a kernel makes: the run's seed, the training step, the micro-batch within it.
struct RandomKey {
  uint64_t seed = 0;
  uint64_t step = 0;
  uint64_t microbatch = 0;
};

// SplitMix64's finaliser (Steele, Lea, Flood, OOPSLA 2014): a bijection with full avalanche.
APART_HOST_DEVICE constexpr uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A node's identity in random_stream: a hash of its ONNX name (FNV-1a), so the node draws the same bits in the
// whole model, in a stage file cut from it, and in the training graph built around it.
APART_HOST_DEVICE constexpr uint64_t node_random_id(const char* name, uint64_t length) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (uint64_t i = 0; i < length; ++i) h = (h ^ static_cast<unsigned char>(name[i])) * 0x100000001B3ull;
  return h;
}

// The stream of one node under one key: element i of it is random_bits(stream, i).
APART_HOST_DEVICE constexpr uint64_t random_stream(const RandomKey& key, uint64_t node) {
  return mix64(mix64(mix64(mix64(key.seed) ^ key.step) ^ key.microbatch) ^ node);
}
APART_HOST_DEVICE constexpr uint64_t random_bits(uint64_t stream, uint64_t element) {
  return mix64(stream ^ mix64(element));
}
// Uniform in [0, 1) from the top 53 bits.
APART_HOST_DEVICE constexpr double random_uniform(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

}  // namespace apart
