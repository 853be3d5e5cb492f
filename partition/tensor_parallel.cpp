// Megatron-style tensor-parallel regions: split-state propagation over the task graph (rules in the header).
#include "partition/tensor_parallel.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <set>
#include <unordered_set>

#include "graph/error.h"

namespace apart {

std::string_view tp_closing_name(TpClosing c) {
  switch (c) {
    case TpClosing::kAllReduce: return "all-reduce";
    case TpClosing::kAllGather: return "all-gather";
    case TpClosing::kVocabParallelLoss: return "vocab-parallel-loss";
  }
  return "?";
}

size_t TensorParallelRegions::count(TpRegionKind kind) const {
  return static_cast<size_t>(std::count_if(regions.begin(), regions.end(), [&](const TpRegion& r) { return r.kind == kind; }));
}

std::string TensorParallelRegions::summary() const {
  std::vector<std::string> parts;
  auto counted = [&](TpRegionKind kind, const char* label) {
    const size_t n = count(kind);
    if (n > 0) parts.push_back(std::to_string(n) + " " + label);
  };
  counted(TpRegionKind::kAttention, "attention");
  counted(TpRegionKind::kMlp, "MLP");
  auto named = [&](TpRegionKind kind, const char* label) {
    const size_t n = count(kind);
    if (n == 0) return;
    std::string s = n == 1 ? std::string(label) : std::to_string(n) + " " + label + "s";
    const bool tied = std::any_of(regions.begin(), regions.end(), [&](const TpRegion& r) { return r.kind == kind && r.tied(); });
    if (tied && kind == TpRegionKind::kLmHead) s += " (tied)";
    parts.push_back(s);
  };
  named(TpRegionKind::kEmbedding, "embedding");
  named(TpRegionKind::kLmHead, "LM head");
  if (parts.empty()) return "none";
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out;
}

namespace {

enum class State : uint8_t { kReplicated, kSplit, kPartial };

struct ValueSplit {
  State state = State::kReplicated;
  int axis = -1;      // kSplit: the axis each rank holds a slice of
  bool free = false;  // kSplit: column order still ours to choose (see the header's Split/Slice rule)
  int seed = -1;      // kSplit/kPartial: the seed task whose region it belongs to (union-find element)
};

// ---- What the graph gives: params behind weights, linears, embeddings ----

// The param a weight operand is, directly or through constant Transpose/Identity/Cast tasks (tied heads); invalid
// when it is anything else.
ValueId param_behind(const TaskGraph& g, ValueId v) {
  for (int depth = 0; depth < 8 && v.valid(); ++depth) {
    const Value& value = g.value(v);
    if (value.kind == ValueKind::kParam) return v;
    if (value.kind != ValueKind::kConstant || !value.producer.valid()) return {};
    const Task& t = g.task(value.producer);
    if (!t.constant || !t.domain.empty() || (t.op_type != "Transpose" && t.op_type != "Identity" && t.op_type != "Cast"))
      return {};
    v = t.inputs.empty() ? ValueId() : t.inputs[0];
  }
  return {};
}

bool known_shape(const TaskGraph& g, ValueId v) { return v.valid() && g.value(v).shape_known; }

struct Linear {
  ValueId x;       // the activation
  ValueId weight;  // the operand as the op reads it ([in, out], or [out, in] with Gemm's transB)
  ValueId param;   // the param behind it
  int64_t in = 0, out = 0;
};

// A MatMul or Gemm of an activation by a param (the header's *linear*).
std::optional<Linear> as_linear(const TaskGraph& g, const Task& t) {
  if (!t.domain.empty() || t.inputs.size() < 2) return std::nullopt;
  const bool gemm = t.op_type == "Gemm";
  if (t.op_type != "MatMul" && !gemm) return std::nullopt;
  if (gemm && t.attr_int("transA", 0) != 0) return std::nullopt;
  Linear l{t.inputs[0], t.inputs[1], param_behind(g, t.inputs[1])};
  if (!l.param.valid() || !known_shape(g, l.x) || !known_shape(g, l.weight) || t.outputs.empty() ||
      !known_shape(g, t.outputs[0]))
    return std::nullopt;
  const Value& x = g.value(l.x);
  const Value& w = g.value(l.weight);
  if (x.kind == ValueKind::kParam || x.kind == ValueKind::kConstant || w.shape.size() != 2 || x.shape.size() < 2)
    return std::nullopt;
  const bool trans_b = gemm && t.attr_int("transB", 0) != 0;
  l.in = trans_b ? w.shape[1] : w.shape[0];
  l.out = trans_b ? w.shape[0] : w.shape[1];
  if (x.shape.back() != l.in) return std::nullopt;
  if (gemm && t.inputs.size() > 2 && t.inputs[2].valid()) {
    // C must be a bias over the output features: [out] or [1, out] (a per-row C would mix the split).
    if (!known_shape(g, t.inputs[2])) return std::nullopt;
    const auto& c = g.value(t.inputs[2]).shape;
    if (c.empty() || c.back() != l.out || (c.size() == 2 && c[0] != 1) || c.size() > 2) return std::nullopt;
  }
  return l;
}

// Gather(T [V, h] param, batch ids) along axis 0.
bool is_embedding(const TaskGraph& g, const Task& t) {
  if (t.op_type != "Gather" || !t.domain.empty() || t.inputs.size() != 2 || t.attr_int("axis", 0) != 0) return false;
  const Value& table = g.value(t.inputs[0]);
  if (table.kind != ValueKind::kParam || !table.shape_known || table.shape.size() != 2) return false;
  const Value& ids = g.value(t.inputs[1]);
  return ids.kind != ValueKind::kParam && ids.kind != ValueKind::kConstant && t.outputs.size() == 1 &&
         known_shape(g, t.outputs[0]);
}

// Selective recomputation's share of an attention region (Korthikanti et al., MLSys'23 §4.2): the tasks from the
// score MatMul through the context MatMul (the first and last MatMul over split heads), each both reached from the
// first and reaching the last: scale, mask, softmax and dropout, whose s²-sized outputs are what the core saves.
std::vector<TaskId> attention_core(const TaskGraph& graph, const std::vector<TaskId>& tasks,
                                   const std::vector<int64_t>& heads_of_task) {
  std::vector<TaskId> matmuls;
  for (TaskId t : tasks)
    if (heads_of_task[t.value()] > 0) matmuls.push_back(t);
  if (matmuls.size() < 2) return {};
  const TaskId first = matmuls.front(), last = matmuls.back();
  std::set<uint32_t> reached{first.value()}, reaching{last.value()};
  for (TaskId t : tasks)
    if (t.value() > first.value() && t.value() <= last.value())
      for (TaskId p : graph.predecessors(t))
        if (reached.count(p.value()) > 0) reached.insert(t.value());
  for (auto it = tasks.rbegin(); it != tasks.rend(); ++it)
    if (it->value() >= first.value() && it->value() < last.value())
      for (TaskId c : graph.successors(*it))
        if (reaching.count(c.value()) > 0) reaching.insert(it->value());
  std::vector<TaskId> core;
  for (TaskId t : tasks)
    if (reached.count(t.value()) > 0 && reaching.count(t.value()) > 0) core.push_back(t);
  return core;
}

// How many tasks read a param as a weight: constant chains (tied heads' Transpose) count their own readers.
size_t weight_readers(const TaskGraph& g, ValueId param) {
  size_t n = 0;
  for (TaskId c : g.consumers(param)) {
    const Task& t = g.task(c);
    if (t.constant && !t.outputs.empty() && t.outputs[0].valid()) n += weight_readers(g, t.outputs[0]);
    else ++n;
  }
  return n;
}

// Floating-point values that depend on a floating-point param: their gradient is needed, so reading them broadcast along the split
// axis would leave a partial gradient on every rank. (Integer initializers, such as Reshape's shapes, train nothing.)
std::vector<bool> needs_gradient(const TaskGraph& g) {
  std::vector<bool> needs(g.num_values(), false);
  for (size_t v = 0; v < g.num_values(); ++v)
    needs[v] = g.values()[v].kind == ValueKind::kParam && is_floating(g.values()[v].dtype);
  for (const Task& t : g.tasks()) {
    bool any = false;
    for (ValueId in : t.inputs) any = any || (in.valid() && needs[in.value()]);
    // No gradient flows into integer or boolean values (shapes, masks), whatever they were computed from.
    if (any)
      for (ValueId out : t.outputs)
        if (out.valid() && is_floating(g.value(out).dtype)) needs[out.value()] = true;
  }
  return needs;
}

int normalized_axis(int64_t axis, size_t rank) {
  const int64_t r = static_cast<int64_t>(rank);
  const int64_t a = axis < 0 ? axis + r : axis;
  return a >= 0 && a < r ? static_cast<int>(a) : -1;
}

// Integer contents of an optional input, or of the attribute older opsets use.
std::optional<std::vector<int64_t>> ints_of(const TaskGraph& g, const Task& t, size_t input, const char* attr) {
  if (input < t.inputs.size() && t.inputs[input].valid()) return g.value(t.inputs[input]).known_ints;
  if (const Attribute* a = t.attr(attr); a && a->type == Attribute::Type::kInts) return a->ints;
  return std::nullopt;
}

const std::set<std::string, std::less<>>& pointwise_ops() {
  static const std::set<std::string, std::less<>> ops = {
      "Abs",  "Add",     "Cast",     "Ceil",     "Clip",        "Cos",      "Div",       "Dropout", "Elu",
      "Erf",  "Exp",     "Floor",    "Gelu",     "HardSigmoid", "HardSwish", "Identity",  "LeakyRelu", "Log",
      "Max",  "Min",     "Mish",     "Mul",      "Neg",         "Pow",       "Reciprocal", "Relu",    "Round",
      "Selu", "Sigmoid", "Sign",     "Sin",      "Softplus",    "Softsign",  "Sqrt",      "Sub",     "Tanh",
      "Where"};
  return ops;
}

bool is_reshape_like(std::string_view op) {
  return op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze";
}

// The header's reshape rule: the output axis a contiguous chunk of input axis `axis` maps to, or -1.
int reshape_axis(const std::vector<int64_t>& in, const std::vector<int64_t>& out, int axis) {
  int64_t before = 1;
  for (int i = 0; i < axis; ++i) before *= in[static_cast<size_t>(i)];
  const int64_t d = in[static_cast<size_t>(axis)];
  int64_t prefix = 1;
  for (size_t j = 0; j < out.size(); ++j) {
    if (prefix == before && out[j] != 1) {
      if (out[j] > 0 && d > 0 && (d % out[j] == 0 || out[j] % d == 0)) return static_cast<int>(j);
      return -1;
    }
    prefix *= out[j];
    if (prefix > before) return -1;
  }
  return -1;
}

// A Slice's [start, end) along `axis` of a dim of size `dim` (step 1 only), or nullopt.
std::optional<std::pair<int64_t, int64_t>> slice_range(const TaskGraph& g, const Task& t, int axis, size_t rank, int64_t dim) {
  const auto starts = ints_of(g, t, 1, "starts");
  const auto ends = ints_of(g, t, 2, "ends");
  if (!starts || !ends || starts->size() != ends->size()) return std::nullopt;
  std::vector<int64_t> axes = ints_of(g, t, 3, "axes").value_or(std::vector<int64_t>{});
  if (axes.empty()) {
    axes.resize(starts->size());
    std::iota(axes.begin(), axes.end(), 0);
  }
  const auto steps = ints_of(g, t, 4, "steps");
  if (axes.size() != starts->size()) return std::nullopt;
  std::optional<std::pair<int64_t, int64_t>> range;
  for (size_t k = 0; k < axes.size(); ++k) {
    if (normalized_axis(axes[k], rank) != axis) continue;
    if (steps && k < steps->size() && (*steps)[k] != 1) return std::nullopt;
    auto clamp = [&](int64_t v) { return std::clamp(v < 0 ? v + dim : v, int64_t{0}, dim); };
    range = std::make_pair(clamp((*starts)[k]), clamp((*ends)[k]));
  }
  return range;
}

// ---- The pass ----

struct Pass {
  const TaskGraph& g;
  const std::vector<bool>& banned;  // seeds that failed in an earlier pass: replicated now
  const std::vector<bool>& grad;
  std::vector<ValueSplit> values;
  std::vector<int> parent;  // union-find over seed tasks
  std::vector<int> group_of_task;
  std::vector<TpRole> role;
  std::vector<bool> failed_seed;
  std::vector<std::vector<ValueId>> sliced;  // per task
  std::vector<int64_t> heads_of_task;        // per task: a score MatMul's heads
  std::vector<int64_t> kv_heads_of_task;     // per task: the kv heads a repeat_kv Expand (or a fused Attention) reads
  std::vector<bool> loss_task;

