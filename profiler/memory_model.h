// Memory of one device running one pipeline stage in training (docs/cost-model.md §4).
#pragma once

#include <cstdint>
#include <string_view>

#include "plan/training.h"

namespace apart {

// Micro-batches whose activations stage `stage` (0-based) of `stages` holds at its peak:
// GPipe m; 1F1B min(S − s, m) (the first stage holds S).
int64_t stage_in_flight_microbatches(Schedule schedule, int stage, int stages, int64_t microbatches);

// Persistent bytes per parameter: weights + gradients + optimizer state.
//   fp32/tf32: 4 + 4 + {SGD 0, momentum 4, Adam 8}        → 8, 12, 16
//   mixed:     2 + 2 + 4 (fp32 master) + {0, 4, 8}          → 8, 12, 16
double bytes_per_param(Optimizer optimizer, Precision precision);

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
};

struct StageMemory {
  int64_t weights = 0;          // working copy (+ fp32 master under mixed precision)
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  int64_t activations = 0;      // saved for backward, over the in-flight micro-batches
  int64_t workspace = 0;
  int64_t total = 0;
};

StageMemory stage_memory(const StageMemoryInput& in);
int64_t stage_memory_bytes(const StageMemoryInput& in);  // stage_memory(in).total

}  // namespace apart
