// The partition driver: atomic (§IV-A) → block (§IV-B) → stage DP (§IV-C) → the candidate with the least
// estimated iteration time, assembled into a Plan. Baselines share everything after the split.
#include "partition/partition.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <set>

#include "graph/error.h"
#include "partition/baselines.h"
#include "partition/block.h"
#include "partition/select.h"
#include "partition/stage_refine.h"

namespace apart {
namespace {

// How a DP run treats activation recomputation.
enum class RecomputeMode { kOff, kAll, kWhereNeeded };

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  return buf;
}

// Why nothing fits, and what would (DESIGN.md: errors say what to do next).
[[noreturn]] void throw_infeasible(const TaskGraph& graph, const AtomicGraph& atomic, const PartitionOptions& o) {
  const double limit = static_cast<double>(o.cluster.usable_memory_bytes());
  const double state_factor = state_bytes_per_param_byte(o.training.optimizer, o.training.precision);
  const double act = 1.0;  // saved bytes are at the run's precision already
  double total = 0;
  size_t worst = 0;
  double worst_bytes = 0;
  for (size_t c = 0; c < atomic.size(); ++c) {
    const BlockCost& b = atomic.components[c].cost;
    const double one = static_cast<double>(b.param_bytes) * state_factor + b.workspace_per_sample + b.workspace_fixed;
    total += static_cast<double>(b.param_bytes) * state_factor + b.saved_per_sample * act;
    if (one > worst_bytes) { worst_bytes = one; worst = c; }
  }
  const std::string device = std::to_string(o.cluster.usable_memory_bytes() / 1'000'000'000) + " GB";
  if (worst_bytes > limit)
    throw Infeasible("task " + graph.task(atomic.components[worst].batch_task).name + " alone needs " +
                     gb(worst_bytes) + " (weights, gradients and " + std::string(optimizer_name(o.training.optimizer)) +
                     " state) but a device has " + device +
                     "; apart does not split a single operator: use devices with more memory, --precision mixed, or "
                     "a lighter --optimizer");
  const int64_t needed = static_cast<int64_t>(std::ceil(total / limit));
  throw Infeasible("no split of the model fits " + std::to_string(o.cluster.devices) + " devices of " + device +
                   " at global batch " + std::to_string(o.training.global_batch) + " with these pins; it needs ≥ " +
                   std::to_string(std::max<int64_t>(needed, o.cluster.devices + 1)) + " devices of " + device +
                   ", or recomputation (--recompute on/auto), or a smaller micro-batch (more --microbatches)");
}

std::vector<StageSolution> solve_all(const StageEvaluator& evaluator, const std::vector<int64_t>& ms,
                                     const std::vector<int>& stage_counts, const std::vector<Schedule>& schedules,
                                     const std::vector<RecomputeMode>& recomputes, const PartitionOptions& o,
                                     SearchStatistics& stats, const std::chrono::steady_clock::time_point start,
                                     const ProgressFn& progress) {
  std::vector<StageSolution> found;
  for (Schedule schedule : schedules)
    for (RecomputeMode recompute : recomputes)
      for (int64_t m : ms) {
        const bool fixed_split = stage_counts.size() == 1 && static_cast<size_t>(stage_counts[0]) == evaluator.blocks();
        const StageDp dp(evaluator, m, schedule, recompute == RecomputeMode::kAll, o.stage.replicas, fixed_split,
                         recompute == RecomputeMode::kWhereNeeded);
        std::vector<int> counts;
        for (int s : stage_counts)
          if (static_cast<size_t>(s) <= evaluator.blocks()) counts.push_back(s);
        stats.candidates += static_cast<int>(counts.size());
        for (auto& solution : dp.solve_many(counts)) {
          if (!solution) continue;
          if (!o.stage.replicas && o.stage.spend_leftover_devices) dp.spend_leftover_devices(*solution);
          found.push_back(std::move(*solution));
        }
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (progress) {
          char line[160];
          std::snprintf(line, sizeof line, "partition: %s recompute %s m=%lld  %zu plans  %.1f s",
                        std::string(schedule_name(schedule)).c_str(),
                        recompute == RecomputeMode::kOff ? "off" : recompute == RecomputeMode::kAll ? "on" : "where needed",
                        static_cast<long long>(m), found.size(), elapsed);
          progress(line);
        }
        if (o.stage.time_limit_s > 0 && elapsed > o.stage.time_limit_s && !found.empty()) {
          stats.stopped_by_time_limit = true;
          return found;
        }
      }
  return found;
}

}  // namespace

std::vector<int64_t> microbatch_candidates(int64_t global_batch, const StageOptions& options) {
  if (options.microbatches) return {*options.microbatches};
  // Divisors in O(√B): a batch up to limits::kMaxBatch enumerates in microseconds.
  std::vector<int64_t> low, high;
  for (int64_t d = 1; d * d <= global_batch; ++d)
    if (global_batch % d == 0) {
      low.push_back(d);
      if (d * d != global_batch) high.push_back(global_batch / d);
    }
  std::vector<int64_t> ms(low.begin(), low.end());
  ms.insert(ms.end(), high.rbegin(), high.rend());
  // Every divisor while there are few (every batch with at most kAllDivisors, all powers of two among them); a
  // highly composite batch keeps divisors about 8 % apart, as stage_candidates does past 24, so the search stays
  // within a few times that of a power-of-two batch.
  constexpr size_t kAllDivisors = 64;
  if (ms.size() <= kAllDivisors) return ms;
  std::vector<int64_t> thinned;
  for (int64_t m : ms)
    if (thinned.empty() || m == ms.back() || static_cast<double>(m) >= 1.08 * static_cast<double>(thinned.back()))
      thinned.push_back(m);
  return thinned;
}

std::vector<int> stage_candidates(int max_stages, const StageOptions& options) {
  if (options.stages) return {*options.stages};
  std::vector<int> s;
  // Every count up to 24; beyond, steps of about 8 % (the estimate changes slowly there).
  for (int x = 1; x <= max_stages; x = x < 24 ? x + 1 : std::max(x + 1, static_cast<int>(x * 1.08))) s.push_back(x);
  if (s.empty() || s.back() != max_stages) s.push_back(max_stages);
  return s;
}

BlockAssignment baseline_split(const AtomicGraph& atomic, Method method, int stages, double microbatch) {
  const size_t n = atomic.size();
  APART_CHECK(stages >= 1 && static_cast<size_t>(stages) <= n, "baseline stage count");
  if (method == Method::kGpipeBalance) return gpipe_balance_split(atomic, stages, microbatch);
  BlockAssignment a;
  a.blocks = static_cast<uint32_t>(stages);
  a.block_of.resize(n);
  if (method == Method::kParams) {
    std::vector<double> prefix(n + 1, 0);
    for (size_t c = 0; c < n; ++c) prefix[c + 1] = prefix[c] + static_cast<double>(atomic.components[c].cost.param_bytes);
    // Boundary s at the first component where the running sum reaches s/S of the total, keeping ≥ 1 per stage.
    std::vector<size_t> bounds{0};
    for (int s = 1; s < stages; ++s) {
      const double target = prefix[n] * s / stages;
      size_t b = static_cast<size_t>(std::lower_bound(prefix.begin(), prefix.end(), target) - prefix.begin());
      b = std::max(b, bounds.back() + 1);
      b = std::min(b, n - static_cast<size_t>(stages - s));
      bounds.push_back(b);
    }
    bounds.push_back(n);
    for (int s = 0; s < stages; ++s)
      for (size_t c = bounds[s]; c < bounds[s + 1]; ++c) a.block_of[c] = static_cast<uint32_t>(s);
  } else {
    for (size_t c = 0; c < n; ++c) a.block_of[c] = static_cast<uint32_t>(c * stages / n);
  }
  return a;
}

Plan partition_graph(const TaskGraph& graph, const CostTable& costs, const PartitionOptions& options,
                     const CostTable* other, const ProgressFn& progress) {
  const auto start = std::chrono::steady_clock::now();
  options.validate();
  const PartitionOptions& o = options;
  const int64_t batch = o.training.global_batch;
  if (o.stage.microbatches && batch % *o.stage.microbatches != 0)
    throw Infeasible("--batch " + std::to_string(batch) + " is not divisible by --microbatches " +
                     std::to_string(*o.stage.microbatches) + "; use a divisor of the batch or --microbatches auto");
  if (o.stage.replicas && *o.stage.replicas > o.cluster.devices)
    throw Infeasible("--replicas " + std::to_string(*o.stage.replicas) + " exceeds --devices " +
                     std::to_string(o.cluster.devices));
  if (o.stage.replicas && o.stage.microbatches && *o.stage.replicas > batch / *o.stage.microbatches)
    throw Infeasible("--replicas " + std::to_string(*o.stage.replicas) + " is more than the " +
                     std::to_string(batch / *o.stage.microbatches) + " samples of a micro-batch; use fewer replicas "
                     "or fewer micro-batches");

  // ---------------- Atomic level (§IV-A) ----------------
  const AtomicGraph atomic = build_atomic_graph(graph, costs, o.atomic, other);
  const int components = static_cast<int>(atomic.size());
  if (o.stage.stages && *o.stage.stages > components)
    throw Infeasible("--stages " + std::to_string(*o.stage.stages) + " is more than the model's " +
                     std::to_string(components) + " batch tasks; use at most " + std::to_string(components));
  if (o.stage.stages && *o.stage.stages * o.stage.replicas.value_or(1) > o.cluster.devices)
    throw Infeasible("--stages " + std::to_string(*o.stage.stages) + " × " +
                     std::to_string(o.stage.replicas.value_or(1)) + " replicas needs more than --devices " +
                     std::to_string(o.cluster.devices));

  Plan plan;
  plan.options = o;
  plan.search.atomic_components = atomic.size();
  const std::vector<int64_t> ms = microbatch_candidates(batch, o.stage);
  const std::vector<Schedule> schedules{o.stage.schedule.value_or(Schedule::k1F1B)};  // auto: 1F1B never loses here
  // auto: none, or per stage where a stage needs it (which the DP chooses exactly; it subsumes "every stage").
  std::vector<RecomputeMode> recomputes;
  if (o.stage.recompute != Recompute::kOn) recomputes.push_back(RecomputeMode::kOff);
  recomputes.push_back(o.stage.recompute == Recompute::kOn ? RecomputeMode::kAll : RecomputeMode::kWhereNeeded);
  if (o.stage.recompute == Recompute::kOff) recomputes.pop_back();

  // Every DP solution becomes a placed candidate; the simulator picks among them at the end.
  std::vector<Candidate> candidates;
  auto add_candidates = [&](std::vector<StageSolution> solutions, const std::shared_ptr<const BlockSequence>& seq,
                            const std::shared_ptr<const BlockAssignment>& assignment,
                            const std::shared_ptr<const StageEvaluator>& evaluator, const std::string& source) {
    for (StageSolution& s : solutions)
      candidates.push_back(place_candidate(std::move(s), seq, assignment, evaluator, source));
  };
  const bool multi_node = o.cluster.devices > o.cluster.devices_per_node;
  // Per-replica micro-batch the block level and the baselines weigh tasks at (the cost tables' u₁).
  const double reference_u = std::max<double>(1.0, static_cast<double>(batch) / o.cluster.devices);
  if (o.method == Method::kApart || o.method == Method::kMetis) {
    // ---------------- Block level (§IV-B; metis: METIS k-way + cycle repair) ----------------
    int k = o.block.blocks > 0 ? o.block.blocks : automatic_block_count(atomic.size(), o.cluster.devices);
    if (o.stage.stages) k = std::max(k, *o.stage.stages);
    k = std::min(k, components);
    auto assignment = std::make_shared<BlockAssignment>();
    if (o.method == Method::kApart) {
      BlockStatistics block_stats;
      *assignment = build_blocks(atomic, k, o.block, o.training, reference_u, &block_stats);
      plan.search.coarsening_levels = block_stats.levels;
      plan.search.refinement_moves = block_stats.moves;
    } else {
      *assignment = metis_blocks(atomic, k, reference_u);
    }
    plan.search.blocks = assignment->blocks;
    // ---------------- Stage level (§IV-C) ----------------
    auto seq = std::make_shared<const BlockSequence>(make_block_sequence(atomic, *assignment));
    const std::string source(method_name(o.method));
    auto evaluator = std::make_shared<const StageEvaluator>(*seq, o.cluster, o.training);
    const int max_stages = std::min<int>({static_cast<int>(assignment->blocks), o.cluster.devices,
                                          o.stage.max_stages > 0 ? o.stage.max_stages : INT32_MAX});
    std::vector<StageSolution> solutions = solve_all(*evaluator, ms, stage_candidates(max_stages, o.stage), schedules,
                                                     recomputes, o, plan.search, start, progress);
    // Stage-cut refinement (stage_refine.h): the best split of each S with its cuts moved off block edges, one
    // more candidate over its own finer runs of components.
    if (o.method == Method::kApart && !plan.search.stopped_by_time_limit)
      if (auto refined = refine_best_candidates(atomic, *assignment, solutions, o.cluster, o.training)) {
        auto runs = std::make_shared<const BlockAssignment>(std::move(refined->assignment));
        std::shared_ptr<const StageEvaluator> run_evaluator(std::move(refined->evaluator));
        std::vector<StageSolution> one;
        one.push_back(std::move(refined->solution));
        add_candidates(std::move(one), refined->sequence, runs, run_evaluator, source + " refined");
      }
    add_candidates(std::move(solutions), seq, assignment, evaluator, source);
    // Pipeline-major: one pipeline replica per node (or several per node), stages talking over NVLink and every
    // stage's replicas all-reducing across nodes. Only for S ≤ devices per node, with equal replica counts.
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (multi_node && (o.stage.time_limit_s <= 0 || elapsed < o.stage.time_limit_s)) {
      auto pipeline = std::make_shared<const StageEvaluator>(*seq, o.cluster, o.training, Layout::kPipelineMajor);
      const int max_pipeline = std::min(max_stages, o.cluster.devices_per_node);
      std::vector<StageSolution> solutions;
      for (Schedule schedule : schedules)
        for (RecomputeMode recompute : recomputes)
          for (int64_t m : ms)
            for (int s : stage_candidates(max_pipeline, o.stage)) {
              if (s < 2 || s > max_pipeline) continue;
              const int replicas = o.stage.replicas ? *o.stage.replicas
                                                    : static_cast<int>(std::min<int64_t>(o.cluster.devices / s, batch / m));
              if (replicas < 1 || replicas * s > o.cluster.devices) continue;
              ++plan.search.candidates;
              auto solution = StageDp(*pipeline, m, schedule, recompute == RecomputeMode::kAll, replicas, false,
                                      recompute == RecomputeMode::kWhereNeeded)
                                  .solve(s);
              if (solution) solutions.push_back(std::move(*solution));
            }
      add_candidates(std::move(solutions), seq, assignment, pipeline, source + " pipeline-major");
    }
  }
  // Baselines: a fixed split per S; the DP over S blocks only chooses replicas, m and recomputation. apart also
  // adds the baseline splits over all S as candidates (cut at component granularity, which k blocks may not
  // offer), so it is never worse than either baseline under the same cost model.
  auto try_baseline = [&](Method method) {
    const int max_stages =
        std::min<int>({components, o.cluster.devices, o.stage.max_stages > 0 ? o.stage.max_stages : 128});
    for (int s : stage_candidates(max_stages, o.stage)) {
      if (s > components) continue;
      auto a = std::make_shared<const BlockAssignment>(baseline_split(atomic, method, s, reference_u));
      auto seq = std::make_shared<const BlockSequence>(make_block_sequence(atomic, *a));
      auto evaluator = std::make_shared<const StageEvaluator>(*seq, o.cluster, o.training);
      add_candidates(solve_all(*evaluator, ms, {s}, schedules, recomputes, o, plan.search, start, {}), seq, a,
                     evaluator, std::string(method_name(method)));
    }
  };
  // PipeDream: its DP fixes the split and the replicas; apart's estimate then picks m and recomputation.
  auto try_pipedream = [&] {
    PipeDreamPlan pd = pipedream_split(atomic, o.cluster, o.training, reference_u);
    if (pd.split.replicas.empty()) return;
    const int stages = static_cast<int>(pd.split.replicas.size());
    if (o.stage.stages && *o.stage.stages != stages) return;
    auto a = std::make_shared<const BlockAssignment>(std::move(pd.layers));
    auto seq = std::make_shared<const BlockSequence>(make_block_sequence(atomic, *a));
    auto evaluator = std::make_shared<const StageEvaluator>(*seq, o.cluster, o.training);
    std::vector<StageSolution> sols;
    for (Schedule schedule : schedules)
      for (RecomputeMode mode : recomputes)
        for (int64_t m : ms) {
          const bool recompute = mode != RecomputeMode::kOff;  // PipeDream's split: all stages or none
          StageSolution sol;
          sol.stages = stages;
          sol.microbatches = m;
          sol.schedule = schedule;
          sol.recompute = recompute;
          sol.boundaries.assign(pd.split.boundaries.begin(), pd.split.boundaries.end());
          sol.replicas = pd.split.replicas;
          if (*std::max_element(sol.replicas.begin(), sol.replicas.end()) > batch / m) continue;
          ++plan.search.candidates;
          if (evaluate_solution(*evaluator, sol)) sols.push_back(std::move(sol));
        }
    add_candidates(std::move(sols), seq, a, evaluator, "pipedream");
  };
  switch (o.method) {
    case Method::kApart:
      if (o.stage.include_baselines) {
        try_baseline(Method::kUniform);
        try_baseline(Method::kParams);
        try_baseline(Method::kGpipeBalance);  // time-balanced cuts at task granularity (bench/RESULTS.md)
      }
      break;
    case Method::kMetis: break;
    case Method::kPipeDream:
      plan.search.blocks = 0;
      try_pipedream();
      break;
    default:
      plan.search.blocks = 0;
      try_baseline(o.method);
  }
  if (candidates.empty()) throw_infeasible(graph, atomic, o);

  // ---------------- The final choice: least simulated iteration time ----------------
  if (progress) progress("partition: simulating the best of " + std::to_string(candidates.size()) + " candidates");
  const auto deadline = o.stage.time_limit_s > 0
                            ? start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                          std::chrono::duration<double>(o.stage.time_limit_s))
                            : std::chrono::steady_clock::time_point::max();
  const Selection selection = select_by_simulation(candidates, o.stage.max_simulations, deadline);
  const Candidate& chosen = candidates[selection.index];
  const StageSolution* best = &chosen.solution;
  const StageEvaluator* chosen_evaluator = chosen.evaluator.get();
  const BlockAssignment& chosen_assignment = *chosen.assignment;
  plan.search.chosen_split = chosen.source;
  plan.search.candidates_placed = static_cast<int>(candidates.size());
  plan.search.simulated = selection.stats.simulated;
  plan.search.pruned = selection.stats.pruned;
  plan.search.not_simulated = selection.stats.not_simulated;
  plan.search.stopped_by_time_limit |= selection.stats.not_simulated > 0 && o.stage.time_limit_s > 0;

