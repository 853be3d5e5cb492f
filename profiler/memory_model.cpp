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

double bytes_per_param(Optimizer optimizer, Precision precision) {
  return param_state_bytes(optimizer, precision).total();
}

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
