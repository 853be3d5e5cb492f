// Atomic level (paper §IV-A) and aggregation of components into blocks.
#include "partition/atomic.h"

#include <algorithm>
#include <map>
#include <set>

#include "graph/error.h"
#include "partition/tensor_parallel.h"
#include "profiler/cost_model.h"

namespace apart {
namespace {

constexpr uint32_t kNoComponent = UINT32_MAX;

WorkCurve fit(double t0, int64_t u0, const TaskCost* other, double t1, int64_t u1) {
  WorkCurve w;
  if (other == nullptr || u1 == u0) {
    w.per_sample_s = t0 / static_cast<double>(u0);
    return w;
  }
  const double slope = (t1 - t0) / static_cast<double>(u1 - u0);
  if (slope <= 0) {  // not growing with the batch: keep it proportional to stay conservative
    w.per_sample_s = std::max(t0 / static_cast<double>(u0), t1 / static_cast<double>(u1));
    return w;
  }
  w.per_sample_s = slope;
  w.fixed_s = std::max(0.0, t0 - slope * static_cast<double>(u0));
  return w;
}

// The tensor-parallel share of each component (BlockCost::tp): a component whose batch task a region splits puts its
// whole work, saved bytes and weights there; the component producing a region's end value pays its closing
// all-reduce forward, the one of its first column linear the all-reduces of its inputs' gradients backward. An LM
// head's all-gather of its logits moves half an all-reduce's ring volume: counted as half the bytes.
void add_tensor_parallel_work(const TaskGraph& graph, const std::vector<uint32_t>& component_of,
                              const std::vector<std::string>& banned_seeds, AtomicGraph& atomic) {
  std::vector<TaskId> banned;
  for (const std::string& name : banned_seeds)
    if (const std::optional<TaskId> t = graph.find_task(name)) banned.push_back(*t);
  atomic.tensor_parallel =
      std::make_shared<const TensorParallelRegions>(find_tensor_parallel_regions(graph, atomic.graph_batch, banned));
  const TensorParallelRegions& found = *atomic.tensor_parallel;
  auto component = [&](TaskId t) -> AtomicComponent* {
    const uint32_t c = t.valid() ? component_of[t.value()] : kNoComponent;
    return c == kNoComponent ? nullptr : &atomic.components[c];
  };
  for (uint32_t t = 0; t < graph.num_tasks(); ++t) {
    AtomicComponent* c = component(TaskId(t));
    if (!c || found.roles[t] == TpRole::kReplicated) continue;
    c->cost.tp.forward = c->cost.forward;
    c->cost.tp.backward = c->cost.backward;
    c->cost.tp.saved_per_sample = c->cost.saved_per_sample;
    c->cost.tp.param_bytes = c->cost.param_bytes;
  }
  for (TaskId t : found.between_regions)
    if (AtomicComponent* c = component(t)) {
      c->cost.tp.sp_forward = c->cost.forward;
      c->cost.tp.sp_backward = c->cost.backward;
      c->cost.tp.sp_saved_per_sample = c->cost.saved_per_sample;
    }
  for (AtomicComponent& c : atomic.components) c.cost.tp.sequence = found.sequence;
  const std::vector<bool> grad = values_requiring_grad(graph);
  const double batch = static_cast<double>(atomic.graph_batch);
  for (const TpRegion& region : found.regions) {
    // The core's forward runs again under selective recomputation; of what its tasks save, the values the core
    // itself produces (scores, probabilities, dropout masks) are dropped, its inputs (q, k, v) kept.
    std::set<uint32_t> core_values;
    for (TaskId t : region.core_tasks)
      for (ValueId out : graph.task(t).outputs)
        if (out.valid()) core_values.insert(out.value());
    for (TaskId t : region.core_tasks) {
      AtomicComponent* c = component(t);
      if (!c) continue;
      c->cost.tp.core_forward = c->cost.forward;
      const BackwardWork bw = backward_work(graph, t, forward_work(graph, t), grad);
      double dropped = bw.extra_saved_bytes, all = bw.extra_saved_bytes;
      for (ValueId v : bw.saved) {
        const double bytes = static_cast<double>(graph.value(v).bytes);
        all += bytes;
        if (core_values.count(v.value()) > 0) dropped += bytes;
      }
      if (all > 0) c->cost.tp.core_saved_per_sample = c->cost.saved_per_sample * dropped / all;
    }
    uint8_t refused = 0;
    for (size_t i = 1; i < std::size(kTpDegrees); ++i)
      if (std::find(region.degrees.begin(), region.degrees.end(), kTpDegrees[i]) == region.degrees.end())
        refused |= static_cast<uint8_t>(1u << (i - 1));
    for (TaskId t : region.tasks)
      if (AtomicComponent* c = component(t)) c->cost.tp.refused |= refused;
    if (AtomicComponent* end = component(graph.value(region.end_value).producer)) {
      end->cost.tp.forward_collective_per_sample +=
          region.closing == TpClosing::kAllGather ? region.end_bytes_per_sample / 2 : region.end_bytes_per_sample;
      ++end->cost.tp.forward_collectives;
    }
    if (region.column_tasks.empty()) continue;
    if (AtomicComponent* first = component(region.column_tasks.front()))
      for (ValueId in : region.inputs) {
        first->cost.tp.backward_collective_per_sample += static_cast<double>(graph.value(in).bytes) / batch;
        ++first->cost.tp.backward_collectives;
      }
  }
}

}  // namespace

AtomicGraph build_atomic_graph(const TaskGraph& graph, const CostTable& costs, const AtomicOptions& options,
                               const CostTable* other) {
  APART_CHECK(graph.finalized(), "build_atomic_graph needs a finalized graph");
  const size_t n = graph.num_tasks();
  if (costs.tasks.size() != n)
    throw InvalidArgument("cost table has " + std::to_string(costs.tasks.size()) + " tasks but the model has " +
                          std::to_string(n) + "; regenerate costs.json for this model and shapes");
  if (costs.microbatch_size <= 0) throw InvalidArgument("cost table has no micro-batch size");
  if (other && other->tasks.size() != n) other = nullptr;
  const int64_t u0 = costs.microbatch_size;
  const int64_t u1 = other ? other->microbatch_size : u0;

  AtomicGraph atomic;
  atomic.graph_batch = options.graph_batch > 0 ? options.graph_batch : u0;
  std::vector<uint32_t> component_of(n, kNoComponent);
  for (uint32_t t = 0; t < n; ++t) {
    const Task& task = graph.task(TaskId(t));
    if (task.constant) continue;
    component_of[t] = static_cast<uint32_t>(atomic.components.size());
    AtomicComponent c;
    c.batch_task = TaskId(t);
    const TaskCost& tc = costs.tasks[t];
    const TaskCost* oc = other ? &other->tasks[t] : nullptr;
    c.cost.forward = fit(tc.forward_s, u0, oc, oc ? oc->forward_s : 0, u1);
    c.cost.backward = fit(tc.backward_s, u0, oc, oc ? oc->backward_s : 0, u1);
    // The batch task's own backward: the constant tasks' fixed share added below stays with B.
    c.cost.backward_weight = {kWeightGradientShare * c.cost.backward.fixed_s,
                              kWeightGradientShare * c.cost.backward.per_sample_s};
    c.cost.saved_per_sample = static_cast<double>(tc.saved_bytes) / static_cast<double>(u0);
    c.cost.workspace_per_sample = static_cast<double>(tc.workspace_bytes) / static_cast<double>(u0);
    atomic.components.push_back(std::move(c));
  }
  if (atomic.components.empty())
    throw Infeasible("the model has no batch task (every node depends on weights and constants only); "
                     "there is nothing to pipeline");

  // Constant tasks join every component that (transitively) consumes them: replicated, not communicated.
  std::vector<std::vector<uint32_t>> users(n);
  for (uint32_t t = static_cast<uint32_t>(n); t-- > 0;) {
    if (!graph.task(TaskId(t)).constant) continue;
    std::set<uint32_t> set;
    for (TaskId s : graph.successors(TaskId(t))) {
      if (component_of[s.value()] != kNoComponent) set.insert(component_of[s.value()]);
      else set.insert(users[s.value()].begin(), users[s.value()].end());
    }
    users[t].assign(set.begin(), set.end());
  }
  // A constant task that runs every step (it reads params: a measured profile's times; the analytic model's are 0)
  // costs the same at any micro-batch size. Its time is split evenly over its users, so that a stage holding all of
  // them pays it once; a stage holding some pays its share (the runtime runs it in full there: an underestimate
  // only for constants shared across stages).
  for (uint32_t t = 0; t < n; ++t) {
    const double share = users[t].empty() ? 0 : 1.0 / static_cast<double>(users[t].size());
    for (uint32_t c : users[t]) {
      AtomicComponent& component = atomic.components[c];
      component.constant_tasks.push_back(TaskId(t));
      component.cost.forward.fixed_s += costs.tasks[t].forward_s * share;
      component.cost.backward.fixed_s += costs.tasks[t].backward_s * share;
    }
  }

  // Weights: each counted once per component that reads it, directly or through its constant tasks.
  for (uint32_t v = 0; v < graph.num_values(); ++v) {
    const Value& value = graph.value(ValueId(v));
    if (value.kind != ValueKind::kParam || value.bytes == 0) continue;
    std::set<uint32_t> readers;
    for (TaskId t : graph.consumers(ValueId(v))) {
      if (component_of[t.value()] != kNoComponent) readers.insert(component_of[t.value()]);
      else readers.insert(users[t.value()].begin(), users[t.value()].end());
    }
    if (readers.empty()) continue;
    for (uint32_t c : readers) atomic.components[c].cost.param_bytes += value.bytes;
    atomic.params.push_back(ParamUse{value.bytes, std::vector<uint32_t>(readers.begin(), readers.end())});
  }
  // A component is one batch task (with the constant tasks feeding it): its weights are one task's. Only a task
  // that reads weights has a weight gradient to compute.
  for (AtomicComponent& c : atomic.components) {
    c.cost.largest_task_param_bytes = c.cost.param_bytes;
    if (c.cost.param_bytes == 0) c.cost.backward_weight = {};
  }
  add_tensor_parallel_work(graph, component_of, options.tp_banned_seeds, atomic);

  // Transfers: values produced by a batch task and read by batch tasks of other components.
  for (uint32_t v = 0; v < graph.num_values(); ++v) {
    const Value& value = graph.value(ValueId(v));
    if (!value.producer.valid() || component_of[value.producer.value()] == kNoComponent) continue;
    const uint32_t producer = component_of[value.producer.value()];
    std::set<uint32_t> consumers;
    for (TaskId t : graph.consumers(ValueId(v)))
      if (component_of[t.value()] != kNoComponent && component_of[t.value()] != producer)
        consumers.insert(component_of[t.value()]);
    if (consumers.empty()) continue;
    Transfer tr;
    tr.producer = producer;
    tr.consumers.assign(consumers.begin(), consumers.end());
    tr.bytes_per_sample = static_cast<double>(value.bytes) / static_cast<double>(atomic.graph_batch);
    atomic.transfers.push_back(std::move(tr));
    atomic.transfer_values.push_back(ValueId(v));
  }
  return atomic;
}

BlockSequence make_block_sequence(const AtomicGraph& atomic, const BlockAssignment& assignment) {
  APART_CHECK(assignment.block_of.size() == atomic.size(), "assignment size");
  BlockSequence seq;
  seq.blocks.resize(assignment.blocks);
  for (size_t c = 0; c < atomic.size(); ++c) {
    BlockCost& b = seq.blocks[assignment.block_of_component(ComponentId(static_cast<uint32_t>(c))).value()];
    const BlockCost& a = atomic.components[c].cost;
    b.forward += a.forward;
    b.backward += a.backward;
    b.backward_weight += a.backward_weight;
    b.param_bytes += a.param_bytes;
    b.saved_per_sample += a.saved_per_sample;
    b.workspace_per_sample = std::max(b.workspace_per_sample, a.workspace_per_sample);
    b.workspace_fixed = std::max(b.workspace_fixed, a.workspace_fixed);
    b.largest_task_param_bytes = std::max(b.largest_task_param_bytes, a.largest_task_param_bytes);
    b.tp += a.tp;
  }
  // Identical (producer, consumers) transfers are summed: the evaluator's setup is linear in their number.
  // Most transfers stay inside a block: they are dropped without allocating (one scratch list for the rest).
  std::map<std::pair<uint32_t, std::vector<uint32_t>>, double> merged;
  std::vector<uint32_t> consumers;
  for (const Transfer& t : atomic.transfers) {
    const uint32_t producer = assignment.block_of_component(ComponentId(t.producer)).value();
    consumers.clear();
    for (uint32_t c : t.consumers) {
      const uint32_t b = assignment.block_of_component(ComponentId(c)).value();
      APART_CHECK(b >= producer, "a transfer goes backward between blocks: the block order is not topological");
      if (b != producer) consumers.push_back(b);
    }
    if (consumers.empty()) continue;
    std::sort(consumers.begin(), consumers.end());
    consumers.erase(std::unique(consumers.begin(), consumers.end()), consumers.end());
    merged[{producer, consumers}] += t.bytes_per_sample;
  }
  for (auto& [key, bytes] : merged) seq.transfers.push_back(Transfer{key.first, key.second, bytes});
  // A weight read by several components of one block counts once in that block.
  for (BlockCost& b : seq.blocks) b.param_bytes = 0;
  seq.params.reserve(atomic.params.size());
  std::vector<uint32_t> readers;
  for (const ParamUse& p : atomic.params) {
    readers.clear();
    for (uint32_t c : p.readers) readers.push_back(assignment.block_of_component(ComponentId(c)).value());
    std::sort(readers.begin(), readers.end());
    readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
    for (uint32_t b : readers) seq.blocks[b].param_bytes += p.bytes;
    seq.params.push_back(ParamUse{p.bytes, readers});
  }
  return seq;
}

}  // namespace apart
