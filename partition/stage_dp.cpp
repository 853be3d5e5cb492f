// Stage-level DP (paper §IV-C) with exact bottleneck search and non-power-of-two replica counts.
#include "partition/stage_dp.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <queue>
#include <utility>

#include "graph/error.h"
#include "profiler/memory_model.h"

namespace apart {
namespace {

// Sorts non-negative finite doubles ascending: their IEEE-754 bit patterns order as unsigned integers do, so an LSD
// radix sort (8 passes of 8 bits) gives std::sort's order in linear time. The DP sorts every h value it tabulates.
void sort_non_negative(std::vector<double>& values) {
  std::vector<uint64_t> keys(values.size()), scratch(values.size());
  for (size_t i = 0; i < values.size(); ++i) keys[i] = std::bit_cast<uint64_t>(values[i]);
  for (int shift = 0; shift < 64; shift += 8) {
    size_t count[257] = {};
    for (uint64_t k : keys) ++count[((k >> shift) & 0xff) + 1];
    if (count[((keys.empty() ? 0 : keys[0]) >> shift & 0xff) + 1] == keys.size()) continue;  // one bucket: in order
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (uint64_t k : keys) scratch[count[(k >> shift) & 0xff]++] = k;
    keys.swap(scratch);
  }
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::bit_cast<double>(keys[i]);
}

}  // namespace

FirstAtMost::FirstAtMost(const std::vector<double>* values, size_t row_length) : values_(values), n_(row_length) {
  const std::vector<double>& v = *values;
  if (n_ <= kScanned) return;
  for (size_t width = 2; width <= n_; width *= 2) {
    const std::vector<double>& previous = levels_.empty() ? v : levels_.back();
    std::vector<double> level(v.size(), std::numeric_limits<double>::infinity());
    for (size_t row = 0; row + n_ <= v.size(); row += n_)
      for (size_t i = 0; i + width <= n_; ++i)
        level[row + i] = std::min(previous[row + i], previous[row + i + width / 2]);
    levels_.push_back(std::move(level));
  }
}

double FirstAtMost::range_min(size_t row_begin, size_t a, size_t b) const {
  const size_t length = b - a + 1;
  const int j = std::bit_width(length) - 1;  // 2^j ≤ length
  const std::vector<double>& level = j == 0 ? *values_ : levels_[static_cast<size_t>(j - 1)];
  return std::min(level[row_begin + a], level[row_begin + b + 1 - (size_t{1} << j)]);
}

int FirstAtMost::find(size_t row_begin, size_t lo, double limit) const {
  if (n_ <= kScanned) {
    const double* row = values_->data() + row_begin;
    for (size_t i = lo; i < n_; ++i)
      if (row[i] <= limit) return static_cast<int>(i);
    return -1;
  }
  if (lo >= n_ || range_min(row_begin, lo, n_ - 1) > limit) return -1;
  size_t a = lo, b = n_ - 1;  // the answer is in [a, b]
  while (a < b) {
    const size_t mid = (a + b) / 2;
    if (range_min(row_begin, lo, mid) <= limit) b = mid; else a = mid + 1;
  }
  return static_cast<int>(a);
}

int StageSolution::zero_of(int stage) const {
  return effective_zero(stage_zero.empty() ? zero : stage_zero[stage], replicas[stage]);
}

int StageSolution::devices_used() const {
  int devices = 0;
  for (int s = 0; s < stages; ++s) devices += devices_of(s);
  return devices;
}

bool StageSolution::any_recompute() const {
  for (int s = 0; s < stages; ++s)
    if (recomputes(s)) return true;
  return false;
}

namespace {

// evaluate_solution's loop: `cost_of(stage, flight)` costs one stage whose degree its blocks allow.
template <class CostOf, class AllowsTp>
bool evaluate_stages(StageSolution& solution, int64_t memory_limit, CostOf cost_of, AllowsTp allows_tp) {
  const int stages = solution.stages;
  APART_CHECK(static_cast<int>(solution.boundaries.size()) == stages + 1, "boundaries");
  APART_CHECK(static_cast<int>(solution.replicas.size()) == stages, "replicas");
  solution.costs.clear();
  solution.bottleneck_h = 0;
  bool fits = true;
  for (int s = 0; s < stages; ++s) {
    const double flight = stage_in_flight_activations(solution.schedule, s, stages, solution.microbatches,
                                                      solution.virtual_stages);
    if (!allows_tp(s)) {
      // A split whose stage its tensor-parallel degree cannot divide (cuts moved under a pinned degree): no plan.
      StageCost refused;
      refused.tp = solution.tp_of(s);
      refused.h = refused.step_s = std::numeric_limits<double>::infinity();
      refused.memory_bytes = std::numeric_limits<int64_t>::max();
      fits = false;
      solution.bottleneck_h = refused.h;
      solution.costs.push_back(refused);
      continue;
    }
    StageCost c = cost_of(s, flight);
    if (c.memory_bytes > memory_limit) fits = false;
    solution.bottleneck_h = std::max(solution.bottleneck_h, c.h);
    solution.costs.push_back(c);
  }
  solution.estimate =
      estimate_iteration_time(solution.costs, solution.microbatches, solution.schedule, solution.virtual_stages);
  return fits;
}

}  // namespace

bool evaluate_solution(const StageEvaluator& evaluator, StageSolution& solution, std::span<const StageLinks> links) {
  APART_CHECK(links.empty() || static_cast<int>(links.size()) == solution.stages, "links");
  return evaluate_stages(
      solution, evaluator.cluster().usable_memory_bytes(),
      [&](int s, double flight) {
        return evaluator.evaluate(solution.boundaries[s], solution.boundaries[s + 1], solution.replicas[s],
                                  solution.microbatches, flight, solution.recompute_of(s),
                                  links.empty() ? nullptr : &links[static_cast<size_t>(s)], solution.zero_of(s),
                                  solution.tp_of(s));
      },
      [&](int s) { return evaluator.allows_tp(solution.boundaries[s], solution.boundaries[s + 1], solution.tp_of(s)); });
}

bool evaluate_solution(const std::function<StageRange(uint32_t first, uint32_t last)>& range_of,
                       const Cluster& cluster, const TrainingSpec& training, Layout layout, StageSolution& solution) {
  APART_CHECK(static_cast<int>(solution.boundaries.size()) == solution.stages + 1, "boundaries");
  std::vector<StageRange> ranges;
  for (int s = 0; s < solution.stages; ++s) ranges.push_back(range_of(solution.boundaries[s], solution.boundaries[s + 1]));
  return evaluate_stages(
      solution, cluster.usable_memory_bytes(),
      [&](int s, double flight) {
        const int tp = solution.tp_of(s);
        return stage_cost(ranges[static_cast<size_t>(s)], solution.replicas[s], solution.microbatches, flight,
                          solution.recompute_of(s), assumed_links(cluster, layout, solution.replicas[s] * tp), training,
                          solution.zero_of(s), tp);
      },
      [&](int s) { return tp_allows(ranges[static_cast<size_t>(s)], solution.tp_of(s)); });
}

std::string_view stage_recompute_name(StageRecompute mode) {
  switch (mode) {
    case StageRecompute::kOff: return "off";
    case StageRecompute::kAll: return "on";
    case StageRecompute::kSelective: return "selective";
    case StageRecompute::kWhereNeeded: return "where needed";
    case StageRecompute::kWholeWhereNeeded: return "where needed (whole stages)";
  }
  return "?";
}

StageZero stage_zero_of(std::optional<int> option) {
  if (!option) return {.stage = 0, .automatic = true};
  return {.stage = *option, .automatic = false};
}

std::vector<StageVariant> stage_variants(StageRecompute recompute, StageZero zero, const std::vector<int>& tp_degrees) {
  std::vector<RecomputeScope> recomputes;
  switch (recompute) {
    case StageRecompute::kOff: recomputes = {RecomputeScope::kNone}; break;
    case StageRecompute::kAll: recomputes = {RecomputeScope::kFull}; break;
    case StageRecompute::kSelective: recomputes = {RecomputeScope::kSelective}; break;
    case StageRecompute::kWhereNeeded:
      recomputes = {RecomputeScope::kNone, RecomputeScope::kSelective, RecomputeScope::kFull};
      break;
    case StageRecompute::kWholeWhereNeeded: recomputes = {RecomputeScope::kNone, RecomputeScope::kFull}; break;
  }
  std::vector<StageVariant> variants;
  for (int tp : tp_degrees)
    for (RecomputeScope rc : recomputes) {
      if (!zero.automatic) {
        variants.push_back({rc, zero.stage, tp});
        continue;
      }
      for (int z = 0; z <= kMaxZeroStage; ++z) variants.push_back({rc, z, tp});
    }
  return variants;
}

std::vector<int> tp_degrees(std::optional<int> pinned, const Cluster& cluster) {
  if (pinned) return {*pinned};
  std::vector<int> degrees;
  for (int tp : kTpDegrees)
    if (cluster.devices_per_node % tp == 0 && tp <= cluster.devices) degrees.push_back(tp);
  return degrees;
}

StageDp::EntryRule StageDp::entry_rule(const StageRange& range, const StageVariant& v) const {
  EntryRule rule;
  // A degree the range's regions refuse never fits; where degree 1 is a choice too, one over a range without split
  // work only adds devices (the same h on t× the devices), so the DP never needs it either.
  if (v.tp > 1 && (!tp_allows(range, v.tp) || (!range.tp.splits_work() && tp_degrees_.front() == 1))) {
    rule.refused = true;
    return rule;
  }
  // Candidates whose groups would need more devices than the cluster has are never evaluated.
  while (rule.placeable < candidates_.size() && candidates_[rule.placeable] * v.tp <= devices_) ++rule.placeable;
  return rule;
}

template <class Cost>
void StageDp::find_lo(EntryRule& rule, Cost&& cost) const {
  // A stage holds at least this many micro-batches in flight (the last one under 1F1B), and memory only grows with
  // it and falls as replicas grow (a smaller micro-batch, a smaller ZeRO shard): the candidates below the first that
  // fits there fit nowhere, so they are not evaluated (never fitting, h infinite) and their h is never a bottleneck.
  const double least_flight = stage_in_flight_activations(schedule_, 0, 1, microbatches_, chunks_);
  const double budget = static_cast<double>(memory_limit_);
  auto fits = [&](size_t c) {
    const StageCost& e = cost(c);
    return std::ceil(e.memory_static + least_flight * e.memory_per_in_flight) <= budget;
  };
  size_t hi = rule.placeable;  // the first candidate that fits at the least in-flight count: in [lo, hi]
  if (rule.refused || rule.placeable == 0 || fits(0)) return;
  for (rule.lo = 1; rule.lo < hi;) {
    const size_t mid = (rule.lo + hi) / 2;
    if (fits(mid)) hi = mid; else rule.lo = mid + 1;
  }
}

template <class Cost>
StageDp::Entry StageDp::entry(const EntryRule& rule, const StageVariant& v, size_t c, Cost&& cost) const {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // Under --zero auto a 1-replica stage runs ZeRO 0 whatever its variant says: that is the ZeRO-0 variant's entry,
  // so the others leave it out as never fitting. Never fitting: memory infinite (memory stays monotone for
  // first_fitting), h infinite; beyond the cluster: memory 0, h infinite.
  if (rule.refused || c < rule.lo || (zero_.automatic && v.zero > 0 && candidates_[c] == 1)) return {kInf, kInf, 0};
  if (c >= rule.placeable) return {};
  const auto& e = cost(c);
  return {e.h, e.memory_static, e.memory_per_in_flight};
}

StageDp::StageDp(const StageEvaluator& evaluator, const StageDpOptions& options)
    : evaluator_(evaluator),
      microbatches_(options.microbatches),
      schedule_(options.schedule),
      chunks_(options.virtual_stages),
      recompute_(options.recompute),
      fixed_split_(options.fixed_split),
      zero_(options.zero),
      k_(evaluator.blocks()),
      devices_(evaluator.cluster().devices),
      memory_limit_(evaluator.cluster().usable_memory_bytes()) {
  for (size_t f = 0; f <= k_; ++f) row_start_.push_back(f * k_ - f * (f - (f > 0 ? 1 : 0)) / 2);
  const int64_t microbatches = options.microbatches;
  const bool fixed_split = options.fixed_split;
  const std::optional<int>& pinned_replicas = options.pinned_replicas;
  const int64_t per_microbatch = evaluator.training().global_batch / microbatches;
  const bool may_shard = zero_.automatic || zero_.stage > 0;
  if (pinned_replicas) {
    if (*pinned_replicas <= per_microbatch && *pinned_replicas <= devices_) candidates_.push_back(*pinned_replicas);
  } else {
    int64_t previous_u = std::numeric_limits<int64_t>::max();
    for (int sd = 1; sd <= devices_ && sd <= per_microbatch; ++sd) {
      const int64_t u = evaluator.microbatch_size(microbatches, sd);
      const bool last_at_u = sd == devices_ || sd == per_microbatch || evaluator.microbatch_size(microbatches, sd + 1) < u;
      if (u < previous_u || (may_shard && last_at_u)) candidates_.push_back(sd);
      previous_u = u;
    }
  }
  const size_t cands = candidates_.size();
  entries_ = k_ * (k_ + 1) / 2 * cands;  // the tables' size (fixed splits have none)
  APART_CHECK(!options.tp_degrees.empty() && std::is_sorted(options.tp_degrees.begin(), options.tp_degrees.end()),
              "tensor-parallel degrees");
  tp_degrees_ = options.tp_degrees;
  for (const StageVariant& v : stage_variants(options.recompute, zero_, options.tp_degrees))
    variants_.emplace_back().variant = v;
  if (fixed_split) {
    // Each block's entries are evaluated on first use (solve_fixed_split): no tables.
    for (uint32_t b = 0; b < k_; ++b) block_ranges_.push_back(evaluator.range(b, b + 1));
    lazy_.resize(k_ * variants_.size());
    return;
  }
  std::vector<StageCost> costs(cands);
  // evaluated[c] == round: candidate c's cost is this range and variant's (no clearing per range).
  std::vector<uint32_t> evaluated(cands, 0);
  uint32_t round = 0;
  auto cost_of = [&](const StageRange& range, const StageVariant& v) {
    ++round;
    return [&, v](size_t c) -> const StageCost& {
      if (evaluated[c] != round)
        costs[c] = evaluator.evaluate(range, candidates_[c], microbatches, 0, v.recompute, v.zero, v.tp);
      evaluated[c] = round;
      return costs[c];
    };
  };
  // Each range's rule per variant: which candidates are never evaluated (entry_rule, find_lo).
  const size_t variant_count = variants_.size();
  std::vector<EntryRule> rules(k_ * (k_ + 1) / 2 * variant_count);
  for (uint32_t first = 0; first < k_ && cands > 0; ++first)
    for (uint32_t last = first + 1; last <= k_; ++last) {
      const StageRange range = evaluator.range(first, last);
      for (size_t v = 0; v < variant_count; ++v) {
        EntryRule& rule = rules[range_index(first, last) * variant_count + v];
        rule = entry_rule(range, variants_[v].variant);
        find_lo(rule, cost_of(range, variants_[v].variant));
      }
    }
  // Whether any split fits at all: each stage needs at least the devices of its first candidate that fits at the
  // least in-flight count (the rules' lo), whatever the limit and the stage count. When even the fewest such devices
  // of the best split pass the cluster, every solve finds nothing (a grid point whose micro-batch is too large), so
  // the tables, the larger part of a DP's work, are not built: the answers are the same.
  if (cands > 0 && !any_split_fits(rules)) return;
  for (VariantTable& table : variants_) {
    table.h.assign(entries_, std::numeric_limits<double>::infinity());
    table.mem_base.assign(entries_, 0);
    table.mem_per_flight.assign(entries_, 0);
  }
  // The rest go into h_values_ (the candidates never evaluated have infinite h: never a bottleneck).
  h_values_.reserve(entries_ * variants_.size());
  least_compute_.assign((k_ + 1) * (k_ + 1), 0);
  // Fills one variant's tables for one range: h, memory without and per in-flight micro-batch.
  auto tabulate = [&](uint32_t first, uint32_t last, const StageRange& range, size_t v) {
    VariantTable& table = variants_[v];
    const EntryRule& rule = rules[range_index(first, last) * variant_count + v];
    auto cost = cost_of(range, table.variant);
    for (size_t c = 0; c < cands; ++c) {
      const size_t at = index(first, last, c);
      const Entry e = entry(rule, table.variant, c, cost);
      table.h[at] = e.h;
      table.mem_base[at] = e.mem_base;
      table.mem_per_flight[at] = e.mem_per_flight;
      if (std::isfinite(e.h)) h_values_.push_back(e.h);
    }
  };
  for (uint32_t first = 0; first < k_ && cands > 0; ++first)
    for (uint32_t last = first + 1; last <= k_; ++last) {
      const StageRange range = evaluator.range(first, last);
      for (size_t v = 0; v < variant_count; ++v) tabulate(first, last, range, v);
      // A lower bound on h for every candidate and variant: the compute at the most replicas under ZeRO 0 (ZeRO
      // only adds exposed collectives to forward and backward) and the first variant's recomputation, the least
      // over the tensor-parallel degrees the range allows.
      double least = std::numeric_limits<double>::infinity();
      for (int tp : options.tp_degrees)
        if (tp_allows(range, tp))
          least = std::min(least, evaluator.evaluate(range, candidates_.back(), microbatches, 0,
                                                     variants_.front().variant.recompute, 0, tp)
                                      .compute_s);
      least_compute_[first * (k_ + 1) + last] = least;
    }
  const bool non_negative =
      std::all_of(h_values_.begin(), h_values_.end(), [](double h) { return h >= 0 && !std::signbit(h); });
  if (non_negative) sort_non_negative(h_values_);
  else std::sort(h_values_.begin(), h_values_.end());
  h_values_.erase(std::unique(h_values_.begin(), h_values_.end()), h_values_.end());
  // After variants_ is complete: each FirstAtMost points at its table's h.
  for (VariantTable& table : variants_) table.first_h = FirstAtMost(&table.h, cands);
}

bool StageDp::any_split_fits(const std::vector<EntryRule>& rules) const {
  // fewest[first, last): the fewest devices any variant's first candidate fitting at the least in-flight count takes
  // (kNone: none fits); least[i]: the fewest devices blocks [i, k) take in stages of such ranges.
  const size_t variant_count = variants_.size();
  std::vector<int64_t> least(k_ + 1, kNone);
  least[k_] = 0;
  for (uint32_t first = static_cast<uint32_t>(k_); first-- > 0;)
    for (uint32_t last = first + 1; last <= k_; ++last) {
      if (least[last] == kNone) continue;
      int64_t fewest = kNone;
      for (size_t v = 0; v < variant_count; ++v) {
        const EntryRule& rule = rules[range_index(first, last) * variant_count + v];
        if (!rule.refused && rule.lo < rule.placeable)
          fewest = std::min<int64_t>(fewest, devices_of(static_cast<int>(rule.lo), v));
      }
      if (fewest != kNone) least[first] = std::min(least[first], fewest + least[last]);
    }
  return least[0] <= devices_;
}

void StageDp::reschedule(Schedule schedule, int virtual_stages) {
  if (stage_in_flight_activations(schedule, 0, 1, microbatches_, virtual_stages) !=
      stage_in_flight_activations(schedule_, 0, 1, microbatches_, chunks_))
    throw InvalidArgument("StageDp::reschedule: " + std::string(schedule_name(schedule)) +
                          " keeps another least in-flight count than the schedule the tables were built for");
  schedule_ = schedule;
  chunks_ = virtual_stages;
}

double StageDp::in_flight(int stage, int stages) const {
  return stage_in_flight_activations(schedule_, stage, stages, microbatches_, chunks_);
}

int StageDp::first_fitting(size_t base, double flight, const std::vector<double>& mem_base,
                           const std::vector<double>& per_flight) const {
  // Memory falls as replicas grow (smaller micro-batches): binary search for the first that fits.
  const double budget = static_cast<double>(memory_limit_);
  size_t lo = 0, hi = candidates_.size();
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    const double mem = mem_base[base + mid] + flight * per_flight[base + mid];
    if (std::ceil(mem) <= budget) hi = mid; else lo = mid + 1;
  }
  return static_cast<int>(lo);
}

