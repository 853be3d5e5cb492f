// Pipeline schedules as per-device op orders: GPipe, 1F1B (PipeDream-Flush) and interleaved 1F1B (Megatron-LM).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "plan/training.h"

namespace apart::sim {

enum class OpKind { kForward, kBackward };

// One compute op of a device: the forward or backward of virtual stage `virtual_stage` on micro-batch `microbatch`.
struct ComputeOp {
  OpKind kind = OpKind::kForward;
  int virtual_stage = 0;
  int64_t microbatch = 0;
  bool operator==(const ComputeOp&) const = default;
};

// The order in which device (pipeline position) `device` of `devices` runs its ops. With `chunks` = v virtual
// stages per device, device d holds virtual stages d, d + P, …, d + (v−1)·P (Megatron's layout).
//   GPipe:       all forwards, then all backwards (v = 1).
//   1F1B:        min(P − d, m) warm-up forwards, then alternate backward/forward, then the remaining backwards.
//   Interleaved: Megatron-LM's order: warm-up (P − d − 1)·2 + (v − 1)·P forwards (capped at m·v), then
//                forward/backward pairs, then backwards; micro-batches go in rounds of P per chunk.
//                Needs m to be a multiple of P (Megatron-LM's constraint); throws Unsupported otherwise.
std::vector<ComputeOp> device_op_order(Schedule schedule, int device, int devices, int chunks, int64_t microbatches);

}  // namespace apart::sim
