// Memory rules (docs/cost-model.md §4): state bytes per parameter, activation precision, in-flight micro-batches,
// and the memory of one device running one pipeline stage. Partition and the simulator call these.
#pragma once

#include <cstdint>
#include <string_view>

#include "graph/error.h"
#include "plan/training.h"

namespace apart {

// Micro-batches whose activations stage `stage` (0-based) of `stages` holds at its peak, counted in chunks: under
// interleaving (`chunks` = v virtual stages per device, each 1/v of the stage) a chunk's micro-batch; else whole ones.
//   GPipe m; 1F1B min(S − s, m) (the first stage holds S);
//   interleaved: min((S − s − 1)·2 + (v − 1)·S + 1, m·v), Megatron-LM's warm-up forwards and the first steady-state
//   forward before the first backward (Narayanan et al., SC'21 §2.2; schedule.h device_op_order);
//   ZB-H1: min(S, m) on every stage, counted from a forward to its weight-gradient pass W: device s defers s of its
//   W passes, so it holds the first stage's 1F1B count (Qi et al.'s memory limit p · M_B, the same peak as 1F1B).
// GPipe and 1F1B take chunks = 1. The one home of these counts: the DP, the memory model, the simulator and the
// report read them through here.
int64_t stage_in_flight_microbatches(Schedule schedule, int stage, int stages, int64_t microbatches, int chunks = 1);
// The same in multiples of one micro-batch's activations of the whole stage: stage_in_flight_microbatches / chunks
// (interleaved: each chunk micro-batch holds 1/v of them). What a stage's memory multiplies its per-micro-batch
// activation bytes by.
double stage_in_flight_activations(Schedule schedule, int stage, int stages, int64_t microbatches, int chunks = 1);

// Persistent bytes per parameter: weights + gradients + optimizer state.
//   fp32/tf32: 4 + 4 + {SGD 0, momentum 4, Adam 8}        → 8, 12, 16
//   mixed:     2 + 2 + 4 (fp32 master) + {0, 4, 8}          → 8, 12, 16
// The copy forward and backward read: 4; mixed: 2.
inline double working_weight_bytes_per_param(Precision precision) { return precision == Precision::kMixed ? 2 : 4; }
// The fp32 master beside it: 0; mixed: 4.
inline double master_weight_bytes_per_param(Precision precision) { return precision == Precision::kMixed ? 4 : 0; }
// 4; mixed: 2 + 4 (fp16 copy + fp32 master).
inline double weight_bytes_per_param(Precision precision) {
  return working_weight_bytes_per_param(precision) + master_weight_bytes_per_param(precision);
}
// 4; mixed: 2.
inline double gradient_bytes_per_param(Precision precision) { return precision == Precision::kMixed ? 2 : 4; }
// fp32 state: 0, 4 (velocity), 8 (moments).
inline double optimizer_state_bytes_per_param(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::kSgd: return 0;
    case Optimizer::kMomentum: return 4;  // fp32 velocity
    case Optimizer::kAdam:
    case Optimizer::kAdamW: return 8;     // fp32 first and second moments
  }
  return 8;
}
double bytes_per_param(Optimizer optimizer, Precision precision);  // the three together

// ZeRO (Rajbhandari et al., SC20, §5): a stage's `replicas` data-parallel replicas each keep 1/N_d of
//   stage 1 (P_os):     the optimizer state and, under mixed precision, the fp32 master weights;
//   stage 2 (P_os+g):   also the gradients;
//   stage 3 (P_os+g+p): also the working copy of the weights.
// Mixed Adam (K = 12): 2 + 2 + 12 → 2 + 2 + 12/N_d, 2 + 14/N_d, 16/N_d bytes per parameter. Stage 0 is plain data
// parallelism (stages 0..kMaxZeroStage, plan/training.h). A stage with one replica has nothing to shard across:
// effective_zero is 0 there.
inline int effective_zero(int zero, int replicas) {
  APART_CHECK(zero >= 0 && zero <= kMaxZeroStage && replicas >= 1, "bad ZeRO stage or replica count");
  return replicas > 1 ? zero : 0;
}
// Bytes per parameter on one device, split as StageMemory splits them (weights include the master copy).
struct ParamStateBytes {
  double weights = 0;
  double gradients = 0;
  double optimizer_state = 0;
  double total() const { return weights + gradients + optimizer_state; }
};
inline ParamStateBytes param_state_bytes(Optimizer optimizer, Precision precision, int zero = 0, int replicas = 1) {
  const int z = effective_zero(zero, replicas);
  const double n = replicas;
  auto sharded_from = [&](int stage, double bytes) { return z >= stage ? bytes / n : bytes; };
  ParamStateBytes b;
  b.weights = sharded_from(3, working_weight_bytes_per_param(precision)) +
              sharded_from(1, master_weight_bytes_per_param(precision));
  b.gradients = sharded_from(2, gradient_bytes_per_param(precision));
  b.optimizer_state = sharded_from(1, optimizer_state_bytes_per_param(optimizer));
  return b;
}

