// The phases of a partition search (phases.h): each takes and returns plain data, so a script of them reads as the
// algorithm and each can be tested alone.
#include "partition/phases.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <mutex>
#include <set>
#include <span>
#include <tuple>

#include "graph/error.h"
#include "graph/threads.h"
#include "graph/units.h"
#include "partition/baselines.h"
#include "partition/stage_refine.h"
#include "partition/target.h"
#include "profiler/memory_model.h"

namespace apart {
namespace {

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
  double total = 0, activations = 0;
  ComponentId worst(0);
  double worst_bytes = 0;
  for (uint32_t c = 0; c < atomic.size(); ++c) {
    const BlockCost& b = atomic.component(ComponentId(c)).cost;
    const double one = static_cast<double>(b.param_bytes) * state_factor + b.workspace_per_sample + b.workspace_fixed;
    total += static_cast<double>(b.param_bytes) * state_factor + b.saved_per_sample * act;
    activations += b.saved_per_sample * act;
    if (one > worst_bytes) { worst_bytes = one; worst = ComponentId(c); }
  }
  const std::string device = std::to_string(o.cluster.usable_memory_bytes() / 1'000'000'000) + " GB";
  if (worst_bytes > limit)
    throw Infeasible("task " + graph.task(atomic.component(worst).batch_task).name + " alone needs " +
                     gb(worst_bytes) + " (weights, gradients and " + std::string(optimizer_name(o.training.optimizer)) +
                     " state) but a device has " + device +
                     "; apart does not split a single operator: use devices with more memory, --precision mixed, or "
                     "a lighter --optimizer");
  // The fewest devices that could hold it: every parameter's state once (ZeRO and TP shard it, never shrink it)
  // plus, unless recomputation may drop them, one sample's saved activations. Past the devices given, no option but
  // a lighter state per parameter helps; within them, the search found no split, and the options not in effect may.
  const double bound = o.stage.recompute == Recompute::kOff ? total : total - activations;
  const int64_t needed = static_cast<int64_t>(std::ceil(bound / limit));
  const bool lighter_state = o.training.precision == Precision::kFp32 && o.cluster.device.peak_fp16_flops > 0;
  std::vector<std::string> fixes;
  if (needed > o.cluster.devices) {
    fixes.push_back("≥ " + std::to_string(needed) + " devices of " + device);
  } else {
    // auto recomputes where memory needs it, and --microbatches auto tries every micro-batch size down to one sample.
    fixes.push_back("more than " + std::to_string(o.cluster.devices) + " devices of " + device);
    if (o.stage.recompute == Recompute::kOff || o.stage.recompute == Recompute::kSelective)
      fixes.push_back("recomputation (--recompute auto)");
    if (o.stage.microbatches && *o.stage.microbatches < o.training.global_batch)
      fixes.push_back("a smaller micro-batch (more --microbatches, or auto)");
    if (o.stage.zero)
      fixes.push_back("ZeRO (--zero auto shards optimizer state, gradients and weights among replicas)");
    if (o.stage.tp && o.cluster.devices_per_node > 1)
      fixes.push_back("tensor parallelism (--tp auto splits a layer's weights across a node's devices)");
  }
  if (lighter_state) fixes.push_back("--precision mixed");
  std::string what;
  for (size_t i = 0; i < fixes.size(); ++i) what += (i == 0 ? "" : i + 1 == fixes.size() ? ", or " : ", ") + fixes[i];
  throw Infeasible("no split of the model fits " + std::to_string(o.cluster.devices) + " devices of " + device +
                   " at global batch " + std::to_string(o.training.global_batch) + " with these pins; it needs " + what);
}

// The most stages a split into `parts` blocks offers on this cluster (--max-stages, else `otherwise`).
int max_stage_count(int parts, const PartitionOptions& o, int otherwise) {
  return std::min<int>({parts, o.cluster.devices, o.stage.max_stages > 0 ? o.stage.max_stages : otherwise});
}

}  // namespace

// ---------------- The clock ----------------

double SearchClock::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::chrono::steady_clock::time_point SearchClock::deadline() const {
  if (!limited()) return std::chrono::steady_clock::time_point::max();
  return start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(time_limit_s));
}

SearchClock SearchClock::silent() const {
  SearchClock quiet = *this;
  quiet.progress = {};
  return quiet;
}

SearchClock SearchClock::one_thread() const {
  SearchClock serial = *this;
  serial.threads = 1;
  return serial;
}

void SearchClock::report(const std::string& line) const {
  if (!progress) return;
  const std::lock_guard<std::mutex> lock(*progress_lock);
  progress(line);
}

// ---------------- The request ----------------

void check_request(const PartitionOptions& o) {
  o.validate();
  const int64_t batch = o.training.global_batch;
  if (o.stage.microbatches && batch % *o.stage.microbatches != 0)
    throw Infeasible("--batch " + std::to_string(batch) + " is not divisible by --microbatches " +
                     std::to_string(*o.stage.microbatches) + "; use a divisor of the batch or --microbatches auto");
  if (o.stage.schedule == Schedule::kInterleaved && o.stage.stages && o.stage.microbatches &&
      *o.stage.microbatches % *o.stage.stages != 0)
    throw Infeasible("--schedule interleaved needs --microbatches (" + std::to_string(*o.stage.microbatches) +
                     ") to be a multiple of --stages (" + std::to_string(*o.stage.stages) + "), as Megatron-LM's "
                     "interleaved order does; pick a multiple, --stages auto, or --schedule 1f1b");
  if (o.stage.replicas && *o.stage.replicas > o.cluster.devices)
    throw Infeasible("--replicas " + std::to_string(*o.stage.replicas) + " exceeds --devices " +
                     std::to_string(o.cluster.devices));
  if (o.stage.replicas && o.stage.microbatches && *o.stage.replicas > batch / *o.stage.microbatches)
    throw Infeasible("--replicas " + std::to_string(*o.stage.replicas) + " is more than the " +
                     std::to_string(batch / *o.stage.microbatches) + " samples of a micro-batch; use fewer replicas "
                     "or fewer micro-batches");
}

