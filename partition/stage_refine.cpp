// Stage-cut refinement (docs/partitioning.md, Algorithm 4): windows around the DP's cuts, an exact bottleneck DP
// over the positions inside them, windows re-centred on the new cuts until none moves.
#include "partition/stage_refine.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "graph/error.h"
#include "graph/threads.h"
#include "profiler/memory_model.h"

namespace apart {
namespace {

constexpr int kMaxRounds = 12;
constexpr double kNoCeiling = std::numeric_limits<double>::infinity();
// A split's bottleneck as a ceiling for the DPs that look for a better one (a little above it: the same sums in
// another order may land an ulp over).
double ceiling_over(double bottleneck_h) { return bottleneck_h > 0 ? bottleneck_h * (1 + 1e-6) : kNoCeiling; }
// Candidates slower than the best by more than this are not refined: moving each cut within about one of
// k = 64 blocks gained up to 4.8 % of a candidate's estimate on GPT-3 13B × 64 devices (all stage counts).
constexpr double kRefineSlack = 0.05;

// Distances from a cut at which a window of `reach` components gets positions: all of them when at most `points`
// fit, else about `points` distances growing geometrically from 1 to `reach` (fine near the cut, coarse far).
std::vector<size_t> window_offsets(size_t reach, size_t points) {
  std::vector<size_t> offsets;
  if (reach <= points) {
    for (size_t d = 1; d <= reach; ++d) offsets.push_back(d);
    return offsets;
  }
  for (size_t i = 1; i <= points; ++i)
    offsets.push_back(static_cast<size_t>(std::ceil(std::pow(static_cast<double>(reach), static_cast<double>(i) / points))));
  offsets.push_back(1);
  std::sort(offsets.begin(), offsets.end());
  offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
  return offsets;
}

struct WindowDpState {
  double max_h = std::numeric_limits<double>::infinity();
  double sum_step = 0;
  size_t previous = 0;
  bool reached = false;
};

// Range sums of runs [i, j) of a sequence of elements in topological order (the components in index order, or a
// block sequence's blocks) without StageEvaluator's O(n²) tables: prefix sums for times, saved bytes and weights first read in the run; sparse tables for the largest
// working set; and, per cut position c, the transfers and weights live across it (made before c, read at or after
// c), from which the bytes a run receives, sends and the shared weights it reads follow exactly (sums of the terms
// that are there, so a run that sends nothing sends 0 bytes, not a rounding residue).
class ComponentRuns {
 public:
  explicit ComponentRuns(const AtomicGraph& atomic)
      : ComponentRuns(component_costs(atomic), atomic.transfers, atomic.params) {}
  // Over a block sequence's blocks (a sequence without weight uses: each block's weights its own).
  explicit ComponentRuns(const BlockSequence& seq) : ComponentRuns(seq.blocks, seq.transfers, own_params(seq)) {}

  ComponentRuns(const std::vector<BlockCost>& costs, const std::vector<Transfer>& transfers,
                std::vector<ParamUse> params)
      : transfers_(transfers), params_(std::move(params)), n_(costs.size()) {
    fwd_fixed_.assign(n_ + 1, 0);
    fwd_ps_.assign(n_ + 1, 0);
    bwd_fixed_.assign(n_ + 1, 0);
    bwd_ps_.assign(n_ + 1, 0);
    saved_ps_.assign(n_ + 1, 0);
    bwd_weight_.assign(n_ + 1, WorkCurve{});
    for (size_t c = 0; c < n_; ++c) {
      const BlockCost& b = costs[c];
      tp_.push_back(b.tp);
      bwd_weight_[c + 1] = bwd_weight_[c];
      bwd_weight_[c + 1] += b.backward_weight;
      fwd_fixed_[c + 1] = fwd_fixed_[c] + b.forward.fixed_s;
      fwd_ps_[c + 1] = fwd_ps_[c] + b.forward.per_sample_s;
      bwd_fixed_[c + 1] = bwd_fixed_[c] + b.backward.fixed_s;
      bwd_ps_[c + 1] = bwd_ps_[c] + b.backward.per_sample_s;
      saved_ps_[c + 1] = saved_ps_[c] + b.saved_per_sample;
    }
    first_read_bytes_.assign(n_ + 1, 0);
    for (const ParamUse& p : params_) first_read_bytes_[p.readers.front() + 1] += p.bytes;
    for (size_t c = 0; c < n_; ++c) first_read_bytes_[c + 1] += first_read_bytes_[c];
    ws_ps_.emplace_back(n_);
    ws_fixed_.emplace_back(n_);
    task_params_.emplace_back(n_);
    for (size_t c = 0; c < n_; ++c) {
      ws_ps_[0][c] = costs[c].workspace_per_sample;
      ws_fixed_[0][c] = costs[c].workspace_fixed;
      task_params_[0][c] = costs[c].largest_task_param_bytes;
    }
    for (size_t width = 2; width <= n_; width *= 2) {
      const size_t half = width / 2;
      std::vector<double> ps(n_ - width + 1), fx(n_ - width + 1);
      std::vector<int64_t> tp(n_ - width + 1);
      for (size_t c = 0; c + width <= n_; ++c) {
        ps[c] = std::max(ws_ps_.back()[c], ws_ps_.back()[c + half]);
        fx[c] = std::max(ws_fixed_.back()[c], ws_fixed_.back()[c + half]);
        tp[c] = std::max(task_params_.back()[c], task_params_.back()[c + half]);
      }
      ws_ps_.push_back(std::move(ps));
      ws_fixed_.push_back(std::move(fx));
      task_params_.push_back(std::move(tp));
    }
  }

