// The attention pattern on a task graph (see attention_pattern.h).
#include "profiler/attention_pattern.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>

namespace apart {
namespace {

bool is_default_domain(const Task& t) { return t.domain.empty(); }

const Task* producer_of(const TaskGraph& g, ValueId v) {
  const TaskId p = g.value(v).producer;
  return p.valid() ? &g.task(p) : nullptr;
}

// A scalar float value a default-domain Constant task writes.
bool is_scalar_float_constant(const TaskGraph& g, ValueId v) {
  const Task* p = producer_of(g, v);
  const Value& value = g.value(v);
  return p && is_default_domain(*p) && p->op_type == "Constant" && value.shape_known && value.elements == 1 &&
         (value.dtype == DType::kFloat32 || value.dtype == DType::kFloat64 || value.dtype == DType::kFloat16 ||
          value.dtype == DType::kBFloat16);
}

// Read by one input slot of one task only, and no graph output: the pattern may take it over.
bool private_value(const TaskGraph& g, ValueId v) {
  const auto readers = g.consumers(v);
  if (readers.size() != 1) return false;
  const Task& reader = g.task(readers[0]);
  if (std::count(reader.inputs.begin(), reader.inputs.end(), v) != 1) return false;
  const auto outputs = g.graph_outputs();
  return std::find(outputs.begin(), outputs.end(), v) == outputs.end();
}

ValueId input(const Task& t, size_t i) { return i < t.inputs.size() ? t.inputs[i] : ValueId(); }

// A Mul or Div of a value by a scalar Constant: the other operand and the factor it applies.
std::optional<std::pair<ValueId, double>> scaling(const AttentionLiterals& lit, const Task& n) {
  if (!is_default_domain(n) || n.inputs.size() != 2 || (n.op_type != "Mul" && n.op_type != "Div")) return std::nullopt;
  for (size_t side = 0; side < 2; ++side) {
    if (!n.inputs[side].valid() || !n.inputs[1 - side].valid()) return std::nullopt;
    const auto c = lit.scale_factor(n.inputs[side]);
    if (!c) continue;
    if (n.op_type == "Div" && side == 0) return std::nullopt;  // c / s is not a scaling
    return std::make_pair(n.inputs[1 - side], n.op_type == "Div" ? 1 / *c : *c);
  }
  return std::nullopt;
}

std::optional<std::vector<int64_t>> shape_of(const TaskGraph& g, ValueId v) {
  if (!v.valid() || !g.value(v).shape_known) return std::nullopt;
  return g.value(v).shape;
}

// Q·Kᵀ and V of rank 4 with matching B, H, D and L; a mask whose last dim is L and broadcasts to [B, H, S, L].
bool shapes_fit(const TaskGraph& g, const AttentionMatch& m) {
  const auto qs = shape_of(g, m.q), ks = shape_of(g, m.k_transposed), vs = shape_of(g, m.v);
  if (!qs || !ks || !vs || qs->size() != 4 || ks->size() != 4 || vs->size() != 4) return false;
  const auto &q = *qs, &k = *ks, &v = *vs;
  if (q[0] != k[0] || q[0] != v[0] || q[1] != k[1] || q[1] != v[1] || q[3] != k[2] || k[3] != v[2]) return false;
  if (!m.mask.valid()) return true;
  const auto ms = shape_of(g, m.mask);
  if (!ms || ms->size() < 2 || ms->size() > 4 || ms->back() != k[3]) return false;
  const std::vector<int64_t> full{q[0], q[1], q[2], k[3]};
  for (size_t i = 0; i < ms->size(); ++i) {
    const int64_t d = (*ms)[ms->size() - 1 - i], want = full[3 - i];
    if (d != 1 && d != want) return false;
  }
  return true;
}

std::optional<AttentionMatch> match_at(const TaskGraph& g, const AttentionLiterals& lit, TaskId softmax_id) {
  const Task& sm = g.task(softmax_id);
  if (!is_default_domain(sm) || sm.op_type != "Softmax" || sm.outputs.size() != 1 || !sm.outputs[0].valid() ||
      sm.inputs.size() != 1 || !sm.inputs[0].valid())
    return std::nullopt;
  if (const Attribute* axis = sm.attr("axis"); axis && axis->i != -1 && axis->i != 3) return std::nullopt;
  AttentionMatch m;
  std::set<TaskId> tasks{softmax_id};
  const ValueId p = sm.outputs[0];
  if (!private_value(g, p)) return std::nullopt;
  const TaskId pv_id = g.consumers(p)[0];
  const Task& pv = g.task(pv_id);
  if (!is_default_domain(pv) || pv.op_type != "MatMul" || input(pv, 0) != p || !input(pv, 1).valid() ||
      pv.outputs.empty() || !pv.outputs[0].valid())
    return std::nullopt;
  tasks.insert(pv_id);
  m.last = pv_id;
  m.v = pv.inputs[1];
  m.y = pv.outputs[0];

  // Back from the softmax: the mask (at most one Where), then scalings, then MatMul(Q, Kᵀ).
  ValueId x = sm.inputs[0];
  bool scaled = false;
  for (;;) {
    if (!private_value(g, x)) return std::nullopt;
    const Task* n = producer_of(g, x);
    if (!n || !is_default_domain(*n)) return std::nullopt;
    tasks.insert(g.value(x).producer);
    if (n->op_type == "MatMul") {
      if (n->inputs.size() != 2 || !n->inputs[0].valid() || !n->inputs[1].valid()) return std::nullopt;
      m.q = n->inputs[0];
      m.k_transposed = n->inputs[1];
      break;
    }
    if (n->op_type == "Where" && !m.mask.valid() && !scaled && n->inputs.size() == 3 && n->inputs[0].valid() &&
        n->inputs[1].valid() && n->inputs[2].valid()) {
      const bool hides = lit.masks_out(n->inputs[1]), keeps = lit.masks_out(n->inputs[2]);
      if (hides == keeps) return std::nullopt;
      m.mask = n->inputs[0];
      m.mask_hides = hides;
      x = n->inputs[hides ? 2 : 1];
      continue;
    }
    const auto s = scaling(lit, *n);
    if (!s) return std::nullopt;
    m.scale *= s->second;
    scaled = true;
    x = s->first;
  }
  // √scale on Q and on Kᵀ (torch's scaled_dot_product_attention export).
  for (ValueId* operand : {&m.q, &m.k_transposed}) {
    const Task* n = producer_of(g, *operand);
    if (!n || !private_value(g, *operand)) continue;
    if (const auto s = scaling(lit, *n)) {
      tasks.insert(g.value(*operand).producer);
      m.scale *= s->second;
      *operand = s->first;
    }
  }
  if (!shapes_fit(g, m)) return std::nullopt;
  if (const Task* t = producer_of(g, m.k_transposed);
      t && is_default_domain(*t) && t->op_type == "Transpose" && private_value(g, m.k_transposed)) {
    m.k_transpose = g.value(m.k_transposed).producer;
  }
  m.causal = m.mask.valid() && lit.causal_triangle(m.mask, m.mask_hides);
  m.tasks.assign(tasks.begin(), tasks.end());
  return m;
}

}  // namespace

std::optional<double> AttentionLiterals::scale_factor(ValueId v) const {
  if (!is_scalar_float_constant(g_, v)) return std::nullopt;
  return std::numeric_limits<double>::quiet_NaN();
}

bool AttentionLiterals::masks_out(ValueId v) const { return is_scalar_float_constant(g_, v); }

bool AttentionLiterals::causal_triangle(ValueId mask, bool hides_when_true) const {
  const Value& m = g_.value(mask);
  const Task* p = producer_of(g_, mask);
  const bool literal = m.kind == ValueKind::kConstant && (!p || (is_default_domain(*p) && p->op_type == "Constant"));
  if (!literal || m.dtype != DType::kBool || !m.shape_known || m.shape.size() != 2 || m.shape[0] != m.shape[1])
    return false;
  if (!m.known_ints) return true;  // contents not kept: a literal square bool mask is taken for the causal one
  const int64_t n = m.shape[0];
  if (static_cast<int64_t>(m.known_ints->size()) != n * n) return false;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      if (((*m.known_ints)[static_cast<size_t>(i * n + j)] != 0) != ((j > i) == hides_when_true)) return false;
  return true;
}

std::vector<AttentionMatch> find_attention(const TaskGraph& g, const AttentionLiterals& literals) {
  std::vector<AttentionMatch> matches;
  std::vector<bool> taken(g.num_tasks(), false);
  for (uint32_t i = 0; i < g.num_tasks(); ++i) {
    auto m = match_at(g, literals, TaskId(i));
    if (!m) continue;
    std::vector<TaskId> uses = m->tasks;
    if (m->k_transpose.valid()) uses.push_back(m->k_transpose);
    bool overlaps = false;
    for (TaskId t : uses) overlaps = overlaps || taken[t.value()];
    if (overlaps) continue;
    for (TaskId t : uses) taken[t.value()] = true;
    matches.push_back(std::move(*m));
  }
  return matches;
}

std::vector<bool> attention_tasks(const TaskGraph& g, const std::vector<AttentionMatch>& matches) {
  std::vector<bool> in(g.num_tasks(), false);
  for (const AttentionMatch& m : matches)
    for (TaskId t : m.tasks) in[t.value()] = true;
  return in;
}

}  // namespace apart