SearchGrid search_grid(const PartitionOptions& o) {
  SearchGrid grid;
  // auto: 1F1B never loses to GPipe here. Interleaving only when asked: it needs m to be a multiple of S and adds
  // transfers, and leaving it out of auto keeps every plan the search made before the same.
  grid.schedules = {o.stage.schedule.value_or(Schedule::k1F1B)};
  grid.virtual_stages = schedule_chunks(grid.schedules.front(), o.stage.virtual_stages);
  // auto: none, or per stage where a stage needs it (which the DP chooses exactly; it subsumes "every stage").
  if (o.stage.recompute == Recompute::kAuto || o.stage.recompute == Recompute::kOff)
    grid.recomputes.push_back(StageRecompute::kOff);
  if (o.stage.recompute == Recompute::kOn) grid.recomputes.push_back(StageRecompute::kAll);
  if (o.stage.recompute == Recompute::kSelective) grid.recomputes.push_back(StageRecompute::kSelective);
  // Per stage under auto; selective (attention cores only) only where the plan already goes past what apart run
  // executes (--tp auto or a degree above 1): at the default --tp 1 a default plan stays executable.
  if (o.stage.recompute == Recompute::kAuto)
    grid.recomputes.push_back(!o.stage.tp || *o.stage.tp > 1 ? StageRecompute::kWhereNeeded : StageRecompute::kWholeWhereNeeded);
  // auto: none, or per stage. The per-stage DP ties on its bottleneck by the fewest devices, which may pick a
  // variant that simulates slower; with the plain DP's solutions among the candidates too, the simulated choice is
  // never worse than --zero 0's (as recomputation's off and where-needed points are).
  grid.zeros = {stage_zero_of(o.stage.zero)};
  if (!o.stage.zero) grid.zeros.insert(grid.zeros.begin(), stage_zero_of(0));
  grid.microbatches = microbatch_candidates(o.training.global_batch, o.stage);
  grid.reference_microbatch = std::max<double>(1.0, static_cast<double>(o.training.global_batch) / o.cluster.devices);
  return grid;
}

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

// ---------------- Atomic level ----------------

AtomicGraph atomic_level(const TaskGraph& graph, const CostTable& costs, const PartitionOptions& o,
                         const CostTable* costs_at_other_size) {
  AtomicGraph atomic = build_atomic_graph(graph, costs, o.atomic, costs_at_other_size);
  const int components = static_cast<int>(atomic.size());
  if (o.stage.stages && *o.stage.stages > components)
    throw Infeasible("--stages " + std::to_string(*o.stage.stages) + " is more than the model's " +
                     std::to_string(components) + " batch tasks; use at most " + std::to_string(components));
  const int tp = o.stage.tp.value_or(1);
  if (o.stage.stages && *o.stage.stages * o.stage.replicas.value_or(1) * tp > o.cluster.devices)
    throw Infeasible("--stages " + std::to_string(*o.stage.stages) + " × " +
                     std::to_string(o.stage.replicas.value_or(1)) + " replicas" +
                     (tp > 1 ? " × --tp " + std::to_string(tp) : std::string()) + " needs more than --devices " +
                     std::to_string(o.cluster.devices));
  return atomic;
}

// ---------------- Block level ----------------

int block_count(const AtomicGraph& atomic, const PartitionOptions& o) {
  int k = o.block.blocks > 0 ? o.block.blocks : automatic_block_count(atomic.size(), o.cluster.devices);
  if (o.stage.stages) k = std::max(k, *o.stage.stages);
  return std::min(k, static_cast<int>(atomic.size()));
}

BlockLevel block_level(const AtomicGraph& atomic, const PartitionOptions& o, const SearchGrid& grid) {
  BlockLevel level;
  level.assignment = build_blocks(atomic, block_count(atomic, o), o.block, o.training, grid.reference_microbatch,
                                  &level.stats);
  return level;
}

BlockLevel metis_block_level(const AtomicGraph& atomic, const PartitionOptions& o, const SearchGrid& grid) {
  BlockLevel level;
  level.assignment = metis_blocks(atomic, block_count(atomic, o), grid.reference_microbatch);
  return level;
}

// ---------------- Stage DP ----------------

Split make_split(const AtomicGraph& atomic, BlockAssignment assignment, const PartitionOptions& o, std::string source) {
  Split split;
  auto owned = std::make_shared<const BlockAssignment>(std::move(assignment));
  split.sequence = std::make_shared<const BlockSequence>(make_block_sequence(atomic, *owned));
  split.assignment = std::move(owned);
  split.evaluator = std::make_shared<const StageEvaluator>(*split.sequence, o.cluster, o.training);
  split.source = std::move(source);
  return split;
}

Split with_layout(const Split& split, Layout layout, std::string source) {
  Split other = split;
  other.evaluator = std::make_shared<const StageEvaluator>(*split.sequence, split.evaluator->cluster(),
                                                           split.evaluator->training(), layout);
  other.source = std::move(source);
  return other;
}

bool fixed_split_may_fit(const StageEvaluator& evaluator, int64_t microbatches, Schedule schedule, int chunks,
                         StageRecompute recompute, StageZero zero, const std::vector<int>& tp_degrees,
                         std::optional<int> pinned_replicas) {
  // Memory depends on the replicas only through the per-replica micro-batch and the ZeRO shard, which fall as they
  // grow: the most replicas the DP may give a stage (its last replica candidate, stage_dp.h) use the least. The same
  // test as the DP's (stage_dp.cpp first_fitting), so a block that fails it fails every candidate there.
  const int64_t per_microbatch = evaluator.training().global_batch / microbatches;
  const int devices = evaluator.cluster().devices;
  const int most = pinned_replicas ? *pinned_replicas : static_cast<int>(std::min<int64_t>(devices, per_microbatch));
  if (most < 1 || most > devices || most > per_microbatch) return false;
  const double budget = static_cast<double>(evaluator.cluster().usable_memory_bytes());
  const int stages = static_cast<int>(evaluator.blocks());
  const std::vector<StageVariant> variants = stage_variants(recompute, zero, tp_degrees);
  for (int b = 0; b < stages; ++b) {
    const double flight = stage_in_flight_activations(schedule, b, stages, microbatches, chunks);
    auto fits = [&](const StageVariant& v) {
      if (!evaluator.allows_tp(static_cast<uint32_t>(b), static_cast<uint32_t>(b + 1), v.tp)) return false;
      const StageCost c = evaluator.evaluate(static_cast<uint32_t>(b), static_cast<uint32_t>(b + 1), most,
                                             microbatches, 0, v.recompute, nullptr, v.zero, v.tp);
      return std::ceil(c.memory_static + flight * c.memory_per_in_flight) <= budget;
    };
    if (std::none_of(variants.begin(), variants.end(), fits)) return false;
  }
  return true;
}