  size_t size() const { return n_; }

  // Forward + backward (+ the recomputed forward) seconds of [i, j) at micro-batch u on one device of a
  // tensor-parallel group of `tp`: StageCost::compute_s less the group's collectives, a lower bound on it that also
  // grows with the run.
  // `sp`: under sequence parallelism (the work between regions divides by tp too).
  double compute_s(size_t i, size_t j, int64_t u, RecomputeScope recompute, int tp, bool sp) const {
    const double uu = static_cast<double>(u);
    const TpWork split = tp_.range(i, j);
    const double forward = tp_device_time((fwd_fixed_[j] - fwd_fixed_[i]) + (fwd_ps_[j] - fwd_ps_[i]) * uu,
                                          split.forward.at(uu) + (sp ? split.sp_forward.at(uu) : 0.0), tp);
    double backward = tp_device_time((bwd_fixed_[j] - bwd_fixed_[i]) + (bwd_ps_[j] - bwd_ps_[i]) * uu,
                                     split.backward.at(uu) + (sp ? split.sp_backward.at(uu) : 0.0), tp);
    if (recompute == RecomputeScope::kFull) backward += forward;
    if (recompute == RecomputeScope::kSelective) backward += split.core_forward.at(uu) / tp;
    return forward + backward;
  }

  // Makes range() answer for runs starting or ending at these cut positions (sorted, unique).
  void prepare(const std::vector<size_t>& positions) {
    // One sweep over the cut positions with the transfers and weights live across the current one.
    // The transfers made at each position and the shared weights first read there, each in index order (two
    // flat arrays with offsets: this runs once per refinement round).
    auto group_by = [&](size_t count, auto&& key, auto&& keep) {
      std::vector<uint32_t> offset(n_ + 1, 0), items;
      for (uint32_t i = 0; i < count; ++i)
        if (keep(i)) ++offset[key(i) + 1];
      for (size_t c = 0; c < n_; ++c) offset[c + 1] += offset[c];
      items.resize(offset[n_]);
      std::vector<uint32_t> filled(offset.begin(), offset.end() - 1);
      for (uint32_t i = 0; i < count; ++i)
        if (keep(i)) items[filled[key(i)]++] = i;
      return std::pair{std::move(offset), std::move(items)};
    };
    const auto [made_from, made] = group_by(
        transfers_.size(), [&](uint32_t t) { return transfers_[t].producer; }, [](uint32_t) { return true; });
    const auto [read_from, read] = group_by(
        params_.size(), [&](uint32_t p) { return params_[p].readers.front(); },
        [&](uint32_t p) { return params_[p].readers.size() > 1; });
    std::vector<uint32_t> live_transfers, live_params;
    size_t next = 0;
    for (size_t c = 0; c <= n_ && next < positions.size(); ++c) {
      if (c > 0) {
        live_transfers.insert(live_transfers.end(), made.begin() + made_from[c - 1], made.begin() + made_from[c]);
        live_params.insert(live_params.end(), read.begin() + read_from[c - 1], read.begin() + read_from[c]);
      }
      std::erase_if(live_transfers, [&](uint32_t t) { return transfers_[t].consumers.back() < c; });
      std::erase_if(live_params, [&](uint32_t p) { return params_[p].readers.back() < c; });
      if (positions[next] != c) continue;
      ++next;
      if (cut_at_.empty()) cut_at_.assign(n_ + 1, -1);
      if (cut_at_[c] >= 0) continue;
      Cut cut;
      for (uint32_t t : live_transfers) {
        const Transfer& tr = transfers_[t];
        const uint32_t first = *std::lower_bound(tr.consumers.begin(), tr.consumers.end(), static_cast<uint32_t>(c));
        cut.in_by_first_read.push_back({first, tr.bytes_per_sample});
        cut.out_by_producer.push_back({tr.producer, tr.bytes_per_sample});
      }
      for (uint32_t p : live_params) {
        const ParamUse& use = params_[p];
        const uint32_t first = *std::lower_bound(use.readers.begin(), use.readers.end(), static_cast<uint32_t>(c));
        cut.params_by_first_read.push_back({first, static_cast<double>(use.bytes)});
      }
      // Ascending by first read (a run [c, j) receives those read before j), descending by producer (a run [i, c)
      // sends those made at or after i); running sums along each.
      auto sorted_sums = [](std::vector<std::pair<uint32_t, double>>& v, bool descending) {
        std::stable_sort(v.begin(), v.end(), [&](const auto& a, const auto& b) {
          return descending ? a.first > b.first : a.first < b.first;
        });
        for (size_t x = 1; x < v.size(); ++x) v[x].second += v[x - 1].second;
      };
      sorted_sums(cut.in_by_first_read, false);
      sorted_sums(cut.out_by_producer, true);
      sorted_sums(cut.params_by_first_read, false);
      cut_at_[c] = static_cast<int32_t>(cuts_.size());
      cuts_.push_back(std::move(cut));
    }
  }

