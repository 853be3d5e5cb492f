// Stage-level DP (paper §IV-C): split blocks B1..Bk into S contiguous stages with replica counts, minimising
// the bottleneck max_i h(b_{i-1}, b_i, sd_i) subject to Σ sd_i ≤ devices and every stage fitting memory.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "partition/stage_cost.h"

namespace apart {

// First index ≥ lo whose value is ≤ a limit over many equal-length rows of values (the DP's h per replica candidate,
// which is not monotone in the replica count). Rows of at most kScanned values are scanned (a few cache lines:
// faster than building anything); longer ones get a sparse table of range minima and a binary search on the
// running minimum from lo, O(log n).
class FirstAtMost {
 public:
  FirstAtMost() = default;
  FirstAtMost(const std::vector<double>* values, size_t row_length);
  // Index within the row starting at `row_begin`, or -1.
  int find(size_t row_begin, size_t lo, double limit) const;

 private:
  static constexpr size_t kScanned = 64;
  double range_min(size_t row_begin, size_t a, size_t b) const;  // inclusive
  const std::vector<double>* values_ = nullptr;
  size_t n_ = 0;
  std::vector<std::vector<double>> levels_;  // levels_[j-1][i]: min of values[i .. i + 2^j) within a row
};

// One candidate: S stages at m micro-batches under a schedule, with recomputation on or off.
struct StageSolution {
  int stages = 0;
  int64_t microbatches = 0;
  Schedule schedule = Schedule::k1F1B;
  int virtual_stages = 1;            // chunks per device: > 1 only interleaved (options.h schedule_chunks)
  RecomputeScope recompute = RecomputeScope::kNone;  // what every stage recomputes (unless stage_recompute says)
  std::vector<RecomputeScope> stage_recompute;       // per stage when the DP chose it per stage; empty: all = recompute
  int zero = 0;                      // ZeRO stage of every stage with replicas (unless stage_zero says per stage)
  std::vector<int> stage_zero;       // per stage when the DP chose it per stage (--zero auto); empty: all = zero
  std::vector<int> stage_tp;         // per stage: tensor-parallel degree of each replica; empty: all 1
  std::vector<uint32_t> boundaries;  // S + 1 entries: 0 = b0 < b1 < … < bS = k; stage i is [b_i, b_{i+1})
  std::vector<int> replicas;         // per stage (each a tensor-parallel group of tp_of(stage) devices)
  std::vector<StageCost> costs;      // per stage
  double bottleneck_h = 0;           // the DP objective: max_i h_i
  PipelineEstimate estimate;         // the selection objective
  int devices_used() const;  // Σ replicas × tensor-parallel degree
  RecomputeScope recompute_of(int stage) const {
    return stage_recompute.empty() ? recompute : stage_recompute[static_cast<size_t>(stage)];
  }
  bool recomputes(int stage) const { return recompute_of(stage) != RecomputeScope::kNone; }
  // The ZeRO stage stage `stage` runs: 0 on one replica (nothing to shard), else its own or the solution's.
  int zero_of(int stage) const;
  bool any_recompute() const;
  int tp_of(int stage) const { return stage_tp.empty() ? 1 : stage_tp[static_cast<size_t>(stage)]; }
  int devices_of(int stage) const { return replicas[static_cast<size_t>(stage)] * tp_of(stage); }
};

// Evaluates every stage of a fixed split with fixed replicas; fills costs, bottleneck and estimate.
// `links`: per stage, the placed links (partition/placement.h); empty: the evaluator's layout assumption.
// Returns false when a stage exceeds device memory, or its blocks refuse its tensor-parallel degree (that stage's
// cost is then infinite).
bool evaluate_solution(const StageEvaluator& evaluator, StageSolution& solution,
                       std::span<const StageLinks> links = {});
// The same over any source of range sums (`range_of(first, last)`, StageEvaluator::range's), unplaced: the links
// `layout` assumes. The refinement's round evaluates its splits this way without StageEvaluator's O(k²) tables.
bool evaluate_solution(const std::function<StageRange(uint32_t first, uint32_t last)>& range_of,
                       const Cluster& cluster, const TrainingSpec& training, Layout layout, StageSolution& solution);

// How a DP run treats activation recomputation.
enum class StageRecompute : uint8_t {
  kOff,           // no stage recomputes
  kAll,           // every stage recomputes its whole forward
  kSelective,     // every stage recomputes its attention cores (RecomputeScope::kSelective)
  kWhereNeeded,   // a stage recomputes only if it does not fit (or needs more replicas to fit) without, its
                  // attention cores before its whole forward; the DP is exact over that per-stage choice too
  kWholeWhereNeeded,  // the same between none and the whole forward only (what apart run executes today)
};
// "off", "on", "selective", "where needed", "where needed (whole stages)"
std::string_view stage_recompute_name(StageRecompute mode);

// How a DP run treats ZeRO (profiler/memory_model.h): one stage for every stage with replicas, or per stage.
struct StageZero {
  int stage = 0;            // 0..3, every stage (a 1-replica stage runs 0)
  bool automatic = false;   // --zero auto: each stage's least-replica variant under the limit, 0 before 1 before 2
                            // before 3 on ties; the DP is exact over that per-stage choice too
};
// --zero's option (nullopt: auto) as a DP setting.
StageZero stage_zero_of(std::optional<int> option);

// One way a stage may run: recomputing nothing, its attention cores or its whole forward, under one ZeRO stage, each
// replica a tensor-parallel group of `tp` devices. The DP's per-stage choices.
struct StageVariant {
  RecomputeScope recompute = RecomputeScope::kNone;
  int zero = 0;
  int tp = 1;
};
// The variants a DP with these settings lets each stage choose from, in its tie-breaking order: the lower
// tensor-parallel degree first (`tp_degrees`, ascending), within that recomputing less first (none, selective,
// full), and within that
// ZeRO 0, 1, 2, 3 (the cheaper in time first).
std::vector<StageVariant> stage_variants(StageRecompute recompute, StageZero zero, const std::vector<int>& tp_degrees = {1});

// The tensor-parallel degrees a search may give a stage: `pinned` (--tp T) alone, or (nullopt, --tp auto) each of
// kTpDegrees that divides the node's devices (a TP group never straddles a node) and is at most the cluster's.
std::vector<int> tp_degrees(std::optional<int> pinned, const Cluster& cluster);

// What one StageDp solves for: everything but the stage count, which solve() takes.
struct StageDpOptions {
  int64_t microbatches = 1;
  Schedule schedule = Schedule::k1F1B;
  int virtual_stages = 1;  // chunks per device (interleaved only; schedule_chunks)
  StageRecompute recompute = StageRecompute::kOff;
  StageZero zero = {};
  std::vector<int> tp_degrees = {1};  // the tensor-parallel degrees each stage may choose among (ascending)
  std::optional<int> pinned_replicas = std::nullopt;  // every stage gets exactly this many replicas (--replicas)
  bool fixed_split = false;  // every block is a stage (baselines): no tables, each block evaluated as needed
};

// The DP for one (m, schedule, recompute, zero), reusable across stage counts S. Replica candidates are, for each
// distinct per-replica micro-batch size ceil(B/(m·sd)), the least sd giving it (more replicas at the same
// size only add all-reduce time and devices), so any sd ≤ devices is reachable, not only powers of two. When ZeRO
// may shard, more replicas at the same size also hold less state: the most sd giving each size is a candidate
// too (the one that fits best there; the sizes between are not tried — on up to four devices there are none).
class StageDp {
 public:
  StageDp(const StageEvaluator& evaluator, const StageDpOptions& options);
  StageDp(const StageDp&) = delete;  // the range-min tables point into this object's vectors
  StageDp& operator=(const StageDp&) = delete;
  // The split into exactly `stages` stages minimising the bottleneck (ties: fewer devices); nullopt when no
  // split fits memory and devices. Exact: binary search over the sorted distinct values h can take.
  std::optional<StageSolution> solve(int stages) const;
  // solve() for several stage counts, sharing the DP tables: one table at a bottleneck limit answers every count
  // (the in-flight count of a stage depends only on the stages after it), so the binary searches run in parallel.
  std::vector<std::optional<StageSolution>> solve_many(const std::vector<int>& stage_counts) const;
  // What a StageDp built with `recompute` instead (the rest of the options the same) answers, from this one's tables:
  // its variants must be among this one's (kOff, kAll or kSelective of kWhereNeeded; kOff or kAll of
  // kWholeWhereNeeded). Exact: the restricted DP over this one's tables is that DP, and its least feasible bottleneck
  // is among this one's h values too. One DP answers a grid's recomputation points at a third less tabulation.
  std::vector<std::optional<StageSolution>> solve_many(const std::vector<int>& stage_counts,
                                                       StageRecompute recompute) const;
  // The schedule and chunks per device the solves that follow plan for: the DP then answers what a StageDp built with
  // them (the rest of the options the same) answers. The tables hold no in-flight count but the least one, a stage
  // alone in its pipeline, which is one micro-batch under every schedule but GPipe (m): so GPipe never takes the
  // place of another, nor another GPipe's (InvalidArgument). The schedule re-solves share one DP this way.
  void reschedule(Schedule schedule, int virtual_stages);
  // Gives leftover devices to stages, one candidate step at a time, while the estimate improves; `recompute`: the
  // one the solution was solved under (solve_many's), by default the DP's own.
  void spend_leftover_devices(StageSolution& solution) const;
  void spend_leftover_devices(StageSolution& solution, StageRecompute recompute) const;
  const std::vector<int>& replica_candidates() const { return candidates_; }