// The stage rules below take a stage's parameters as bytes the way the model stores them (the cost table's
// param_bytes, plan.json's stages[].param_bytes) and count elements as kParamStorageBytes each (plan/training.h).
// Weights + gradients + optimizer state per stored parameter byte: bytes_per_param / kParamStorageBytes
// (fp32 and mixed alike: 2, 3, 4 for sgd, momentum, adam).
// Under ZeRO `zero` over `replicas` replicas: param_state_bytes(...).total() / kParamStorageBytes.
inline double state_bytes_per_param_byte(Optimizer optimizer, Precision precision, int zero = 0, int replicas = 1) {
  return param_state_bytes(optimizer, precision, zero, replicas).total() / kParamStorageBytes;
}
// Gradient bytes all-reduced per stored parameter byte: gradient_bytes_per_param / kParamStorageBytes (mixed: 0.5).
inline double gradient_bytes_per_param_byte(Precision precision) {
  return gradient_bytes_per_param(precision) / kParamStorageBytes;
}
// Working-weight bytes (what ZeRO all-gathers) per stored parameter byte: working_weight_bytes_per_param /
// kParamStorageBytes (mixed: 0.5).
inline double working_weight_bytes_per_param_byte(Precision precision) {
  return working_weight_bytes_per_param(precision) / kParamStorageBytes;
}
// ZeRO-3 gathers each task's full working weights just before it runs (forward, and again for backward) and frees
// them after: the largest task's gathered weights, `largest_task_param_bytes` as stored, are workspace on top of the
// 1/N_d shard (one task's set in flight at a time; prefetching the next would double it). 0 below stage 3.
inline double zero_gathered_bytes(double largest_task_param_bytes, Precision precision, int zero, int replicas) {
  if (effective_zero(zero, replicas) < 3) return 0;
  return largest_task_param_bytes * working_weight_bytes_per_param_byte(precision);
}
// Bytes the optimizer step moves through memory per stored parameter byte: it reads the fp32 master weights,
// the gradients and the state, writes the weights (and their 16-bit copy under mixed), the state, and zeroes the
// gradients for the next iteration: (4 + weight + 2 · gradient + 2 · state bytes per param) / kParamStorageBytes.
// fp32: 4, 6, 8 for sgd, momentum, adam (Adam: 32 bytes per 4-byte param).
inline double optimizer_traffic_bytes_per_param_byte(Optimizer optimizer, Precision precision) {
  return (kParamStorageBytes + weight_bytes_per_param(precision) + 2 * gradient_bytes_per_param(precision) +
          2 * optimizer_state_bytes_per_param(optimizer)) /
         kParamStorageBytes;
}
// The optimizer step of `param_bytes` stored parameter bytes on a device whose memory streams `memory_bandwidth`
// bytes/s: a memory-bound update, traffic / bandwidth (docs/cost-model.md, "Optimizer step"); 0 without a bandwidth.
// Under ZeRO stage ≥ 1 each of the `replicas` replicas updates only its 1/N_d shard: the time over N_d.
inline double optimizer_step_time(int64_t param_bytes, Optimizer optimizer, Precision precision,
                                  double memory_bandwidth, int zero = 0, int replicas = 1) {
  if (param_bytes <= 0 || !(memory_bandwidth > 0)) return 0;
  const double shards = effective_zero(zero, replicas) >= 1 ? replicas : 1;
  return static_cast<double>(param_bytes) * optimizer_traffic_bytes_per_param_byte(optimizer, precision) /
         memory_bandwidth / shards;
}
// Activation bytes per fp32 byte the graph stores: mixed precision keeps activations (and moves whole-kernel
// traffic) in fp16/bf16, half; fp32 and tf32 keep fp32.
inline double activation_bytes_factor(Precision precision) { return precision == Precision::kMixed ? 0.5 : 1.0; }

struct StageMemoryInput {
  int64_t param_bytes = 0;                       // the stage's distinct params as stored in the model
  int param_dtype_bytes = 4;                     // bytes per stored param element (fp32 models: 4)
  int64_t saved_bytes_per_microbatch = 0;        // Σ TaskCost::saved_bytes of the stage's tasks
  int64_t stage_input_bytes_per_microbatch = 0;  // activations the stage receives per micro-batch
  int64_t max_workspace_bytes = 0;               // max TaskCost::workspace_bytes in the stage
  int64_t in_flight = 1;                         // stage_in_flight_microbatches(...)
  Optimizer optimizer = Optimizer::kAdam;
  Precision precision = Precision::kFp32;
  bool recompute = false;
  int zero = 0;                                  // ZeRO stage 0..3 across the stage's replicas
  int replicas = 1;                              // N_d
  int64_t largest_task_param_bytes = 0;          // ZeRO-3's gathered working set (zero_gathered_bytes)
};

struct StageMemory {
  int64_t weights = 0;          // working copy (+ fp32 master under mixed precision)
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  int64_t activations = 0;      // saved for backward, over the in-flight micro-batches
  int64_t workspace = 0;        // the largest task's working set (+ its gathered weights under ZeRO-3)
  int64_t total = 0;
};

StageMemory stage_memory(const StageMemoryInput& in);
int64_t stage_memory_bytes(const StageMemoryInput& in);  // stage_memory(in).total

}  // namespace apart
