// A training graph lowered to the kernels of one step, by the cost model's own rules (see kernel_program.h).
#include "codegen/kernel_program.h"

#include <algorithm>

#include "profiler/fusion.h"
#include "profiler/op_work.h"

namespace apart {
namespace {

std::string op_name(const Task& t) {
  return t.domain.empty() || t.domain == "ai.onnx" ? t.op_type : t.domain + "." + t.op_type;
}

bool is_float_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kFloat16 || d == DType::kBFloat16;
}

}  // namespace

bool is_alias_view(const Task& task) {
  if (!task.domain.empty() && task.domain != "ai.onnx") return false;
  const std::string& op = task.op_type;
  return op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze" || op == "Identity";
}

KernelProgram lower_to_kernels(const TaskGraph& g, const KernelProgramOptions& options) {
  const uint32_t n = static_cast<uint32_t>(g.num_tasks());
  const std::vector<bool> run = tasks_run_each_step(g);
  const FusionGroups fusion = options.fuse ? find_fusion_groups(g) : FusionGroups{};
  const std::vector<OpWork> work = step_work(g, fusion, run);

  KernelProgram p;
  p.kernel_of.assign(n, KernelProgram::kNone);
  p.alias.assign(n, false);
  p.folded.assign(n, false);
  double float_bytes = 0, fp32_bytes = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (!run[i]) continue;
    const TaskId id(i);
    const Task& t = g.task(id);
    for (ValueId o : t.outputs) {
      if (!o.valid() || !g.value(o).shape_known) continue;
      const Value& v = g.value(o);
      p.totals.largest_tensor_bytes = std::max(p.totals.largest_tensor_bytes, v.bytes);
      if (!is_float_dtype(v.dtype)) continue;
      float_bytes += static_cast<double>(v.bytes);
      if (v.dtype == DType::kFloat32) fp32_bytes += static_cast<double>(v.bytes);
    }
    const uint32_t group = fusion.group_of.empty() ? FusionGroups::kNone : fusion.group_of[i];
    if (group != FusionGroups::kNone && group != i) {  // a member of the group its first task's kernel runs
      ProgramKernel& k = p.kernels[p.kernel_of[group]];
      k.name += "+" + op_name(t);
      k.tasks.push_back(id);
      k.flops += work[i].flops;
      k.bytes_read += work[i].bytes_read;
      k.bytes_written += work[i].bytes_written;
      p.kernel_of[i] = p.kernel_of[group];
      continue;
    }
    ProgramKernel k;
    k.name = (group == FusionGroups::kNone ? "" : "fused:") + op_name(t);
    k.tasks.push_back(id);
    for (ValueId o : t.outputs)
      if (o.valid()) {
        k.dtype = g.value(o).dtype;
        break;
      }
    k.flops = work[i].flops;
    k.bytes_read = work[i].bytes_read;
    k.bytes_written = work[i].bytes_written;
    k.launch = launches_kernel(g, fusion, run, id);
    p.alias[i] = !k.launch && is_alias_view(t) && !t.inputs.empty() && t.inputs[0].valid();
    p.folded[i] = group == FusionGroups::kNone && folds_into_gemm(g, id, run);
    if (p.folded[i]) k.name += " (folded into its MatMuls)";
    p.kernel_of[i] = static_cast<uint32_t>(p.kernels.size());
    p.kernels.push_back(std::move(k));
  }
  for (const ProgramKernel& k : p.kernels) {
    p.totals.launches += k.launch ? 1 : 0;
    p.totals.bytes += k.bytes_read + k.bytes_written;
    p.totals.flops += k.flops;
  }
  p.totals.fp32_activation_fraction = float_bytes > 0 ? fp32_bytes / float_bytes : 0.0;
  return p;
}

}  // namespace apart