 private:
  // The memory-feasible first candidates of the ranges at one in-flight count (they do not depend on the
  // bottleneck limit, so every probe of the binary search reuses them): per stored range (index() / candidates),
  // the plain and the recomputing variant, kUnknown until fitting_of finds them.
  static constexpr int32_t kUnknown = -2;
  // The variants one solve_many() reads (a bit per index into variants_) and what its solutions record.
  struct View {
    uint64_t active = 0;
    RecomputeScope recompute = RecomputeScope::kNone;  // every stage's, unless where_needed
    bool where_needed = false;
    bool has(size_t v) const { return (active >> v) & 1u; }
  };
  View view_of(StageRecompute recompute) const;
  struct Fitting {
    double flight;
    uint64_t active;  // the view's variants (the fewest devices is over them)
    std::vector<int32_t> starts;  // per stored range: each variant's first fitting candidate
    std::vector<int32_t> fewest;  // per stored range: the fewest devices any of them fits in (kNone: none), apart
                                  // so that fill()'s test of every range reads a dense array
  };
  Fitting& fitting_starts(double in_flight, const View& view) const;
  // The range's first fitting candidate per variant, found on first use.
  const int32_t* fitting_of(Fitting& fitting, uint32_t first, uint32_t last) const;
  int fewest_fitting_devices(Fitting& fitting, uint32_t first, uint32_t last) const {
    const int32_t known = fitting.fewest[range_index(first, last)];
    return known != kUnknown ? known : (fitting_of(fitting, first, last), fitting.fewest[range_index(first, last)]);
  }
  // Least candidate index whose memory fits and h ≤ limit, or -1; *variant: the variant (index into variants_)
  // that gives it, the first in order on ties. `fitting`: the stage's in-flight count's; `under_limit`: per range
  // and variant, the first candidate with h ≤ limit (kUnknown until found), kept by fill().
  // Only candidates on fewer than `device_cap` devices are looked for (-1 when none).
  int min_candidate(uint32_t first, uint32_t last, Fitting& fitting, double limit, std::vector<int32_t>& under_limit,
                    int device_cap, const View& view, int* variant) const;
  // Devices a stage takes at candidate c under variant v: replicas × its tensor-parallel degree.
  int devices_of(int c, size_t v) const { return candidates_[static_cast<size_t>(c)] * variants_[v].variant.tp; }
  int first_fitting(size_t base, double in_flight, const std::vector<double>& mem_base,
                    const std::vector<double>& per_flight) const;
  // Min devices for blocks [first, k) in `stages_left` stages when every h ≤ limit; fills choice tables.
  static constexpr int kNone = std::numeric_limits<int>::max();
  struct Table {  // per (stages left − 1, first block), flattened: least devices and the choice that gives it
    std::vector<int> devices;
    std::vector<uint32_t> last;
    std::vector<int> cand;
    std::vector<uint8_t> variant;
    std::vector<int32_t> under_limit;  // min_candidate's per-range cache at this table's limit
  };
  // A table filled at a higher limit: its least devices bound this limit's from below (a lower limit only removes
  // choices), for the entries it computed (rows below `stages`; every start, or those a count of `stages` reaches).
  struct Floor {
    const std::vector<int>* devices = nullptr;
    int stages = 0;
    bool every_start = false;
    bool covers(int r, uint32_t i) const {
      return devices && r < stages && (every_start || i >= static_cast<uint32_t>(stages - 1 - r));
    }
  };
  void fill(int stages, double limit, bool every_start, const View& view, Table& table,
            const Floor* floor = nullptr) const;
  bool feasible(int stages, double limit, const View& view, std::vector<uint32_t>* boundaries,
                std::vector<int>* replicas, std::vector<int>* variants) const;
  std::vector<std::optional<StageSolution>> solve_many(const std::vector<int>& stage_counts, const View& view) const;
  // The solution of `stages` stages with these blocks and choices (variants_ indices), evaluated.
  StageSolution solution_of(int stages, const View& view, std::vector<uint32_t> boundaries, std::vector<int> replicas,
                            const std::vector<int>& chosen) const;