namespace {

// The recomputation setting whose DP answers every one of `recomputes` (StageDp::solve_many's subsets): the
// where-needed one among them when every other is a subset of it; else none (each gets its own DP).
std::optional<StageRecompute> host_recompute(const std::vector<StageRecompute>& recomputes) {
  auto subset_of = [](StageRecompute part, StageRecompute host) {
    if (part == host) return true;
    if (host == StageRecompute::kWhereNeeded) return part != StageRecompute::kWholeWhereNeeded;
    if (host == StageRecompute::kWholeWhereNeeded) return part == StageRecompute::kOff || part == StageRecompute::kAll;
    return false;
  };
  for (StageRecompute host : recomputes)
    if (std::all_of(recomputes.begin(), recomputes.end(), [&](StageRecompute r) { return subset_of(r, host); }))
      return host;
  return std::nullopt;
}

}  // namespace

namespace {

// One DP's grid point: the DP is built for `built` and answers every setting of `recomputes`.
struct GridPoint {
  Schedule schedule;
  StageZero zero;
  int64_t microbatches;
  StageRecompute built;                    // the DP's own setting
  std::vector<StageRecompute> recomputes;  // the settings it answers, in grid order
};

// One DP per (schedule, zero, m) answers every recomputation setting of the grid from one set of tables, where the
// where-needed setting's variants hold the others' (StageDp::solve_many); else one DP per grid point.
std::vector<GridPoint> grid_points(const SearchGrid& grid) {
  const std::optional<StageRecompute> host = host_recompute(grid.recomputes);
  std::vector<GridPoint> points;
  for (Schedule schedule : grid.schedules)
    for (StageZero zero : grid.zeros)
      for (int64_t m : grid.microbatches) {
        if (host) {
          points.push_back({schedule, zero, m, *host, grid.recomputes});
          continue;
        }
        for (StageRecompute recompute : grid.recomputes) points.push_back({schedule, zero, m, recompute, {recompute}});
      }
  return points;
}

StageDpOptions dp_options(const GridPoint& p, int chunks, const std::vector<int>& tp, const StageOptions& o,
                          bool fixed_split) {
  return {.microbatches = p.microbatches,
          .schedule = p.schedule,
          .virtual_stages = chunks,
          .recompute = p.built,
          .zero = p.zero,
          .tp_degrees = tp,
          .pinned_replicas = o.replicas,
          .fixed_split = fixed_split};
}

// A grid point's solutions per recomputation setting it answers (those `may_fit` allows), from its DP.
std::vector<std::vector<StageSolution>> answer_point(const StageDp& dp, const GridPoint& p,
                                                     const std::vector<char>& may_fit, const std::vector<int>& counts,
                                                     const StageOptions& o) {
  std::vector<std::vector<StageSolution>> answers(p.recomputes.size());
  for (size_t r = 0; r < p.recomputes.size(); ++r) {
    if (!may_fit[r]) continue;
    for (auto& solution : dp.solve_many(counts, p.recomputes[r])) {
      if (!solution) continue;
      if (!o.replicas && o.spend_leftover_devices) dp.spend_leftover_devices(*solution, p.recomputes[r]);
      answers[r].push_back(std::move(*solution));
    }
  }
  return answers;
}

// The points' solutions gathered in grid order: schedule, recomputation, ZeRO, m (the order the selection breaks
// ties in); `ran`: the points solved.
StageSolutions gather_points(const SearchGrid& grid, const std::vector<GridPoint>& points,
                             std::vector<std::vector<std::vector<StageSolution>>>& solutions,
                             const std::vector<char>& ran, size_t counts) {
  StageSolutions found;
  for (Schedule schedule : grid.schedules)
    for (size_t r = 0; r < grid.recomputes.size(); ++r)
      for (size_t i = 0; i < points.size(); ++i) {
        const GridPoint& p = points[i];
        if (p.schedule != schedule || !ran[i]) continue;
        const auto answers = std::find(p.recomputes.begin(), p.recomputes.end(), grid.recomputes[r]);
        if (answers == p.recomputes.end()) continue;
        found.solved += static_cast<int>(counts);
        for (StageSolution& solution : solutions[i][static_cast<size_t>(answers - p.recomputes.begin())])
          found.solutions.push_back(std::move(solution));
      }
  return found;
}

}  // namespace

StageSolutions solve_stage_dp(const StageEvaluator& evaluator, const SearchGrid& grid,
                              const std::vector<int>& stage_counts, const StageOptions& o, const SearchClock& clock) {
  const bool fixed_split = stage_counts.size() == 1 && static_cast<size_t>(stage_counts[0]) == evaluator.blocks();
  std::vector<int> counts;
  for (int s : stage_counts)
    if (static_cast<size_t>(s) <= evaluator.blocks()) counts.push_back(s);
  const std::vector<int> tp = tp_degrees(o.tp, evaluator.cluster());
  const std::vector<GridPoint> points = grid_points(grid);

  // Grid points are independent DPs: run on clock.threads, gathered in grid order. A point that ends past the time
  // limit once something was found stops the ones not yet started.
  // Per point, per recomputation setting it answers: the solutions.
  std::vector<std::vector<std::vector<StageSolution>>> solutions(points.size());
  std::vector<char> ran(points.size(), 0);
  std::atomic<bool> stop{false};
  std::mutex progress_lock;  // the counts below, for the progress lines
  size_t plans = 0, done = 0;
  double best_estimate = std::numeric_limits<double>::infinity();
  run_indexed(points.size(), clock.threads, [&](size_t i) {
    if (stop.load()) return;
    const GridPoint& p = points[i];
    ran[i] = 1;
    solutions[i].resize(p.recomputes.size());
    const int chunks = schedule_chunks(p.schedule, grid.virtual_stages);
    std::vector<char> may_fit(p.recomputes.size(), 1);
    if (fixed_split)
      for (size_t r = 0; r < p.recomputes.size(); ++r)
        may_fit[r] = fixed_split_may_fit(evaluator, p.microbatches, p.schedule, chunks, p.recomputes[r], p.zero, tp,
                                         o.replicas);
    if (std::none_of(may_fit.begin(), may_fit.end(), [](char f) { return f != 0; })) return;
    const StageDp dp(evaluator, dp_options(p, chunks, tp, o, fixed_split));
    solutions[i] = answer_point(dp, p, may_fit, counts, o);
    size_t point_plans = 0;
    for (const auto& answered : solutions[i]) point_plans += answered.size();
    size_t found = 0;
    {
      const std::lock_guard<std::mutex> lock(progress_lock);
      found = plans += point_plans;
      ++done;
      for (const auto& answered : solutions[i])
        for (const StageSolution& solution : answered)
          best_estimate = std::min(best_estimate, solution.estimate.iteration_s);
      if (clock.progress) {
        char line[200];
        std::snprintf(line, sizeof line, "stage DP, %zu of %zu grid points (%s, recompute %s, m=%lld): %zu plans, "
                      "best estimate %s, %.1f s", done, points.size(), std::string(schedule_name(p.schedule)).c_str(),
                      std::string(stage_recompute_name(p.built)).c_str(), static_cast<long long>(p.microbatches),
                      found, found > 0 ? format_seconds(best_estimate).c_str() : "none yet", clock.elapsed_s());
        clock.report(line);
      }
    }
    if (clock.limited() && clock.elapsed_s() > clock.time_limit_s && found > 0) stop.store(true);
  });
  StageSolutions found = gather_points(grid, points, solutions, ran, counts.size());
  found.stopped_by_time_limit = stop.load();
  return found;
}