namespace apart {

FusedAttentionWork fused_attention_work(const TaskGraph& g, const AttentionMatch& m, const std::vector<bool>& grad) {
  FusedAttentionWork w;
  const Value &q = g.value(m.q), &kt = g.value(m.k_transposed), &v = g.value(m.v), &y = g.value(m.y);
  auto bytes = [](const Value& x) { return static_cast<double>(x.bytes); };
  auto batch = [](const Value& x) { return x.kind != ValueKind::kParam && x.kind != ValueKind::kConstant; };
  w.forward.flops =
      attention_forward_flops(q.shape[0], q.shape[1], q.shape[2], kt.shape[3], q.shape[3], v.shape[3], m.causal);
  w.forward.bytes_read = bytes(q) + bytes(kt) + bytes(v);
  w.forward.bytes_written = bytes(y);
  for (const Value* x : {&q, &kt, &v})
    if (!batch(*x)) w.forward.fixed_bytes_read += bytes(*x);
  BackwardWork& b = w.backward;
  b.flops = kAttentionGradFlopsFactor * w.forward.flops;
  b.kernels = 1;
  b.bytes = bytes(y) + bytes(q) + bytes(kt) + bytes(v);  // dY, Q, K, V read
  for (ValueId x : {m.q, m.k_transposed, m.v}) {
    if (grad[x.value()]) b.bytes += bytes(g.value(x));  // its gradient written
    if (batch(g.value(x))) b.saved.push_back(x);
  }
  if (m.mask.valid() && !m.causal) {
    const Value& mask = g.value(m.mask);
    w.forward.bytes_read += bytes(mask);
    b.bytes += bytes(mask);
    if (batch(mask)) {
      b.saved.push_back(m.mask);
      if (m.mask_hides) {  // its Not runs each step
        w.forward.bytes_read += bytes(mask);
        w.forward.bytes_written += bytes(mask);
        ++w.forward_launches;
      }
    } else {
      w.forward.fixed_bytes_read += bytes(mask);
    }
  }
  if (!m.k_transpose.valid() && batch(kt)) {  // the added Transpose of Kᵀ, and its gradient's
    w.forward.bytes_read += bytes(kt);
    w.forward.bytes_written += bytes(kt);
    ++w.forward_launches;
    if (grad[m.k_transposed.value()]) {
      b.bytes += 2 * bytes(kt);
      ++b.kernels;
    }
  }
  std::sort(b.saved.begin(), b.saved.end());
  b.saved.erase(std::unique(b.saved.begin(), b.saved.end()), b.saved.end());
  return w;
}

}  // namespace apart