  // ---------------- Assemble the plan ----------------
  plan.layout = chosen.placement.layout;
  plan.microbatches = best->microbatches;
  plan.microbatch_size = batch / best->microbatches;
  plan.schedule = best->schedule;
  plan.recompute = best->recompute;
  plan.estimate = best->estimate;
  plan.simulated.iteration_s = selection.result.iteration_s;
  plan.simulated.pipeline_s = selection.result.pipeline_s;
  plan.simulated.bubble_fraction = selection.result.bubble_fraction;
  for (const sim::StageStats& st : selection.result.stages)
    if (st.busy_s > selection.result.stages[plan.simulated.bottleneck_stage].busy_s) plan.simulated.bottleneck_stage = st.stage;
  plan.options.stage.stages = best->stages;
  plan.options.stage.microbatches = best->microbatches;
  plan.options.stage.schedule = best->schedule;
  plan.options.stage.recompute = !best->any_recompute() ? Recompute::kOff
                                 : best->stage_recompute.empty() ? Recompute::kOn
                                                                 : o.stage.recompute;
  plan.samples_per_s = plan.simulated.iteration_s > 0 ? static_cast<double>(batch) / plan.simulated.iteration_s : 0;
  plan.compute_lower_bound_s = chosen_evaluator->total_per_sample_s() * static_cast<double>(batch) / o.cluster.devices;