std::vector<StageSolutions> solve_stage_dp_orders(const StageEvaluator& evaluator, const SearchGrid& grid,
                                                  const std::vector<PipelineOrder>& orders, const StageOptions& o,
                                                  const SearchClock& clock) {
  APART_CHECK(grid.microbatches.size() == 1, "solve_stage_dp_orders: one micro-batch count");
  std::vector<StageSolutions> found(orders.size());
  const std::vector<int> tp = tp_degrees(o.tp, evaluator.cluster());
  // A split of S blocks into S stages is the fixed-split DP, which builds no tables, and GPipe keeps another least
  // in-flight count: those are solved as solve_stage_dp does.
  const SearchClock each = clock.silent().one_thread();
  std::vector<size_t> shared;
  for (size_t j = 0; j < orders.size(); ++j) {
    SearchGrid at = grid;
    at.schedules = {orders[j].schedule};
    at.virtual_stages = orders[j].chunks;
    if (static_cast<size_t>(orders[j].stages) == evaluator.blocks() || orders[j].schedule == Schedule::kGPipe) {
      found[j] = solve_stage_dp(evaluator, at, {orders[j].stages}, o, each);
    } else if (static_cast<size_t>(orders[j].stages) < evaluator.blocks()) {
      shared.push_back(j);
    } else {
      found[j].solved = 0;  // no count fits the blocks (solve_stage_dp solves none)
    }
  }
  if (shared.empty()) return found;
  SearchGrid first = grid;
  first.schedules = {orders[shared.front()].schedule};
  const std::vector<GridPoint> points = grid_points(first);
  // Per order, per point, per recomputation setting the point answers.
  std::vector<std::vector<std::vector<std::vector<StageSolution>>>> solutions(
      orders.size(), std::vector<std::vector<std::vector<StageSolution>>>(points.size()));
  // As solve_stage_dp's points on one thread: none starts once one ends past the time limit with something found.
  std::vector<char> ran(points.size(), 0);
  bool stopped = false, any = false;
  for (size_t i = 0; i < points.size() && !stopped; ++i) {
    const GridPoint& p = points[i];
    const std::vector<char> may_fit(p.recomputes.size(), 1);
    ran[i] = 1;
    StageDp dp(evaluator, dp_options(p, orders[shared.front()].chunks, tp, o, false));
    for (size_t j : shared) {
      dp.reschedule(orders[j].schedule, orders[j].chunks);
      GridPoint as = p;
      as.schedule = orders[j].schedule;
      solutions[j][i] = answer_point(dp, as, may_fit, {orders[j].stages}, o);
      for (const auto& answered : solutions[j][i]) any |= !answered.empty();
    }
    stopped = clock.limited() && clock.elapsed_s() > clock.time_limit_s && any;
  }
  for (size_t j : shared) {
    SearchGrid at = grid;
    at.schedules = {orders[j].schedule};
    std::vector<GridPoint> as = points;
    for (GridPoint& p : as) p.schedule = orders[j].schedule;
    found[j] = gather_points(at, as, solutions[j], ran, 1);
    found[j].stopped_by_time_limit = stopped;
  }
  return found;
}

StageSolutions solve_pipeline_major(const StageEvaluator& pipeline, const SearchGrid& grid, int max_stages,
                                    const PartitionOptions& o, const SearchClock& clock) {
  // One DP per (schedule, recompute, zero, m, replicas): the stage counts that give the same replica count (most
  // of them, wherever the micro-batch caps it) share its tables and are solved together (solve_many answers each
  // count as solve() would).
  struct Point {
    Schedule schedule;
    StageRecompute recompute;
    StageZero zero;
    int64_t microbatches;
    int replicas;
    std::vector<int> stages;
  };
  std::vector<Point> points;
  const int64_t batch = o.training.global_batch;
  size_t pairs = 0;
  for (Schedule schedule : grid.schedules)
    for (StageRecompute recompute : grid.recomputes)
      for (StageZero zero : grid.zeros)
        for (int64_t m : grid.microbatches)
          for (int s : stage_candidates(max_stages, o.stage)) {
            if (s < 2 || s > max_stages) continue;
            const int replicas = o.stage.replicas ? *o.stage.replicas
                                                  : static_cast<int>(std::min<int64_t>(o.cluster.devices / s, batch / m));
            if (replicas < 1 || replicas * s > o.cluster.devices) continue;
            ++pairs;
            Point* same = points.empty() ? nullptr : &points.back();
            if (same && same->schedule == schedule && same->recompute == recompute && same->zero.stage == zero.stage &&
                same->zero.automatic == zero.automatic && same->microbatches == m && same->replicas == replicas)
              same->stages.push_back(s);
            else
              points.push_back({schedule, recompute, zero, m, replicas, {s}});
          }
  std::vector<std::vector<std::optional<StageSolution>>> solutions(points.size());
  run_indexed(points.size(), clock.threads, [&](size_t i) {
    const Point& p = points[i];
    const StageDp dp(pipeline, {.microbatches = p.microbatches,
                                .schedule = p.schedule,
                                .virtual_stages = schedule_chunks(p.schedule, grid.virtual_stages),
                                .recompute = p.recompute,
                                .zero = p.zero,
                                .pinned_replicas = p.replicas});
    solutions[i] = dp.solve_many(p.stages);
  });
  StageSolutions found;
  found.solved = static_cast<int>(pairs);
  for (auto& point : solutions)
    for (auto& solution : point)
      if (solution) found.solutions.push_back(std::move(*solution));
  return found;
}

// ---------------- Candidates ----------------

void CandidateSet::add(StageSolutions found, const Split& split) {
  for (StageSolution& s : found.solutions)
    candidates.push_back(place_candidate(std::move(s), split.sequence, split.assignment, split.evaluator, split.source));
  solved += found.solved;
  stopped_by_time_limit |= found.stopped_by_time_limit;
}