StageDp::View StageDp::view_of(StageRecompute recompute) const {
  View view;
  view.recompute = recompute == StageRecompute::kAll         ? RecomputeScope::kFull
                   : recompute == StageRecompute::kSelective ? RecomputeScope::kSelective
                                                             : RecomputeScope::kNone;
  view.where_needed = recompute == StageRecompute::kWhereNeeded || recompute == StageRecompute::kWholeWhereNeeded;
  APART_CHECK(variants_.size() <= 64, "at most 64 stage variants");
  for (const StageVariant& wanted : stage_variants(recompute, zero_, tp_degrees_)) {
    size_t v = 0;
    while (v < variants_.size() && !(variants_[v].variant.recompute == wanted.recompute &&
                                     variants_[v].variant.zero == wanted.zero && variants_[v].variant.tp == wanted.tp))
      ++v;
    APART_CHECK(v < variants_.size(), "the DP was not built with the recomputation asked of it");
    view.active |= uint64_t{1} << v;
  }
  return view;
}

StageDp::Fitting& StageDp::fitting_starts(double flight, const View& view) const {
  for (Fitting& f : fitting_)
    if (f.flight == flight && f.active == view.active) return f;
  // Per stored range (index() / candidates): one entry per variant and the fewest devices, found on first use.
  const size_t cands = candidates_.size();
  const size_t ranges = cands == 0 ? 0 : entries_ / cands;
  fitting_.push_back({flight, view.active, std::vector<int32_t>(variants_.size() * ranges, kUnknown),
                      std::vector<int32_t>(ranges, kUnknown)});
  return fitting_.back();
}

