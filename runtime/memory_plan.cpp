// Static memory planner: liveness intervals over the topological order, then greedy-by-size
// placement (largest buffer first, lowest offset that no live-overlapping buffer occupies).
#include "runtime/memory_plan.h"

#include <algorithm>

#include "graph/error.h"

namespace apart {

MemoryPlan plan_memory(const TaskGraph& graph, const MemoryPlanOptions& options) {
  APART_CHECK(graph.finalized(), "plan_memory needs a finalized graph");
  APART_CHECK(options.alignment > 0, "alignment must be positive");
  const int64_t steps = static_cast<int64_t>(graph.num_tasks());
  auto runs = [&](size_t t) { return options.run_task.empty() || options.run_task[t]; };
  MemoryPlan plan;
  plan.offset_of.assign(graph.num_values(), -1);

  std::vector<bool> is_output(graph.num_values(), false);
  for (ValueId v : graph.graph_outputs()) is_output[v.value()] = true;

  // --- Views: each aliased value's reads keep the value it views (its root) alive ---
  auto aliases = [&](size_t t) { return !options.alias_task.empty() && options.alias_task[t] && runs(t); };
  std::vector<int64_t> held_until(graph.num_values(), -1);  // by root value: the last step a view of it is read
  {
    std::vector<uint32_t> root(graph.num_values());
    for (uint32_t v = 0; v < graph.num_values(); ++v) root[v] = v;
    for (size_t t = 0; t < graph.num_tasks(); ++t) {
      if (!aliases(t)) continue;
      const Task& task = graph.task(TaskId(static_cast<uint32_t>(t)));
      const ValueId view = task.outputs[0];
      root[view.value()] = root[task.inputs[0].value()];
      int64_t& until = held_until[root[view.value()]];
      until = std::max<int64_t>(until, static_cast<int64_t>(t));
      for (TaskId c : graph.consumers(view)) until = std::max<int64_t>(until, c.value());
      if (is_output[view.value()]) until = steps;
    }
  }

  // --- Liveness ---------------------------------------------------------------------
  std::vector<BufferAssignment> buffers;
  for (size_t t = 0; t < graph.num_tasks(); ++t) {
    if (!runs(t)) continue;
    const bool view = aliases(t);
    for (ValueId out : graph.task(TaskId(static_cast<uint32_t>(t))).outputs) {
      if (!out.valid() || (view && out == graph.task(TaskId(static_cast<uint32_t>(t))).outputs[0])) continue;
      const Value& v = graph.value(out);
      if (!v.shape_known || v.bytes <= 0) continue;
      if (is_output[out.value()] && !options.outputs_in_arena) continue;
      BufferAssignment b;
      b.value = out;
      b.bytes = (v.bytes + options.alignment - 1) / options.alignment * options.alignment;
      b.first_step = b.last_step = static_cast<int64_t>(t);
      for (TaskId c : graph.consumers(out)) b.last_step = std::max<int64_t>(b.last_step, c.value());
      if (is_output[out.value()]) b.last_step = steps;
      b.last_step = std::max(b.last_step, held_until[out.value()]);
      buffers.push_back(b);
    }
  }
  std::vector<int64_t> live(static_cast<size_t>(steps) + 1, 0);
  for (const auto& b : buffers) {
    plan.total_bytes += b.bytes;
    for (int64_t s = b.first_step; s <= b.last_step; ++s) live[static_cast<size_t>(s)] += b.bytes;
  }
  plan.lower_bound_bytes = live.empty() ? 0 : *std::max_element(live.begin(), live.end());

  // --- Placement: largest first, into the lowest gap among time-overlapping placed buffers ---
  std::stable_sort(buffers.begin(), buffers.end(), [](const auto& a, const auto& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.first_step < b.first_step;
  });
  std::vector<const BufferAssignment*> overlapping;
  for (size_t i = 0; i < buffers.size(); ++i) {
    BufferAssignment& b = buffers[i];
    overlapping.clear();
    for (size_t j = 0; j < i; ++j)
      if (buffers[j].first_step <= b.last_step && b.first_step <= buffers[j].last_step) overlapping.push_back(&buffers[j]);
    std::sort(overlapping.begin(), overlapping.end(), [](auto* x, auto* y) { return x->offset < y->offset; });
    int64_t offset = 0;
    for (const auto* o : overlapping) {
      if (o->offset >= offset + b.bytes) break;  // the gap before o fits
      offset = std::max(offset, o->offset + o->bytes);
    }
    b.offset = offset;
    plan.offset_of[b.value.value()] = offset;
    plan.peak_bytes = std::max(plan.peak_bytes, offset + b.bytes);
  }
  plan.buffers = std::move(buffers);
  return plan;
}

void check_memory_plan(const MemoryPlan& plan) {
  const auto& bs = plan.buffers;
  for (size_t i = 0; i < bs.size(); ++i) {
    APART_CHECK(bs[i].offset >= 0 && bs[i].offset + bs[i].bytes <= plan.peak_bytes, "buffer outside the arena");
    for (size_t j = i + 1; j < bs.size(); ++j) {
      const bool live_together = bs[i].first_step <= bs[j].last_step && bs[j].first_step <= bs[i].last_step;
      const bool share_bytes = bs[i].offset < bs[j].offset + bs[j].bytes && bs[j].offset < bs[i].offset + bs[i].bytes;
      APART_CHECK(!(live_together && share_bytes), "values " + std::to_string(bs[i].value.value()) + " and " +
                                                       std::to_string(bs[j].value.value()) +
                                                       " are live together and overlap in the arena");
    }
  }
}

}  // namespace apart
