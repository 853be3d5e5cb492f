// Cutting an interleaved plan's batch tasks into its P·v chunks (Megatron-LM's layout: chunk c on device c mod P).
#include "partition/virtual_stages.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "graph/error.h"
#include "graph/module_layers.h"
#include "partition/phases.h"
#include "partition/tensor_parallel.h"

namespace apart {

namespace {

// Moves each cut between chunks (end[c]: one past chunk c's last position in `order`) that falls `inside` something
// a cut may not split to the nearest position, by the tasks' time, that does not, keeping every chunk at least one
// task. A cut with no such position in reach stays where it was.
void move_cuts_outside(const std::vector<bool>& inside, const std::vector<TaskId>& order,
                       const std::function<double(TaskId)>& weight, std::vector<size_t>& end) {
  const size_t n = order.size();
  std::vector<double> before(n + 1, 0.0);  // time of the tasks before position e
  for (size_t e = 1; e <= n; ++e) before[e] = before[e - 1] + weight(order[e - 1]);
  for (size_t c = 0; c + 1 < end.size(); ++c) {
    if (!inside[end[c]]) continue;
    const size_t low = (c == 0 ? 0 : end[c - 1]) + 1, high = n - (end.size() - c - 1);
    size_t best = end[c];
    for (size_t e = low; e <= high; ++e)
      if (!inside[e] &&
          (best == end[c] || std::abs(before[e] - before[end[c]]) < std::abs(before[best] - before[end[c]])))
        best = e;
    end[c] = best;
  }
}

// In a plan of tensor-parallel stages, moves each cut between chunks (end[c]: one past chunk c's last position in
// `order`) that falls inside a TP region to the nearest position, by the tasks' time, that falls inside none, keeping
// every chunk at least one task: the runtime computes a region a boundary cuts whole on every TP rank
// (codegen/tensor_parallel_shard.h). A cut with no such position in reach stays where it was.
void keep_tensor_parallel_regions_whole(const Plan& plan, const std::vector<TaskId>& order,
                                        const std::function<double(TaskId)>& weight, std::vector<size_t>& end) {
  if (!plan.tensor_parallel || std::none_of(plan.stages.begin(), plan.stages.end(),
                                            [](const PlanStage& s) { return s.cost.tp > 1; }))
    return;
  const TensorParallelRegions& tp = *plan.tensor_parallel;
  const size_t n = order.size();
  // inside[e]: a cut before position e would split a region (it has tasks before e and at or after it).
  std::vector<size_t> first(tp.regions.size(), n), last(tp.regions.size(), 0);
  for (size_t i = 0; i < n; ++i)
    if (const int32_t r = order[i].value() < tp.region_of.size() ? tp.region_of[order[i].value()] : -1; r >= 0) {
      first[static_cast<size_t>(r)] = std::min(first[static_cast<size_t>(r)], i);
      last[static_cast<size_t>(r)] = std::max(last[static_cast<size_t>(r)], i);
    }
  std::vector<int> opened(n + 1, 0);
  for (size_t r = 0; r < tp.regions.size(); ++r)
    if (first[r] < last[r]) {
      ++opened[first[r] + 1];
      --opened[last[r] + 1];
    }
  std::vector<bool> inside(n + 1, false);
  for (size_t e = 1, depth = 0; e <= n; ++e) {
    depth += static_cast<size_t>(opened[e]);
    inside[e] = depth > 0;
  }
  move_cuts_outside(inside, order, weight, end);
}

// Under --target (partition/target.h), moves each cut that falls inside a layer to the nearest position, by time,
// between two layers (the modules before the layers count as the first, those after as the last): the engines cut
// their interleaved chunks between whole layers as they cut stages.
void keep_layers_whole(const Plan& plan, const TaskGraph& graph, const std::vector<TaskId>& order,
                       const std::function<double(TaskId)>& weight, std::vector<size_t>& end) {
  if (!plan.options.stage.target) return;
  std::vector<std::string> paths;
  for (TaskId t : order) paths.push_back(module_path(graph.task(t)));
  const LayerStack stack = layer_stack(paths);
  if (stack.empty()) return;
  const int last = static_cast<int>(stack.layers.size()) - 1;
  std::vector<bool> inside(order.size() + 1, false);
  for (size_t e = 1; e < order.size(); ++e)
    inside[e] = std::clamp(stack.position[e - 1], 0, last) == std::clamp(stack.position[e], 0, last);
  move_cuts_outside(inside, order, weight, end);
}

}  // namespace

std::vector<PlanStage> cut_virtual_stages(const Plan& plan, const TaskGraph& graph, const CostTable& costs) {
  if (plan.schedule != Schedule::kInterleaved || plan.stages.empty()) return {};
  const size_t p = plan.stages.size();
  const size_t v = static_cast<size_t>(std::max(1, plan.virtual_stages));
  const size_t chunks = p * v;
  std::vector<TaskId> order;  // batch tasks, stage after stage
  for (const PlanStage& stage : plan.stages)
    for (TaskId t : stage.tasks)
      if (!graph.task(t).constant) order.push_back(t);
  if (order.size() < chunks)
    throw Infeasible("the interleaved plan's " + std::to_string(p) + " stages × " + std::to_string(v) +
                     " virtual stages need " + std::to_string(chunks) + " chunks, but the model has " +
                     std::to_string(order.size()) + " batch tasks: plan fewer --virtual-stages or --stages");
  auto weight = [&](TaskId t) {
    const TaskCost& c = costs.tasks.at(t.value());
    return c.forward_s + c.backward_s;
  };
  double total = 0, planned = 0;
  for (TaskId t : order) total += weight(t);
  for (const PlanStage& stage : plan.stages) planned += stage.cost.forward_s + stage.cost.backward_s;
  // Where chunk c ends: the cumulative share of the planned time, in the table's units.
  std::vector<double> target(chunks);
  double cumulative = 0;
  for (size_t c = 0; c < chunks; ++c) {
    const StageCost& cost = plan.stages[c % p].cost;
    cumulative += planned > 0 ? (cost.forward_s + cost.backward_s) / static_cast<double>(v) / planned
                              : 1.0 / static_cast<double>(chunks);
    target[c] = cumulative * total;
  }
  // Each task goes to the chunk whose run its midpoint falls in; every chunk keeps at least one task.
  std::vector<int> chunk_of_task(graph.num_tasks(), -1);
  std::vector<size_t> end(chunks, 0);  // one past the chunk's last position in `order`
  size_t at = 0;
  double done = 0;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t left = chunks - c - 1;  // chunks after this one, each needing a task
    size_t stop = at + 1;                 // at least one task
    done += weight(order[at]);
    while (stop + left < order.size() && (c + 1 == chunks || done + weight(order[stop]) / 2 <= target[c])) {
      done += weight(order[stop]);
      ++stop;
    }
    at = stop;
    end[c] = stop;
  }
  APART_CHECK(at == order.size(), "the chunk cut left tasks out");
  keep_tensor_parallel_regions_whole(plan, order, weight, end);
  keep_layers_whole(plan, graph, order, weight, end);
  for (size_t c = 0; c < chunks; ++c)
    for (size_t i = c == 0 ? 0 : end[c - 1]; i < end[c]; ++i) chunk_of_task[order[i].value()] = static_cast<int>(c);