const int32_t* StageDp::fitting_of(Fitting& fitting, uint32_t first, uint32_t last) const {
  const size_t range = range_index(first, last);
  const size_t base = range * candidates_.size();
  int32_t* starts = &fitting.starts[variants_.size() * range];
  if (fitting.fewest[range] == kUnknown) {
    int32_t fewest = kNone;  // the fewest devices any of the view's variants fits in, after the variants' starts
    for (size_t v = 0; v < variants_.size(); ++v) {
      if (!((fitting.active >> v) & 1u)) {
        starts[v] = static_cast<int32_t>(candidates_.size());  // not read: never fits
        continue;
      }
      starts[v] = first_fitting(base, fitting.flight, variants_[v].mem_base, variants_[v].mem_per_flight);
      if (static_cast<size_t>(starts[v]) < candidates_.size()) fewest = std::min(fewest, devices_of(starts[v], v));
    }
    fitting.fewest[range] = fewest;
  }
  return starts;
}

int StageDp::min_candidate(uint32_t first, uint32_t last, Fitting& fitting, double limit,
                           std::vector<int32_t>& under_limit, int device_cap, const View& view, int* variant) const {
  const size_t base = index(first, last, 0);
  const size_t range = variants_.size() * range_index(first, last);
  const int32_t* starts = fitting_of(fitting, first, last);
  // The first candidate ≥ the fitting one with h ≤ limit. The first one with h ≤ limit at all depends only on the
  // range and the limit, so it is found once per fill and answers every in-flight count whose fitting candidate is
  // not after it.
  auto first_under = [&](size_t v) {
    int32_t& any = under_limit[range + v];
    if (any == kUnknown) any = variants_[v].first_h.find(base, 0, limit);
    if (any < 0 || any >= starts[v]) return static_cast<int>(any);
    return variants_[v].first_h.find(base, static_cast<size_t>(starts[v]), limit);
  };
  // A later variant (a higher tensor-parallel degree, recomputation, a higher ZeRO stage) only where it lets the stage
  // use fewer devices (or fit at all) under the same limit.
  // Only fewer devices than `device_cap`, and than the best so far, count: a variant whose first fitting candidate
  // already takes as many is not searched.
  int best = -1;
  *variant = 0;
  for (size_t v = 0; v < variants_.size(); ++v) {
    if (!view.has(v)) continue;
    const int cap = best < 0 ? device_cap : devices_of(best, static_cast<size_t>(*variant));
    if (static_cast<size_t>(starts[v]) >= candidates_.size() || devices_of(starts[v], v) >= cap) continue;
    const int c = first_under(v);
    if (c >= 0 && devices_of(c, v) < cap) {
      best = c;
      *variant = static_cast<int>(v);
    }
  }
  return best;
}

