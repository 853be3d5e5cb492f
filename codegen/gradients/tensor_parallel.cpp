// Gradient rules of the tensor-parallel collectives (codegen/tensor_parallel_shard.h): Megatron's conjugate pairs.
#include "codegen/gradients/gradient.h"
#include "codegen/tensor_parallel_shard.h"

namespace apart::autodiff {
namespace {

// f = ai.apart.TpCopy: identity forward, so each rank's input gradient is its own part of the sum: all-reduce it.
void tp_copy_rule(GradNode& n) {
  const std::string dx = n.e.fresh("tp_allreduce");
  n.e.node(kTpAllReduceOp, {n.gy()}, {dx}, kApartDomain);
  n.give(0, dx);
}

// g = ai.apart.TpAllReduce: every rank's output is the same sum, so the gradient of each summand is the output's.
void tp_allreduce_rule(GradNode& n) { n.give(0, n.gy()); }

// A collective along the node's sequence axis applied to the output gradient.
std::string along_axis(GradNode& n, const char* op, const char* backward = nullptr) {
  std::string dx = n.e.fresh(op);
  onnx::NodeProto& b = n.e.node(op, {n.gy()}, {dx}, kApartDomain);
  n.copy_attrs(b, {"axis", kTpLengthAttr});  // uneven parts: the whole length travels with the axis
  if (backward != nullptr) set_attr(b, kTpBackwardAttr, std::string(backward));
  return dx;
}

// ai.apart.TpAllGather: y = the ranks' parts concatenated. Into a TP region (backward "reduce_scatter") each rank's
// gradient of y is its heads' part of the whole gradient: sum them and keep this rank's part (Megatron's
// reduce-scatter). Into replicated computation ("scatter") every rank's gradient of y is already the whole one:
// keep this rank's part.
void tp_allgather_rule(GradNode& n) {
  const std::string backward = n.attr_string(kTpBackwardAttr, kTpBackwardReduceScatter);
  if (backward == kTpBackwardReduceScatter) n.give(0, along_axis(n, kTpReduceScatterOp));
  else if (backward == kTpBackwardScatter) n.give(0, along_axis(n, kTpScatterOp));
  else n.unsupported(std::string(kTpBackwardAttr) + " = '" + backward + "'");
}

// ai.apart.TpReduceScatter: y_r = part r of Σ_s x_s, so every x_s gets the gradient of the whole sum: the parts'
// gradients all-gathered (its own backward a reduce-scatter: x_s is a partial sum, as a region's output is).
void tp_reduce_scatter_rule(GradNode& n) { n.give(0, along_axis(n, kTpAllGatherOp, kTpBackwardReduceScatter)); }

// ai.apart.TpScatter (x the same on every rank): x's gradient is every rank's part of y's, all-gathered, the same on
// every rank (its own backward a scatter).
void tp_scatter_rule(GradNode& n) { n.give(0, along_axis(n, kTpAllGatherOp, kTpBackwardScatter)); }

// ai.apart.VocabParallelCrossEntropy: d loss / d scores = (softmax − onehot) · the reduction's coefficient, on this
// rank's columns only; the forward's lse (log Σ exp over the whole vocabulary) makes it local: no message.
void vocab_parallel_cross_entropy_rule(GradNode& n) {
  const std::string dx = n.e.fresh("vocab_parallel_ce_grad");
  onnx::NodeProto& b = n.e.node(kVocabParallelCrossEntropyGradOp, {n.gy(0), n.x(0), n.x(1), n.y(1)}, {dx}, kApartDomain);
  n.copy_attrs(b, {kVocabStartAttr, kVocabSizeAttr, "ignore_index", "reduction"});
  n.give(0, dx);
}

}  // namespace

void register_tensor_parallel_rules() {
  auto& r = rules();
  r[std::string(kApartDomain) + "." + kTpCopyOp] = tp_copy_rule;
  r[std::string(kApartDomain) + "." + kTpAllReduceOp] = tp_allreduce_rule;
  r[std::string(kApartDomain) + "." + kTpAllGatherOp] = tp_allgather_rule;
  r[std::string(kApartDomain) + "." + kTpReduceScatterOp] = tp_reduce_scatter_rule;
  r[std::string(kApartDomain) + "." + kTpScatterOp] = tp_scatter_rule;
  r[std::string(kApartDomain) + "." + kVocabParallelCrossEntropyOp] = vocab_parallel_cross_entropy_rule;
}

}  // namespace apart::autodiff
