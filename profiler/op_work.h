// Forward work of one task: FLOPs and bytes moved at the graph's bound shapes (docs/cost-model.md §1).
#pragma once

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

// Forward FLOPs and bytes of task `t` at the shapes bound in `g`. Never throws on unknown shapes:
// it counts what it can and sets known=false. Constant tasks get their work computed too; the
// caller decides whether they cost anything per step.
OpWork forward_work(const TaskGraph& g, TaskId t);

}  // namespace apart