  // The sums stage_cost takes for [i, j); i and j must have been prepared.
  StageRange range(size_t i, size_t j) const {
    StageRange r;
    r.forward = {fwd_fixed_[j] - fwd_fixed_[i], fwd_ps_[j] - fwd_ps_[i]};
    r.backward = {bwd_fixed_[j] - bwd_fixed_[i], bwd_ps_[j] - bwd_ps_[i]};
    r.backward_weight = {bwd_weight_[j].fixed_s - bwd_weight_[i].fixed_s,
                         bwd_weight_[j].per_sample_s - bwd_weight_[i].per_sample_s};
    r.saved_per_sample = saved_ps_[j] - saved_ps_[i];
    const Cut& at_start = prepared(i);
    const Cut& at_end = prepared(j);
    // Received: live across i, first read before j. Sent: live across j, made at or after i.
    r.in_per_sample = sum_below(at_start.in_by_first_read, static_cast<uint32_t>(j));
    r.out_per_sample = 0;
    {
      const auto& v = at_end.out_by_producer;  // descending producers
      const auto it = std::partition_point(v.begin(), v.end(), [&](const auto& e) { return e.first >= i; });
      if (it != v.begin()) r.out_per_sample = std::prev(it)->second;
    }
    r.param_bytes = (first_read_bytes_[j] - first_read_bytes_[i]) +
                    static_cast<int64_t>(sum_below(at_start.params_by_first_read, static_cast<uint32_t>(j)));
    const int level = std::bit_width(j - i) - 1;
    const size_t width = size_t{1} << level;
    r.workspace_per_sample = std::max(ws_ps_[level][i], ws_ps_[level][j - width]);
    r.workspace_fixed = std::max(ws_fixed_[level][i], ws_fixed_[level][j - width]);
    r.largest_task_param_bytes = std::max(task_params_[level][i], task_params_[level][j - width]);
    r.tp = tp_.range(i, j);
    return r;
  }

 private:
  struct Cut {
    std::vector<std::pair<uint32_t, double>> in_by_first_read;      // (first consumer ≥ c, running bytes)
    std::vector<std::pair<uint32_t, double>> out_by_producer;       // (producer < c, running bytes)
    std::vector<std::pair<uint32_t, double>> params_by_first_read;  // shared weights (first reader ≥ c, running)
  };
  static double sum_below(const std::vector<std::pair<uint32_t, double>>& v, uint32_t limit) {
    const auto it = std::partition_point(v.begin(), v.end(), [&](const auto& e) { return e.first < limit; });
    return it == v.begin() ? 0.0 : std::prev(it)->second;
  }

  static std::vector<BlockCost> component_costs(const AtomicGraph& atomic) {
    std::vector<BlockCost> costs;
    costs.reserve(atomic.size());
    for (const AtomicComponent& c : atomic.components) costs.push_back(c.cost);
    return costs;
  }
  static std::vector<ParamUse> own_params(const BlockSequence& seq) {
    if (!seq.params.empty()) return seq.params;
    std::vector<ParamUse> params;
    for (uint32_t b = 0; b < seq.size(); ++b)
      if (seq.blocks[b].param_bytes > 0) params.push_back({.bytes = seq.blocks[b].param_bytes, .readers = {b}});
    return params;
  }

