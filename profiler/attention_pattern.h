// The attention pattern, found on a task graph: the one home of the rule that says which MatMul·scale·mask·Softmax·
// MatMul chains run as one fused (flash) attention kernel. codegen/attention_fusion.h rewrites what it finds into one
// Attention node before autodiff (the runtime runs it blocked, with no seq × seq tensor); the cost model prices the
// same chains as that one kernel (docs/cost-model.md §2, "Fused attention"), so what is priced is what runs.
#pragma once

#include <optional>
#include <vector>

#include "graph/task_graph.h"
#include "profiler/cost_model.h"
#include "profiler/op_work.h"

namespace apart {

// The contents of literals, which a task graph holds only in part (the importer keeps small integer and bool
// tensors as Value::known_ints, never float values).
class AttentionLiterals {
 public:
  virtual ~AttentionLiterals() = default;
  // The factor a scalar float Constant node's value `v` applies (never an initializer: a float initializer is a
  // trained param by default); nullopt when `v` is no such Constant or its value is 0 or not finite. NaN: a scaling
  // whose factor is not known.
  virtual std::optional<double> scale_factor(ValueId v) const;
  // Whether `v` is a scalar float Constant that softmax gives no weight: −∞, or float32's lowest (what torch writes
  // as torch.finfo(dtype).min).
  virtual bool masks_out(ValueId v) const;
  // Whether the bool literal `mask` (Constant node or initializer) of shape [n, n] is the causal triangle: true
  // exactly above the diagonal when `hides_when_true` (Where(mask, −∞, s)), exactly on and below it otherwise.
  virtual bool causal_triangle(ValueId mask, bool hides_when_true) const;

  explicit AttentionLiterals(const TaskGraph& g) : g_(g) {}

 protected:
  const TaskGraph& g_;
};
// The task graph's own answers (what the planner has: it never reads tensor data). scale_factor: any scalar float
// Constant, factor NaN. masks_out: any scalar float Constant. causal_triangle: from known_ints when the importer kept
// them (≤ 4,096 elements), else any square bool literal is taken for the causal triangle (a model's literal [n, n]
// mask is its causal mask; padding masks are inputs). codegen's answers read the ONNX tensors and are exact.

// One attention: P = Softmax(mask(scale(MatMul(Q, Kᵀ))), axis −1); Y = MatMul(P, V), with Q, Kᵀ, V of rank 4
// ([B, H, S, D], [B, H, D, L], [B, H, L, Dv], the same B and H). scale(·): any chain of Mul/Div by scalar Constants
// (also a Mul by a scalar on Q or on Kᵀ, as torch's scaled_dot_product_attention export writes √scale on both).
// mask(·): at most one Where with a bool condition and a masks_out scalar branch, in either order, after the
// scalings; its condition's last dim is L and it broadcasts to [B, H, S, L]. Every value inside the pattern has the
// pattern's next task as its only reader (one input slot) and is no graph output. Additive float masks (Add) are
// not matched: they may be computed from params (T5's bias), and the fused kernel's gradient gives none to its mask.
struct AttentionMatch {
  // The tasks the fused kernel replaces, in topological order: the MatMuls, scalings, Where and Softmax (Kᵀ's own
  // Transpose is no member: the fused form keeps a copy in its place).
  std::vector<TaskId> tasks;
  TaskId last;  // MatMul(P, V): the fused kernel takes its place
  ValueId q, k_transposed, v, y;
  double scale = 1;        // the product of the scalings' factors (NaN when a factor is unknown)
  ValueId mask;            // the Where's condition; invalid when none (or when `causal` replaces it)
  bool mask_hides = true;  // true where it hides a key (Where(mask, −∞, s)); false where it keeps one
  bool causal = false;     // the mask is the causal triangle of a square S × S: is_causal instead of a mask
  // Kᵀ's own Transpose (when Kᵀ is one, read only here): the fused kernel's K is a Transpose of its input instead
  // (the same copy); invalid: Kᵀ comes from elsewhere and the fused form adds a Transpose of it.
  TaskId k_transpose;
};

// Every attention of `g` (finalized, shapes bound), in topological order; no task is in two of them.
std::vector<AttentionMatch> find_attention(const TaskGraph& g, const AttentionLiterals& literals);
inline std::vector<AttentionMatch> find_attention(const TaskGraph& g) {
  return find_attention(g, AttentionLiterals(g));
}

// Per task of `g`: whether a match replaces it (in AttentionMatch::tasks; all false when there is none).
std::vector<bool> attention_tasks(const TaskGraph& g, const std::vector<AttentionMatch>& matches);

// What a match costs as codegen's rewrite runs it (docs/cost-model.md §2, "Fused attention"), `grad` from
// values_requiring_grad. Forward: one Attention kernel, attention_forward_flops (causal: the blocks the kernel
// computes), reading Q, Kᵀ (as K), V and the mask (none when is_causal replaces it), writing Y; no S × L tensor.
// Backward: one ai.apart.AttentionGrad, kAttentionGradFlopsFactor × those FLOPs, reading dY, Q, K, V and the mask,
// writing the gradients of Q, K, V that are needed; it saves Q, Kᵀ, V and a batch mask (nothing S × L). Where the
// rewrite adds kernels, they are added here: the Transpose of a Kᵀ that is no Transpose of its own (a copy forward,
// its gradient's copy backward) and the Not of a batch mask that hides where it is true.
struct FusedAttentionWork {
  OpWork forward;
  int forward_launches = 1;
  BackwardWork backward;
};
FusedAttentionWork fused_attention_work(const TaskGraph& g, const AttentionMatch& m, const std::vector<bool>& grad);

}  // namespace apart