  Pass(const TaskGraph& graph, const std::vector<bool>& b, const std::vector<bool>& gr)
      : g(graph),
        banned(b),
        grad(gr),
        values(graph.num_values()),
        parent(graph.num_tasks()),
        group_of_task(graph.num_tasks(), -1),
        role(graph.num_tasks(), TpRole::kReplicated),
        failed_seed(graph.num_tasks(), false),
        sliced(graph.num_tasks()),
        heads_of_task(graph.num_tasks(), 0),
        kv_heads_of_task(graph.num_tasks(), 0),
        loss_task(graph.num_tasks(), false) {
    std::iota(parent.begin(), parent.end(), 0);
  }

  int find(int x) {
    while (parent[static_cast<size_t>(x)] != x) x = parent[static_cast<size_t>(x)] = parent[static_cast<size_t>(parent[static_cast<size_t>(x)])];
    return x;
  }
  int unite(int a, int b) {
    a = find(a);
    b = find(b);
    if (a == b) return a;
    if (b < a) std::swap(a, b);
    parent[static_cast<size_t>(b)] = a;  // the earlier seed stays the root: deterministic
    return a;
  }

  const ValueSplit& state(ValueId v) const {
    static const ValueSplit kReplicated;
    return v.valid() ? values[v.value()] : kReplicated;
  }
  bool split(ValueId v) const { return state(v).state == State::kSplit; }
  const std::vector<int64_t>& shape(ValueId v) const { return g.value(v).shape; }
  void set_split(ValueId v, int axis, bool free, int seed) {
    if (v.valid()) values[v.value()] = {State::kSplit, axis, free, seed};
  }

