// The memory rules of docs/cost-model.md §4: state per parameter, in-flight micro-batches, a stage's peak.
#include "profiler/memory_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "graph/error.h"

namespace apart {

int64_t stage_in_flight_microbatches(Schedule schedule, int stage, int stages, int64_t microbatches, int chunks) {
  APART_CHECK(stages >= 1 && stage >= 0 && stage < stages && microbatches >= 1 && chunks >= 1,
              "bad stage/microbatch numbers");
  APART_CHECK(chunks == 1 || schedule == Schedule::kInterleaved, "only the interleaved schedule runs chunks");
  switch (schedule) {
    case Schedule::kGPipe: return microbatches;
    case Schedule::k1F1B: break;
    case Schedule::kZbH1: return std::min<int64_t>(stages, microbatches);
    case Schedule::kInterleaved: {
      const int64_t warmup = static_cast<int64_t>(stages - stage - 1) * 2 + static_cast<int64_t>(chunks - 1) * stages;
      return std::min<int64_t>(warmup + 1, microbatches * chunks);
    }
  }
  return std::min<int64_t>(stages - stage, microbatches);
}

double stage_in_flight_activations(Schedule schedule, int stage, int stages, int64_t microbatches, int chunks) {
  return static_cast<double>(stage_in_flight_microbatches(schedule, stage, stages, microbatches, chunks)) /
         static_cast<double>(chunks);
}

double working_weight_bytes_per_param(Precision precision) { return precision == Precision::kMixed ? 2 : 4; }
double master_weight_bytes_per_param(Precision precision) { return precision == Precision::kMixed ? 4 : 0; }
double weight_bytes_per_param(Precision precision) {
  return working_weight_bytes_per_param(precision) + master_weight_bytes_per_param(precision);
}
double gradient_bytes_per_param(Precision precision) { return precision == Precision::kMixed ? 2 : 4; }

double optimizer_state_bytes_per_param(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::kSgd: return 0;
    case Optimizer::kMomentum: return 4;  // fp32 velocity
    case Optimizer::kAdam:
    case Optimizer::kAdamW: return 8;     // fp32 first and second moments
  }
  return 8;
}

double bytes_per_param(Optimizer optimizer, Precision precision) {
  return param_state_bytes(optimizer, precision).total();
}

int effective_zero(int zero, int replicas) {
  APART_CHECK(zero >= 0 && zero <= kMaxZeroStage && replicas >= 1, "bad ZeRO stage or replica count");
  return replicas > 1 ? zero : 0;
}

ParamStateBytes param_state_bytes(Optimizer optimizer, Precision precision, int zero, int replicas) {
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

double zero_gathered_bytes(double largest_task_param_bytes, Precision precision, int zero, int replicas) {
  if (effective_zero(zero, replicas) < 3) return 0;
  return largest_task_param_bytes * working_weight_bytes_per_param_byte(precision);
}

double state_bytes_per_param_byte(Optimizer optimizer, Precision precision, int zero, int replicas) {
  return param_state_bytes(optimizer, precision, zero, replicas).total() / kParamStorageBytes;
}

double gradient_bytes_per_param_byte(Precision precision) {
  return gradient_bytes_per_param(precision) / kParamStorageBytes;
}

double working_weight_bytes_per_param_byte(Precision precision) {
  return working_weight_bytes_per_param(precision) / kParamStorageBytes;
}

double optimizer_traffic_bytes_per_param_byte(Optimizer optimizer, Precision precision) {
  return (kParamStorageBytes + weight_bytes_per_param(precision) + 2 * gradient_bytes_per_param(precision) +
          2 * optimizer_state_bytes_per_param(optimizer)) /
         kParamStorageBytes;
}

double optimizer_step_time(int64_t param_bytes, Optimizer optimizer, Precision precision, double memory_bandwidth,
                           int zero, int replicas) {
  if (param_bytes <= 0 || !(memory_bandwidth > 0)) return 0;
  const double shards = effective_zero(zero, replicas) >= 1 ? replicas : 1;
  return static_cast<double>(param_bytes) * optimizer_traffic_bytes_per_param_byte(optimizer, precision) /
         memory_bandwidth / shards;
}

double activation_bytes_factor(Precision precision) { return precision == Precision::kMixed ? 0.5 : 1.0; }

StageMemory stage_memory(const StageMemoryInput& in) {
  APART_CHECK(in.param_dtype_bytes > 0 && in.in_flight >= 0, "bad StageMemoryInput");
  const double params = static_cast<double>(in.param_bytes) / in.param_dtype_bytes;
  StageMemory m;
  const ParamStateBytes per_param = param_state_bytes(in.optimizer, in.precision, in.zero, in.replicas);
  m.weights = std::llround(params * per_param.weights);
  m.gradients = std::llround(params * per_param.gradients);
  m.optimizer_state = std::llround(params * per_param.optimizer_state);
  if (in.recompute) {
    // Only each in-flight micro-batch's stage inputs stay; one micro-batch is recomputed at a time.
    m.activations = in.stage_input_bytes_per_microbatch * in.in_flight + in.saved_bytes_per_microbatch;
  } else {
    m.activations = in.saved_bytes_per_microbatch * in.in_flight;
  }
  // The gathered weights are counted as stored params (kParamStorageBytes each) like the stage's; param_dtype_bytes
  // models are rescaled to that count.
  m.workspace = in.max_workspace_bytes +
                std::llround(zero_gathered_bytes(static_cast<double>(in.largest_task_param_bytes) * kParamStorageBytes /
                                                     in.param_dtype_bytes,
                                                 in.precision, in.zero, in.replicas));
  m.total = m.weights + m.gradients + m.optimizer_state + m.activations + m.workspace;
  return m;
}

int64_t stage_memory_bytes(const StageMemoryInput& in) { return stage_memory(in).total; }

}  // namespace apart
