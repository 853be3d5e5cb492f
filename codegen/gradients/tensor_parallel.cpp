// Gradient rules of the tensor-parallel collectives (codegen/tensor_parallel_shard.h): Megatron's conjugate pair.
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

}  // namespace

void register_tensor_parallel_rules() {
  auto& r = rules();
  r[std::string(kApartDomain) + "." + kTpCopyOp] = tp_copy_rule;
  r[std::string(kApartDomain) + "." + kTpAllReduceOp] = tp_allreduce_rule;
}

}  // namespace apart::autodiff
