// The tensor-parallel collectives of a shard (codegen/tensor_parallel_shard.h) over the executor's TP group.
#include "runtime/communicator.h"
#include "runtime/cpu/families.h"
#include "runtime/kernel.h"

namespace apart::cpu {
namespace {

// ai.apart.TpCopy (Megatron's f): the input, unchanged; its gradient is all-reduced (by TpAllReduce in the backward).
void tp_copy_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  copy_bytes(x, ctx.output(0, x.dtype(), x.shape()));
}

// ai.apart.TpAllReduce (Megatron's g): the sum of every TP rank's input, the same on each (float32 or float64). Without
// a group (a degree-1 run of a shard) it is the identity.
void tp_allreduce_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  copy_bytes(x, y);
  Communicator* group = ctx.tensor_parallel_group();
  if (group == nullptr || group->size() == 1) return;
  if (x.dtype() == DType::kFloat32) group->allreduce_sum(y.span<float>())->wait();
  else if (x.dtype() == DType::kFloat64) group->allreduce_sum(y.span<double>())->wait();
  else ctx.unsupported("an all-reduce of " + std::string(dtype_name(x.dtype())));
}

}  // namespace

void register_tensor_parallel_kernels() {
  register_kernel("ai.apart.TpCopy", tp_copy_k);
  register_kernel("ai.apart.TpAllReduce", tp_allreduce_k);
}

}  // namespace apart::cpu