  std::vector<int> stage_of_block(chosen_assignment.blocks, 0);
  for (int s = 0; s < best->stages; ++s)
    for (uint32_t b = best->boundaries[s]; b < best->boundaries[s + 1]; ++b) stage_of_block[b] = s;
  std::vector<int> stage_of_task(graph.num_tasks(), -1);  // batch tasks only
  std::vector<std::set<uint32_t>> tasks_of(best->stages);
  for (size_t c = 0; c < atomic.size(); ++c) {
    const int s = stage_of_block[chosen_assignment.block_of[c]];
    stage_of_task[atomic.components[c].batch_task.value()] = s;
    tasks_of[s].insert(atomic.components[c].batch_task.value());
    for (TaskId t : atomic.components[c].constant_tasks) tasks_of[s].insert(t.value());
  }
  for (int s = 0; s < best->stages; ++s) {
    PlanStage st;
    st.id = s;
    st.replicas = best->replicas[s];
    st.devices = chosen.placement.devices[s];
    for (uint32_t t : tasks_of[s]) {
      st.tasks.push_back(TaskId(t));
      if (!graph.task(TaskId(t)).constant) ++st.batch_tasks;
    }
    st.cost = best->costs[s];
    st.recompute = best->recomputes(s);
    plan.peak_memory_bytes = std::max(plan.peak_memory_bytes, st.cost.memory_bytes);
    plan.stages.push_back(std::move(st));
  }
  // Boundary values: produced by a batch task of one stage (or a model input), read by batch tasks of others.
  for (uint32_t v = 0; v < graph.num_values(); ++v) {
    const Value& value = graph.value(ValueId(v));
    int from;
    if (value.kind == ValueKind::kInput) from = -1;
    else if (value.producer.valid() && stage_of_task[value.producer.value()] >= 0) from = stage_of_task[value.producer.value()];
    else continue;  // params, constants
    std::set<int> to;
    for (TaskId t : graph.consumers(ValueId(v)))
      if (stage_of_task[t.value()] >= 0 && stage_of_task[t.value()] != from) to.insert(stage_of_task[t.value()]);
    // At the run's activation precision (mixed: half of the graph's fp32 bytes), as the cost model sends them.
    const double per_sample = static_cast<double>(value.bytes) / static_cast<double>(atomic.graph_batch) *
                              activation_bytes_factor(o.training.precision);
    for (int s : to) {
      APART_CHECK(s > from, "a value flows backward between stages: " + value.name);
      plan.stages[s].inputs.push_back({ValueId(v), from, per_sample * static_cast<double>(plan.stages[s].cost.microbatch)});
    }
    const bool model_output = value.kind == ValueKind::kOutput ||
                              std::find(graph.graph_outputs().begin(), graph.graph_outputs().end(), ValueId(v)) !=
                                  graph.graph_outputs().end();
    if (from >= 0 && (!to.empty() || model_output))
      plan.stages[from].outputs.push_back({ValueId(v), std::vector<int>(to.begin(), to.end()),
                                           per_sample * static_cast<double>(plan.stages[from].cost.microbatch)});
  }
  plan.search.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

}  // namespace apart
