// The analytic cost model: per-task forward/backward time, saved bytes and memory (docs/cost-model.md).
#pragma once

#include <cstdint>
#include <vector>

#include "graph/task_graph.h"
#include "profiler/cost_table.h"
#include "profiler/device.h"
#include "profiler/op_work.h"

namespace apart {

// Fractions of peak a kernel class reaches: compute for its FLOPs, memory for its bytes.
struct OpEfficiency {
  double compute = 1;
  double memory = 1;
};
// Per class on `device`: the measured cpu device keeps its probe-relative figures, datasheet devices (GPU presets,
// --cluster devices) the calibration against measured A100 iterations (docs/cost-model.md §3).
OpEfficiency default_efficiency(OpClass c, const Device& device);

struct CostOptions {
  Precision precision = Precision::kFp32;
  AttentionKernel attention = AttentionKernel::kFused;  // plan/training.h: what the priced engine runs
  // Micro-batch size u the costs are for; 0 = the graph's bound batch (no scaling).
  int64_t microbatch_size = 0;
  // Batch the graph's shapes were bound at: the importer's ImportedModel::batch (its one batch rule), 1 when that is 0.
  int64_t reference_batch = 1;
  void validate() const;  // throws InvalidArgument
};

// max(FLOPs / (peak·eff.compute), bytes / (bandwidth·eff.memory)) + overhead; 0 when no work.
double roofline_time(double flops, double bytes, double peak_flops, double bandwidth, OpEfficiency eff,
                     double overhead_s);

// Which values need a gradient: float params, and float values computed from them.
std::vector<bool> values_requiring_grad(const TaskGraph& g);

struct BackwardWork {
  double flops = 0;
  double bytes = 0;                 // read + written
  int kernels = 0;                  // kernel launches the backward takes
  std::vector<ValueId> saved;       // values this task keeps for its backward (batch values only)
  double extra_saved_bytes = 0;     // state that is not a graph value: dropout masks, pool indices
};
// Backward rule per op (docs/cost-model.md §2). `grad` comes from values_requiring_grad.
BackwardWork backward_work(const TaskGraph& g, TaskId t, const OpWork& forward, const std::vector<bool>& grad);

// Every task's costs at micro-batch size options.microbatch_size. Constant tasks cost nothing per
// step (zero FLOPs, times and saved bytes; they keep param_bytes). A value saved by several tasks
// is counted once, at the first task (topological order) that saves it. Opaque ops get the
// fallback and a warning in CostTable::warnings naming them.
CostTable estimate_costs(const TaskGraph& g, const Device& device, const CostOptions& options = {});

// What the cost model prices for one step of a training graph (autodiff's: the backward is tasks of its own, so no
// backward rule applies): its kernel launches (launches_kernel over tasks_run_each_step, profiler/fusion.h), the
// bytes its kernels read and write (forward_work, less what fused groups keep out of memory on a device that fuses;
// times activation_bytes_factor(precision), as estimate_costs prices a kernel's traffic) and its FLOPs. The kernel
// program (codegen/kernel_program.h) lists the same kernels: `apart kernels` prints both.
struct StepPrice {
  int64_t launches = 0;
  double bytes = 0;
  double flops = 0;
};
StepPrice price_training_step(const TaskGraph& training_graph, const Device& device, Precision precision);
// What the planner prices for one step of a forward graph (`table`: estimate_costs of `forward`, forward and backward
// per task): its launches (TaskCost::launches), bytes and FLOPs forward plus backward. Its training graph's kernel
// program prices the same step task by task (tests/profiler/planned_step_test.cpp holds them together).
StepPrice price_planned_step(const TaskGraph& forward, const CostTable& table);

// Linear rescaling of a table (analytic or measured) to another micro-batch size: batch tasks'
// times, FLOPs, bytes and saved/output/workspace bytes scale by new/old; constant tasks keep theirs.
CostTable rescale_costs(const CostTable& table, const TaskGraph& g, int64_t microbatch_size);

}  // namespace apart
