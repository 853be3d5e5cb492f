// Forward FLOPs and bytes per ONNX op; the counting conventions are in docs/cost-model.md §1.
#include "profiler/op_work.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>

#include "graph/dtype.h"
#include "graph/flash_tiles.h"

namespace apart {
namespace {

bool is_onnx_domain(const std::string& d) { return d.empty() || d == "ai.onnx" || d == "com.microsoft"; }

// FLOPs per output element of elementwise ops. Every arithmetic op counts 1, whatever its hardware
// cost (Exp, Erf, Pow, Tanh count 1 like Add): FLOPs stay comparable with published counts, and
// these kernels are memory-bound, so the roofline's byte term dominates their time anyway.
const std::unordered_map<std::string, double>& elementwise_flops() {
  static const std::unordered_map<std::string, double> table = [] {
    std::unordered_map<std::string, double> m;
    for (const char* op :
         {"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Abs", "Relu", "LeakyRelu", "PRelu",
          "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh",
          "Asinh", "Acosh", "Atanh", "Floor", "Ceil", "Round", "Sign", "Clip", "Elu", "Selu", "Celu", "Softplus",
          "Softsign", "HardSigmoid", "HardSwish", "Mish", "ThresholdedRelu", "Shrink", "Gelu", "FastGelu",
          "BiasGelu", "QuickGelu", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And",
          "Or", "Xor", "Mod", "Where", "IsNaN", "IsInf", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
          "BitwiseNot", "Dropout", "Bernoulli", "RandomNormalLike", "RandomUniformLike", "RandomNormal",
          "RandomUniform", "Max", "Min", "Sum", "Mean", "DequantizeLinear", "QuantizeLinear"})
      m.emplace(op, 1.0);
    m["RotaryEmbedding"] = 3;  // per output element: two products and a sum (the dims past rotary_embedding_dim copied)
    m["Cast"] = 0;  // conversion only: bytes, no arithmetic
    m["CastLike"] = 0;
    m["DequantizeLinear"] = 2;  // (x - zero_point) * scale
    m["QuantizeLinear"] = 2;
    return m;
  }();
  return table;
}

const std::unordered_map<std::string, OpClass>& class_table() {
  static const std::unordered_map<std::string, OpClass> table = [] {
    std::unordered_map<std::string, OpClass> m;
    for (const char* op : {"MatMul", "Gemm", "Einsum", "Conv", "ConvTranspose", "LSTM", "GRU", "RNN", "FusedMatMul",
                           "Attention"})
      m[op] = OpClass::kMatMul;
    for (const auto& [op, f] : elementwise_flops()) m[op] = OpClass::kElementwise;
    for (const char* op : {"BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization",
                           "MeanVarianceNormalization", "LRN", "SimplifiedLayerNormalization", "RMSNormalization",
                           "SkipLayerNormalization", "LpNormalization"})
      m[op] = OpClass::kNormalization;
    for (const char* op : {"Softmax", "LogSoftmax", "Hardmax", "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"})
      m[op] = OpClass::kSoftmax;
    for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin",
                           "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "CumSum", "TopK"})
      m[op] = OpClass::kReduction;
    for (const char* op : {"MaxPool", "AveragePool", "LpPool", "MaxRoiPool", "RoiAlign", "MaxUnpool"}) m[op] = OpClass::kPool;
    for (const char* op : {"Transpose", "Concat", "Split", "Slice", "Pad", "Expand", "Tile", "Gather", "GatherElements",
                           "GatherND", "ScatterND", "ScatterElements", "Scatter", "DepthToSpace", "SpaceToDepth",
                           "Resize", "Upsample", "OneHot", "Trilu", "ReverseSequence", "Compress", "NonZero",
                           "ConstantOfShape", "Range", "EyeLike", "Unique", "CenterCropPad", "Col2Im"})
      m[op] = OpClass::kDataMovement;
    for (const char* op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Shape", "Size", "Constant"})
      m[op] = OpClass::kView;
    return m;
  }();
  return table;
}

// Reads the task's operands defensively: an input/output may be absent (optional) or unshaped.
struct Operands {
  const TaskGraph& g;
  const Task& task;
  const Value* in(size_t i) const {
    if (i >= task.inputs.size() || !task.inputs[i].valid()) return nullptr;
    return &g.value(task.inputs[i]);
  }
  const Value* out(size_t i) const {
    if (i >= task.outputs.size() || !task.outputs[i].valid()) return nullptr;
    return &g.value(task.outputs[i]);
  }
  static bool shaped(const Value* v) { return v && v->shape_known; }
  static double elems(const Value* v) { return shaped(v) ? static_cast<double>(v->elements) : 0.0; }
  static double nbytes(const Value* v) { return shaped(v) ? static_cast<double>(v->bytes) : 0.0; }
};

double product(std::span<const int64_t> dims, size_t from = 0) {
  double p = 1;
  for (size_t i = from; i < dims.size(); ++i) p *= static_cast<double>(dims[i]);
  return p;
}

bool is_fixed(const Value& v) { return v.kind == ValueKind::kParam || v.kind == ValueKind::kConstant; }

// Default byte traffic: every present input read once, every output written once.
void count_all_bytes(const Operands& o, OpWork& w) {
  for (ValueId id : o.task.inputs) {
    if (!id.valid()) continue;
    const Value& v = o.g.value(id);
    if (!v.shape_known) {
      w.known = false;
      continue;
    }
    w.bytes_read += static_cast<double>(v.bytes);
    if (is_fixed(v)) w.fixed_bytes_read += static_cast<double>(v.bytes);
  }
  for (ValueId id : o.task.outputs) {
    if (!id.valid()) continue;
    const Value& v = o.g.value(id);
    if (!v.shape_known) {
      w.known = false;
      continue;
    }
    w.bytes_written += static_cast<double>(v.bytes);
  }
}

// Largest element count among the inputs: the broadcast output size when the output is unshaped.
double max_input_elems(const Operands& o) {
  double m = 0;
  for (size_t i = 0; i < o.task.inputs.size(); ++i) m = std::max(m, Operands::elems(o.in(i)));
  return m;
}

// Output elements, or the broadcast estimate (marking the work unknown) when the output is unshaped.
double output_elems(const Operands& o, OpWork& w) {
  if (Operands::shaped(o.out(0))) return Operands::elems(o.out(0));
  w.known = false;
  return max_input_elems(o);
}

// MatMul with numpy semantics: rank-1 operands are promoted, batch dims broadcast.
double matmul_flops(const Operands& o, OpWork& w) {
  const Value* a = o.in(0);
  const Value* b = o.in(1);
  if (!Operands::shaped(a) || !Operands::shaped(b) || a->shape.empty() || b->shape.empty()) {
    w.known = false;
    return 0;
  }
  std::vector<int64_t> as = a->shape, bs = b->shape;
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  const double m = static_cast<double>(as[as.size() - 2]);
  const double k = static_cast<double>(as.back());
  const double n = static_cast<double>(bs.back());
  const size_t batch_rank = std::max(as.size(), bs.size()) - 2;
  double batch = 1;
  for (size_t i = 0; i < batch_rank; ++i) {
    // Align from the right; a missing dim is 1.
    const int64_t ai = static_cast<int64_t>(as.size()) - 2 - static_cast<int64_t>(batch_rank) + static_cast<int64_t>(i);
    const int64_t bi = static_cast<int64_t>(bs.size()) - 2 - static_cast<int64_t>(batch_rank) + static_cast<int64_t>(i);
    const int64_t ad = ai >= 0 ? as[static_cast<size_t>(ai)] : 1;
    const int64_t bd = bi >= 0 ? bs[static_cast<size_t>(bi)] : 1;
    batch *= static_cast<double>(std::max(ad, bd));
  }
  return 2.0 * batch * m * n * k;
}

double gemm_flops(const Operands& o, OpWork& w) {
  const Value* a = o.in(0);
  const Value* b = o.in(1);
  if (!Operands::shaped(a) || !Operands::shaped(b) || a->shape.size() != 2 || b->shape.size() != 2) {
    w.known = false;
    return 0;
  }
  const bool trans_a = o.task.attr_int("transA", 0) != 0;
  const bool trans_b = o.task.attr_int("transB", 0) != 0;
  const double m = static_cast<double>(trans_a ? a->shape[1] : a->shape[0]);
  const double k = static_cast<double>(trans_a ? a->shape[0] : a->shape[1]);
  const double n = static_cast<double>(trans_b ? b->shape[0] : b->shape[1]);
  // alpha·A·B + beta·C: the multiply-adds, plus one add per output element when C is given.
  return 2.0 * m * n * k + (o.in(2) ? m * n : 0.0);
}

double conv_flops(const Operands& o, OpWork& w) {
  const Value* wt = o.in(1);
  const Value* y = o.out(0);
  if (!Operands::shaped(wt) || !Operands::shaped(y) || wt->shape.size() < 2) {
    w.known = false;
    return 0;
  }
  // W is [C_out, C_in / group, k…]: each output element is a dot product of C_in/group · Πk terms.
  const double per_output = static_cast<double>(wt->shape[1]) * product(wt->shape, 2);
  const double out = Operands::elems(y);
  return 2.0 * out * per_output + (o.in(2) ? out : 0.0);
}

double conv_transpose_flops(const Operands& o, OpWork& w) {
  const Value* x = o.in(0);
  const Value* wt = o.in(1);
  if (!Operands::shaped(x) || !Operands::shaped(wt) || wt->shape.size() < 2) {
    w.known = false;
    return 0;
  }
  // W is [C_in, C_out / group, k…]: each input element scatters into C_out/group · Πk outputs.
  const double per_input = static_cast<double>(wt->shape[1]) * product(wt->shape, 2);
  double flops = 2.0 * Operands::elems(x) * per_input;
  if (o.in(2)) {
    if (Operands::shaped(o.out(0))) flops += Operands::elems(o.out(0));
    else w.known = false;
  }
  return flops;
}

// Attention-23 as one fused (flash) kernel, of OpClass::kMatMul (tensor-core work): attention_forward_flops; its
// bytes are Q, K, V, the mask and Y: no S × L tensor is ever written (the default byte count of its operands is
// exactly that). `first`: the index of Q among the inputs (1 for ai.apart.AttentionGrad, whose input 0 is dY).
double attention_flops(const Operands& o, OpWork& w, size_t first = 0) {
  const Value* q = o.in(first);
  const Value* k = o.in(first + 1);
  const Value* v = o.in(first + 2);
  if (!Operands::shaped(q) || !Operands::shaped(k) || !Operands::shaped(v) || q->shape.size() != k->shape.size() ||
      (q->shape.size() != 3 && q->shape.size() != 4)) {
    w.known = false;
    return 0;
  }
  // 4-D: [B, H, S, D]; 3-D: [B, S, H·D] with q_num_heads and kv_num_heads.
  const bool four = q->shape.size() == 4;
  const int64_t q_heads = four ? q->shape[1] : std::max<int64_t>(1, o.task.attr_int("q_num_heads", 1));
  const int64_t kv_heads = four ? k->shape[1] : std::max<int64_t>(1, o.task.attr_int("kv_num_heads", 1));
  const int64_t q_seq = four ? q->shape[2] : q->shape[1], kv_seq = four ? k->shape[2] : k->shape[1];
  const int64_t head = four ? q->shape[3] : q->shape[2] / q_heads;
  const int64_t v_head = four ? v->shape[3] : v->shape[2] / kv_heads;
  return attention_forward_flops(q->shape[0], q_heads, q_seq, kv_seq, head, v_head,
                                 o.task.attr_int("is_causal", 0) != 0);
}

// Recurrent layers: per step and direction, gates · (input + hidden) multiply-adds plus gate math.
double recurrent_flops(const Operands& o, OpWork& w, double gates) {
  const Value* x = o.in(0);
  const Value* r = o.in(2);
  if (!Operands::shaped(x) || !Operands::shaped(r) || x->shape.size() != 3 || r->shape.size() != 3) {
    w.known = false;
    return 0;
  }
  const double seq = static_cast<double>(x->shape[0]), batch = static_cast<double>(x->shape[1]);
  const double input = static_cast<double>(x->shape[2]);
  const double dirs = static_cast<double>(r->shape[0]), hidden = static_cast<double>(r->shape[2]);
  return dirs * seq * batch * (2.0 * gates * hidden * (input + hidden) + 3.0 * gates * hidden);
}

// Einsum: every combination of the distinct indices does (operands − 1) multiplies and one add.
double einsum_flops(const Operands& o, OpWork& w) {
  const std::string eq = o.task.attr_string("equation", "");
  const std::string lhs = eq.substr(0, eq.find("->"));
  std::unordered_map<char, int64_t> size_of;
  size_t operand = 0, start = 0;
  while (start <= lhs.size()) {
    size_t end = lhs.find(',', start);
    if (end == std::string::npos) end = lhs.size();
    std::string term;
    for (size_t i = start; i < end; ++i)
      if (lhs[i] != ' ') term += lhs[i];
    const Value* v = o.in(operand);
    if (!Operands::shaped(v)) {
      w.known = false;
      return 0;
    }
    const size_t ell = term.find("...");
    const int64_t letters = static_cast<int64_t>(term.size()) - (ell == std::string::npos ? 0 : 3);
    const int64_t ell_rank = static_cast<int64_t>(v->shape.size()) - letters;
    if (ell_rank < 0 || (ell == std::string::npos && ell_rank != 0)) {
      w.known = false;
      return 0;
    }
    size_t axis = 0;
    for (size_t i = 0; i < term.size(); ++i) {
      if (ell != std::string::npos && i == ell) {
        // Ellipsis dims, aligned from the right, named by unprintable pseudo-letters.
        for (int64_t e = 0; e < ell_rank; ++e) {
          auto& s = size_of[static_cast<char>(1 + (ell_rank - 1 - e))];
          s = std::max(s, v->shape[axis++]);
        }
        i += 2;
        continue;
      }
      auto& s = size_of[term[i]];
      s = std::max(s, v->shape[axis++]);
    }
    ++operand;
    start = end + 1;
  }
  double combos = 1;
  for (const auto& [letter, size] : size_of) combos *= static_cast<double>(size);
  return combos * static_cast<double>(std::max<size_t>(operand, 1));
}

}  // namespace

std::string_view op_class_name(OpClass c) {
  switch (c) {
    case OpClass::kMatMul: return "matmul";
    case OpClass::kElementwise: return "elementwise";
    case OpClass::kNormalization: return "normalization";
    case OpClass::kSoftmax: return "softmax";
    case OpClass::kReduction: return "reduction";
    case OpClass::kPool: return "pool";
    case OpClass::kDataMovement: return "data-movement";
    case OpClass::kView: return "view";
    case OpClass::kOpaque: return "opaque";
  }
  return "opaque";
}

OpClass op_class(const Task& task) {
  // apart's fused attention (codegen/attention_fusion.h) and its gradient op: GEMM work, no S × L tensor.
  if (task.domain == "ai.apart" && (task.op_type == "Attention" || task.op_type == "AttentionGrad"))
    return OpClass::kMatMul;
  // The normalisations' gradient ops (runtime/cpu/norm_grad.cpp): one kernel each.
  if (task.domain == "ai.apart" && (task.op_type == "LayerNormalizationGrad" || task.op_type == "RMSNormalizationGrad"))
    return OpClass::kNormalization;
  if (task.opaque || !is_onnx_domain(task.domain)) return OpClass::kOpaque;
  const auto& table = class_table();
  auto it = table.find(task.op_type);
  return it == table.end() ? OpClass::kOpaque : it->second;
}

bool has_cost_rule(std::string_view op_type) { return class_table().count(std::string(op_type)) > 0; }

double attention_forward_flops(int64_t batch, int64_t q_heads, int64_t q_seq, int64_t kv_seq, int64_t head,
                               int64_t v_head, bool causal) {
  const double pairs = flash_pairs(q_seq, kv_seq, std::max(head, v_head), causal);
  return 2.0 * static_cast<double>(batch) * static_cast<double>(q_heads) * pairs * static_cast<double>(head + v_head);
}

OpWork forward_work(const TaskGraph& g, TaskId t) {
  const Task& task = g.task(t);
  const Operands o{g, task};
  const std::string& op = task.op_type;
  OpWork w;
  const OpClass cls = op_class(task);

  switch (cls) {
    case OpClass::kView:
      // Metadata only (Reshape, Squeeze…), or data fixed at import (Constant, Shape): no kernel runs.
      return w;

    case OpClass::kOpaque: {
      // Fallback: one FLOP per output element and every input read, every output written once.
      count_all_bytes(o, w);
      w.flops = output_elems(o, w);
      w.known = false;
      return w;
    }

    case OpClass::kMatMul:
      count_all_bytes(o, w);
      if (op == "MatMul" || op == "FusedMatMul") w.flops = matmul_flops(o, w);
      else if (op == "Gemm") w.flops = gemm_flops(o, w);
      else if (op == "Conv") w.flops = conv_flops(o, w);
      else if (op == "ConvTranspose") w.flops = conv_transpose_flops(o, w);
      else if (op == "Einsum") w.flops = einsum_flops(o, w);
      else if (op == "Attention")
        w.flops = attention_flops(o, w);
      else if (op == "AttentionGrad")
        w.flops = kAttentionGradFlopsFactor * attention_flops(o, w, 1);
      else if (op == "LSTM") w.flops = recurrent_flops(o, w, 4);
      else if (op == "GRU") w.flops = recurrent_flops(o, w, 3);
      else if (op == "RNN") w.flops = recurrent_flops(o, w, 1);
      return w;

    case OpClass::kElementwise: {
      count_all_bytes(o, w);
      double per = elementwise_flops().at(op);
      // Variadic Max/Min/Sum: n−1 binary ops per output element; Mean adds the division.
      if (op == "Max" || op == "Min" || op == "Sum" || op == "Mean") {
        size_t n = 0;
        for (ValueId id : task.inputs) n += id.valid() ? 1 : 0;
        per = static_cast<double>(n > 0 ? n - 1 : 0) + (op == "Mean" ? 1.0 : 0.0);
      }
      w.flops = per * output_elems(o, w);
      return w;
    }

    case OpClass::kNormalization: {
      count_all_bytes(o, w);
      const double n = Operands::shaped(o.in(0)) ? Operands::elems(o.in(0)) : output_elems(o, w);
      if (!Operands::shaped(o.in(0))) w.known = false;
      // Training-mode statistics: mean (1), variance (3: sub, mul, add), normalise (2), affine (2). A gradient op
      // (whose input 0, dY, has X's shape): kNormGradientFlopsFactor × its forward's.
      double per = 8;
      if (op == "MeanVarianceNormalization") per = 6;
      else if (op == "SimplifiedLayerNormalization" || op == "RMSNormalization") per = 5;
      else if (op == "LayerNormalizationGrad")
        per = kNormGradientFlopsFactor * 8;
      else if (op == "RMSNormalizationGrad")
        per = kNormGradientFlopsFactor * 5;
      else if (op == "SkipLayerNormalization") per = 9;  // the residual add, then LayerNorm
      else if (op == "LpNormalization") per = 3;
      else if (op == "LRN") per = 2.0 * static_cast<double>(task.attr_int("size", 1)) + 3;
      w.flops = per * n;
      return w;
    }

    case OpClass::kSoftmax: {
      count_all_bytes(o, w);
      const double n = Operands::shaped(o.in(0)) ? Operands::elems(o.in(0)) : output_elems(o, w);
      if (!Operands::shaped(o.in(0))) w.known = false;
      // max (1), subtract (1), exp (1), sum (1), divide or log (1).
      double per = 5;
      if (op == "Hardmax") per = 1;
      else if (op == "SoftmaxCrossEntropyLoss") per = 6;
      else if (op == "NegativeLogLikelihoodLoss") per = 0;
      w.flops = per * n;
      if (op == "NegativeLogLikelihoodLoss") w.flops = output_elems(o, w);
      return w;
    }

    case OpClass::kReduction: {
      count_all_bytes(o, w);
      if (!Operands::shaped(o.in(0))) {
        w.known = false;
        return w;
      }
      const double n = Operands::elems(o.in(0));
      // One op per input element; squares and exps add one more; Mean divides each output once.
      double flops = n;
      if (op == "ReduceSumSquare" || op == "ReduceL2" || op == "ReduceLogSumExp" || op == "GlobalLpPool") flops = 2 * n;
      if (op == "ReduceMean") flops = n + output_elems(o, w);
      if (op == "GlobalAveragePool") flops = n + output_elems(o, w);
      if (op == "TopK") {
        const Value* k = o.in(1);
        const double kk = k && k->known_ints && !k->known_ints->empty() ? static_cast<double>((*k->known_ints)[0]) : 1.0;
        flops = n * std::max(1.0, std::ceil(std::log2(kk + 1)));
      }
      w.flops = flops;
      return w;
    }

    case OpClass::kPool: {
      count_all_bytes(o, w);
      const std::vector<int64_t> kernel = task.attr_ints("kernel_shape");
      const double window = product(kernel);
      // One op per window element per output (compare or add); LpPool adds the power.
      w.flops = output_elems(o, w) * window * (op == "LpPool" ? 2.0 : 1.0);
      if (op == "AveragePool") w.flops += output_elems(o, w);  // the division
      if (kernel.empty() && (op == "MaxPool" || op == "AveragePool" || op == "LpPool")) w.known = false;
      return w;
    }

    case OpClass::kDataMovement: {
      // A copy: reads what it writes (only the selected elements for Gather/Slice), no arithmetic.
      const Value* y = o.out(0);
      if (op == "Gather" || op == "GatherElements" || op == "GatherND" || op == "Slice" || op == "Compress" ||
          op == "OneHot") {
        for (size_t i = 1; i < task.inputs.size(); ++i) {
          const Value* v = o.in(i);
          if (!v) continue;
          if (!v->shape_known) w.known = false;
          w.bytes_read += Operands::nbytes(v);
          if (is_fixed(*v)) w.fixed_bytes_read += Operands::nbytes(v);
        }
        for (ValueId id : task.outputs) {
          if (!id.valid()) continue;
          const Value& v = g.value(id);
          if (!v.shape_known) w.known = false;
          w.bytes_written += Operands::nbytes(&v);
        }
        if (op != "OneHot") w.bytes_read += Operands::nbytes(y);  // the gathered elements themselves
        return w;
      }
      if (op == "ConstantOfShape" || op == "Range" || op == "EyeLike") {
        if (!Operands::shaped(y)) w.known = false;
        w.bytes_written = Operands::nbytes(y);
        return w;
      }
      count_all_bytes(o, w);
      if (op == "ScatterND" || op == "ScatterElements" || op == "Scatter") {
        // The update is a copy of data plus one write per update element.
        const Value* upd = o.in(2);
        w.flops = 0;
        if (!Operands::shaped(upd)) w.known = false;
      } else if (op == "Resize" || op == "Upsample") {
        // Interpolation weights per output element: nearest 0, linear 4, cubic 16 (per 2-D window).
        const std::string mode = task.attr_string("mode", "nearest");
        const double per = mode == "nearest" ? 0.0 : (mode == "cubic" ? 16.0 : 4.0);
        w.flops = per * output_elems(o, w);
      }
      return w;
    }
  }
  return w;
}

}  // namespace apart