void StageDp::fill(int stages, double limit, bool every_start, const View& view, Table& t, const Floor* floor) const {
  // devices[r][i]: least devices for blocks [i, k) in r + 1 stages (the first of them is stage S − 1 − r). Its
  // in-flight count, S − (S − 1 − r) = r + 1 under 1F1B (m under GPipe), does not depend on S, so one table with
  // every start i answers every stage count ≤ `stages` at once (every_start); for one S, starts before S − 1 − r
  // cannot be reached and are skipped.
  APART_CHECK(!fixed_split_, "a fixed split's DP has no tables (solve_fixed_split)");
  const size_t n = k_ + 1;
  t.devices.assign(static_cast<size_t>(stages) * n, kNone);
  // The choices are read only where devices is set (feasible()'s walk), which this fill writes too: not cleared.
  t.last.resize(t.devices.size());
  t.cand.resize(t.devices.size());
  t.variant.resize(t.devices.size());
  t.under_limit.assign(candidates_.empty() ? 0 : variants_.size() * (entries_ / candidates_.size()), kUnknown);
  for (int r = 0; r < stages; ++r) {
    Fitting& fitting = fitting_starts(in_flight(stages - 1 - r, stages), view);
    const uint32_t i_min = every_start ? 0u : static_cast<uint32_t>(stages - 1 - r);
    const uint32_t i_max = static_cast<uint32_t>(k_ - 1 - r);
    for (uint32_t i = i_min; i <= i_max && i < k_; ++i) {
      // The floor's least devices: none there, none here; once a choice reaches it, no later one does better.
      const int least = floor && floor->covers(r, i) ? (*floor->devices)[r * n + i] : 0;
      if (least == kNone) continue;
      int best = kNone;
      uint32_t best_last = 0;
      int best_cand = -1;
      int best_variant = 0, variant = 0;
      if (r == 0) {
        const int c = min_candidate(i, static_cast<uint32_t>(k_), fitting, limit, t.under_limit, devices_ + 1, view, &variant);
        if (c >= 0) {
          best = devices_of(c, static_cast<size_t>(variant));
          best_last = static_cast<uint32_t>(k_);
          best_cand = c;
          best_variant = variant;
        }
      } else {
        for (uint32_t last = i + 1; last + r <= k_; ++last) {
          // h ≥ compute time ≥ its least (most replicas, no recomputation), which only grows with `last`.
          if (least_compute_[i * n + last] > limit) break;
          const int rest = t.devices[(r - 1) * n + last];
          if (rest == kNone || rest >= devices_) continue;
          const int fewest = fewest_fitting_devices(fitting, i, last);  // devices any variant fits in
          if (fewest == kNone || rest + fewest >= best) continue;
          const int c = min_candidate(i, last, fitting, limit, t.under_limit, best - rest, view, &variant);
          if (c < 0) continue;
          const int total = rest + devices_of(c, static_cast<size_t>(variant));
          if (total < best) {
            best = total;
            best_last = last;
            best_cand = c;
            best_variant = variant;
            if (best <= least) break;
          }
        }
      }
      if (best <= devices_) {
        t.devices[r * n + i] = best;
        t.last[r * n + i] = best_last;
        t.cand[r * n + i] = best_cand;
        t.variant[r * n + i] = static_cast<uint8_t>(best_variant);
      }
    }
  }
}