void CandidateSet::add(CandidateSet other) {
  for (Candidate& c : other.candidates) candidates.push_back(std::move(c));
  solved += other.solved;
  stopped_by_time_limit |= other.stopped_by_time_limit;
}

CandidateSet refined_candidates(const AtomicGraph& atomic, const BlockAssignment& blocks, const StageSolutions& coarse,
                                const PartitionOptions& o, const std::string& source, int threads,
                                ExactCutCache* exact) {
  CandidateSet found;
  for (RefinedCandidate& refined :
       refine_best_candidates(atomic, blocks, coarse.solutions, o.cluster, o.training, threads, exact)) {
    Split runs;
    runs.assignment = std::make_shared<const BlockAssignment>(std::move(refined.assignment));
    runs.sequence = refined.sequence;
    runs.evaluator = std::move(refined.evaluator);
    runs.source = source + " " + refined.kind;
    StageSolutions one;
    one.solutions.push_back(std::move(refined.solution));
    found.add(std::move(one), runs);
  }
  return found;
}

CandidateSet block_candidates(const AtomicGraph& atomic, const BlockAssignment& blocks, const PartitionOptions& o,
                              const SearchGrid& grid, const SearchClock& clock, CutRefinement refinement) {
  const Split split = make_split(atomic, blocks, o, std::string(method_name(o.method)));
  const int max_stages = max_stage_count(static_cast<int>(blocks.blocks), o, INT32_MAX);
  StageSolutions stage_major =
      solve_stage_dp(*split.evaluator, grid, stage_candidates(max_stages, o.stage), o.stage, clock);
  CandidateSet found;
  const bool refine = refinement == CutRefinement::kOn && !stage_major.stopped_by_time_limit;
  ExactCutCache exact;  // the block levels below mostly refine the same pins again: their exact cuts are the same
  if (refine) found.add(refined_candidates(atomic, blocks, stage_major, o, split.source, clock.threads, &exact));
  const std::vector<int> counts = refine ? refined_stage_counts(stage_major.solutions) : std::vector<int>{};
  found.add(std::move(stage_major), split);
  // More blocks never hurt: the refined stage counts are searched again over the coarser block levels k/2, k/4, …
  // (each the blocks --blocks k/2, k/4, … would build), so a search over 2k blocks holds every candidate of those
  // stage counts that a search over k blocks has (docs/partitioning.md, "Stage-cut refinement").
  if (refine) {
    const int requested = o.block.blocks > 0 ? o.block.blocks : automatic_block_count(atomic.size(), o.cluster.devices);
    uint32_t previous = blocks.blocks;
    for (int k = requested / 2; k >= kMinCoarserBlocks; k /= 2) {
      if (clock.limited() && clock.elapsed_s() > clock.time_limit_s) break;
      PartitionOptions at_k = o;
      at_k.block.blocks = k;
      const int level = block_count(atomic, at_k);  // what --blocks k searches over
      if (static_cast<uint32_t>(level) >= previous) continue;
      previous = static_cast<uint32_t>(level);
      std::vector<int> fitting;
      for (int s : counts)
        if (s <= level) fitting.push_back(s);
      if (fitting.empty()) break;
      const std::string source = split.source + " k=" + std::to_string(level);
      const Split coarser = make_split(
          atomic, build_blocks(atomic, level, o.block, o.training, grid.reference_microbatch), o, source);
      StageSolutions solutions = solve_stage_dp(*coarser.evaluator, grid, fitting, o.stage, clock.silent());
      found.add(refined_candidates(atomic, *coarser.assignment, solutions, o, source, clock.threads, &exact));
      found.add(std::move(solutions), coarser);
    }
  }

  // Pipeline-major: one pipeline replica per node (or several per node), stages talking over NVLink and every
  // stage's replicas all-reducing across nodes. Only for S ≤ devices per node, with equal replica counts.
  // Pipeline-major lays one device of every stage side by side: stages of degree 1 only.
  const bool multi_node = o.cluster.devices > o.cluster.devices_per_node && o.stage.tp.value_or(1) == 1;
  if (multi_node && (!clock.limited() || clock.elapsed_s() < clock.time_limit_s)) {
    clock.report("stage DP, pipeline-major layout (stages inside a node)");
    const Split pipeline = with_layout(split, Layout::kPipelineMajor, split.source + " pipeline-major");
    found.add(solve_pipeline_major(*pipeline.evaluator, grid, std::min(max_stages, o.cluster.devices_per_node), o, clock),
              pipeline);
  }
  return found;
}

CandidateSet fixed_split_candidates(const AtomicGraph& atomic, Method method, const PartitionOptions& o,
                                    const SearchGrid& grid, const SearchClock& clock) {
  const int components = static_cast<int>(atomic.size());
  std::vector<int> counts;
  for (int s : stage_candidates(max_stage_count(components, o, 128), o.stage))
    if (s <= components) counts.push_back(s);
  // One split per stage count, each an independent DP: run on clock.threads, gathered in stage-count order.
  std::vector<Split> splits(counts.size());
  std::vector<StageSolutions> solutions(counts.size());
  const SearchClock each = clock.silent().one_thread();
  run_indexed(counts.size(), clock.threads, [&](size_t i) {
    splits[i] = make_split(atomic, baseline_split(atomic, method, counts[i], grid.reference_microbatch), o,
                           std::string(method_name(method)));
    solutions[i] = solve_stage_dp(*splits[i].evaluator, grid, {counts[i]}, o.stage, each);
  });
  CandidateSet found;
  for (size_t i = 0; i < counts.size(); ++i) found.add(std::move(solutions[i]), splits[i]);
  return found;
}