  const std::vector<Transfer>& transfers_;
  std::vector<ParamUse> params_;
  size_t n_;
  std::vector<double> fwd_fixed_, fwd_ps_, bwd_fixed_, bwd_ps_, saved_ps_;
  std::vector<WorkCurve> bwd_weight_;  // prefix sums of BlockCost::backward_weight
  std::vector<int64_t> first_read_bytes_;  // prefix: weights whose first reader is before c
  std::vector<std::vector<double>> ws_ps_, ws_fixed_;  // sparse tables of range maxima
  std::vector<std::vector<int64_t>> task_params_;      // the same, of the largest task's weights (ZeRO-3)
  const Cut& prepared(size_t c) const {
    APART_CHECK(c < cut_at_.size() && cut_at_[c] >= 0, "ComponentRuns: a range at an unprepared cut");
    return cuts_[static_cast<size_t>(cut_at_[c])];
  }
  std::vector<Cut> cuts_;        // in the order prepared
  std::vector<int32_t> cut_at_;  // per position 0..n: its index in cuts_, or -1 (empty until the first prepare)
  TpPrefix tp_;  // the components' tensor-parallel shares and refused degrees
};

}  // namespace

std::optional<RefinedCandidate> refine_stage_cuts(const AtomicGraph& atomic, const BlockAssignment& blocks,
                                                  const StageSolution& coarse, const Cluster& cluster,
                                                  const TrainingSpec& training, size_t max_runs) {
  const size_t n = atomic.size();
  const int stages = coarse.stages;
  APART_CHECK(blocks.block_of.size() == n, "refine_stage_cuts: assignment size");
  APART_CHECK(static_cast<int>(coarse.boundaries.size()) == stages + 1, "refine_stage_cuts: boundaries");
  // Every cut needs a position on each side; past max_runs / 4 stages the windows would be too coarse to help.
  if (stages < 2 || static_cast<size_t>(stages) > max_runs / 4) return std::nullopt;
  // A topological order in which every block is one run: by block, then by component index (blocks are numbered
  // topologically and component indices are a topological order).
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return blocks.block_of[a] < blocks.block_of[b]; });
  std::vector<size_t> block_start(blocks.blocks + 1, n);  // position of each block's first component in `order`
  for (size_t p = n; p-- > 0;) block_start[blocks.block_of[order[p]].value()] = p;
  for (size_t b = blocks.blocks; b-- > 0;) block_start[b] = std::min(block_start[b], block_start[b + 1]);

  // Cut s sits at position cut[s] of `order`; its window reaches `before[s]` components back and `after[s]`
  // forward: the coarse blocks on either side of the coarse cut.
  std::vector<size_t> cut(stages + 1), before(stages + 1, 0), after(stages + 1, 0);
  for (int s = 0; s <= stages; ++s) {
    const uint32_t b = coarse.boundaries[s];
    cut[s] = block_start[b];
    if (s == 0 || s == stages) continue;
    before[s] = cut[s] - block_start[b - 1];
    after[s] = block_start[b + 1] - cut[s];
  }
  // Positions per window side, so that a round's sequence stays within max_runs runs.
  const size_t per_side = std::max<size_t>(1, (max_runs - static_cast<size_t>(stages)) / (2 * (stages - 1)));
  const std::vector<size_t> coarse_cut = cut;
  std::vector<size_t> result_cut = cut;
  std::optional<RefinedCandidate> result;
  double bottleneck = coarse.bottleneck_h;
  for (int round = 0; round < kMaxRounds; ++round) {
    // This round's runs: cut at every position of every window (and at 0 and n).
    std::vector<size_t> positions{0, n};
    for (int s = 1; s < stages; ++s) {
      positions.push_back(cut[s]);
      for (size_t d : window_offsets(before[s], per_side)) positions.push_back(cut[s] - std::min(d, cut[s]));
      for (size_t d : window_offsets(after[s], per_side)) positions.push_back(std::min(n, cut[s] + d));
    }
    std::sort(positions.begin(), positions.end());
    positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
    const size_t runs = positions.size() - 1;
    auto run_of = [&](size_t position) {
      return static_cast<size_t>(std::lower_bound(positions.begin(), positions.end(), position) - positions.begin());
    };
    RefinedCandidate candidate;
    candidate.assignment.blocks = static_cast<uint32_t>(runs);
    candidate.assignment.block_of.resize(n);
    for (size_t r = 0; r < runs; ++r)
      for (size_t p = positions[r]; p < positions[r + 1]; ++p)
        candidate.assignment.block_of[order[p]] = BlockId(static_cast<uint32_t>(r));
    candidate.sequence = std::make_shared<const BlockSequence>(make_block_sequence(atomic, candidate.assignment));
    // The round's ranges from prefix sums and per-cut sums (the DP reads ~runs²/S of the runs² ranges a
    // StageEvaluator would tabulate); the kept round gets its evaluator after the loop.
    ComponentRuns sums(*candidate.sequence);
    std::vector<size_t> every_run(runs + 1);
    std::iota(every_run.begin(), every_run.end(), size_t{0});
    sums.prepare(every_run);

    // The window DP: stage s = runs [t_s, t_{s+1}) with the coarse replica count, every stage within device
    // memory; least bottleneck, then least Σ steps (ties: the earliest cut).
    std::vector<std::vector<size_t>> allowed(stages + 1);  // runs a cut may start at
    for (int s = 0; s <= stages; ++s) {
      const size_t from = cut[s] - std::min(before[s], cut[s]), to = std::min(n, cut[s] + after[s]);
      for (size_t t = run_of(from); t <= runs && positions[t] <= to; ++t) allowed[s].push_back(t);
    }
    // No split is worth more than the previous one's bottleneck, which is among the positions: a stage (and a
    // state) over that ceiling is dropped without changing the answer (exact_stage_cuts' argument), and a stage
    // whose compute alone passes it is not costed. If the ceiling was reckoned otherwise (the coarse split's sums in
    // another order, a pipeline-major layout's links) and the DP then reaches nothing, the round runs again without.
    std::vector<std::map<size_t, WindowDpState>> state;
    for (double ceiling : {ceiling_over(bottleneck), kNoCeiling}) {
      state.assign(stages + 1, {});
      state[0][0] = WindowDpState{0, 0, 0, true};
      for (int s = 0; s < stages; ++s) {
        const double flight =
            stage_in_flight_activations(coarse.schedule, s, stages, coarse.microbatches, coarse.virtual_stages);
        const int tp = coarse.tp_of(s);
        const bool sp = training.sequence_parallel && tp > 1;  // compute_s under it: a lower bound either way
        const int64_t microbatch = microbatch_size(training.global_batch, coarse.microbatches, coarse.replicas[s]);
        const StageLinks links = assumed_links(cluster, Layout::kStageMajor, coarse.replicas[s] * tp);
        for (size_t j : allowed[s + 1]) {
          WindowDpState best;
          for (const auto& [i, from] : state[s]) {
            if (i >= j) break;
            if (best.reached && best.max_h < from.max_h) continue;  // max(from, this stage) cannot beat it
            if (sums.compute_s(i, j, microbatch, coarse.recompute_of(s), tp, sp) > ceiling) continue;
            const StageRange range = sums.range(i, j);
            if (!tp_allows(range, tp)) continue;
            const StageCost c = stage_cost(range, coarse.replicas[s], coarse.microbatches, flight,
                                           coarse.recompute_of(s), links, training, coarse.zero_of(s), tp);
            if (c.h > ceiling || c.memory_bytes > cluster.usable_memory_bytes()) continue;
            const double max_h = std::max(from.max_h, c.h), sum_step = from.sum_step + c.step_s;
            if (!best.reached || max_h < best.max_h || (max_h == best.max_h && sum_step < best.sum_step))
              best = WindowDpState{max_h, sum_step, i, true};
          }
          if (best.reached) state[s + 1][j] = best;
        }
      }
      if (state[stages].find(runs) != state[stages].end() || ceiling == kNoCeiling) break;
    }
    // The previous split is among the positions, so the DP reaches the end unless rounding moved a stage's
    // memory across the limit between run structures; then keep what the previous round found.
    if (state[stages].find(runs) == state[stages].end()) break;
    StageSolution refined = coarse;
    refined.boundaries.assign(stages + 1, 0);
    refined.boundaries[stages] = static_cast<uint32_t>(runs);
    for (int s = stages; s > 0; --s)
      refined.boundaries[s - 1] = static_cast<uint32_t>(state[s][refined.boundaries[s]].previous);
    const auto range_of = [&](uint32_t first, uint32_t last) { return sums.range(first, last); };
    if (!evaluate_solution(range_of, cluster, training, Layout::kStageMajor, refined) ||
        refined.bottleneck_h > bottleneck * (1 + 1e-12))
      break;
    bottleneck = refined.bottleneck_h;

    bool moved = false;
    for (int s = 1; s < stages; ++s) {
      moved |= positions[refined.boundaries[s]] != cut[s];
      cut[s] = positions[refined.boundaries[s]];
    }
    // Keep the round with the least estimated time (the DP minimises the bottleneck; the estimate decides).
    if (!result || refined.estimate.iteration_s < result->solution.estimate.iteration_s * (1 - 1e-12)) {
      candidate.solution = std::move(refined);
      result = std::move(candidate);
      result_cut = cut;
    }
    if (!moved) break;  // the next round would search the same windows
  }
  if (!result || result_cut == coarse_cut) return std::nullopt;
  result->evaluator = std::make_shared<const StageEvaluator>(*result->sequence, cluster, training);
  // The same sums in the evaluator's order; a split on the memory limit may land a byte over it.
  if (!evaluate_solution(*result->evaluator, result->solution)) return std::nullopt;
  return result;
}