bool StageDp::feasible(int stages, double limit, const View& view, std::vector<uint32_t>* boundaries,
                       std::vector<int>* replicas, std::vector<int>* variants) const {
  Table t;
  fill(stages, limit, false, view, t);
  const size_t n = k_ + 1;
  const int total = t.devices[(stages - 1) * n + 0];
  if (total == kNone || total > devices_) return false;
  if (boundaries) {
    boundaries->assign(1, 0);
    replicas->clear();
    variants->clear();
    uint32_t i = 0;
    for (int r = stages - 1; r >= 0; --r) {
      const size_t at = r * n + i;
      replicas->push_back(candidates_[t.cand[at]]);
      variants->push_back(t.variant[at]);
      i = t.last[at];
      boundaries->push_back(i);
    }
  }
  return true;
}

std::optional<StageSolution> StageDp::solve(int stages) const {
  std::vector<std::optional<StageSolution>> one = solve_many({stages});
  return std::move(one.front());
}

std::vector<std::optional<StageSolution>> StageDp::solve_many(const std::vector<int>& stage_counts) const {
  return solve_many(stage_counts, view_of(recompute_));
}

std::vector<std::optional<StageSolution>> StageDp::solve_many(const std::vector<int>& stage_counts,
                                                              StageRecompute recompute) const {
  return solve_many(stage_counts, view_of(recompute));
}