CandidateSet pipedream_candidates(const AtomicGraph& atomic, const PartitionOptions& o, const SearchGrid& grid) {
  CandidateSet found;
  PipeDreamPlan pd = pipedream_split(atomic, o.cluster, o.training, grid.reference_microbatch);
  if (pd.split.replicas.empty()) return found;
  const int stages = static_cast<int>(pd.split.replicas.size());
  if (o.stage.stages && *o.stage.stages != stages) return found;
  // PipeDream chooses its own replica counts, each replica one device: nothing to offer under those pins.
  if (o.stage.replicas && std::any_of(pd.split.replicas.begin(), pd.split.replicas.end(),
                                      [&](int r) { return r != *o.stage.replicas; }))
    return found;
  if (o.stage.tp.value_or(1) != 1) return found;
  const Split split = make_split(atomic, std::move(pd.layers), o, "pipedream");
  StageSolutions evaluated;
  for (Schedule schedule : grid.schedules)
    for (StageRecompute mode : grid.recomputes)
      for (int64_t m : grid.microbatches) {
        StageSolution sol;
        sol.stages = stages;
        sol.microbatches = m;
        sol.schedule = schedule;
        sol.virtual_stages = schedule_chunks(schedule, grid.virtual_stages);
        if (schedule == Schedule::kInterleaved && m % stages != 0) continue;  // Megatron-LM's constraint
        // PipeDream's split: all stages or none (per-stage choices recompute everything).
        sol.recompute = mode == StageRecompute::kOff         ? RecomputeScope::kNone
                        : mode == StageRecompute::kSelective ? RecomputeScope::kSelective
                                                             : RecomputeScope::kFull;
        sol.zero = o.stage.zero.value_or(0);            // and one ZeRO stage (auto: none)
        sol.boundaries.assign(pd.split.boundaries.begin(), pd.split.boundaries.end());
        sol.replicas = pd.split.replicas;
        if (*std::max_element(sol.replicas.begin(), sol.replicas.end()) > o.training.global_batch / m) continue;
        ++evaluated.solved;
        if (evaluate_solution(*split.evaluator, sol)) evaluated.solutions.push_back(std::move(sol));
      }
  found.add(std::move(evaluated), split);
  return found;
}

// ---------------- Schedules (--schedule auto) ----------------

namespace {

// The fewest atomic components of any of the candidate's stages: a stage runs as at most that many chunks.
uint32_t fewest_components(const Candidate& c) {
  const StageSolution& sol = c.solution;
  std::vector<uint32_t> components(static_cast<size_t>(sol.stages), 0);
  for (BlockId b : c.assignment->block_of) {
    const auto after = std::upper_bound(sol.boundaries.begin(), sol.boundaries.end(), b.value());
    ++components[static_cast<size_t>(after - sol.boundaries.begin() - 1)];
  }
  return *std::min_element(components.begin(), components.end());
}

// The interleaved chunk counts auto offers: kAutoVirtualStages, or the pinned --virtual-stages.
std::vector<int> interleaved_chunks(const StageOptions& o) {
  if (o.virtual_stages > 0) return {o.virtual_stages};
  return {std::begin(kAutoVirtualStages), std::end(kAutoVirtualStages)};
}

// What a variant's source adds to its original's: " zb-h1", " interleaved v=3".
std::string schedule_label(Schedule schedule, int chunks) {
  return " " + std::string(schedule_name(schedule)) + (chunks > 1 ? " v=" + std::to_string(chunks) : "");
}

// The candidate under another schedule, the same split, replicas, degrees and placement (`links`: its placed links);
// stages that no longer fit recompute more where allowed (none → selective → full, as far as --recompute lets them).
// Nothing when it still does not fit or its estimate does not beat the original's.
std::optional<Candidate> rescheduled(const Candidate& c, std::span<const StageLinks> links, Schedule schedule,
                                     int chunks, const StageOptions& o) {
  Candidate v = c;
  StageSolution& sol = v.solution;
  sol.schedule = schedule;
  sol.virtual_stages = chunks;
  const Cluster& cluster = c.evaluator->cluster();
  if (!evaluate_solution(*c.evaluator, sol, links)) {
    if (o.recompute == Recompute::kOff) return std::nullopt;
    const RecomputeScope most = o.recompute == Recompute::kSelective ? RecomputeScope::kSelective : RecomputeScope::kFull;
    if (sol.stage_recompute.empty()) sol.stage_recompute.assign(static_cast<size_t>(sol.stages), sol.recompute);
    for (bool fits = false; !fits;) {
      bool changed = false;
      for (int s = 0; s < sol.stages; ++s) {
        RecomputeScope& scope = sol.stage_recompute[static_cast<size_t>(s)];
        if (sol.costs[s].memory_bytes <= cluster.usable_memory_bytes() || scope == most) continue;
        scope = scope == RecomputeScope::kNone ? RecomputeScope::kSelective : RecomputeScope::kFull;
        changed = true;
      }
      if (!changed) return std::nullopt;
      fits = evaluate_solution(*c.evaluator, sol, links);
    }
  }
  if (sol.estimate.iteration_s >= c.solution.estimate.iteration_s) return std::nullopt;
  v.source += schedule_label(schedule, chunks);
  return v;
}

}  // namespace

const std::vector<Candidate>* ScheduleResolveCache::find(const Key& key) const {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  ++hits_;
  return &it->second.found;
}

void ScheduleResolveCache::add(const Key& key, std::shared_ptr<const StageEvaluator> split,
                               std::vector<Candidate> found) {
  entries_.insert_or_assign(key, Entry{std::move(split), std::move(found)});
}