// ---------------- Task-granular cuts ----------------

namespace {

// What each stage of the split keeps from the coarse candidate.
struct StagePins {
  int replicas = 1;
  RecomputeScope recompute = RecomputeScope::kNone;
  int zero = 0;
  int tp = 1;
  bool sp = false;  // sequence parallel: tp > 1 under TrainingSpec::sequence_parallel
  int64_t microbatch = 1;  // per replica
  double in_flight = 1;  // stage_in_flight_activations
  StageLinks links;
};

// The latest cut positions of a split whose every stage's compute is ≤ limit (each stage as long as the limit and
// the stages after it allow), or empty when there is none. Componentwise the latest of all such splits.
std::vector<size_t> latest_cuts(const ComponentRuns& runs, const std::vector<StagePins>& pins, double limit) {
  const size_t n = runs.size(), stages = pins.size();
  std::vector<size_t> cut(stages + 1, 0);
  for (size_t s = 0; s < stages; ++s) {
    const size_t lo = cut[s] + 1, hi = n - (stages - s - 1);  // every later stage keeps a component
    if (lo > hi) return {};
    if (s + 1 == stages) {
      if (runs.compute_s(cut[s], n, pins[s].microbatch, pins[s].recompute, pins[s].tp, pins[s].sp) > limit) return {};
      cut[s + 1] = n;
      break;
    }
    // The last end in [lo, hi] within the limit (compute grows with the end).
    size_t a = lo, b = hi + 1;  // first end past the limit lies in [a, b]
    while (a < b) {
      const size_t mid = (a + b) / 2;
      if (runs.compute_s(cut[s], mid, pins[s].microbatch, pins[s].recompute, pins[s].tp, pins[s].sp) <= limit) a = mid + 1; else b = mid;
    }
    if (a == lo) return {};  // not even one component fits
    cut[s + 1] = a - 1;
  }
  return cut;
}

// The earliest cut positions under the same rule, from the back.
std::vector<size_t> earliest_cuts(const ComponentRuns& runs, const std::vector<StagePins>& pins, double limit) {
  const size_t n = runs.size(), stages = pins.size();
  std::vector<size_t> cut(stages + 1, n);
  cut[0] = 0;
  for (size_t s = stages; s-- > 1;) {
    const size_t hi = cut[s + 1] - 1, lo = s;  // every earlier stage keeps a component
    if (lo > hi) return {};
    size_t a = lo, b = hi;  // the first start within the limit lies in [a, b]; hi always is
    if (runs.compute_s(hi, cut[s + 1], pins[s].microbatch, pins[s].recompute, pins[s].tp, pins[s].sp) > limit) return {};
    while (a < b) {
      const size_t mid = (a + b) / 2;
      if (runs.compute_s(mid, cut[s + 1], pins[s].microbatch, pins[s].recompute, pins[s].tp, pins[s].sp) <= limit) b = mid; else a = mid + 1;
    }
    cut[s] = a;
  }
  if (runs.compute_s(0, cut[1], pins[0].microbatch, pins[0].recompute, pins[0].tp, pins[0].sp) > limit) return {};
  return cut;
}

double max_compute(const ComponentRuns& runs, const std::vector<StagePins>& pins, const std::vector<size_t>& cut) {
  double worst = 0;
  for (size_t s = 0; s < pins.size(); ++s)
    worst = std::max(worst, runs.compute_s(cut[s], cut[s + 1], pins[s].microbatch, pins[s].recompute, pins[s].tp, pins[s].sp));
  return worst;
}

// The least compute bottleneck over every split (exact: a bisection over doubles down to adjacent values, each
// probe a greedy pass that is exact for costs growing with the run), and its latest cuts.
std::vector<size_t> least_compute_cuts(const ComponentRuns& runs, const std::vector<StagePins>& pins) {
  const size_t stages = pins.size();
  std::vector<size_t> even(stages + 1);
  for (size_t s = 0; s <= stages; ++s) even[s] = s * runs.size() / stages;
  double hi = max_compute(runs, pins, even);  // feasible
  double lo = 0;
  for (int probe = 0; probe < 200 && std::nextafter(lo, hi) < hi; ++probe) {
    const double mid = lo + (hi - lo) / 2;
    if (mid <= lo || mid >= hi) break;
    const std::vector<size_t> cut = latest_cuts(runs, pins, mid);
    if (cut.empty()) lo = mid;
    else hi = max_compute(runs, pins, cut);  // the value it reaches, ≤ mid
  }
  return latest_cuts(runs, pins, hi);
}

RefinedCandidate candidate_of_cuts(const AtomicGraph& atomic, const std::vector<size_t>& cut, const StageSolution& coarse,
                                   const Cluster& cluster, const TrainingSpec& training, bool* fits) {
  RefinedCandidate candidate;
  const int stages = coarse.stages;
  candidate.assignment.blocks = static_cast<uint32_t>(stages);
  candidate.assignment.block_of.resize(atomic.size());
  for (int s = 0; s < stages; ++s)
    for (size_t c = cut[s]; c < cut[s + 1]; ++c) candidate.assignment.block_of[c] = BlockId(static_cast<uint32_t>(s));
  candidate.sequence = std::make_shared<const BlockSequence>(make_block_sequence(atomic, candidate.assignment));
  candidate.evaluator = std::make_shared<const StageEvaluator>(*candidate.sequence, cluster, training);
  candidate.solution = coarse;
  candidate.solution.boundaries.resize(stages + 1);
  std::iota(candidate.solution.boundaries.begin(), candidate.solution.boundaries.end(), 0u);
  *fits = evaluate_solution(*candidate.evaluator, candidate.solution);
  return candidate;
}

}  // namespace