std::vector<std::optional<StageSolution>> StageDp::solve_many(const std::vector<int>& stage_counts,
                                                              const View& view) const {
  std::vector<std::optional<StageSolution>> out(stage_counts.size());
  if (schedule_ == Schedule::kInterleaved || schedule_ == Schedule::kZbH1) {
    // Their in-flight counts depend on S itself (interleaved (v − 1)·S, ZB-H1 min(S, m)), not only on the stages
    // after: one table per count. Megatron-LM's interleaved order needs m to be a multiple of S: other counts have
    // no interleaved plan.
    if (stage_counts.size() > 1) {
      for (size_t q = 0; q < stage_counts.size(); ++q) out[q] = std::move(solve_many({stage_counts[q]}, view).front());
      return out;
    }
    if (schedule_ == Schedule::kInterleaved && stage_counts.size() == 1 &&
        (stage_counts[0] < 1 || microbatches_ % stage_counts[0] != 0))
      return out;
  }
  if (fixed_split_) {
    for (size_t q = 0; q < stage_counts.size(); ++q)
      if (static_cast<size_t>(stage_counts[q]) == k_) out[q] = solve_fixed_split(view);
    return out;
  }
  // Per stage count, the index range of h_values_ its least feasible bottleneck lies in; nothing to search for
  // counts that cannot be feasible.
  struct Search {
    int stages;
    size_t lo, hi;
    bool active;
  };
  std::vector<Search> searches;
  int max_stages = 0;
  for (int s : stage_counts) {
    const bool possible = s >= 1 && static_cast<size_t>(s) <= k_ && !candidates_.empty() && !h_values_.empty() &&
                          static_cast<int64_t>(s) * candidates_.front() <= devices_;
    searches.push_back({s, 0, h_values_.empty() ? 0 : h_values_.size() - 1, possible});
    if (possible) max_stages = std::max(max_stages, s);
  }
  const size_t n = k_ + 1;
  Table t;
  // One table at a limit answers every stage count: probe where the widest open range is halved, and let the
  // answer narrow every range it falls in (a parallel binary search; each range ends at its least feasible value).
  int open = 0;
  for (const Search& s : searches) open += s.active ? 1 : 0;
  const bool every_start = open > 1;  // one count: the cheaper table of its reachable starts
  // Every probe's least devices, by h index: the nearest probe above a limit bounds its table from below (fill).
  struct Probed {
    size_t at;
    int stages;
    std::vector<int> devices;
  };
  std::vector<Probed> probed;
  auto probe = [&](size_t at) {
    // Only the counts whose range holds `at` read this table, and rows up to S − 1 answer S (fill): the rest of
    // the rows are not needed.
    int needed = 0;
    for (const Search& s : searches)
      if (s.active && at >= s.lo && at <= s.hi) needed = std::max(needed, s.stages);
    const Probed* above = nullptr;
    for (const Probed& p : probed)
      if (p.at > at && (!above || p.at < above->at)) above = &p;
    const Floor floor{above ? &above->devices : nullptr, above ? above->stages : 0, every_start};
    fill(needed, h_values_[at], every_start, view, t, &floor);
    probed.push_back({at, needed, t.devices});
    for (Search& s : searches) {
      if (!s.active || at < s.lo || at > s.hi) continue;
      const int total = t.devices[static_cast<size_t>(s.stages - 1) * n];
      if (total != kNone && total <= devices_) s.hi = at; else s.lo = at + 1;
    }
  };
  if (max_stages > 0) {
    probe(h_values_.size() - 1);  // feasible at all?
    for (Search& s : searches)
      if (s.active && s.lo > s.hi) s.active = false;
  }
  for (;;) {
    const Search* widest = nullptr;
    for (const Search& s : searches)
      if (s.active && s.lo < s.hi && (!widest || s.hi - s.lo > widest->hi - widest->lo)) widest = &s;
    if (!widest) break;
    probe((widest->lo + widest->hi) / 2);
  }
  for (size_t q = 0; q < searches.size(); ++q) {
    const Search& s = searches[q];
    if (!s.active) continue;
    std::vector<uint32_t> boundaries;
    std::vector<int> replicas, chosen;
    APART_CHECK(feasible(s.stages, h_values_[s.hi], view, &boundaries, &replicas, &chosen), "DP lost feasibility");
    out[q] = solution_of(s.stages, view, std::move(boundaries), std::move(replicas), chosen);
  }
  return out;
}