  void run() {
    for (size_t i = 0; i < g.num_tasks(); ++i) {
      const TaskId id(static_cast<uint32_t>(i));
      const Task& t = g.task(id);
      if (t.constant) continue;
      int group = -1;
      for (ValueId in : t.inputs)
        if (split(in)) group = group < 0 ? find(state(in).seed) : unite(group, state(in).seed);
      if (group < 0) {
        seed(id, t);
        continue;
      }
      group_of_task[i] = group;
      role[i] = TpRole::kFollowsSplit;
      if (!follow(id, t, group)) failed_seed[static_cast<size_t>(group)] = true;
    }
  }

  // A task with no split input: a column linear or an embedding starts a region, anything else stays replicated.
  void seed(TaskId id, const Task& t) {
    const size_t i = id.value();
    if (banned[i]) return;
    if (is_embedding(g, t)) {
      values[t.outputs[0].value()] = {State::kPartial, -1, false, static_cast<int>(i)};
      group_of_task[i] = static_cast<int>(i);
      role[i] = TpRole::kVocab;
      return;
    }
    if (as_linear(g, t)) {
      // A Gemm's C is sliced with the columns: a param, a constant or something that needs no gradient.
      if (t.op_type == "Gemm" && t.inputs.size() > 2 && t.inputs[2].valid()) {
        const Value& c = g.value(t.inputs[2]);
        if (c.kind != ValueKind::kParam && c.kind != ValueKind::kConstant && grad[t.inputs[2].value()]) return;
      }
      const ValueId y = t.outputs[0];
      set_split(y, static_cast<int>(shape(y).size()) - 1, true, static_cast<int>(i));
      group_of_task[i] = static_cast<int>(i);
      role[i] = TpRole::kColumn;
      if (t.op_type == "Gemm" && t.inputs.size() > 2 && t.inputs[2].valid()) sliced[i].push_back(t.inputs[2]);
    }
  }