ExactCuts exact_stage_cuts(const AtomicGraph& atomic, const StageSolution& coarse, const Cluster& cluster,
                           const TrainingSpec& training, size_t max_pairs) {
  ExactCuts found;
  const size_t n = atomic.size();
  const int stages = coarse.stages;
  APART_CHECK(static_cast<int>(coarse.replicas.size()) == stages, "exact_stage_cuts: replicas");
  if (stages < 2 || static_cast<size_t>(stages) > n) return found;
  ComponentRuns runs(atomic);
  std::vector<StagePins> pins(stages);
  for (int s = 0; s < stages; ++s) {
    StagePins& p = pins[s];
    p.replicas = coarse.replicas[s];
    p.recompute = coarse.recompute_of(s);
    p.zero = coarse.zero_of(s);
    p.tp = coarse.tp_of(s);
    p.sp = training.sequence_parallel && p.tp > 1;
    p.microbatch = microbatch_size(training.global_batch, coarse.microbatches, p.replicas);
    p.in_flight = stage_in_flight_activations(coarse.schedule, s, stages, coarse.microbatches, coarse.virtual_stages);
    p.links = assumed_links(cluster, Layout::kStageMajor, p.replicas * p.tp);
  }
  const int64_t memory_limit = cluster.usable_memory_bytes();

  const std::vector<size_t> compute_cut = least_compute_cuts(runs, pins);
  if (compute_cut.empty()) return found;
  bool fits = false;
  RefinedCandidate balanced = candidate_of_cuts(atomic, compute_cut, coarse, cluster, training, &fits);
  balanced.kind = "compute-balanced";
  if (fits) found.least_compute = std::move(balanced);
  const double compute_optimum = max_compute(runs, pins, compute_cut);

  // The least bottleneck: windows of the cuts every split with all stages' compute ≤ limit keeps to, a min-max DP
  // over them pruned at the limit; the limit's margin over the compute optimum doubles until the DP finds a split.
  struct State {
    double max_h = std::numeric_limits<double>::infinity();
    double sum_step = 0;
    size_t previous = 0;
    bool reached = false;
  };
  // No split is worth more than the coarse one's bottleneck, which the DP can reach: a stage (and a state) over it
  // is dropped without changing the answer, as every state's best way there is under it when any is. Unless the
  // coarse bottleneck was reckoned otherwise (its sums in another order; a pipeline-major layout's links) and the
  // DP then finds nothing under it: the round runs again without the ceiling.
  double ceiling = ceiling_over(coarse.bottleneck_h);
  for (double margin = 1.0 / 1024; margin <= 4.0; margin *= 2) {
    const double limit = compute_optimum * (1 + margin);
    const double cap = std::min(limit, ceiling);  // a stage's compute ≤ its h
    const std::vector<size_t> earliest = earliest_cuts(runs, pins, limit), latest = latest_cuts(runs, pins, limit);
    if (earliest.empty() || latest.empty()) continue;
    size_t pairs = 0;
    std::vector<size_t> positions;
    for (int s = 0; s < stages; ++s) {
      pairs += (latest[s] - earliest[s] + 1) * (latest[s + 1] - earliest[s + 1] + 1);
      for (size_t c = earliest[s]; c <= latest[s]; ++c) positions.push_back(c);
    }
    positions.push_back(n);
    if (pairs > max_pairs) break;
    std::sort(positions.begin(), positions.end());  // neighbouring windows may overlap
    positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
    runs.prepare(positions);
    // state[s][c − earliest[s]]: the best way to cut the first s stages with cut s at c.
    std::vector<std::vector<State>> state(stages + 1);
    for (int s = 0; s <= stages; ++s) state[s].resize(latest[s] - earliest[s] + 1);
    state[0][0] = State{0, 0, 0, true};
    for (int s = 0; s < stages; ++s) {
      const StagePins& p = pins[s];
      for (size_t i = earliest[s]; i <= latest[s]; ++i) {
        const State& from = state[s][i - earliest[s]];
        if (!from.reached) continue;
        for (size_t j = std::max(i + 1, earliest[s + 1]); j <= latest[s + 1]; ++j) {
          if (runs.compute_s(i, j, p.microbatch, p.recompute, p.tp, p.sp) > cap) break;  // and for every later end
          State& to = state[s + 1][j - earliest[s + 1]];
          if (to.reached && to.max_h < from.max_h) continue;  // max(from, this stage) cannot beat it: not costed
          const StageRange range = runs.range(i, j);
          if (!tp_allows(range, p.tp)) continue;
          const StageCost c = stage_cost(range, p.replicas, coarse.microbatches, p.in_flight, p.recompute, p.links,
                                         training, p.zero, p.tp);
          if (c.h > cap || c.memory_bytes > memory_limit) continue;
          const double max_h = std::max(from.max_h, c.h), sum_step = from.sum_step + c.step_s;
          if (!to.reached || max_h < to.max_h || (max_h == to.max_h && sum_step < to.sum_step))
            to = State{max_h, sum_step, i, true};
        }
      }
    }
    if (!state[stages][0].reached) {
      if (limit >= ceiling) {  // the coarse split was inside: reckoned over the ceiling here
        ceiling = kNoCeiling;
        margin /= 2;
      }
      continue;
    }
    std::vector<size_t> cut(stages + 1, n);
    for (int s = stages; s > 0; --s) cut[s - 1] = state[s][cut[s] - earliest[s]].previous;
    RefinedCandidate best = candidate_of_cuts(atomic, cut, coarse, cluster, training, &fits);
    // The evaluator sums the same terms in another order; a split on the memory limit may land a byte over it.
    best.kind = "task cuts";
    if (fits) found.least_bottleneck = std::move(best);
    break;
  }
  return found;
}

