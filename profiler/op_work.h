// Forward work of one task: FLOPs and bytes moved at the graph's bound shapes (docs/cost-model.md §1).
#pragma once

#include <cstdint>
#include <string_view>

#include "graph/task_graph.h"

namespace apart {

// What kind of kernel an op is: selects the roofline efficiency and the backward rule.
enum class OpClass : uint8_t {
  kMatMul,        // MatMul, Gemm, Einsum, Conv, ConvTranspose: tensor-core work, weight + input gradients
  kElementwise,   // one output element per input element (with broadcasting): Add, Relu, Erf, Cast…
  kNormalization, // BatchNormalization, LayerNormalization, InstanceNormalization, GroupNormalization…
  kSoftmax,       // Softmax, LogSoftmax, Hardmax
  kReduction,     // Reduce*, ArgMax/ArgMin, GlobalAveragePool…
  kPool,          // MaxPool, AveragePool, LpPool
  kDataMovement,  // a real copy without arithmetic: Transpose, Concat, Slice, Gather, Pad, Expand…
  kView,          // metadata only, no kernel: Reshape, Flatten, Squeeze, Unsqueeze, Identity, Shape, Constant…
  kOpaque,        // op unknown to apart (custom domain, control flow): fallback estimate
};
std::string_view op_class_name(OpClass c);
OpClass op_class(const Task& task);
// Whether a default-domain op has a cost rule of its own (anything else is costed as opaque).
bool has_cost_rule(std::string_view op_type);

struct OpWork {
  double flops = 0;          // forward FLOPs; a multiply-add counts 2
  double bytes_read = 0;     // bytes the kernel reads (inputs; only the gathered rows for Gather)
  double bytes_written = 0;  // bytes the kernel writes (outputs)
  bool known = true;         // false: opaque op or a shape it needed was unknown (fallback used)
  // Part of bytes_read that comes from params and constants: does not scale with the batch.
  double fixed_bytes_read = 0;
};

// One fused (flash) attention kernel's forward FLOPs: Q·Kᵀ and P·V over the (query, key) pairs the blocked kernel
// computes (graph/flash_tiles.h: all S·L, or under is_causal the blocks up to the diagonal, about half),
// 2 · batch · q_heads · pairs · (head + v_head); softmax, scale and mask are in the noise. GQA: every query head
// reads a KV head of v_head.
double attention_forward_flops(int64_t batch, int64_t q_heads, int64_t q_seq, int64_t kv_seq, int64_t head,
                               int64_t v_head, bool causal);
// Its backward (ai.apart.AttentionGrad) over its forward: the CPU kernel (runtime/cpu/attention.cpp) keeps no softmax
// statistics, so it runs the forward again per block of query rows (2 products per tile) for them and for O, then 5
// products per tile (the logits again, dV, dP, dQ, dK): 3.5×. (FlashAttention-2's backward, which reads the saved O
// and logsumexp instead, does the last 5 only: 2.5×.)
inline constexpr double kAttentionGradFlopsFactor = 3.5;

// A normalisation's backward over its forward, in FLOPs: x̂ again, dx̂ = dY·scale, two row means, dX, and the
// scale and bias gradients' sums: 2×. The planner's backward rule and the gradient ops' forward_work
// (ai.apart.LayerNormalizationGrad, RMSNormalizationGrad) both take it.
inline constexpr double kNormGradientFlopsFactor = 2;

// Forward FLOPs and bytes of task `t` at the shapes bound in `g`. Never throws on unknown shapes:
// it counts what it can and sets known=false. Constant tasks get their work computed too; the
// caller decides whether they cost anything per step.
OpWork forward_work(const TaskGraph& g, TaskId t);

}  // namespace apart
