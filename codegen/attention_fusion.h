// Fused attention before autodiff: the MatMul·scale·mask·Softmax·MatMul pattern rewritten into one Attention node,
// whose gradient op (ai.apart.AttentionGrad) recomputes the weights tile by tile, so that no seq × seq tensor exists
// in the forward or the backward (docs/autodiff.md, "Fused attention").
#pragma once

#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

#include "graph/task_graph.h"

namespace apart {

// What fuse_attention rewrote: the names of the Attention nodes it wrote, one per matched pattern.
struct AttentionFusion {
  std::vector<std::string> nodes;
  bool changed() const { return !nodes.empty(); }
};

// Rewrites each attention of `model` that find_attention (profiler/attention_pattern.h, the one home of the pattern,
// which the cost model prices too) finds on `graph` (`model` imported: shapes), the literals read from `model`'s
// tensors: P = Softmax(mask(scale(MatMul(Q, Kᵀ)))); Y = MatMul(P, V) becomes one Attention node (opset ≥ 23: the
// default domain's; below: ai.apart.Attention, the same op and attributes) with `scale` and, where the mask is a
// literal causal triangle of a square S × S, `is_causal` instead of the mask; Kᵀ's Transpose (when Kᵀ is one, read
// only here) is replaced by one that gives K, else a Transpose of Kᵀ is added; a mask that hides where it is true
// gets a Not. Additive float masks (Add) are left unfused. value_info is added for the Attention outputs. Node order
// stays topological.
AttentionFusion fuse_attention(onnx::ModelProto& model, const TaskGraph& graph);

}  // namespace apart
