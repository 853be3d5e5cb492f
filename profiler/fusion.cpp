// Fused kernels: the groups, their internal values and the traffic a group does not do (docs/cost-model.md §3).
#include "profiler/fusion.h"

#include <algorithm>
#include <numeric>
#include <unordered_set>

#include "profiler/attention_pattern.h"

namespace apart {
namespace {

bool is_batch_value(const Value& v) { return v.kind != ValueKind::kParam && v.kind != ValueKind::kConstant; }
double vbytes(const Value& v) { return v.shape_known ? static_cast<double>(v.bytes) : 0.0; }

uint32_t find_root(std::vector<uint32_t>& parent, uint32_t x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

// Values in the order first seen; a group may be long (a chain of thousands of elementwise ops).
struct ValueSet {
  std::vector<ValueId> order;
  std::unordered_set<uint32_t> seen;
  bool contains(ValueId v) const { return seen.count(v.value()) > 0; }
  void insert(ValueId v) {
    if (seen.insert(v.value()).second) order.push_back(v);
  }
};

}  // namespace

bool is_fusible(OpClass c) {
  switch (c) {
    case OpClass::kElementwise:
    case OpClass::kNormalization:
    case OpClass::kSoftmax:
    case OpClass::kReduction:
    case OpClass::kDataMovement:
    case OpClass::kView: return true;
    case OpClass::kMatMul:
    case OpClass::kPool:
    case OpClass::kOpaque: return false;
  }
  return false;
}

FusionGroups find_fusion_groups(const TaskGraph& g, AttentionKernel attention_kernel) {
  const uint32_t n = static_cast<uint32_t>(g.num_tasks());
  std::vector<bool> fusible(n), view(n);
  std::vector<int> level(n, 0);
  // One flash kernel each: no member fuses. Materialised: no attention is matched, its tasks fuse as any others.
  const std::vector<bool> attention =
      attention_kernel == AttentionKernel::kFused ? attention_tasks(g, find_attention(g)) : std::vector<bool>(n, false);
  for (uint32_t i = 0; i < n; ++i) {  // topological order: producers first
    const Task& t = g.task(TaskId(i));
    fusible[i] = !t.constant && !attention[i] && is_fusible(op_class(t));
    view[i] = op_class(t) == OpClass::kView;
    for (ValueId in : t.inputs) {
      if (!in.valid()) continue;
      const TaskId p = g.value(in).producer;
      if (!p.valid() || g.task(p).constant) continue;
      level[i] = std::max(level[i], level[p.value()] + (fusible[p.value()] ? 0 : 1));
    }
  }
  // Whether every task reading v, through views, is a fusible batch task at `at`, and no alias of v is a graph output.
  auto fuses_into_readers = [&](auto& self, ValueId v, int at) -> bool {
    if (g.value(v).kind == ValueKind::kOutput) return false;
    for (TaskId c : g.consumers(v)) {
      if (!fusible[c.value()] || level[c.value()] != at) return false;
      if (view[c.value()])
        for (ValueId o : g.task(c).outputs)
          if (o.valid() && !self(self, o, at)) return false;
    }
    return true;
  };

  FusionGroups out;
  out.internal.assign(g.num_values(), false);
  std::vector<uint32_t> parent(n);
  std::iota(parent.begin(), parent.end(), 0u);
  auto mark_internal = [&](auto& self, ValueId v, uint32_t producer) -> void {
    out.internal[v.value()] = true;
    for (TaskId c : g.consumers(v)) {
      parent[find_root(parent, c.value())] = find_root(parent, producer);
      if (view[c.value()])
        for (ValueId o : g.task(c).outputs)
          if (o.valid()) self(self, o, c.value());
    }
  };
  for (uint32_t i = 0; i < n; ++i) {
    if (!fusible[i] || view[i]) continue;  // a view's output is decided with the value it aliases
    for (ValueId v : g.task(TaskId(i)).outputs) {
      if (!v.valid() || !is_batch_value(g.value(v)) || g.consumers(v).empty()) continue;
      if (fuses_into_readers(fuses_into_readers, v, level[i])) mark_internal(mark_internal, v, i);
    }
  }

  // Groups of two or more, named by their first task (the union keeps no order, so collect by root first).
  std::vector<uint32_t> size(n, 0);
  for (uint32_t i = 0; i < n; ++i)
    if (fusible[i]) ++size[find_root(parent, i)];
  std::vector<uint32_t> index_of_root(n, FusionGroups::kNone);
  out.group_of.assign(n, FusionGroups::kNone);
  for (uint32_t i = 0; i < n; ++i) {
    if (!fusible[i]) continue;
    const uint32_t r = find_root(parent, i);
    if (size[r] < 2) continue;
    if (index_of_root[r] == FusionGroups::kNone) {
      index_of_root[r] = static_cast<uint32_t>(out.groups.size());
      out.groups.emplace_back();
    }
    out.groups[index_of_root[r]].push_back(TaskId(i));
  }
  for (const auto& members : out.groups)
    for (TaskId t : members) out.group_of[t.value()] = members.front().value();
  return out;
}

std::vector<bool> tasks_run_each_step(const TaskGraph& g) {
  std::vector<bool> from_params(g.num_values(), false), run(g.num_tasks(), false);
  for (uint32_t v = 0; v < g.num_values(); ++v) from_params[v] = g.value(ValueId(v)).kind == ValueKind::kParam;
  for (uint32_t i = 0; i < g.num_tasks(); ++i) {  // topological order
    const Task& t = g.task(TaskId(i));
    bool reads_params = false;
    for (ValueId in : t.inputs) reads_params = reads_params || (in.valid() && from_params[in.value()]);
    for (ValueId out : t.outputs)
      if (out.valid()) from_params[out.value()] = reads_params;
    run[i] = !t.constant || reads_params;
  }
  return run;
}

bool folds_into_gemm(const TaskGraph& g, TaskId t, const std::vector<bool>& run_each_step) {
  const Task& task = g.task(t);
  if (!run_each_step[t.value()] || !task.domain.empty() || task.op_type != "Transpose" || task.outputs.size() != 1 ||
      task.inputs.empty() || !task.inputs[0].valid() || !task.outputs[0].valid())
    return false;
  const Value& in = g.value(task.inputs[0]);
  const ValueId out = task.outputs[0];
  if (!in.shape_known || in.shape.size() < 2 || g.value(out).kind == ValueKind::kOutput || g.consumers(out).empty())
    return false;
  const std::vector<int64_t> perm = task.attr_ints("perm");
  const size_t rank = in.shape.size();
  if (perm.size() != rank) return rank == 2 && perm.empty();  // no perm: reversed axes, a swap at rank 2
  for (size_t i = 0; i + 2 < rank; ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  if (perm[rank - 2] != static_cast<int64_t>(rank - 1) || perm[rank - 1] != static_cast<int64_t>(rank - 2))
    return false;
  for (TaskId c : g.consumers(out)) {
    const Task& reader = g.task(c);
    if (!reader.domain.empty() || reader.op_type != "MatMul") return false;
  }
  return true;
}

bool in_fusion_group(const FusionGroups& fusion, TaskId t) {
  return !fusion.group_of.empty() && fusion.group_of[t.value()] != FusionGroups::kNone;
}

bool launches_kernel(const TaskGraph& g, const FusionGroups& fusion, const std::vector<bool>& run_each_step, TaskId t) {
  if (!run_each_step[t.value()] || op_class(g.task(t)) == OpClass::kView) return false;
  if (in_fusion_group(fusion, t)) return fusion.group_of[t.value()] == t.value();
  return !folds_into_gemm(g, t, run_each_step);
}

std::vector<OpWork> step_work(const TaskGraph& g, const FusionGroups& fusion, const std::vector<bool>& run_each_step) {
  const uint32_t n = static_cast<uint32_t>(g.num_tasks());
  std::vector<OpWork> work(n);
  std::vector<BackwardWork> no_backward(n);
  for (uint32_t i = 0; i < n; ++i)
    if (run_each_step[i] && (in_fusion_group(fusion, TaskId(i)) || !folds_into_gemm(g, TaskId(i), run_each_step)))
      work[i] = forward_work(g, TaskId(i));
  if (!fusion.groups.empty())
    remove_fused_traffic(g, fusion, std::vector<bool>(g.num_values(), false), work, no_backward);
  return work;
}

void remove_fused_traffic(const TaskGraph& g, const FusionGroups& fusion, const std::vector<bool>& grad,
                          std::vector<OpWork>& forward, std::vector<BackwardWork>& backward) {
  auto internal = [&](ValueId v) { return v.valid() && fusion.internal[v.value()]; };
  for (const auto& members : fusion.groups) {
    ValueSet read, gradient_written, saved_read, external_batch_inputs;
    bool saved_internal = false;
    for (TaskId id : members) {
      const Task& t = g.task(id);
      OpWork& fw = forward[id.value()];
      BackwardWork& bw = backward[id.value()];
      // Forward: internal values are neither read nor written; an external value is read once by the group.
      double not_read = 0, not_read_fixed = 0, not_written = 0;
      for (ValueId in : t.inputs) {
        if (!in.valid()) continue;
        const Value& v = g.value(in);
        if (internal(in) || read.contains(in)) {
          not_read += vbytes(v);
          if (!is_batch_value(v)) not_read_fixed += vbytes(v);
        } else {
          read.insert(in);
          if (is_batch_value(v)) external_batch_inputs.insert(in);
        }
      }
      for (ValueId o : t.outputs)
        if (internal(o)) not_written += vbytes(g.value(o));
      fw.bytes_read = std::max(0.0, fw.bytes_read - not_read);
      fw.fixed_bytes_read = std::clamp(fw.fixed_bytes_read - not_read_fixed, 0.0, fw.bytes_read);
      fw.bytes_written = std::max(0.0, fw.bytes_written - not_written);

      // Backward, as the fused kernel moves it: the gradients of its external outputs read, those of its external
      // inputs written once, the external values it saved read once; nothing internal.
      if (bw.flops <= 0 && bw.bytes <= 0 && bw.saved.empty()) continue;
      double moved = 0;
      for (ValueId o : t.outputs)
        if (o.valid() && grad[o.value()] && !internal(o)) moved += vbytes(g.value(o));
      for (ValueId in : t.inputs) {
        if (!in.valid() || !grad[in.value()] || internal(in) || gradient_written.contains(in)) continue;
        gradient_written.insert(in);
        moved += vbytes(g.value(in));
      }
      std::vector<ValueId> kept;
      for (ValueId v : bw.saved) {
        if (internal(v)) {
          saved_internal = true;
        } else if (!saved_read.contains(v)) {
          saved_read.insert(v);
          kept.push_back(v);
          moved += vbytes(g.value(v));
        }
      }
      bw.saved = std::move(kept);
      bw.bytes = moved;
    }
    if (!saved_internal) continue;
    // The fused backward recomputes its internal values from the group's external batch inputs: saved, and read.
    BackwardWork& first = backward[members.front().value()];
    for (ValueId in : external_batch_inputs.order) {
      if (saved_read.contains(in)) continue;
      first.saved.push_back(in);
      first.bytes += vbytes(g.value(in));
    }
  }
}

}  // namespace apart