  // A task reading a split value: sets its outputs' states, or returns false (the region fails).
  bool follow(TaskId id, const Task& t, int group) {
    const size_t i = id.value();
    if (!t.domain.empty()) return false;
    for (ValueId out : t.outputs)
      if (out.valid() && !g.value(out).shape_known) return false;
    for (ValueId in : t.inputs)
      if (in.valid() && !g.value(in).shape_known) return false;
    const std::string& op = t.op_type;

    if (auto l = as_linear(g, t)) {
      // x split along its contraction axis: a row linear. Split anywhere else, or a split weight: refused.
      const ValueSplit& x = state(l->x);
      if (x.state != State::kSplit || split(t.inputs[1]) || x.axis != static_cast<int>(shape(l->x).size()) - 1) return false;
      values[t.outputs[0].value()] = {State::kPartial, -1, false, group};
      role[i] = TpRole::kRow;
      return true;
    }
    if (pointwise_ops().count(op) > 0) return pointwise(i, t, group);
    if (op == "Transpose") {
      const ValueSplit& x = state(t.inputs[0]);
      const size_t rank = shape(t.inputs[0]).size();
      std::vector<int64_t> perm = t.attr_ints("perm");
      if (perm.empty())
        for (size_t k = 0; k < rank; ++k) perm.push_back(static_cast<int64_t>(rank - 1 - k));
      if (perm.size() != rank) return false;
      for (size_t k = 0; k < rank; ++k)
        if (normalized_axis(perm[k], rank) == x.axis) {
          set_split(t.outputs[0], static_cast<int>(k), false, group);
          return true;
        }
      return false;
    }
    if (is_reshape_like(op)) {
      if (split_input_count(t) != 1 || !split(t.inputs[0])) return false;  // a split shape operand: refused
      const int j = reshape_axis(shape(t.inputs[0]), shape(t.outputs[0]), state(t.inputs[0]).axis);
      if (j < 0) return false;
      set_split(t.outputs[0], j, false, group);
      return true;
    }
    if (op == "Softmax" || op == "LogSoftmax") {
      const ValueSplit& x = state(t.inputs[0]);
      const int axis = normalized_axis(t.attr_int("axis", 1), shape(t.inputs[0]).size());
      if (axis < 0 || x.axis >= axis) return false;  // it normalises over the split axis
      set_split(t.outputs[0], x.axis, false, group);
      return true;
    }
    if (op.rfind("Reduce", 0) == 0) return reduce(t, group);
    if (op == "MatMul") return score_matmul(i, t, group);
    if (op == "Split" || op == "Slice") return piece(t, group);
    if (op == "Concat") return concat(t, group);
    if (op == "RotaryEmbedding") return rotary(t, group);
    if (op == "Attention") return fused_attention(i, t, group);
    if (op == "Expand") return expand(i, t, group);
    if (op == "SoftmaxCrossEntropyLoss") {
      const ValueSplit& scores = state(t.inputs[0]);
      if (scores.axis != 1 || split_input_count(t) != 1) return false;
      for (size_t k = 1; k < t.outputs.size(); ++k)
        if (t.outputs[k].valid() && !g.consumers(t.outputs[k]).empty()) return false;  // a split log_prob read on
      role[i] = TpRole::kVocab;
      loss_task[i] = true;
      return true;
    }
    return false;
  }

  size_t split_input_count(const Task& t) const {
    return static_cast<size_t>(std::count_if(t.inputs.begin(), t.inputs.end(), [&](ValueId v) { return split(v); }));
  }

  bool pointwise(size_t i, const Task& t, int group) {
    const ValueId y = t.outputs[0];
    const size_t rank = shape(y).size();
    int axis = -1;
    bool free = true;
    // The split operands: one output axis, at full size.
    for (ValueId in : t.inputs) {
      if (!split(in)) continue;
      const int a = state(in).axis + static_cast<int>(rank) - static_cast<int>(shape(in).size());
      if (a < 0 || (axis >= 0 && a != axis) || shape(in)[static_cast<size_t>(state(in).axis)] != shape(y)[static_cast<size_t>(a)])
        return false;
      axis = a;
      free = free && state(in).free && g.consumers(in).size() == 1;
    }
    if (axis < 0) return false;
    // The replicated operands: broadcast along the axis (no gradient) or read sliced.
    for (ValueId in : t.inputs) {
      if (!in.valid() || split(in)) continue;
      const Value& v = g.value(in);
      const int p = axis - (static_cast<int>(rank) - static_cast<int>(v.shape.size()));
      const bool broadcast = p < 0 || v.shape[static_cast<size_t>(p)] == 1;
      if (broadcast) {
        if (grad[in.value()]) return false;
        continue;
      }
      if (v.shape[static_cast<size_t>(p)] != shape(y)[static_cast<size_t>(axis)]) return false;
      const bool sliceable = v.kind == ValueKind::kConstant || !grad[in.value()] ||
                             (v.kind == ValueKind::kParam && weight_readers(g, in) == 1);
      if (!sliceable) return false;
      sliced[i].push_back(in);
    }
    for (ValueId out : t.outputs) {
      if (!out.valid()) continue;
      if (shape(out) != shape(y)) return false;
      set_split(out, axis, free, group);
    }
    return true;
  }