std::vector<Candidate> schedule_variants(const AtomicGraph& atomic, const std::vector<Candidate>& candidates,
                                         const PartitionOptions& o, const SearchClock& clock,
                                         ScheduleResolveCache* cache) {
  std::vector<Candidate> variants;
  std::vector<size_t> pipelined;  // 1F1B candidates of ≥ 2 stages
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    if (c.solution.schedule != Schedule::k1F1B || c.solution.stages < 2) continue;
    pipelined.push_back(i);
    const std::vector<StageLinks>& links = c.links;
    if (auto v = rescheduled(c, links, Schedule::kZbH1, 1, o.stage)) variants.push_back(std::move(*v));
    if (c.solution.microbatches % c.solution.stages != 0) continue;  // Megatron-LM's order: m a multiple of S
    const uint32_t fewest = fewest_components(c);
    for (int chunks : interleaved_chunks(o.stage))
      if (static_cast<uint32_t>(chunks) <= fewest)
        if (auto v = rescheduled(c, links, Schedule::kInterleaved, chunks, o.stage)) variants.push_back(std::move(*v));
  }
  // Where memory binds, the 1F1B split does not fit the schedules' larger in-flight counts: the stage DP again (and
  // its cut refinement) near the stage and micro-batch counts of the best few 1F1B candidates by estimate.
  std::stable_sort(pipelined.begin(), pipelined.end(), [&](size_t a, size_t b) {
    return candidates[a].solution.estimate.iteration_s < candidates[b].solution.estimate.iteration_s;
  });
  const SearchGrid grid = search_grid(o);
  std::set<std::tuple<const StageEvaluator*, int, int64_t>> resolved;                 // (split, S, m) taken
  std::set<std::tuple<const StageEvaluator*, Schedule, int, int, int64_t>> solved;  // (split, schedule, v, S, m)
  struct Resolve {  // one stage DP again: candidate `from` under this schedule at (stages, microbatches)
    size_t from;
    Schedule schedule;
    int chunks, stages;
    int64_t microbatches;
  };
  std::vector<Resolve> jobs;
  for (size_t i : pipelined) {
    if (resolved.size() >= kScheduleResolves) break;
    const Candidate& c = candidates[i];
    if (c.evaluator->layout() != Layout::kStageMajor) continue;  // pipeline-major plans equal replicas per point
    if (c.evaluator->blocks() > kScheduleResolveBlocks) continue;  // the refined splits' runs: a DP costs O(k²)
    const int stages = c.solution.stages;
    const int64_t m = c.solution.microbatches;
    if (!resolved.insert({c.evaluator.get(), stages, m}).second) continue;
    auto solve = [&](Schedule schedule, int chunks, int at_stages, int64_t microbatches) {
      if (solved.insert({c.evaluator.get(), schedule, chunks, at_stages, microbatches}).second)
        jobs.push_back({i, schedule, chunks, at_stages, microbatches});
    };
    solve(Schedule::kZbH1, 1, stages, m);
    // Interleaving needs S to divide m: at this S and the least micro-batch count above m that it divides, and at
    // this m and the stage counts nearest S that divide it (unless --stages pins S).
    std::set<std::pair<int, int64_t>> points;
    const auto multiple = std::find_if(grid.microbatches.begin(), grid.microbatches.end(),
                                       [&](int64_t x) { return x >= m && x % stages == 0; });
    if (multiple != grid.microbatches.end()) points.insert({stages, *multiple});
    if (!o.stage.stages) {
      const int most = static_cast<int>(std::min({static_cast<int64_t>(c.evaluator->blocks()),
                                                  static_cast<int64_t>(o.cluster.devices), m}));
      for (int below = stages; below >= 2; --below)
        if (m % below == 0) {
          points.insert({below, m});
          break;
        }
      for (int above = stages; above <= most; ++above)
        if (m % above == 0) {
          points.insert({above, m});
          break;
        }
    }
    for (const auto& [at_stages, microbatches] : points)
      for (int chunks : interleaved_chunks(o.stage)) solve(Schedule::kInterleaved, chunks, at_stages, microbatches);
  }
  // The re-solves of one split at one micro-batch count share a DP's tables (solve_stage_dp_orders); the groups run
  // on clock.threads, and the candidates are gathered in job order. Those an earlier call of the same search solved
  // come from `cache`.
  std::vector<std::vector<Candidate>> found_by_job(jobs.size());
  auto key_of = [&](const Resolve& job) {
    const Candidate& c = candidates[job.from];
    return ScheduleResolveCache::Key{.split = c.evaluator.get(),
                                     .source = c.source,
                                     .schedule = job.schedule,
                                     .chunks = job.chunks,
                                     .stages = job.stages,
                                     .microbatches = job.microbatches};
  };
  std::vector<char> cached(jobs.size(), 0);
  if (cache)
    for (size_t j = 0; j < jobs.size(); ++j)
      if (const std::vector<Candidate>* found = cache->find(key_of(jobs[j]))) {
        found_by_job[j] = *found;
        cached[j] = 1;
      }
  std::vector<std::vector<size_t>> groups;  // jobs by (split, m), in the order of their first job
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (cached[j]) continue;
    auto same = std::find_if(groups.begin(), groups.end(), [&](const std::vector<size_t>& g) {
      return candidates[jobs[g.front()].from].evaluator == candidates[jobs[j].from].evaluator &&
             jobs[g.front()].microbatches == jobs[j].microbatches;
    });
    if (same == groups.end())
      groups.push_back({j});
    else
      same->push_back(j);
  }
  const SearchClock each = clock.silent().one_thread();
  run_indexed(groups.size(), clock.threads, [&](size_t g) {
    const std::vector<size_t>& group = groups[g];
    SearchGrid point = grid;
    point.microbatches = {jobs[group.front()].microbatches};
    std::vector<PipelineOrder> orders;
    for (size_t j : group) orders.push_back({jobs[j].schedule, jobs[j].chunks, jobs[j].stages});
    const StageEvaluator& evaluator = *candidates[jobs[group.front()].from].evaluator;
    std::vector<StageSolutions> solved_orders = solve_stage_dp_orders(evaluator, point, orders, o.stage, each);
    for (size_t q = 0; q < group.size(); ++q) {
      const size_t j = group[q];
      const Resolve& job = jobs[j];
      const Candidate& c = candidates[job.from];
      const std::string source = c.source + schedule_label(job.schedule, job.chunks) + " dp";
      const StageSolutions& solutions = solved_orders[q];
      CandidateSet found = refined_candidates(atomic, *c.assignment, solutions, o, source);
      found.add(solutions, Split{c.assignment, c.sequence, c.evaluator, source});
      for (Candidate& v : found.candidates)
        if (static_cast<uint32_t>(job.chunks) <= fewest_components(v)) found_by_job[j].push_back(std::move(v));
    }
  });
  if (cache)
    for (size_t j = 0; j < jobs.size(); ++j)
      if (!cached[j]) cache->add(key_of(jobs[j]), candidates[jobs[j].from].evaluator, found_by_job[j]);
  for (std::vector<Candidate>& found : found_by_job)
    variants.insert(variants.end(), std::make_move_iterator(found.begin()), std::make_move_iterator(found.end()));
  return variants;
}

// ---------------- Simulated selection → the Plan ----------------