  // One range's entry at one replica candidate under one variant, by the tables' rules (Entries).
  struct Entry {
    double h = std::numeric_limits<double>::infinity();
    double mem_base = 0, mem_per_flight = 0;
  };
  // Which candidates of a range under a variant are never evaluated: all (`refused`: a tensor-parallel degree the
  // range refuses or does not need), those before `lo` (the first that fits a device at the least in-flight count;
  // 0 until find_lo) and from `placeable` on (more devices than the cluster has).
  struct EntryRule {
    bool refused = false;
    size_t lo = 0, placeable = 0;
  };
  EntryRule entry_rule(const StageRange& range, const StageVariant& v) const;
  // `cost(c)`: candidate c's StageCost (the caller's cache evaluates each at most once).
  template <class Cost>
  void find_lo(EntryRule& rule, Cost&& cost) const;
  // Whether some split of the blocks into stages fits the devices when each stage takes the fewest devices a variant
  // fits in at the least in-flight count (`rules`: per stored range and variant): when not, no limit and no stage
  // count has a solution.
  bool any_split_fits(const std::vector<EntryRule>& rules) const;
  template <class Cost>
  Entry entry(const EntryRule& rule, const StageVariant& v, size_t c, Cost&& cost) const;

  // Fixed splits (every block a stage, the baselines') build no tables: each block's entries are evaluated on first
  // use, and the least bottleneck is found by moving the bottleneck stages to their fewest devices at a lower h
  // (solve_fixed_split) — the binary search's answer, with far fewer evaluations.
  struct LazyEntries {
    bool ruled = false;
    EntryRule rule;
    std::vector<Entry> entries;  // per candidate
    std::vector<uint8_t> known;  // per candidate: entries[c] evaluated
  };
  const Entry& lazy_entry(uint32_t block, size_t variant, size_t c) const {
    const LazyEntries& lazy = lazy_[block * variants_.size() + variant];
    if (lazy.ruled && lazy.known[c]) [[likely]] return lazy.entries[c];
    return evaluate_lazy_entry(block, variant, c);
  }
  const Entry& evaluate_lazy_entry(uint32_t block, size_t variant, size_t c) const;
  LazyEntries& lazy_entries(uint32_t block, size_t variant) const;
  int lazy_first_fitting(uint32_t block, size_t variant, double in_flight) const;
  std::optional<StageSolution> solve_fixed_split(const View& view) const;
  void spend_leftover_devices(StageSolution& solution, const View& view) const;
  double in_flight(int stage, int stages) const;

