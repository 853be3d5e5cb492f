// The memory rules of docs/cost-model.md §4: state per parameter, in-flight micro-batches, a stage's peak.
#include "profiler/memory_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "graph/error.h"

namespace apart {

int64_t stage_in_flight_microbatches(Schedule schedule, int stage, int stages, int64_t microbatches) {
  APART_CHECK(stages >= 1 && stage >= 0 && stage < stages && microbatches >= 1, "bad stage/microbatch numbers");
  if (schedule == Schedule::kGPipe) return microbatches;
  return std::min<int64_t>(stages - stage, microbatches);
}

double weight_bytes_per_param(Precision precision) { return precision == Precision::kMixed ? 2 + 4 : 4; }
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
  return weight_bytes_per_param(precision) + gradient_bytes_per_param(precision) +
         optimizer_state_bytes_per_param(optimizer);
}

double state_bytes_per_param_byte(Optimizer optimizer, Precision precision) {
  return bytes_per_param(optimizer, precision) / kParamStorageBytes;
}

double gradient_bytes_per_param_byte(Precision precision) {
  return gradient_bytes_per_param(precision) / kParamStorageBytes;
}

double optimizer_traffic_bytes_per_param_byte(Optimizer optimizer, Precision precision) {
  return (kParamStorageBytes + weight_bytes_per_param(precision) + 2 * gradient_bytes_per_param(precision) +
          2 * optimizer_state_bytes_per_param(optimizer)) /
         kParamStorageBytes;
}

double optimizer_step_time(int64_t param_bytes, Optimizer optimizer, Precision precision, double memory_bandwidth) {
  if (param_bytes <= 0 || !(memory_bandwidth > 0)) return 0;
  return static_cast<double>(param_bytes) * optimizer_traffic_bytes_per_param_byte(optimizer, precision) /
         memory_bandwidth;
}

double activation_bytes_factor(Precision precision) { return precision == Precision::kMixed ? 0.5 : 1.0; }

StageMemory stage_memory(const StageMemoryInput& in) {
  APART_CHECK(in.param_dtype_bytes > 0 && in.in_flight >= 0, "bad StageMemoryInput");
  const double params = static_cast<double>(in.param_bytes) / in.param_dtype_bytes;
  StageMemory m;
  m.weights = std::llround(params * weight_bytes_per_param(in.precision));
  m.gradients = std::llround(params * gradient_bytes_per_param(in.precision));
  m.optimizer_state = std::llround(params * optimizer_state_bytes_per_param(in.optimizer));
  if (in.recompute) {
    // Only each in-flight micro-batch's stage inputs stay; one micro-batch is recomputed at a time.
    m.activations = in.stage_input_bytes_per_microbatch * in.in_flight + in.saved_bytes_per_microbatch;
  } else {
    m.activations = in.saved_bytes_per_microbatch * in.in_flight;
  }
  m.workspace = in.max_workspace_bytes;
  m.total = m.weights + m.gradients + m.optimizer_state + m.activations + m.workspace;
  return m;
}

int64_t stage_memory_bytes(const StageMemoryInput& in) { return stage_memory(in).total; }

}  // namespace apart
