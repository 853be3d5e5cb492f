// Backward rules per op, the roofline and estimate_costs (docs/cost-model.md §2–3).
#include "profiler/cost_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "graph/dtype.h"
#include "graph/error.h"
#include "profiler/attention_pattern.h"
#include "profiler/fusion.h"
#include "profiler/memory_model.h"

namespace apart {
namespace {


bool is_batch_value(const Value& v) { return v.kind != ValueKind::kParam && v.kind != ValueKind::kConstant; }

double vbytes(const Value* v) { return v && v->shape_known ? static_cast<double>(v->bytes) : 0.0; }
double velems(const Value* v) { return v && v->shape_known ? static_cast<double>(v->elements) : 0.0; }

struct TaskView {
  const TaskGraph& g;
  const Task& task;
  const std::vector<bool>& grad;
  const Value* in(size_t i) const {
    return i < task.inputs.size() && task.inputs[i].valid() ? &g.value(task.inputs[i]) : nullptr;
  }
  const Value* out(size_t i) const {
    return i < task.outputs.size() && task.outputs[i].valid() ? &g.value(task.outputs[i]) : nullptr;
  }
  bool needs_grad(size_t i) const {
    return i < task.inputs.size() && task.inputs[i].valid() && grad[task.inputs[i].value()];
  }
  bool any_grad() const {
    for (size_t i = 0; i < task.inputs.size(); ++i)
      if (needs_grad(i)) return true;
    return false;
  }
  // Saves input i when it is batch data (params and constants stay in memory anyway).
  void save_input(size_t i, BackwardWork& b) const {
    const Value* v = in(i);
    if (v && is_batch_value(*v)) b.saved.push_back(task.inputs[i]);
  }
  void save_output(size_t i, BackwardWork& b) const {
    if (out(i)) b.saved.push_back(task.outputs[i]);
  }
};

// Unary ops whose derivative is a function of the output (PyTorch saves `result` for these).
bool saves_output(const std::string& op) {
  return op == "Relu" || op == "Sigmoid" || op == "Tanh" || op == "Exp" || op == "Sqrt" || op == "Reciprocal" ||
         op == "Elu" || op == "Selu" || op == "Celu";
}
// Ops whose gradient is zero almost everywhere or undefined: nothing flows back.
bool has_no_gradient(const std::string& op) {
  return op == "Floor" || op == "Ceil" || op == "Round" || op == "Sign" || op == "Equal" || op == "Less" ||
         op == "Greater" || op == "LessOrEqual" || op == "GreaterOrEqual" || op == "Not" || op == "And" ||
         op == "Or" || op == "Xor" || op == "IsNaN" || op == "IsInf" || op == "BitShift" || op == "Mod" ||
         op.rfind("Bitwise", 0) == 0 || op.rfind("Random", 0) == 0 || op == "Bernoulli" || op == "ArgMax" ||
         op == "ArgMin" || op == "NonZero" || op == "OneHot" || op == "Shape" || op == "Size" || op == "Range" ||
         op == "ConstantOfShape" || op == "EyeLike";
}

// Sum-reductions a broadcasting binary op's gradient needs: one add per output element for each
// input that was broadcast (smaller than the output) and needs a gradient.
double broadcast_reduction_flops(const TaskView& v, double out_elems) {
  double f = 0;
  for (size_t i = 0; i < v.task.inputs.size(); ++i)
    if (v.needs_grad(i) && velems(v.in(i)) < out_elems) f += out_elems;
  return f;
}

BackwardWork matmul_backward(const TaskView& v, const OpWork& fw) {
  BackwardWork b;
  const std::string& op = v.task.op_type;
  if (op == "LSTM" || op == "GRU" || op == "RNN") {
    // Backward through time: input, recurrent and weight gradients, ≈ 2× forward; keeps X and Y.
    b.flops = 2 * fw.flops;
    b.bytes = 2 * (fw.bytes_read + fw.bytes_written);
    b.kernels = 2;
    v.save_input(0, b);
    v.save_output(0, b);
    return b;
  }
  if (op == "Attention") {
    // ai.apart.AttentionGrad, as for a matched attention (fused_attention_work, profiler/attention_pattern.h):
    // kAttentionGradFlopsFactor × the forward; reads dY, Q, K, V and the mask, writes the gradients needed. Keeps Q,
    // K, V and the mask (the weights are recomputed, so nothing S × L is saved).
    b.flops = kAttentionGradFlopsFactor * fw.flops;
    b.bytes = fw.bytes_read + fw.bytes_written;
    for (size_t i = 0; i < 3; ++i)
      if (v.needs_grad(i)) b.bytes += vbytes(v.in(i));
    b.kernels = 1;
    for (size_t i = 0; i < std::min<size_t>(4, v.task.inputs.size()); ++i) v.save_input(i, b);
    return b;
  }
  if (op == "Einsum") {
    // One contraction of the same size per operand needing a gradient; each keeps the others.
    int n = 0;
    for (size_t i = 0; i < v.task.inputs.size(); ++i) {
      if (!v.needs_grad(i)) continue;
      ++n;
      for (size_t j = 0; j < v.task.inputs.size(); ++j)
        if (j != i) v.save_input(j, b);
    }
    b.flops = n * fw.flops;
    b.bytes = n * (fw.bytes_read + fw.bytes_written);
    b.kernels = n;
    std::sort(b.saved.begin(), b.saved.end());
    b.saved.erase(std::unique(b.saved.begin(), b.saved.end()), b.saved.end());
    return b;
  }
  // MatMul, Gemm, Conv, ConvTranspose: dA = dY·Bᵀ needs B, dB = Aᵀ·dY needs A; each costs as much
  // as the forward product. The bias gradient is a sum over the output: one add per element.
  const Value* a = v.in(0);
  const Value* w = v.in(1);
  const Value* y = v.out(0);
  const double bias_flops = v.task.inputs.size() > 2 ? velems(y) : 0.0;
  const double product_flops = std::max(0.0, fw.flops - bias_flops);
  const bool grad_a = v.needs_grad(0), grad_b = v.needs_grad(1), grad_c = v.needs_grad(2);
  if (grad_a) {
    b.flops += product_flops;
    b.bytes += vbytes(y) + vbytes(w) + vbytes(a);
    b.kernels += 1;
    v.save_input(1, b);
  }
  if (grad_b) {
    b.flops += product_flops;
    b.bytes += vbytes(y) + vbytes(a) + vbytes(w);
    b.kernels += 1;
    v.save_input(0, b);
  }
  if (grad_c) {
    b.flops += bias_flops;
    b.bytes += vbytes(y) + vbytes(v.in(2));
    b.kernels += 1;
  }
  return b;
}

BackwardWork elementwise_backward(const TaskView& v, const OpWork& fw) {
  BackwardWork b;
  const std::string& op = v.task.op_type;
  if (has_no_gradient(op)) return b;
  const double out = velems(v.out(0));
  const double dy = vbytes(v.out(0));
  double dx = 0;  // bytes of the input gradients written
  for (size_t i = 0; i < v.task.inputs.size(); ++i)
    if (v.needs_grad(i)) dx += vbytes(v.in(i));
  b.kernels = 1;
  b.bytes = dy + dx;
  const double reduce = broadcast_reduction_flops(v, out);
  if (op == "Add" || op == "Sub" || op == "Sum" || op == "Neg" || op == "Cast" || op == "CastLike" ||
      op == "Identity") {
    b.flops = reduce + (op == "Sub" || op == "Neg" ? out : 0.0);  // passes dY through (negated for Sub)
  } else if (op == "Mul") {
    // dA = dY·B, dB = dY·A: each needs the other operand.
    for (size_t i = 0; i < 2; ++i)
      if (v.needs_grad(i)) {
        b.flops += out;
        v.save_input(1 - i, b);
        b.bytes += vbytes(v.in(1 - i));
      }
    b.flops += reduce;
  } else if (op == "Div") {
    // dA = dY / B (1), dB = −dY·A / B² (3); both need B, dB needs A.
    if (v.needs_grad(0)) b.flops += out;
    if (v.needs_grad(1)) b.flops += 3 * out, v.save_input(0, b);
    v.save_input(1, b);
    b.bytes += vbytes(v.in(0)) + vbytes(v.in(1));
    b.flops += reduce;
  } else if (op == "Where") {
    // Routes dY by the condition into each branch's gradient.
    v.save_input(0, b);
    b.flops = out * 2 + reduce;
    b.bytes += vbytes(v.in(0));
  } else if (op == "Dropout") {
    // dX = dY · mask · scale; the mask is the only state (1 byte per element when not an output).
    b.flops = out;
    if (v.out(1)) v.save_output(1, b);
    else b.extra_saved_bytes = out;
    b.bytes += out;
  } else if (op == "Max" || op == "Min" || op == "Pow" || op == "PRelu" || op == "Mean") {
    // Derivative needs the inputs (which one won, the base and exponent, the slope).
    for (size_t i = 0; i < v.task.inputs.size(); ++i) {
      v.save_input(i, b);
      b.bytes += vbytes(v.in(i));
    }
    b.flops = 2 * out * static_cast<double>(std::max<size_t>(1, v.task.inputs.size())) + reduce;
  } else if (saves_output(op)) {
    // dX = dY · f'(y): derivative from the saved output, then the chain-rule multiply.
    v.save_output(0, b);
    b.flops = 2 * out;
    b.bytes += dy;
  } else {
    // Unary with an input-dependent derivative (Erf, Gelu, Log, Clip, LeakyRelu, Sin…).
    v.save_input(0, b);
    b.flops = 2 * out + reduce;
    b.bytes += vbytes(v.in(0));
  }
  (void)fw;
  return b;
}

BackwardWork other_backward(const TaskView& v, const OpWork& fw, OpClass cls) {
  BackwardWork b;
  const std::string& op = v.task.op_type;
  const Value* x = v.in(0);
  const Value* y = v.out(0);
  switch (cls) {
    case OpClass::kNormalization:
      if (op == "LayerNormalization" || op == "RMSNormalization") {
        // One kernel, ai.apart.<op>Grad (runtime/cpu/norm_grad.cpp): reads dY, X, the scale (and LayerNorm's saved
        // per-row Mean and InvStdDev), writes dX and the scale's (and bias's) gradients. Keeps X.
        v.save_input(0, b);
        const double rows = op == "LayerNormalization" && velems(v.in(1)) > 0 ? velems(x) / velems(v.in(1)) : 0.0;
        b.flops = kNormGradientFlopsFactor * fw.flops;
        b.bytes = vbytes(y) + vbytes(x) + vbytes(v.in(1)) + 2 * rows * dtype_size(x ? x->dtype : DType::kFloat32);
        for (size_t i = 0; i < 3; ++i)
          if (v.needs_grad(i)) b.bytes += vbytes(v.in(i));
        b.kernels = 1;
        return b;
      }
      // dX from x (or x̂), the statistics and dY; scale/bias gradients reduce over the batch.
      // Per-row statistics (mean, 1/σ) are a few bytes per row and not counted.
      v.save_input(0, b);
      if (op == "SkipLayerNormalization") v.save_input(1, b);
      b.flops = 2 * fw.flops;
      b.bytes = vbytes(x) + 2 * vbytes(y) + fw.fixed_bytes_read * 2;
      b.kernels = 2;
      return b;
    case OpClass::kSoftmax:
      if (op == "SoftmaxCrossEntropyLoss" || op == "NegativeLogLikelihoodLoss") {
        // dScores = softmax − one-hot: keeps the log-probabilities (an output, or scores-sized) and labels.
        if (op == "SoftmaxCrossEntropyLoss") {
          if (v.out(1)) v.save_output(1, b);
          else b.extra_saved_bytes = vbytes(x);
        }
        v.save_input(1, b);
        b.flops = 2 * velems(x);
        b.bytes = 2 * vbytes(x);
        b.kernels = 1;
        return b;
      }
      // dX = y ⊙ (dY − Σ dY⊙y): keeps the output.
      v.save_output(0, b);
      b.flops = 4 * velems(y);
      b.bytes = 3 * vbytes(y);
      b.kernels = 1;
      return b;
    case OpClass::kReduction:
      b.kernels = 1;
      b.bytes = vbytes(y) + vbytes(x);  // read dY, write the broadcast dX
      if (op == "ReduceSum" || op == "CumSum") {
        b.flops = op == "CumSum" ? velems(x) : 0;
      } else if (op == "ReduceMean" || op == "GlobalAveragePool") {
        b.flops = velems(x);
      } else if (op == "ReduceMax" || op == "ReduceMin" || op == "GlobalMaxPool" || op == "TopK") {
        // Routes dY to the arg-max: needs the input and the result (or TopK's indices).
        v.save_input(0, b);
        if (op == "TopK") v.save_output(1, b);
        else v.save_output(0, b);
        b.flops = velems(x);
        b.bytes += vbytes(x);
      } else {
        // L1, L2, SumSquare, LogSumExp, Prod, LogSum, GlobalLpPool: derivative from x (and y).
        v.save_input(0, b);
        v.save_output(0, b);
        b.flops = 2 * velems(x);
        b.bytes += vbytes(x);
      }
      return b;
    case OpClass::kPool:
      b.kernels = 1;
      if (op == "MaxPool") {
        // Scatters dY to the arg-max positions: keeps the input and int64 indices (as PyTorch does).
        v.save_input(0, b);
        if (v.out(1)) v.save_output(1, b);
        else b.extra_saved_bytes = 8 * velems(y);
        b.flops = velems(y);
        b.bytes = vbytes(y) + 8 * velems(y) + vbytes(x);
      } else {
        // AveragePool / LpPool: spreads dY over each window; needs only shapes (LpPool: x and y).
        if (op == "LpPool") v.save_input(0, b), v.save_output(0, b);
        b.flops = fw.flops;
        b.bytes = vbytes(y) + vbytes(x);
      }
      return b;
    case OpClass::kDataMovement: {
      if (has_no_gradient(op)) return b;
      b.kernels = 1;
      if (op == "Gather" || op == "GatherElements" || op == "GatherND") {
        // Scatter-add of dY into a zeroed gradient of the data: keeps the indices.
        v.save_input(1, b);
        b.flops = velems(y);
        b.bytes = 2 * vbytes(y) + vbytes(v.in(1)) + (v.needs_grad(0) ? vbytes(x) : 0.0);
      } else if (op == "Expand" || op == "Tile") {
        b.flops = velems(y);  // sum dY back to the input's shape
        b.bytes = vbytes(y) + vbytes(x);
      } else if (op == "ScatterND" || op == "ScatterElements" || op == "Scatter") {
        v.save_input(1, b);
        b.bytes = fw.bytes_read + fw.bytes_written;
      } else {
        // Transpose, Concat, Split, Slice, Pad, Resize…: the inverse copy (and Resize's weights).
        b.flops = fw.flops;
        b.bytes = fw.bytes_read + fw.bytes_written;
      }
      return b;
    }
    case OpClass::kOpaque:
      // Unknown op: assume backward ≈ 2× forward and that it keeps every batch input.
      for (size_t i = 0; i < v.task.inputs.size(); ++i) v.save_input(i, b);
      b.flops = 2 * fw.flops;
      b.bytes = 2 * (fw.bytes_read + fw.bytes_written);
      b.kernels = 2;
      return b;
    default:
      return b;
  }
}

// A fused kernel (profiler/fusion.h) runs at the least efficient of its tasks' classes (a decomposed LayerNorm at the
// normalisation's fractions of peak, a scale-mask-softmax at the softmax's) on its summed FLOPs and bytes: one roofline
// and one launch forward, one roofline and the most launches any of its tasks' backward takes backward. Each task
// gets the share of it that it would take alone; the launches go to the first. None of its tasks is a GEMM, so the
// peak is the vector one.
void time_fused_kernel(const std::vector<TaskId>& members, const TaskGraph& g, const Device& device,
                       const std::vector<BackwardWork>& backward, CostTable& table) {
  OpEfficiency eff{1, 1};
  double flops = 0, bytes = 0, backward_flops = 0, backward_bytes = 0, alone_forward = 0, alone_backward = 0;
  int backward_kernels = 0;
  std::vector<double> forward_share, backward_share;
  for (TaskId t : members) {
    const OpEfficiency own = default_efficiency(op_class(g.task(t)), device);
    eff.compute = std::min(eff.compute, own.compute);
    eff.memory = std::min(eff.memory, own.memory);
    const TaskCost& c = table.tasks[t.value()];
    flops += c.flops;
    bytes += c.bytes_accessed;
    backward_flops += c.backward_flops;
    backward_bytes += c.backward_bytes;
    backward_kernels = std::max(backward_kernels, backward[t.value()].kernels);
    forward_share.push_back(roofline_time(c.flops, c.bytes_accessed, device.peak_fp32_flops, device.memory_bandwidth, own, 0));
    backward_share.push_back(roofline_time(c.backward_flops, c.backward_bytes, device.peak_fp32_flops,
                                           device.memory_bandwidth, own, 0));
    alone_forward += forward_share.back();
    alone_backward += backward_share.back();
  }
  const double forward_s = roofline_time(flops, bytes, device.peak_fp32_flops, device.memory_bandwidth, eff, 0);
  const double backward_s =
      roofline_time(backward_flops, backward_bytes, device.peak_fp32_flops, device.memory_bandwidth, eff, 0);
  for (size_t k = 0; k < members.size(); ++k) {
    TaskCost& c = table.tasks[members[k].value()];
    c.forward_s = alone_forward > 0 ? forward_s * (forward_share[k] / alone_forward) : 0.0;
    c.backward_s = alone_backward > 0 ? backward_s * (backward_share[k] / alone_backward) : 0.0;
  }
  for (TaskId t : members) table.tasks[t.value()].launches = 0;
  TaskCost& first = table.tasks[members.front().value()];
  first.forward_s += device.kernel_overhead_s;
  first.launches = 1;
  if (backward_flops > 0 || backward_bytes > 0) {
    first.backward_s += device.kernel_overhead_s * std::max(1, backward_kernels);
    first.launches += std::max(1, backward_kernels);
  }
}

}  // namespace

OpEfficiency default_efficiency(OpClass c, const Device& device) {
  // The measured cpu device: its probe's peaks are what its kernels sustain at best; streaming kernels reach ~80%
  // of the probed bandwidth, reductions and normalisations (two passes) ~60%, strided copies ~50%.
  // Datasheet devices (GPU presets, --cluster devices): one calibration, fit with fused kernels (profiler/fusion.h)
  // and materialised attention (AttentionKernel::kMaterialized, as those runs had it) against measured A100
  // iteration times (Narayanan et al. SC21 Table 1, Korthikanti et al. MLSys'23 Table 5; docs/cost-model.md §3,
  // bench/RESULTS.md): GEMMs sustain ~66.5% of the dense tensor peak and, where memory-bound (the attention's batched
  // products), ~65% of DRAM bandwidth; fused elementwise and copy kernels ~60%, norms, softmax and reductions ~35%.
  // Small kernels are governed by the per-kernel overhead, added on top (Device::kernel_overhead_s).
  const bool datasheet = !device.measured;
  switch (c) {
    case OpClass::kMatMul:
      return {datasheet ? 0.665 : 0.70, datasheet ? 0.65 : 0.80};
    case OpClass::kElementwise:
      return {0.50, datasheet ? 0.60 : 0.80};
    case OpClass::kNormalization:
    case OpClass::kSoftmax:
    case OpClass::kReduction:
      return {0.40, datasheet ? 0.35 : 0.60};
    case OpClass::kPool: return {0.40, 0.60};
    case OpClass::kDataMovement:
      return {0.50, datasheet ? 0.60 : 0.50};
    case OpClass::kView: return {1.0, 1.0};
    case OpClass::kOpaque: return {0.30, 0.50};
  }
  return {0.5, 0.5};
}

void CostOptions::validate() const {
  if (microbatch_size < 0) throw InvalidArgument("micro-batch size must be positive (got " + std::to_string(microbatch_size) + ")");
  if (reference_batch < 1) throw InvalidArgument("reference batch must be positive (got " + std::to_string(reference_batch) + ")");
}

double roofline_time(double flops, double bytes, double peak_flops, double bandwidth, OpEfficiency eff,
                     double overhead_s) {
  if (flops <= 0 && bytes <= 0) return 0;
  const double compute = flops > 0 ? flops / (peak_flops * eff.compute) : 0.0;
  const double memory = bytes > 0 ? bytes / (bandwidth * eff.memory) : 0.0;
  return std::max(compute, memory) + overhead_s;
}

std::vector<bool> values_requiring_grad(const TaskGraph& g) {
  std::vector<bool> grad(g.num_values(), false);
  for (size_t i = 0; i < g.num_values(); ++i) {
    const Value& v = g.values()[i];
    grad[i] = v.kind == ValueKind::kParam && is_floating(v.dtype);
  }
  for (const Task& t : g.tasks()) {  // topological order
    if (t.constant || has_no_gradient(t.op_type)) continue;
    bool any = false;
    for (ValueId in : t.inputs) any |= in.valid() && grad[in.value()];
    if (!any) continue;
    for (ValueId out : t.outputs)
      if (out.valid() && is_floating(g.value(out).dtype)) grad[out.value()] = true;
  }
  return grad;
}

BackwardWork backward_work(const TaskGraph& g, TaskId t, const OpWork& forward, const std::vector<bool>& grad) {
  const Task& task = g.task(t);
  TaskView v{g, task, grad};
  const OpClass cls = op_class(task);
  if (task.constant || cls == OpClass::kView || !v.any_grad()) return {};
  BackwardWork b;
  if (cls == OpClass::kMatMul) b = matmul_backward(v, forward);
  else if (cls == OpClass::kElementwise) b = elementwise_backward(v, forward);
  else b = other_backward(v, forward, cls);
  return b;
}

CostTable estimate_costs(const TaskGraph& g, const Device& device, const CostOptions& options) {
  options.validate();
  const int64_t reference = options.reference_batch;
  const int64_t microbatch = options.microbatch_size > 0 ? options.microbatch_size : reference;
  const double scale = static_cast<double>(microbatch) / static_cast<double>(reference);
  // Mixed precision keeps fp32 activations in fp16/bf16: half the bytes moved and saved.
  const double byte_factor = activation_bytes_factor(options.precision);  // also applied to whole-kernel traffic
  auto act_bytes = [&](const Value& v) {
    const double b = v.shape_known ? static_cast<double>(v.bytes) : 0.0;
    return v.dtype == DType::kFloat32 ? b * byte_factor : b;
  };

  CostTable table;
  table.device = device.name;
  table.microbatch_size = microbatch;
  table.source = "analytic";
  table.precision = std::string(precision_name(options.precision));
  table.tasks.resize(g.num_tasks());

  const std::vector<bool> grad = values_requiring_grad(g);
  std::vector<bool> saved_counted(g.num_values(), false);
  std::map<std::string, int> opaque_ops, unknown_shape_ops;

  // Each task's work at the graph's bound shapes; on a fusing device, less the traffic its fused kernel does not do.
  const uint32_t n = static_cast<uint32_t>(g.num_tasks());
  std::vector<OpWork> forward(n);
  std::vector<BackwardWork> backward(n);
  for (uint32_t i = 0; i < n; ++i) {
    forward[i] = forward_work(g, TaskId(i));
    if (!g.task(TaskId(i)).constant) backward[i] = backward_work(g, TaskId(i), forward[i], grad);
  }
  // Each attention as the one flash kernel the runtime runs (profiler/attention_pattern.h): its work on the task it
  // replaces last (MatMul(P, V)), none on the others, whose seq × seq outputs never exist. Materialised attention
  // (AttentionKernel::kMaterialized) keeps the chain op by op, as the backward rules price it.
  const std::vector<AttentionMatch> attention =
      options.attention == AttentionKernel::kFused ? find_attention(g) : std::vector<AttentionMatch>{};
  const std::vector<bool> in_attention = attention_tasks(g, attention);
  std::vector<int> forward_launches(n, 1);
  std::vector<bool> attention_last(n, false);
  std::vector<double> attention_gradient_bytes(n, 0.0);  // per last task: the gradients of Q, K, V it writes
  for (const AttentionMatch& m : attention) {
    for (TaskId t : m.tasks) forward[t.value()] = {}, backward[t.value()] = {};
    FusedAttentionWork w = fused_attention_work(g, m, grad);
    const uint32_t last = m.last.value();
    forward[last] = w.forward;
    backward[last] = std::move(w.backward);
    forward_launches[last] = w.forward_launches;
    attention_last[last] = true;
    for (ValueId x : {m.q, m.k_transposed, m.v})
      if (grad[x.value()] && is_batch_value(g.value(x))) attention_gradient_bytes[last] += act_bytes(g.value(x));
  }
  const FusionGroups fusion = device.fuses_elementwise ? find_fusion_groups(g, options.attention) : FusionGroups{};
  if (device.fuses_elementwise) remove_fused_traffic(g, fusion, grad, forward, backward);

  for (uint32_t i = 0; i < n; ++i) {
    const TaskId id(i);
    const Task& task = g.task(id);
    TaskCost& c = table.tasks[i];
    const OpWork& fw = forward[i];
    const OpClass cls = op_class(task);
    c.known = fw.known;
    if (cls == OpClass::kOpaque) ++opaque_ops[task.domain.empty() ? task.op_type : task.domain + "::" + task.op_type];
    else if (!fw.known) ++unknown_shape_ops[task.op_type];

    // Param bytes read (kept by constant tasks too: the partitioner places their params).
    std::vector<ValueId> seen;
    for (ValueId in : task.inputs) {
      if (!in.valid() || std::find(seen.begin(), seen.end(), in) != seen.end()) continue;
      seen.push_back(in);
      const Value& v = g.value(in);
      if (v.kind == ValueKind::kParam && v.shape_known) c.param_bytes += v.bytes;
    }
    const bool fused_last = attention_last[i];
    if (in_attention[i] && !fused_last) continue;  // inside a flash kernel: its output never exists
    double out_bytes = 0;
    for (ValueId out : task.outputs)
      if (out.valid()) out_bytes += act_bytes(g.value(out));
    c.output_bytes = std::llround(task.constant ? out_bytes : out_bytes * scale);
    if (task.constant) continue;  // costs nothing per step

    // Forward: FLOPs scale with the batch; bytes from params/constants do not.
    const double fwd_flops = fw.flops * scale;
    const double fixed = std::min(fw.fixed_bytes_read, fw.bytes_read);
    const double fwd_bytes = byte_factor * (fixed + (fw.bytes_read - fixed + fw.bytes_written) * scale);
    c.flops = fwd_flops;
    c.bytes_accessed = fwd_bytes;
    const OpEfficiency eff = default_efficiency(cls, device);
    const double peak = cls == OpClass::kMatMul ? device.matmul_peak(options.precision) : device.peak_fp32_flops;
    const double overhead = cls == OpClass::kView ? 0.0 : device.kernel_overhead_s * forward_launches[i];
    c.forward_s = roofline_time(fwd_flops, fwd_bytes, peak, device.memory_bandwidth, eff, overhead);
    c.launches = cls == OpClass::kView ? 0 : forward_launches[i];

    // Backward.
    const BackwardWork& bw = backward[i];
    c.backward_flops = bw.flops * scale;
    // Backward traffic is mostly activations and their gradients; weight reads are a small share.
    c.backward_bytes = byte_factor * bw.bytes * scale;
    if (bw.flops > 0 || bw.bytes > 0) {
      const double t = roofline_time(c.backward_flops, c.backward_bytes, peak, device.memory_bandwidth, eff, 0.0);
      c.backward_s = t + device.kernel_overhead_s * std::max(1, bw.kernels);
      c.launches += std::max(1, bw.kernels);
    }

    // Saved for backward: each value once, at the first task that saves it.
    double saved = bw.extra_saved_bytes;
    for (ValueId s : bw.saved) {
      if (saved_counted[s.value()]) continue;
      saved_counted[s.value()] = true;
      saved += act_bytes(g.value(s));
    }
    c.saved_bytes = std::llround(saved * scale);

    // Working set: forward outputs, or backward's output gradients plus its input gradients.
    double grads = out_bytes + attention_gradient_bytes[i];
    for (ValueId in : task.inputs)
      if (!fused_last && in.valid() && grad[in.value()] && is_batch_value(g.value(in))) grads += act_bytes(g.value(in));
    c.workspace_bytes = std::llround(std::max(out_bytes, bw.flops > 0 || bw.bytes > 0 ? grads : 0.0) * scale);
  }
  for (const auto& members : fusion.groups) time_fused_kernel(members, g, device, backward, table);

  auto list = [](const std::map<std::string, int>& m) {
    std::string s;
    for (const auto& [op, n] : m) s += (s.empty() ? "" : ", ") + op + " ×" + std::to_string(n);
    return s;
  };
  if (!opaque_ops.empty())
    table.warnings.push_back("ops unknown to the cost model, estimated by the opaque fallback (1 FLOP per output "
                             "element, inputs read and outputs written once, backward 2× forward): " + list(opaque_ops));
  if (!unknown_shape_ops.empty())
    table.warnings.push_back("tasks with unknown shapes, costed from the shapes that are known: " + list(unknown_shape_ops));
  return table;
}

StepPrice price_training_step(const TaskGraph& g, const Device& device, Precision precision) {
  const uint32_t n = static_cast<uint32_t>(g.num_tasks());
  const std::vector<bool> run = tasks_run_each_step(g);
  const FusionGroups fusion = device.fuses_elementwise ? find_fusion_groups(g) : FusionGroups{};
  const std::vector<OpWork> work = step_work(g, fusion, run);
  const double factor = activation_bytes_factor(precision);
  StepPrice price;
  for (uint32_t i = 0; i < n; ++i) {
    if (!run[i]) continue;
    price.launches += launches_kernel(g, fusion, run, TaskId(i)) ? 1 : 0;
    price.bytes += factor * (work[i].bytes_read + work[i].bytes_written);
    price.flops += work[i].flops;
  }
  return price;
}

StepPrice price_planned_step(const TaskGraph& g, const CostTable& table) {
  APART_CHECK(table.tasks.size() == g.num_tasks(), "cost table does not match the graph");
  StepPrice price;
  for (uint32_t i = 0; i < g.num_tasks(); ++i) {
    const TaskCost& c = table.tasks[i];
    price.launches += c.launches;
    price.bytes += c.bytes_accessed + c.backward_bytes;
    price.flops += c.flops + c.backward_flops;
  }
  return price;
}

CostTable rescale_costs(const CostTable& table, const TaskGraph& g, int64_t microbatch_size) {
  if (microbatch_size <= 0) throw InvalidArgument("micro-batch size must be positive");
  APART_CHECK(table.tasks.size() == g.num_tasks(), "cost table does not match the graph");
  APART_CHECK(table.microbatch_size > 0, "cost table without a micro-batch size");
  CostTable out = table;
  out.microbatch_size = microbatch_size;
  const double s = static_cast<double>(microbatch_size) / static_cast<double>(table.microbatch_size);
  for (uint32_t i = 0; i < g.num_tasks(); ++i) {
    if (g.task(TaskId(i)).constant) continue;
    TaskCost& c = out.tasks[i];
    c.flops *= s;
    c.bytes_accessed *= s;
    c.forward_s *= s;
    c.backward_s *= s;
    c.backward_flops *= s;
    c.backward_bytes *= s;
    c.saved_bytes = std::llround(static_cast<double>(c.saved_bytes) * s);
    c.output_bytes = std::llround(static_cast<double>(c.output_bytes) * s);
    c.workspace_bytes = std::llround(static_cast<double>(c.workspace_bytes) * s);
  }
  return out;
}

}  // namespace apart