  std::vector<PlanStage> result(chunks);
  for (size_t c = 0; c < chunks; ++c) {
    const PlanStage& stage = plan.stages[c % p];
    PlanStage& chunk = result[c];
    chunk.id = StageId(static_cast<uint32_t>(c));
    chunk.replicas = stage.replicas;
    chunk.devices = stage.devices;
    chunk.cost = stage.cost;
    chunk.recompute = stage.recompute;
    // The chunk's batch tasks and, as a stage holds them, the constant tasks they read (through constant tasks).
    std::vector<bool> held(graph.num_tasks(), false);
    std::vector<TaskId> pending;
    for (size_t i = c == 0 ? 0 : end[c - 1]; i < end[c]; ++i) pending.push_back(order[i]);
    while (!pending.empty()) {
      const TaskId t = pending.back();
      pending.pop_back();
      if (held[t.value()]) continue;
      held[t.value()] = true;
      for (ValueId in : graph.task(t).inputs)
        if (in.valid() && graph.value(in).producer.valid() && graph.task(graph.value(in).producer).constant)
          pending.push_back(graph.value(in).producer);
    }
    for (uint32_t t = 0; t < graph.num_tasks(); ++t)  // task ids are a topological order
      if (held[t]) {
        chunk.tasks.push_back(TaskId(t));
        if (!graph.task(TaskId(t)).constant) ++chunk.batch_tasks;
      }
  }
  add_stage_boundaries(graph, chunk_of_task, std::max<int64_t>(1, plan.options.atomic.graph_batch), plan.options.training.precision, result);
  return result;
}

}  // namespace apart
