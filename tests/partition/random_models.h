// Small random task graphs and cost tables for the partition oracles.
#pragma once

#include <random>
#include <string>

#include "graph/task_graph.h"
#include "partition/block_sequence.h"
#include "profiler/cost_table.h"

namespace apart::testing {

struct RandomModel {
  TaskGraph graph;
  CostTable costs;
};

// `tasks` ONNX-like nodes in a DAG (chain when `chain`); a few weight-only (constant) tasks feed batch tasks.
// Values are bound at batch `graph_batch`; costs are at micro-batch `graph_batch`.
inline RandomModel random_model(uint32_t seed, int tasks, bool chain, int64_t graph_batch = 4) {
  std::mt19937 rng(seed);
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  RandomModel m;
  TaskGraph& g = m.graph;
  Value x;
  x.name = "x";
  x.kind = ValueKind::kInput;
  x.bytes = graph_batch * 64;
  const ValueId input = g.add_value(x);
  g.mark_graph_input(input);
  std::vector<ValueId> produced{input};
  ValueId last_weight;
  for (int t = 0; t < tasks; ++t) {
    Task task;
    task.name = "n" + std::to_string(t);
    const bool constant = t > 0 && t + 1 < tasks && pick(5) == 0;
    if (constant) {
      Value w;
      w.name = "w" + std::to_string(t);
      w.kind = ValueKind::kParam;
      w.bytes = 1000 * (1 + pick(50));
      task.op_type = "Transpose";
      task.inputs.push_back(g.add_value(w));
    } else {
      task.op_type = "MatMul";
      const int batch_inputs = chain ? 1 : 1 + pick(2);
      for (int i = 0; i < batch_inputs; ++i) {
        ValueId in = chain ? produced.back() : produced[produced.size() - 1 - pick(std::min<int>(3, produced.size()))];
        if (std::find(task.inputs.begin(), task.inputs.end(), in) == task.inputs.end()) task.inputs.push_back(in);
      }
      // Its own weight, or (now and then) the previous weight again, as tied layers share one.
      if (pick(4) == 0 && last_weight.valid()) {
        task.inputs.push_back(last_weight);
      } else if (const int64_t weight_bytes = 1000 * pick(200); weight_bytes > 0) {
        Value w;
        w.name = "w" + std::to_string(t);
        w.kind = ValueKind::kParam;
        w.bytes = weight_bytes;
        last_weight = g.add_value(w);
        task.inputs.push_back(last_weight);
      }
    }
    Value out;
    out.name = "v" + std::to_string(t);
    out.kind = t + 1 == tasks ? ValueKind::kOutput : ValueKind::kActivation;
    out.bytes = graph_batch * (8 + pick(400));
    const ValueId o = g.add_value(out);
    task.outputs.push_back(o);
    g.add_task(std::move(task));
    if (!constant) produced.push_back(o);
    else {
      // Feed the constant into the next batch task through `pending`.
      produced.insert(produced.end() - 1, o);
    }
    if (t + 1 == tasks) g.mark_graph_output(o);
  }
  g.finalize();
  g.classify_constants();
  m.costs.device = "test";
  m.costs.microbatch_size = graph_batch;
  for (const Task& task : g.tasks()) {
    TaskCost c;
    if (!task.constant) {
      c.forward_s = uniform(0.5, 3.0) * 1e-3 * graph_batch;
      c.backward_s = 2 * c.forward_s;
      c.saved_bytes = graph_batch * (100 + pick(2000));
      c.workspace_bytes = graph_batch * pick(100);
    }
    for (ValueId in : task.inputs)
      if (g.value(in).kind == ValueKind::kParam) c.param_bytes += g.value(in).bytes;
    m.costs.tasks.push_back(c);
  }
  return m;
}

// A block sequence with random affine times, weights, saved bytes (some blocks with an attention core, TpWork) and
// forward transfers (some skipping a block).
inline BlockSequence random_sequence(std::mt19937& rng, int k) {
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  BlockSequence seq;
  for (int b = 0; b < k; ++b) {
    BlockCost c;
    c.forward = {uniform(0, 1e-4), uniform(1e-4, 1e-3)};
    c.backward = {uniform(0, 2e-4), uniform(2e-4, 2e-3)};
    c.param_bytes = static_cast<int64_t>(uniform(0, 4e8));
    c.saved_per_sample = uniform(1e6, 5e7);
    c.workspace_per_sample = uniform(0, 1e6);
    if (uniform(0, 1) < 0.6) {  // an attention core: a little forward, much of the saved bytes (selective recompute)
      const double f = uniform(0.05, 0.3);
      c.tp.core_forward = {c.forward.fixed_s * f, c.forward.per_sample_s * f};
      c.tp.core_saved_per_sample = c.saved_per_sample * uniform(0.2, 0.7);
    }
    seq.blocks.push_back(c);
  }
  for (int b = 0; b + 1 < k; ++b) {
    Transfer t{static_cast<uint32_t>(b), {static_cast<uint32_t>(b + 1)}, uniform(1e4, 1e6)};
    if (b + 3 < k && uniform(0, 1) < 0.3) t.consumers.push_back(static_cast<uint32_t>(b + 3));
    seq.transfers.push_back(t);
  }
  return seq;
}

}  // namespace apart::testing