  const StageEvaluator& evaluator_;
  int64_t microbatches_;
  Schedule schedule_;
  int chunks_;
  StageRecompute recompute_;
  bool fixed_split_;
  StageZero zero_;
  size_t k_;
  int devices_;
  int64_t memory_limit_;
  std::vector<int> tp_degrees_;          // StageDpOptions::tp_degrees
  std::vector<int> candidates_;          // replica counts, ascending
  // Per variant and (first, last, candidate), flattened: h, memory without in-flight activations, per in-flight
  // bytes; the first h ≤ a limit from a candidate on.
  struct VariantTable {
    StageVariant variant;
    std::vector<double> h, mem_base, mem_per_flight;
    FirstAtMost first_h;
  };
  std::vector<VariantTable> variants_;
  size_t entries_ = 0;  // per variant: ranges stored × candidates
  // Per (first, last), (k + 1)²: the least compute time of the range (most replicas, no recomputation), a lower
  // bound on its h for every candidate, rising with `last`: fill() stops widening a range past the limit there.
  std::vector<double> least_compute_;
  mutable std::deque<Fitting> fitting_;  // per in-flight count (a deque: fill() holds one while adding another)
  std::vector<StageRange> block_ranges_;  // fixed splits: each block's range
  mutable std::vector<LazyEntries> lazy_;  // fixed splits: per (block, variant)
  std::vector<double> h_values_;         // sorted distinct h values
  // The ranges first < last, row by row (first·k − first(first−1)/2 ranges come before row `first`: row_start_).
  std::vector<size_t> row_start_;
  size_t range_index(uint32_t first, uint32_t last) const { return row_start_[first] + (last - first - 1); }
  size_t index(uint32_t first, uint32_t last, size_t c) const { return range_index(first, last) * candidates_.size() + c; }
};

}  // namespace apart