  // Concat along another axis of operands all split alike (rotate_half's cat(-x2, x1) over split heads): each rank
  // concatenates its own heads. A replicated operand (or one split elsewhere) would mix ranks: refused.
  bool concat(const Task& t, int group) {
    const ValueId y = t.outputs[0];
    const size_t rank = shape(y).size();
    const int along = normalized_axis(t.attr_int("axis", 0), rank);
    int axis = -1;
    for (ValueId in : t.inputs) {
      if (!split(in) || shape(in).size() != rank) return false;
      const int a = state(in).axis;
      if ((axis >= 0 && a != axis) || a == along ||
          shape(in)[static_cast<size_t>(a)] != shape(y)[static_cast<size_t>(a)])
        return false;
      axis = a;
    }
    if (axis < 0) return false;
    set_split(y, axis, false, group);
    return true;
  }

  // Expand of a split value whose split axis is not broadcast (repeat_kv's expand of [B, kv, 1, S, d] to
  // [B, kv, n_rep, S, d] over split kv heads): each rank expands its own part; the shape operand's entry there is
  // divided by the degree (codegen/tensor_parallel_shard.h). A split shape operand is refused.
  bool expand(size_t i, const Task& t, int group) {
    if (split_input_count(t) != 1 || !split(t.inputs[0])) return false;
    const ValueId x = t.inputs[0], y = t.outputs[0];
    const int a = state(x).axis + static_cast<int>(shape(y).size()) - static_cast<int>(shape(x).size());
    if (a < 0 || shape(x)[static_cast<size_t>(state(x).axis)] != shape(y)[static_cast<size_t>(a)]) return false;
    if (t.inputs.size() < 2 || !g.value(t.inputs[1]).known_ints) return false;  // its target is cut at run time
    set_split(y, a, false, group);
    kv_heads_of_task[i] = shape(x)[static_cast<size_t>(state(x).axis)];
    return true;
  }

  // Opset 23's RotaryEmbedding of [B, heads, S, d] split along the heads: each head rotates alone (its caches and
  // position ids are per position, read whole). The 3-D form (heads folded into the hidden axis by num_heads) is
  // refused: its attribute would need the rank's head count.
  bool rotary(const Task& t, int group) {
    const ValueId x = t.inputs[0];
    if (split_input_count(t) != 1 || !split(x) || shape(x).size() != 4 || state(x).axis != 1) return false;
    for (size_t k = 1; k < t.inputs.size(); ++k)
      if (t.inputs[k].valid() && grad[t.inputs[k].value()]) return false;
    set_split(t.outputs[0], 1, false, group);
    return t.outputs.size() == 1;
  }

  // Opset 23's Attention over q, k, v [B, heads, S, d] all split along the heads (grouped-query: q's heads and the
  // kv heads each cut in contiguous parts, so rank r's q heads read rank r's kv heads): each rank attends over its
  // own heads, like the score MatMul. A mask is read whole when it broadcasts over the heads and needs no gradient;
  // the 3-D form (q_num_heads attributes), the KV-cache inputs and outputs are refused.
  bool fused_attention(size_t i, const Task& t, int group) {
    if (t.inputs.size() < 3) return false;
    for (size_t k = 0; k < 3; ++k)
      if (!split(t.inputs[k]) || shape(t.inputs[k]).size() != 4 || state(t.inputs[k]).axis != 1) return false;
    for (size_t k = 3; k < t.inputs.size(); ++k) {
      if (!t.inputs[k].valid()) continue;
      if (k > 3 || split(t.inputs[k]) || grad[t.inputs[k].value()]) return false;
      const auto& m = shape(t.inputs[k]);
      if (m.size() == 4 && m[1] != 1) return false;  // a per-head mask
    }
    for (size_t k = 1; k < t.outputs.size(); ++k)
      if (t.outputs[k].valid() && !g.consumers(t.outputs[k]).empty()) return false;
    set_split(t.outputs[0], 1, false, group);
    heads_of_task[i] = shape(t.inputs[0])[1];
    if (shape(t.inputs[1])[1] != heads_of_task[i]) kv_heads_of_task[i] = shape(t.inputs[1])[1];
    return true;
  }

  bool reduce(const Task& t, int group) {
    const ValueSplit& x = state(t.inputs[0]);
    if (split_input_count(t) != 1 || !split(t.inputs[0])) return false;
    const size_t rank = shape(t.inputs[0]).size();
    const auto axes = ints_of(g, t, 1, "axes");
    if (!axes || axes->empty()) return false;  // over every axis (or unknown axes): includes the split one
    int removed_before = 0;
    for (int64_t a : *axes) {
      const int n = normalized_axis(a, rank);
      if (n < 0 || n == x.axis) return false;
      if (n < x.axis) ++removed_before;
    }
    const bool keep = t.attr_int("keepdims", 1) != 0;
    set_split(t.outputs[0], keep ? x.axis : x.axis - removed_before, false, group);
    return true;
  }

  // MatMul of two split operands along one batch axis (attention's scores and context).
  bool score_matmul(size_t i, const Task& t, int group) {
    if (t.inputs.size() != 2 || !split(t.inputs[0]) || !split(t.inputs[1])) return false;
    const auto& a = shape(t.inputs[0]);
    const auto& b = shape(t.inputs[1]);
    const size_t rank = shape(t.outputs[0]).size();
    const int aa = state(t.inputs[0]).axis, ab = state(t.inputs[1]).axis;
    if (a.size() < 3 || b.size() < 3 || aa >= static_cast<int>(a.size()) - 2 || ab >= static_cast<int>(b.size()) - 2)
      return false;
    const int oa = aa + static_cast<int>(rank - a.size()), ob = ab + static_cast<int>(rank - b.size());
    if (oa != ob || a[static_cast<size_t>(aa)] != b[static_cast<size_t>(ab)]) return false;
    set_split(t.outputs[0], oa, false, group);
    heads_of_task[i] = a[static_cast<size_t>(aa)];
    return true;
  }

