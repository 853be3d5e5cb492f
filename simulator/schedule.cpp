// Per-device op orders of the three schedules (see schedule.h for the rules and their sources).
#include "simulator/schedule.h"

#include <algorithm>
#include <string>

#include "graph/error.h"

namespace apart::sim {

namespace {

std::vector<ComputeOp> interleaved_order(int device, int devices, int chunks, int64_t microbatches) {
  const int64_t p = devices;
  const int64_t v = chunks;
  if (microbatches % p != 0)
    throw Unsupported("interleaved 1F1B needs the micro-batch count (" + std::to_string(microbatches) +
                      ") to be a multiple of the pipeline depth (" + std::to_string(p) +
                      "), as in Megatron-LM; use --schedule 1f1b or re-plan with a multiple");
  const int64_t total = microbatches * v;
  // Megatron-LM schedules.py: the k-th forward (backward) of a device runs chunk (k mod P·v) / P
  // (reversed for backward) on micro-batch (k / P·v)·P + k mod P.
  auto forward = [&](int64_t k) {
    const int64_t chunk = (k % (p * v)) / p;
    return ComputeOp{OpKind::kForward, static_cast<int>(chunk * p + device), (k / (p * v)) * p + k % p};
  };
  auto backward = [&](int64_t k) {
    const int64_t chunk = v - 1 - (k % (p * v)) / p;
    return ComputeOp{OpKind::kBackward, static_cast<int>(chunk * p + device), (k / (p * v)) * p + k % p};
  };
  const int64_t warmup = std::min(total, (p - device - 1) * 2 + (v - 1) * p);
  std::vector<ComputeOp> ops;
  ops.reserve(static_cast<size_t>(2 * total));
  for (int64_t k = 0; k < warmup; ++k) ops.push_back(forward(k));
  for (int64_t k = 0; k < total - warmup; ++k) {
    ops.push_back(forward(warmup + k));
    ops.push_back(backward(k));
  }
  for (int64_t k = total - warmup; k < total; ++k) ops.push_back(backward(k));
  return ops;
}

}  // namespace

std::vector<ComputeOp> device_op_order(Schedule schedule, int device, int devices, int chunks, int64_t microbatches) {
  APART_CHECK(device >= 0 && device < devices && chunks >= 1 && microbatches >= 1, "bad schedule arguments");
  std::vector<ComputeOp> ops;
  switch (schedule) {
    case Schedule::kGPipe:
      APART_CHECK(chunks == 1, "GPipe has one chunk per device");
      for (int64_t mb = 0; mb < microbatches; ++mb) ops.push_back({OpKind::kForward, device, mb});
      for (int64_t mb = 0; mb < microbatches; ++mb) ops.push_back({OpKind::kBackward, device, mb});
      break;
    case Schedule::k1F1B: {
      APART_CHECK(chunks == 1, "1F1B has one chunk per device");
      // PipeDream-Flush: the warm-up fills the pipeline below this device, so device d holds
      // at most min(P − d, m) micro-batches' activations.
      const int64_t warmup = std::min<int64_t>(devices - device, microbatches);
      for (int64_t mb = 0; mb < warmup; ++mb) ops.push_back({OpKind::kForward, device, mb});
      for (int64_t mb = 0; mb < microbatches; ++mb) {
        ops.push_back({OpKind::kBackward, device, mb});
        if (warmup + mb < microbatches) ops.push_back({OpKind::kForward, device, warmup + mb});
      }
      break;
    }
    case Schedule::kInterleaved:
      ops = interleaved_order(device, devices, chunks, microbatches);
      break;
  }
  return ops;
}

}  // namespace apart::sim