Plan choose_plan(const TaskGraph& graph, const AtomicGraph& atomic, CandidateSet found, const BlockLevel& blocks,
                 const PartitionOptions& o, const SearchClock& clock, ScheduleResolveCache* resolves) {
  auto nothing_fits = [&] {
    if (o.stage.target)
      throw Infeasible("--target " + std::string(engine_name(*o.stage.target)) +
                       ": no plan the engine runs (one TP degree and replica count on every stage, cuts between whole "
                       "layers, its schedules, ZeRO stages and recomputation) fits these devices and this batch; "
                       "plan without --target to see what does");
    throw_infeasible(graph, atomic, o);
  };
  if (found.candidates.empty()) nothing_fits();
  // The found candidates, then their schedule variants (ties go to the found).
  std::vector<Candidate>& candidates = found.candidates;
  if (!o.stage.schedule) {
    clock.report("the pipelined candidates under ZB-H1 and the interleaved order (--schedule auto)");
    std::vector<Candidate> variants = schedule_variants(atomic, candidates, o, clock, resolves);
    candidates.insert(candidates.end(), std::make_move_iterator(variants.begin()),
                      std::make_move_iterator(variants.end()));
    if (o.stage.target) {  // only the variants the engine runs (partition/target.h)
      const ComponentLayers layers = component_layers(graph, atomic);
      std::erase_if(candidates, [&](const Candidate& c) {
        return !target_admits(c, *o.stage.target, o.training.global_batch, &layers);
      });
    }
  }
  if (candidates.empty()) nothing_fits();
  clock.report("simulating the best of " + std::to_string(candidates.size()) + " placed candidates");
  const Selection selection = select_by_simulation(candidates, o.stage.max_simulations, clock.deadline(), clock.threads);
  const Candidate& chosen = candidates[selection.index];
  Plan plan = assemble_plan(graph, atomic, chosen, selection.result, o);
  SearchStatistics& search = plan.search;
  search.atomic_components = atomic.size();
  search.blocks = blocks.assignment.blocks;
  search.coarsening_levels = blocks.stats.levels;
  search.refinement_moves = blocks.stats.moves;
  search.candidates = found.solved;
  search.chosen_split = chosen.source;
  search.candidates_placed = static_cast<int>(candidates.size());
  search.simulated = selection.stats.simulated;
  search.pruned = selection.stats.pruned;
  search.not_simulated = selection.stats.not_simulated;
  search.stopped_by_time_limit = found.stopped_by_time_limit || (selection.stats.not_simulated > 0 && clock.limited());
  search.seconds = clock.elapsed_s();
  return plan;
}

void add_stage_boundaries(const TaskGraph& graph, const std::vector<int>& stage_of_task, int64_t graph_batch,
                          Precision precision, std::vector<PlanStage>& stages) {
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
    const double per_sample = static_cast<double>(value.bytes) / static_cast<double>(graph_batch) *
                              activation_bytes_factor(precision);
    for (int s : to) {
      APART_CHECK(s > from, "a value flows backward between stages: " + value.name);
      const StageId from_stage = from >= 0 ? StageId(static_cast<uint32_t>(from)) : StageId::invalid();
      stages[s].inputs.push_back({ValueId(v), from_stage, per_sample * boundary_samples(stages[s].cost)});
    }
    const bool model_output = value.kind == ValueKind::kOutput ||
                              std::find(graph.graph_outputs().begin(), graph.graph_outputs().end(), ValueId(v)) !=
                                  graph.graph_outputs().end();
    if (from >= 0 && (!to.empty() || model_output)) {
      std::vector<StageId> to_stages;
      for (int t : to) to_stages.push_back(StageId(static_cast<uint32_t>(t)));
      stages[from].outputs.push_back({ValueId(v), std::move(to_stages), per_sample * boundary_samples(stages[from].cost)});
    }
  }
}

Plan assemble_plan(const TaskGraph& graph, const AtomicGraph& atomic, const Candidate& chosen,
                   const sim::SimResult& replay, const PartitionOptions& o) {
  const int64_t batch = o.training.global_batch;
  const StageSolution& best = chosen.solution;
  Plan plan;
  plan.options = o;
  plan.tensor_parallel = atomic.tensor_parallel;
  const Placement placement = chosen.placement();
  plan.layout = placement.layout;
  plan.microbatches = best.microbatches;
  plan.microbatch_size = batch / best.microbatches;
  plan.schedule = best.schedule;
  plan.virtual_stages = best.virtual_stages;
  plan.recompute = best.any_recompute();
  plan.estimate = best.estimate;
  plan.simulated.iteration_s = replay.iteration_s;
  plan.simulated.pipeline_s = replay.pipeline_s;
  plan.simulated.bubble_fraction = replay.bubble_fraction;
  for (const sim::StageStats& st : replay.stages)
    if (st.busy_s > replay.stages[plan.simulated.bottleneck_stage].busy_s) plan.simulated.bottleneck_stage = st.stage;
  plan.options.stage.stages = best.stages;
  plan.options.stage.microbatches = best.microbatches;
  plan.options.stage.schedule = best.schedule;
  if (best.schedule == Schedule::kInterleaved) plan.options.stage.virtual_stages = best.virtual_stages;
  plan.options.stage.recompute = !best.any_recompute()             ? Recompute::kOff
                                 : !best.stage_recompute.empty()   ? o.stage.recompute
                                 : best.recompute == RecomputeScope::kSelective ? Recompute::kSelective
                                                                                : Recompute::kOn;
  plan.samples_per_s = plan.simulated.iteration_s > 0 ? static_cast<double>(batch) / plan.simulated.iteration_s : 0;
  plan.compute_lower_bound_s = chosen.evaluator->total_per_sample_s() * static_cast<double>(batch) / o.cluster.devices;

  const BlockAssignment& assignment = *chosen.assignment;
  std::vector<StageId> stage_of_block(assignment.blocks);
  for (uint32_t s = 0; s < static_cast<uint32_t>(best.stages); ++s)
    for (uint32_t b = best.boundaries[s]; b < best.boundaries[s + 1]; ++b) stage_of_block[b] = StageId(s);
  std::vector<int> stage_of_task(graph.num_tasks(), -1);  // batch tasks only
  std::vector<std::set<uint32_t>> tasks_of(best.stages);
  for (uint32_t c = 0; c < atomic.size(); ++c) {
    const AtomicComponent& component = atomic.component(ComponentId(c));
    const StageId s = stage_of_block[assignment.block_of_component(ComponentId(c)).value()];
    stage_of_task[component.batch_task.value()] = static_cast<int>(s.value());
    tasks_of[s.value()].insert(component.batch_task.value());
    for (TaskId t : component.constant_tasks) tasks_of[s.value()].insert(t.value());
  }
  for (int s = 0; s < best.stages; ++s) {
    PlanStage st;
    st.id = StageId(static_cast<uint32_t>(s));
    st.replicas = best.replicas[s];
    st.devices = placement.devices[s];
    for (uint32_t t : tasks_of[s]) {
      st.tasks.push_back(TaskId(t));
      if (!graph.task(TaskId(t)).constant) ++st.batch_tasks;
    }
    st.cost = best.costs[s];
    st.recompute = best.recomputes(s);
    plan.peak_memory_bytes = std::max(plan.peak_memory_bytes, st.cost.memory_bytes);
    plan.stages.push_back(std::move(st));
  }
  add_stage_boundaries(graph, stage_of_task, atomic.graph_batch, o.training.precision, plan.stages);
  return plan;
}

}  // namespace apart