  // Split/Slice: along another axis the split passes through; along the split axis only a Split, the one reader of a
  // free value (the header's rule), each piece then free again.
  bool piece(const Task& t, int group) {
    const ValueId x = t.inputs[0];
    if (split_input_count(t) != 1 || !split(x)) return false;
    const ValueSplit s = state(x);
    const size_t rank = shape(x).size();
    const int64_t dim = shape(x)[static_cast<size_t>(s.axis)];
    bool along;
    if (t.op_type == "Split") {
      along = normalized_axis(t.attr_int("axis", 0), rank) == s.axis;
    } else {
      const auto range = slice_range(g, t, s.axis, rank, dim);
      along = range.has_value() && !(range->first == 0 && range->second == dim);
      if (!range) {
        // Unknown ranges, or none on the split axis: pass through only when the split axis is surely not sliced.
        for (ValueId out : t.outputs)
          if (out.valid() && shape(out)[static_cast<size_t>(s.axis)] != dim) return false;
      }
    }
    if (along) {
      // The shard pass cuts a Split's sizes, not a Slice's ranges (codegen/tensor_parallel_shard.h): Slices along the
      // split axis stay replicated, so the planner never chooses a layout apart run refuses.
      if (!s.free || t.op_type == "Slice") return false;
      if (g.consumers(x).size() != 1) return false;  // one Split reads it
    }
    for (ValueId out : t.outputs)
      if (out.valid()) set_split(out, s.axis, along, group);
    return true;
  }
};

int64_t gcd_add(int64_t acc, int64_t v) { return acc == 0 ? v : std::gcd(acc, v); }

// The common module path (module_path: the node name's, or the dynamo exporter's metadata) of the region's linears
// and lookups ("/blocks.3/attn"), else the first one's name.
std::string region_name(const TaskGraph& g, const std::vector<TaskId>& key_tasks) {
  auto segments = [](const std::string& name) {
    std::vector<std::string> out;
    size_t begin = 0;
    for (size_t k = 0; k <= name.size(); ++k)
      if (k == name.size() || name[k] == '/') {
        out.push_back(name.substr(begin, k - begin));
        begin = k + 1;
      }
    out.pop_back();  // the op's own part: "MatMul", "Gather_3"
    return out;
  };
  std::vector<std::string> common = segments(module_path(g.task(key_tasks.front())));
  for (TaskId t : key_tasks) {
    const std::vector<std::string> s = segments(module_path(g.task(t)));
    size_t k = 0;
    while (k < common.size() && k < s.size() && common[k] == s[k]) ++k;
    common.resize(k);
  }
  std::string name;
  for (size_t k = 0; k < common.size(); ++k) name += (k ? "/" : "") + common[k];
  return name.empty() ? g.task(key_tasks.front()).name : name;
}

}  // namespace

std::vector<TaskId> tp_region_seeds(const TpRegion& region) {
  std::vector<TaskId> seeds = region.column_tasks;
  if (region.kind == TpRegionKind::kEmbedding)
    for (TaskId t : region.tasks) seeds.push_back(t);  // its Gather (the only seed among its tasks)
  return seeds;
}

TensorParallelRegions find_tensor_parallel_regions(const TaskGraph& graph, int64_t graph_batch,
                                                   const std::vector<TaskId>& banned_seeds) {
  if (!graph.finalized()) throw InvalidArgument("find_tensor_parallel_regions: finalize the task graph first");
  if (graph_batch < 1) throw InvalidArgument("find_tensor_parallel_regions: graph_batch is " + std::to_string(graph_batch) + ", expected >= 1");
  const size_t n = graph.num_tasks();
  const std::vector<bool> grad = needs_gradient(graph);
  std::vector<bool> banned(n, false);
  for (TaskId t : banned_seeds)
    if (t.valid() && t.value() < n) banned[t.value()] = true;
  TensorParallelRegions result;

  // Each pass either keeps every region or bans at least one more seed, so this ends within n passes.
  for (size_t attempt = 0; attempt <= n; ++attempt) {
    Pass pass(graph, banned, grad);
    pass.run();

    struct Group {
      std::vector<TaskId> tasks, columns, rows;
      std::vector<ValueId> gathered, sliced, loss_scores;
      std::vector<std::pair<ValueId, int>> split_values;
      bool embedding = false, failed = false;
      int64_t heads = 0, kv_heads = 0, units = 0;
      ValueId partial;
    };
    std::vector<Group> groups(n);
    std::vector<int> root_of(n, -1);
    for (size_t i = 0; i < n; ++i) {
      if (pass.group_of_task[i] < 0) continue;
      const int r = pass.find(pass.group_of_task[i]);
      root_of[i] = r;
      Group& gr = groups[static_cast<size_t>(r)];
      const TaskId id(static_cast<uint32_t>(i));
      gr.tasks.push_back(id);
      if (pass.role[i] == TpRole::kColumn) gr.columns.push_back(id);
      if (pass.role[i] == TpRole::kRow) gr.rows.push_back(id);
      if (pass.role[i] == TpRole::kVocab && !pass.loss_task[i]) gr.embedding = true;
      if (pass.loss_task[i]) gr.loss_scores.push_back(graph.task(id).inputs[0]);
      gr.heads = std::max(gr.heads, pass.heads_of_task[i]);
      gr.kv_heads = std::max(gr.kv_heads, pass.kv_heads_of_task[i]);
      for (ValueId v : pass.sliced[i]) gr.sliced.push_back(v);
    }
    for (size_t i = 0; i < n; ++i)
      if (pass.failed_seed[i]) groups[static_cast<size_t>(pass.find(static_cast<int>(i)))].failed = true;
    std::unordered_set<uint32_t> outputs;
    for (ValueId v : graph.graph_outputs()) outputs.insert(v.value());
    for (size_t v = 0; v < graph.num_values(); ++v) {
      const ValueSplit& s = pass.values[v];
      if (s.state == State::kReplicated) continue;
      Group& gr = groups[static_cast<size_t>(pass.find(s.seed))];
      const Value& value = graph.values()[v];
      if (s.state == State::kPartial) {
        gr.partial = ValueId(static_cast<uint32_t>(v));
        continue;
      }
      gr.units = gcd_add(gr.units, value.shape[static_cast<size_t>(s.axis)]);
      gr.split_values.emplace_back(ValueId(static_cast<uint32_t>(v)), s.axis);
      if (outputs.count(static_cast<uint32_t>(v)) > 0) gr.gathered.push_back(ValueId(static_cast<uint32_t>(v)));
    }

    // The largest embedding vocabulary and the embeddings' tables, for recognising LM heads (the largest only: a
    // 2-class head beside BERT's 2-row token-type table is no LM head).
    int64_t vocabulary = 0;
    std::set<uint32_t> tables;
    for (size_t r = 0; r < n; ++r)
      if (groups[r].embedding) {
        const ValueId table = graph.task(TaskId(static_cast<uint32_t>(r))).inputs[0];
        vocabulary = std::max(vocabulary, graph.value(table).shape[0]);
        tables.insert(table.value());
      }

    // Classify each group; the ones that fit no kind fail.
    std::vector<std::optional<TpRegionKind>> kind(n);
    bool any_failed = false;
    for (size_t r = 0; r < n; ++r) {
      Group& gr = groups[r];
      if (gr.tasks.empty() || root_of[r] != static_cast<int>(r)) continue;
      auto own_weights = [&] {
        for (const auto* linears : {&gr.columns, &gr.rows})
          for (TaskId t : *linears)
            if (weight_readers(graph, as_linear(graph, graph.task(t))->param) != 1) return false;
        return true;
      };
      if (!gr.failed) {
        if (gr.embedding) {
          kind[r] = TpRegionKind::kEmbedding;
        } else if (gr.rows.size() == 1 && !gr.columns.empty() && gr.gathered.empty() && gr.loss_scores.empty() &&
                   own_weights()) {
          kind[r] = gr.heads > 0 ? TpRegionKind::kAttention : TpRegionKind::kMlp;
        } else if (gr.rows.empty() && gr.columns.size() == 1 && gr.gathered.size() + gr.loss_scores.size() == 1) {
          const Linear l = *as_linear(graph, graph.task(gr.columns[0]));
          if ((vocabulary > 0 && l.out == vocabulary) || tables.count(l.param.value()) > 0) kind[r] = TpRegionKind::kLmHead;
        }
      }
      if (!kind[r]) {
        // Its seeds become replicated (the embedding seed is the root itself).
        any_failed = true;
        banned[r] = true;
        for (TaskId t : gr.columns) banned[t.value()] = true;
      }
    }
    if (any_failed) continue;

    // ---- Every region holds: write the result ----
    result.roles.assign(n, TpRole::kReplicated);
    result.region_of.assign(n, -1);
    std::vector<size_t> order;  // roots by first task (a root is its region's first seed, tasks are topological)
    for (size_t r = 0; r < n; ++r)
      if (kind[r]) order.push_back(r);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return groups[a].tasks.front() < groups[b].tasks.front(); });
    std::vector<uint32_t> weight_of_region;
    for (size_t r : order) {
      const Group& gr = groups[r];
      TpRegion region;
      region.kind = *kind[r];
      region.tasks = gr.tasks;
      region.column_tasks = gr.columns;
      region.row_tasks = gr.rows;
      std::vector<TaskId> key = gr.columns;
      key.insert(key.end(), gr.rows.begin(), gr.rows.end());
      if (key.empty()) key.push_back(gr.tasks.front());
      std::sort(key.begin(), key.end());
      region.name = region_name(graph, key);
      region.heads = gr.heads;
      region.sliced_inputs = gr.sliced;
      region.split_values = gr.split_values;
      std::set<uint32_t> seen;
      for (TaskId c : gr.columns) {
        const ValueId x = graph.task(c).inputs[0];
        if (seen.insert(x.value()).second) region.inputs.push_back(x);
      }
      const double batch = static_cast<double>(graph_batch);
      uint32_t weight = 0;
      switch (region.kind) {
        case TpRegionKind::kEmbedding: {
          const Task& t = graph.task(gr.tasks.front());
          region.end_value = t.outputs[0];
          region.split_units = graph.value(t.inputs[0]).shape[0];
          region.bounded_by = std::to_string(region.split_units) + " vocabulary rows";
          weight = t.inputs[0].value();
          break;
        }
        case TpRegionKind::kLmHead: {
          const Linear l = *as_linear(graph, graph.task(gr.columns[0]));
          weight = l.param.value();
          region.split_units = gr.units;
          region.bounded_by = std::to_string(l.out) + " vocabulary columns";
          if (!gr.loss_scores.empty()) {
            region.end_value = gr.loss_scores[0];
            region.closing = TpClosing::kVocabParallelLoss;
          } else {
            region.end_value = gr.gathered[0];
            region.closing = TpClosing::kAllGather;
          }
          break;
        }
        case TpRegionKind::kAttention:
        case TpRegionKind::kMlp: {
          region.end_value = gr.partial;
          region.split_units = gr.units;
          int64_t bound = as_linear(graph, graph.task(gr.columns[0]))->out;
          if (region.kind == TpRegionKind::kAttention) {
            region.bounded_by = std::to_string(gr.heads) + " heads";
            bound = gr.heads;
            if (gr.kv_heads > 0 && gr.kv_heads != gr.heads) {  // grouped-query: the kv heads are cut too
              region.bounded_by += ", " + std::to_string(gr.kv_heads) + (gr.kv_heads == 1 ? " kv head" : " kv heads");
              bound = std::gcd(bound, gr.kv_heads);
            }
            region.core_tasks = attention_core(graph, gr.tasks, pass.heads_of_task);
          } else
            region.bounded_by = std::to_string(bound) + " ffn features";
          if (region.split_units != bound)
            region.bounded_by += " (gcd of the split widths " + std::to_string(region.split_units) + ")";
          break;
        }
      }
      const Value& end = graph.value(region.end_value);
      if (region.closing == TpClosing::kVocabParallelLoss) {
        // Max, sum of exponentials and target logit: one float each per token (row of the scores).
        const int64_t classes = end.shape.size() > 1 ? end.shape[1] : 1;
        const double tokens = classes > 0 ? static_cast<double>(end.elements / classes) : 0.0;
        region.end_bytes_per_sample = 3.0 * 4.0 * tokens / batch;
      } else {
        region.end_bytes_per_sample = static_cast<double>(end.bytes) / batch;
      }
      // A vocabulary split takes every degree: Megatron-LM pads the table to a multiple of it
      // (--make-vocab-size-divisible-by), each rank holding ⌈V/t⌉ rows; costed as V/t (the padding is < t rows).
      const bool vocabulary = region.kind == TpRegionKind::kEmbedding || region.kind == TpRegionKind::kLmHead;
      if (vocabulary && region.split_units % kTpDegrees[std::size(kTpDegrees) - 1] != 0)
        region.bounded_by += ", padded to a multiple of the degree";
      for (int d : kTpDegrees)
        if (region.split_units > 0 && (vocabulary || region.split_units % d == 0)) region.degrees.push_back(d);
      const size_t index = result.regions.size();
      for (TaskId t : gr.tasks) {
        result.roles[t.value()] = pass.role[t.value()];
        result.region_of[t.value()] = static_cast<int32_t>(index);
      }
      result.regions.push_back(std::move(region));
      weight_of_region.push_back(weight);
    }
    // Tied weights: embeddings and LM heads reading one table.
    for (size_t a = 0; a < result.regions.size(); ++a)
      for (size_t b = 0; b < result.regions.size(); ++b)
        if (a != b && weight_of_region[a] == weight_of_region[b] &&
            (result.regions[a].kind == TpRegionKind::kLmHead || result.regions[b].kind == TpRegionKind::kLmHead))
          result.regions[a].shares_weight_with.push_back(b);