StageSolution StageDp::solution_of(int stages, const View& view, std::vector<uint32_t> boundaries,
                                   std::vector<int> replicas, const std::vector<int>& chosen) const {
  StageSolution solution;
  solution.stages = stages;
  solution.microbatches = microbatches_;
  solution.schedule = schedule_;
  solution.virtual_stages = chunks_;
  solution.recompute = view.recompute;
  solution.zero = zero_.automatic ? 0 : zero_.stage;
  solution.boundaries = std::move(boundaries);
  solution.replicas = std::move(replicas);
  if (view.where_needed)
    for (int v : chosen) solution.stage_recompute.push_back(variants_[static_cast<size_t>(v)].variant.recompute);
  if (zero_.automatic)
    for (int v : chosen) solution.stage_zero.push_back(variants_[static_cast<size_t>(v)].variant.zero);
  if (variants_.back().variant.tp > 1)
    for (int v : chosen) solution.stage_tp.push_back(variants_[static_cast<size_t>(v)].variant.tp);
  const bool fits = evaluate_solution(evaluator_, solution);
  APART_CHECK(fits, "DP returned a split that does not fit memory");
  return solution;
}

StageDp::LazyEntries& StageDp::lazy_entries(uint32_t block, size_t variant) const {
  LazyEntries& lazy = lazy_[block * variants_.size() + variant];
  if (!lazy.ruled) {
    lazy.entries.resize(candidates_.size());
    lazy.known.assign(candidates_.size(), 0);
    // No least-fitting candidate (lo): with memory monotone in the replicas, the binary search at a stage's own
    // in-flight count (at least the least) never lands below it.
    lazy.rule = entry_rule(block_ranges_[block], variants_[variant].variant);
    lazy.ruled = true;
  }
  return lazy;
}

const StageDp::Entry& StageDp::evaluate_lazy_entry(uint32_t block, size_t variant, size_t c) const {
  LazyEntries& lazy = lazy_entries(block, variant);
  if (!lazy.known[c]) {
    const StageVariant& v = variants_[variant].variant;
    lazy.entries[c] = entry(lazy.rule, v, c, [&](size_t at) {
      return evaluator_.evaluate(block_ranges_[block], candidates_[at], microbatches_, 0, v.recompute, v.zero, v.tp);
    });
    lazy.known[c] = 1;
  }
  return lazy.entries[c];
}

int StageDp::lazy_first_fitting(uint32_t block, size_t variant, double flight) const {
  // first_fitting's binary search over the same memory figures.
  const double budget = static_cast<double>(memory_limit_);
  size_t lo = 0, hi = candidates_.size();
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    const Entry& e = lazy_entry(block, variant, mid);
    if (std::ceil(e.mem_base + flight * e.mem_per_flight) <= budget) hi = mid; else lo = mid + 1;
  }
  return static_cast<int>(lo);
}

std::optional<StageSolution> StageDp::solve_fixed_split(const View& view) const {
  // Every block is a stage, so a bottleneck limit L is feasible iff Σ_i (the fewest devices stage i fits in with
  // h ≤ L) ≤ devices, and that sum only falls as L rises. Start every stage at its fewest devices (any h); while the
  // sum fits, move the stages whose h is the bottleneck to their fewest devices with a lower h. When one has none,
  // or the sum would pass the devices, the bottleneck is the least feasible limit — the binary search's answer —
  // and each stage takes min_candidate's choice there (the first variant on ties, its first candidate).
  const int stages = static_cast<int>(k_);
  const size_t cands = candidates_.size(), variants = variants_.size();
  if (stages < 1 || cands == 0 || static_cast<int64_t>(stages) * candidates_.front() > devices_) return std::nullopt;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  struct Choice {
    int cand = -1, variant = 0, devices = kNone;
    double h = kInf;
  };
  std::vector<int> start(static_cast<size_t>(stages) * variants, static_cast<int>(cands));
  for (int s = 0; s < stages; ++s) {
    const double flight = in_flight(s, stages);
    for (size_t v = 0; v < variants; ++v)
      if (view.has(v)) start[s * variants + v] = lazy_first_fitting(static_cast<uint32_t>(s), v, flight);
  }
  // The fewest devices of stage s with h < bound (`strict`) or ≤ bound, from candidate `from[v]` of each variant
  // on; the candidates passed are left out of `from` (strict: a later bound is lower, they stay above it).
  auto fewest = [&](int s, double bound, bool strict, int* from) {
    Choice best;
    for (size_t v = 0; v < variants; ++v) {
      if (!view.has(v)) continue;
      auto h_at = [&](int c) { return lazy_entry(static_cast<uint32_t>(s), v, static_cast<size_t>(c)).h; };
      int c = from[v];
      // Only fewer devices than the best so far count.
      for (; c < static_cast<int>(cands) && devices_of(c, v) < best.devices; ++c) {
        const double h = h_at(c);
        if (strict ? h < bound : h <= bound) {
          best = {c, static_cast<int>(v), devices_of(c, v), h};
          break;
        }
      }
      if (strict) from[v] = c;
    }
    return best;
  };
  std::vector<int> next = start;
  std::vector<Choice> current(static_cast<size_t>(stages));
  int64_t total = 0;
  // The stages by h, the bottleneck on top (a stage's entry is replaced only when it moves, and only the top's move).
  std::priority_queue<std::pair<double, int>> by_h;
  for (int s = 0; s < stages; ++s) {
    current[s] = fewest(s, kInf, true, &next[s * variants]);
    if (current[s].cand < 0) return std::nullopt;
    total += current[s].devices;
    by_h.emplace(current[s].h, s);
  }
  if (total > devices_) return std::nullopt;
  double limit = 0;
  std::vector<std::pair<int, Choice>> moves;
  for (;;) {
    limit = by_h.top().first;
    moves.clear();
    int64_t moved_total = total;
    bool lower = true;
    while (!by_h.empty() && by_h.top().first == limit && lower) {
      const int s = by_h.top().second;
      by_h.pop();
      const Choice c = fewest(s, limit, true, &next[s * variants]);
      lower = c.cand >= 0;
      moved_total += c.devices - current[s].devices;
      moves.emplace_back(s, c);
    }
    if (!lower || moved_total > devices_) break;
    for (const auto& [s, c] : moves) {
      current[s] = c;
      by_h.emplace(c.h, s);
    }
    total = moved_total;
  }
  std::vector<uint32_t> boundaries(1, 0);
  std::vector<int> replicas, chosen;
  for (int s = 0; s < stages; ++s) {
    const Choice c = fewest(s, limit, false, &start[s * variants]);
    APART_CHECK(c.cand >= 0, "fixed split lost feasibility");
    boundaries.push_back(static_cast<uint32_t>(s + 1));
    replicas.push_back(candidates_[static_cast<size_t>(c.cand)]);
    chosen.push_back(c.variant);
  }
  return solution_of(stages, view, std::move(boundaries), std::move(replicas), chosen);
}

