// The kernel program of a training graph: the kernels one step launches, in order, each with the tasks it covers,
// its dtype, FLOPs and bytes. Computed once from the graph; the runtime's executor runs it (views alias, constants
// run once), the cost model prices the same list (price_training_step, profiler/cost_model.h), and `apart kernels`
// prints it (docs/runtime.md, "The kernel program").
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "graph/task_graph.h"

namespace apart {

struct ProgramKernel {
  std::string name;           // the op ("MatMul", "ai.apart.AttentionGrad"), or "fused:" and its ops joined by "+"
  std::vector<TaskId> tasks;  // the tasks it covers, in topological order
  DType dtype = DType::kUndefined;  // of its first output
  double flops = 0;
  double bytes_read = 0;
  double bytes_written = 0;
  // false: a view (Reshape, Flatten, Squeeze, Unsqueeze, Identity alias their input; Shape and Size read
  // metadata) or a Transpose folded into its GEMMs: no launch, no bytes.
  bool launch = true;
};

struct KernelProgramTotals {
  int64_t launches = 0;
  double bytes = 0;  // read + written, over every kernel
  double flops = 0;
  int64_t largest_tensor_bytes = 0;     // the largest value a step computes (views included)
  double fp32_activation_fraction = 0;  // of the float bytes a step computes, the share in float32
};

struct KernelProgram {
  static constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  std::vector<ProgramKernel> kernels;  // in launch order (the graph's topological order)
  std::vector<uint32_t> kernel_of;     // per task: its kernel, kNone for a task computed once before the first step
  std::vector<bool> alias;             // per task: its output is a view of its input 0 (no kernel, no copy)
  // Per task: a Transpose folded into its GEMMs (folds_into_gemm, profiler/fusion.h): no kernel, no copy; its readers
  // (MatMuls) read its input with their operand flag set.
  std::vector<bool> folded;
  KernelProgramTotals totals;
};

struct KernelProgramOptions {
  // Group what the profiler's find_fusion_groups groups into one kernel each (the device fuses elementwise chains:
  // Device::fuses_elementwise). false: one kernel per task, as the CPU runs them.
  bool fuse = false;
};

// The program of `training_graph` (finalized, static shapes): tasks_run_each_step's tasks (profiler/fusion.h), one
// kernel per task or per fusion group, FLOPs and bytes from forward_work less what a group keeps out of memory
// (remove_fused_traffic), launches by launches_kernel: the cost model's rules, so that its price and this list agree.
KernelProgram lower_to_kernels(const TaskGraph& training_graph, const KernelProgramOptions& options = {});

// Whether the executor may alias task t's output 0 to its input 0: Reshape, Flatten, Squeeze, Unsqueeze, Identity.
bool is_alias_view(const Task& task);

}  // namespace apart