    // ---- The sequence sequence parallelism cuts: each attention or MLP end value's, read at batch 1 ----
    for (const TpRegion& r : result.regions) {
      if (r.kind != TpRegionKind::kAttention && r.kind != TpRegionKind::kMlp) continue;
      const std::vector<int64_t>& s = graph.value(r.end_value).shape;
      for (size_t a = graph_batch > 1 ? 1 : 0; a + 1 < s.size(); ++a)
        if (s[a] > 1) {
          result.sequence = std::max(result.sequence, s[a]);
          break;
        }
    }

    // ---- Replicated tasks between a region's end and a region's input (what sequence parallelism shards) ----
    std::vector<bool> after(graph.num_values(), false), before(graph.num_values(), false);
    for (const TpRegion& r : result.regions) {
      after[r.end_value.value()] = true;
      for (ValueId x : r.inputs) before[x.value()] = true;
    }
    auto replicated_batch = [&](size_t i) { return !graph.tasks()[i].constant && result.region_of[i] < 0; };
    for (size_t i = 0; i < n; ++i) {
      if (!replicated_batch(i)) continue;
      bool any = false;
      for (ValueId in : graph.tasks()[i].inputs) any = any || (in.valid() && after[in.value()]);
      if (any)
        for (ValueId out : graph.tasks()[i].outputs)
          if (out.valid()) after[out.value()] = true;
    }
    std::vector<bool> feeds(n, false);
    for (size_t k = n; k-- > 0;) {
      if (!replicated_batch(k)) continue;
      bool any = false;
      for (ValueId out : graph.tasks()[k].outputs) any = any || (out.valid() && before[out.value()]);
      if (!any) continue;
      feeds[k] = true;
      for (ValueId in : graph.tasks()[k].inputs)
        if (in.valid()) before[in.value()] = true;
    }
    for (size_t i = 0; i < n; ++i) {
      if (!feeds[i]) continue;
      bool fed = false;
      for (ValueId in : graph.tasks()[i].inputs) fed = fed || (in.valid() && after[in.value()]);
      if (fed) result.between_regions.push_back(TaskId(static_cast<uint32_t>(i)));
    }
    return result;
  }
  APART_CHECK(false, "find_tensor_parallel_regions: no fixpoint (every failing pass bans a seed)");
  return result;
}

}  // namespace apart