void StageDp::spend_leftover_devices(StageSolution& solution) const {
  spend_leftover_devices(solution, view_of(recompute_));
}

void StageDp::spend_leftover_devices(StageSolution& solution, StageRecompute recompute) const {
  spend_leftover_devices(solution, view_of(recompute));
}

void StageDp::spend_leftover_devices(StageSolution& solution, const View& view) const {
  if (candidates_.size() < 2) return;
  // Only the changed stage is re-evaluated; each trial's estimate is O(1) from the current costs' sums and maxima
  // (StageReplacementEstimate) under GPipe and 1F1B. A stage's trial
  // (its next replica candidate, the first variant that fits there) depends on that stage alone, so it is kept
  // until the stage changes.
  struct Trial {
    bool known = false, fits = false;
    int replicas = 0;
    StageVariant variant;
    StageCost cost;
  };
  std::vector<Trial> trials(static_cast<size_t>(solution.stages));
  StageReplacementEstimate replaced(solution.costs, microbatches_, schedule_, chunks_);
  for (;;) {
    const int used = solution.devices_used();
    double best_time = solution.estimate.iteration_s;
    int best_stage = -1;
    for (int s = 0; s < solution.stages; ++s) {
      Trial& trial = trials[static_cast<size_t>(s)];
      if (trial.known && !trial.fits) continue;
      const int tp = solution.tp_of(s);
      if (!trial.known) {
        // Devices used only grow: a stage without a next candidate, or whose next one does not fit the devices
        // left, has none until it changes (it never does then).
        auto it = std::upper_bound(candidates_.begin(), candidates_.end(), solution.replicas[s]);
        if (it == candidates_.end() || used + (*it - solution.replicas[s]) * tp > devices_) {
          trial.known = true;
          trial.fits = false;
          continue;
        }
        // Per stage (where needed, --zero auto): the first variant in the DP's order, at the stage's
        // tensor-parallel degree, that now fits.
        trial = Trial{.known = true, .replicas = *it};
        for (size_t v = 0; v < variants_.size(); ++v) {
          const VariantTable& table = variants_[v];
          if (!view.has(v) || table.variant.tp != tp) continue;
          trial.variant = table.variant;
          trial.cost = evaluator_.evaluate(solution.boundaries[s], solution.boundaries[s + 1], *it, microbatches_,
                                           in_flight(s, solution.stages), trial.variant.recompute, nullptr,
                                           trial.variant.zero, tp);
          if (trial.cost.memory_bytes <= memory_limit_) {
            trial.fits = true;
            break;
          }
        }
      } else if (used + (trial.replicas - solution.replicas[s]) * tp > devices_) {
        trial.fits = false;
        continue;
      }
      if (!trial.fits) continue;
      const double t = replaced.iteration_s(static_cast<size_t>(s), trial.cost);
      // Strictly better by a margin, so float noise cannot make the choice depend on evaluation order.
      if (t < best_time * (1 - 1e-12)) {
        best_time = t;
        best_stage = s;
      }
    }
    if (best_stage < 0) break;
    Trial& best = trials[static_cast<size_t>(best_stage)];
    solution.replicas[best_stage] = best.replicas;
    if (view.where_needed) solution.stage_recompute[best_stage] = best.variant.recompute;
    if (zero_.automatic) solution.stage_zero[best_stage] = best.variant.zero;
    solution.costs[best_stage] = best.cost;
    best.known = false;
    // The next round compares with this one's time: under GPipe and 1F1B from the kept figures (the same bits as
    // estimate_iteration_time), else the full formula; evaluate_solution sets the whole estimate at the end.
    replaced.replace(static_cast<size_t>(best_stage), best.cost);
    if (const std::optional<double> now = replaced.current_iteration_s()) {
      solution.estimate.iteration_s = *now;
    } else {
      solution.estimate = estimate_iteration_time(solution.costs, microbatches_, schedule_, chunks_);
    }
  }
  evaluate_solution(evaluator_, solution);
}

}  // namespace apart
