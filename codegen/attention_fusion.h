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

// Rewrites each attention of `model` written as torch exports and apart's zoo write it:
//   P = Softmax(mask(scale(MatMul(Q, Kᵀ))), axis −1);  Y = MatMul(P, V)
// with Q, Kᵀ, V of rank 4 ([B, H, S, D], [B, H, D, L], [B, H, L, Dv], the same B and H), where scale(·) is any chain
// of Mul/Div by scalar Constant nodes (also a Mul by a scalar on Q or on Kᵀ, as torch's scaled_dot_product_attention
// export writes √scale on both), and mask(·) is at most one Where with a bool condition and a −∞ (or float32's
// lowest) scalar branch, in either order. Every value inside the pattern must have the pattern's next node as its only
// reader and must not be a graph output. The pattern becomes one Attention node (opset ≥ 23: the default domain's;
// below: ai.apart.Attention, the same op and attributes) with `scale` and, where the mask is a literal causal
// triangle of a square S × S, `is_causal` instead of the mask; Kᵀ's Transpose (when Kᵀ is one, read only here) is
// replaced by one that gives K, else a Transpose of Kᵀ is added; a mask that hides where it is true gets a Not.
// Additive float masks (Add) are left unfused: they may be computed from params (T5's bias), and Attention's
// gradient op gives no gradient to its mask. `graph` is `model` imported (shapes); value_info is added for the
// Attention outputs. Node order stays topological.
AttentionFusion fuse_attention(onnx::ModelProto& model, const TaskGraph& graph);

}  // namespace apart
