// The stage memory formula of docs/cost-model.md §4.
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

namespace {
double state_bytes(Optimizer o) {
  switch (o) {
    case Optimizer::kSgd: return 0;
    case Optimizer::kMomentum: return 4;  // fp32 velocity
    case Optimizer::kAdam:
    case Optimizer::kAdamW: return 8;     // fp32 first and second moments
  }
  return 8;
}
}  // namespace

double bytes_per_param(Optimizer optimizer, Precision precision) {
  const bool mixed = precision == Precision::kMixed;
  const double weights = mixed ? 2 + 4 : 4;  // fp16 working copy + fp32 master
  const double grads = mixed ? 2 : 4;
  return weights + grads + state_bytes(optimizer);
}

StageMemory stage_memory(const StageMemoryInput& in) {
  APART_CHECK(in.param_dtype_bytes > 0 && in.in_flight >= 0, "bad StageMemoryInput");
  const double params = static_cast<double>(in.param_bytes) / in.param_dtype_bytes;
  const bool mixed = in.precision == Precision::kMixed;
  StageMemory m;
  m.weights = std::llround(params * (mixed ? 6.0 : 4.0));
  m.gradients = std::llround(params * (mixed ? 2.0 : 4.0));
  m.optimizer_state = std::llround(params * state_bytes(in.optimizer));
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