namespace {

// The best candidate of each stage count (the first of equals, as the final choice does) within the slack of the
// best, fastest first.
std::vector<const StageSolution*> best_per_stage_count(const std::vector<StageSolution>& candidates) {
  std::map<int, const StageSolution*> best_per_count;
  for (const StageSolution& s : candidates) {
    const StageSolution*& best = best_per_count[s.stages];
    if (!best || s.estimate.iteration_s < best->estimate.iteration_s * (1 - 1e-12)) best = &s;
  }
  std::vector<const StageSolution*> queue;
  for (const auto& [count, best] : best_per_count) queue.push_back(best);
  std::stable_sort(queue.begin(), queue.end(), [](const StageSolution* a, const StageSolution* b) {
    return a->estimate.iteration_s < b->estimate.iteration_s;
  });
  // Refinement moves cuts by about a block; it cannot lift a candidate much slower than the best.
  const double best_time = queue.empty() ? 0.0 : queue.front()->estimate.iteration_s;
  std::erase_if(queue, [&](const StageSolution* s) { return s->estimate.iteration_s > best_time * (1 + kRefineSlack); });
  return queue;
}

}  // namespace

std::vector<int> refined_stage_counts(const std::vector<StageSolution>& candidates) {
  std::vector<int> counts;
  for (const StageSolution* s : best_per_stage_count(candidates)) counts.push_back(s->stages);
  return counts;
}

