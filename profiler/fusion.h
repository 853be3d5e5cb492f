// Kernel fusion on devices that fuse (GPU presets): which tasks run as one kernel, which values never reach memory,
// and the traffic that leaves each task (docs/cost-model.md §3, "Fusion").
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "graph/task_graph.h"
#include "profiler/cost_model.h"
#include "profiler/op_work.h"

namespace apart {

// Whether an op may join a fused kernel: elementwise, views, copies (Transpose, Split, Gather…), normalisations,
// softmax and reductions, the ops a fusing compiler (XLA, TorchInductor) or hand-fused kernels (Megatron-LM's
// LayerNorm, bias-GeLU, bias-dropout-add, scale-mask-softmax) run as one pass. Never GEMMs, pools or opaque ops.
bool is_fusible(OpClass c);

// The fused kernels of a graph. A value is *internal* when a fusible batch task produces it, it is not a graph
// output, it has consumers and all of them are fusible batch tasks at its producer's fusion level (level: the most
// non-fusible tasks on any path from the graph's inputs, so no GEMM lies between producer and consumer); a view's
// output is internal only if the value it aliases is. An internal value is never written, read or saved. A group is
// a connected set of tasks joined by internal values: one kernel forward, one backward. The tasks of an attention
// (find_attention, profiler/attention_pattern.h) are no members under AttentionKernel::kFused: they run as one flash
// kernel of their own; kMaterialized groups them as any other tasks (scale-mask-softmax one kernel, as Megatron-LM's).
struct FusionGroups {
  static constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  std::vector<uint32_t> group_of;   // per task: the index of its group's first task (topological), kNone outside any
  std::vector<bool> internal;       // per value
  // Tasks of each group of two or more, in topological order (a task alone keeps its own costs).
  std::vector<std::vector<TaskId>> groups;
};
FusionGroups find_fusion_groups(const TaskGraph& g, AttentionKernel attention = AttentionKernel::kFused);

// Sets each grouped task's traffic to what its fused kernel moves, at the graph's bound shapes. Forward: its reads
// less those of internal values and the second read of an external value (`bytes_read`, with its fixed part), its
// writes less those of internal values. Backward (`bytes`), replacing the op's own rule: the gradients of its external
// outputs read, those of its external inputs written, the external values it saved read, each once per group.
// Internal values leave `saved`; a group that had saved one saves its external batch inputs instead (the fused
// backward recomputes the rest from them, as Megatron-LM's bias-GeLU and LayerNorm kernels do), on its first task,
// which also reads them in backward. Never makes a figure negative.
// The tasks one step of a graph runs: batch tasks, and constant tasks that read a param directly or through other
// constant tasks (the optimizer changes params between steps: a tied head's Transpose of the embedding table). The
// other constant tasks are computed once, before the first step. The runtime's executor and the kernel program
// (codegen/kernel_program.h) take this one rule.
std::vector<bool> tasks_run_each_step(const TaskGraph& g);

// Whether task t is a Transpose its GEMMs read through their operand flag (BLAS's and cuBLAS's transa/transb) instead
// of a copy: it swaps the last two of two or more axes and keeps the others, runs each step, its output is no graph
// output and every reader is a MatMul. It launches nothing and moves nothing; the MatMuls read its input.
bool folds_into_gemm(const TaskGraph& g, TaskId t, const std::vector<bool>& run_each_step);

// Whether task t is in one of `fusion`'s groups.
bool in_fusion_group(const FusionGroups& fusion, TaskId t);

// Whether task t is a kernel launch of its own in a step: it runs each step (`run_each_step`), it is no view (no
// kernel: Reshape, Squeeze… alias their input; Shape, Size read metadata), no fused group's member but the first
// (the group is one kernel) and, outside groups, no Transpose folded into its GEMMs (folds_into_gemm).
bool launches_kernel(const TaskGraph& g, const FusionGroups& fusion, const std::vector<bool>& run_each_step, TaskId t);

// Each task's work in one step of a graph whose backward is tasks of its own (a training graph): forward_work for the
// tasks in `run_each_step` (zero for the others), less what `fusion`'s groups keep out of memory
// (remove_fused_traffic's forward rule); a Transpose folded into its GEMMs (folds_into_gemm) does none. What
// price_training_step prices and the kernel program lists.
std::vector<OpWork> step_work(const TaskGraph& g, const FusionGroups& fusion, const std::vector<bool>& run_each_step);

void remove_fused_traffic(const TaskGraph& g, const FusionGroups& fusion, const std::vector<bool>& grad,
                          std::vector<OpWork>& forward, std::vector<BackwardWork>& backward);

}  // namespace apart
