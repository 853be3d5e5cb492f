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
// a connected set of tasks joined by internal values: one kernel forward, one backward.
struct FusionGroups {
  static constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  std::vector<uint32_t> group_of;   // per task: the index of its group's first task (topological), kNone outside any
  std::vector<bool> internal;       // per value
  // Tasks of each group of two or more, in topological order (a task alone keeps its own costs).
  std::vector<std::vector<TaskId>> groups;
};
FusionGroups find_fusion_groups(const TaskGraph& g);

// Sets each grouped task's traffic to what its fused kernel moves, at the graph's bound shapes. Forward: its reads
// less those of internal values and the second read of an external value (`bytes_read`, with its fixed part), its
// writes less those of internal values. Backward (`bytes`), replacing the op's own rule: the gradients of its external
// outputs read, those of its external inputs written, the external values it saved read, each once per group.
// Internal values leave `saved`; a group that had saved one saves its external batch inputs instead (the fused
// backward recomputes the rest from them, as Megatron-LM's bias-GeLU and LayerNorm kernels do), on its first task,
// which also reads them in backward. Never makes a figure negative.
void remove_fused_traffic(const TaskGraph& g, const FusionGroups& fusion, const std::vector<bool>& grad,
                          std::vector<OpWork>& forward, std::vector<BackwardWork>& backward);

}  // namespace apart