std::vector<RefinedCandidate> refine_best_candidates(const AtomicGraph& atomic, const BlockAssignment& blocks,
                                                     const std::vector<StageSolution>& candidates,
                                                     const Cluster& cluster, const TrainingSpec& training,
                                                     int threads, ExactCutCache* exact_cache) {
  // Per candidate: the window refinement and the exact cuts, two independent jobs each; gathered in that order.
  const std::vector<const StageSolution*> queue = best_per_stage_count(candidates);
  std::vector<std::vector<RefinedCandidate>> found(2 * queue.size());
  run_indexed(found.size(), threads, [&](size_t job) {
    const StageSolution& coarse = *queue[job / 2];
    std::vector<RefinedCandidate>& out = found[job];
    if (job % 2 == 0) {
      if (auto moved = refine_stage_cuts(atomic, blocks, coarse, cluster, training)) out.push_back(std::move(*moved));
      return;
    }
    auto solve = [&] { return exact_stage_cuts(atomic, coarse, cluster, training); };
    ExactCuts exact = exact_cache ? exact_cache->get_or_solve(coarse, solve) : solve();
    if (exact.least_bottleneck) out.push_back(std::move(*exact.least_bottleneck));
    if (exact.least_compute) out.push_back(std::move(*exact.least_compute));
  });
  std::vector<RefinedCandidate> refined;
  for (std::vector<RefinedCandidate>& some : found)
    for (RefinedCandidate& r : some) refined.push_back(std::move(r));
  std::stable_sort(refined.begin(), refined.end(), [](const RefinedCandidate& a, const RefinedCandidate& b) {
    return a.solution.estimate.iteration_s < b.solution.estimate.iteration_s;
  });
  return refined;
}

}  // namespace apart
