// The phases of a partition search, each a free function over plain data: the request → atomic level → block
// level → stage DP → placed candidates → simulated selection → the Plan. partition_graph (partition.h) runs them
// for --method apart, partition_by_method (methods.h) for the baselines.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "graph/task_graph.h"
#include "partition/atomic.h"
#include "partition/block.h"
#include "partition/options.h"
#include "partition/partition.h"
#include "partition/select.h"
#include "partition/stage_dp.h"
#include "partition/stage_refine.h"
#include "profiler/cost_table.h"

namespace apart {

// When the search started, what it may spend (--time-limit, threads) and where its progress lines go.
struct SearchClock {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double time_limit_s = 0;  // 0: no limit
  ProgressFn progress;      // may be empty; called through report(), one line at a time from any thread
  // Threads the phases run independent DPs on (PartitionOptions::search_threads); their results are gathered in a
  // fixed order, so the count never changes what is found.
  int threads = 1;
  std::shared_ptr<std::mutex> progress_lock = std::make_shared<std::mutex>();
  void report(const std::string& line) const;  // progress(line) when set
  double elapsed_s() const;
  bool limited() const { return time_limit_s > 0; }
  // No simulation starts after it once one has run (select.h); time_point::max() without a limit.
  std::chrono::steady_clock::time_point deadline() const;
  SearchClock silent() const;  // the same clock without progress lines (the baseline splits print none)
  SearchClock one_thread() const;  // the same clock on the caller's thread (for work already run in parallel)
};

// ---------------- The request ----------------
// Validates the options and throws Infeasible for pins that cannot hold for any model: --microbatches not dividing
// --batch, --replicas beyond --devices or beyond the samples of a micro-batch.
void check_request(const PartitionOptions& options);

// The (schedule, recomputation, ZeRO, micro-batch count) combinations every stage DP runs for, fixed by the options.
struct SearchGrid {
  std::vector<Schedule> schedules;          // the pinned one, else 1F1B (GPipe never beats it here)
  int virtual_stages = 1;                   // chunks per device under interleaved (schedule_chunks of the options)
  std::vector<StageRecompute> recomputes;   // off and/or where needed; on when pinned
  std::vector<StageZero> zeros;             // the pinned ZeRO stage; auto: none and per stage (stage_dp.h)
  std::vector<int64_t> microbatches;        // microbatch_candidates
  double reference_microbatch = 1;          // per-replica micro-batch the block level and baselines weigh tasks at
};
SearchGrid search_grid(const PartitionOptions& options);

// Candidate micro-batch counts (the divisors of B, about 8 % apart when B has more than 64; or the pinned one) and
// stage counts (every count up to 24, then steps of about 8 %, and max_stages; or the pinned one).
std::vector<int64_t> microbatch_candidates(int64_t global_batch, const StageOptions& options);
std::vector<int> stage_candidates(int max_stages, const StageOptions& options);

// ---------------- Atomic level (§IV-A) ----------------
// build_atomic_graph, then the pins that need the model's size: --stages beyond its batch tasks or the devices.
AtomicGraph atomic_level(const TaskGraph& graph, const CostTable& costs, const PartitionOptions& options,
                         const CostTable* costs_at_other_size = nullptr);

// ---------------- Block level (§IV-B) ----------------
struct BlockLevel {
  BlockAssignment assignment;  // blocks == 0: the method has no block level (baselines, pipedream)
  BlockStatistics stats;       // coarsening levels and refinement moves (zero for METIS)
};
// k: --blocks, else automatic_block_count; at least --stages, at most the components.
int block_count(const AtomicGraph& atomic, const PartitionOptions& options);
// apart's multilevel blocks (build_blocks), and METIS k-way with cycle repair (--method metis).
BlockLevel block_level(const AtomicGraph& atomic, const PartitionOptions& options, const SearchGrid& grid);
BlockLevel metis_block_level(const AtomicGraph& atomic, const PartitionOptions& options, const SearchGrid& grid);

// ---------------- Stage DP (§IV-C) ----------------
// A split of the components into blocks, with the block sequence and the evaluator the stage DP runs on; the
// candidates of one split share them.
struct Split {
  std::shared_ptr<const BlockAssignment> assignment;
  std::shared_ptr<const BlockSequence> sequence;
  std::shared_ptr<const StageEvaluator> evaluator;
  std::string source;  // what the candidates' Plan::search.chosen_split says: "apart", "uniform", …
};
Split make_split(const AtomicGraph& atomic, BlockAssignment assignment, const PartitionOptions& options,
                 std::string source);
// The same blocks costed for another layout (pipeline-major: stages of one pipeline inside a node).
Split with_layout(const Split& split, Layout layout, std::string source);

// The DP's solutions, in the order found, and what it took.
struct StageSolutions {
  std::vector<StageSolution> solutions;
  int solved = 0;                      // (S, m, schedule, recompute, layout) combinations solved
  bool stopped_by_time_limit = false;  // a grid point ended past --time-limit with something found
};
// Stage-major: every grid point × every stage count ≤ the blocks, leftover devices spent unless --replicas pins
// them; a split of S blocks into S stages runs the fixed-split DP. Stops after the grid point that ends past the
// time limit once something was found, with a progress line per grid point.
StageSolutions solve_stage_dp(const StageEvaluator& evaluator, const SearchGrid& grid,
                              const std::vector<int>& stage_counts, const StageOptions& options,
                              const SearchClock& clock);
// solve_stage_dp at one micro-batch count (grid.microbatches holds one) for several (schedule, chunks, stage count)
// orders, one result per order equal to solve_stage_dp(evaluator, grid under that schedule and chunk count, {stages}),
// from one DP per ZeRO setting that every order but GPipe's shares (StageDp::reschedule): the tables are built once.
struct PipelineOrder {
  Schedule schedule = Schedule::k1F1B;
  int chunks = 1;
  int stages = 1;
};
// On one thread; as solve_stage_dp's, no grid point starts once one ended past the time limit with something found.
std::vector<StageSolutions> solve_stage_dp_orders(const StageEvaluator& evaluator, const SearchGrid& grid,
                                                  const std::vector<PipelineOrder>& orders, const StageOptions& options,
                                                  const SearchClock& clock);
// Pipeline-major (multi-node jobs): 2 ≤ S ≤ max_stages, every stage min(devices / S, B / m) replicas (or --replicas).
StageSolutions solve_pipeline_major(const StageEvaluator& pipeline, const SearchGrid& grid, int max_stages,
                                    const PartitionOptions& options, const SearchClock& clock);
// Whether every block of `evaluator` can fit a device as a stage of its own at micro-batch count m under the
// schedule and recomputation mode, with the most replicas the DP could give it (the least per-replica micro-batch)
// at any of `tp_degrees` its block allows: when not, the fixed-split DP at that grid point finds nothing, so it need
// not be built.
bool fixed_split_may_fit(const StageEvaluator& evaluator, int64_t microbatches, Schedule schedule, int chunks,
                         StageRecompute recompute, StageZero zero, const std::vector<int>& tp_degrees,
                         std::optional<int> pinned_replicas);

// ---------------- Candidates: solutions placed on devices ----------------
struct CandidateSet {
  std::vector<Candidate> candidates;  // in the order found: the selection's ties go to the earlier
  int solved = 0;                     // SearchStatistics::candidates
  bool stopped_by_time_limit = false;
  void add(StageSolutions found, const Split& split);
  void add(CandidateSet other);
};

// The stage DP over apart's (or METIS's) blocks: stage-major, then (CutRefinement::kOn, within the time limit) the
// best split of each stage count with its cuts moved off block edges and solved at component granularity
// (stage_refine.h refine_best_candidates), then pipeline-major for multi-node jobs within the time limit. The
// refined candidates come first, as they always have (the selection's ties go to them).
// With kOn, the refined stage counts also search the coarser block levels k/2, k/4, … ≥ kMinCoarserBlocks (and ≥ a
// pinned --stages), so that raising --blocks from k to 2k never loses a candidate of a pinned stage count.
enum class CutRefinement : uint8_t { kOff, kOn };
inline constexpr int kMinCoarserBlocks = 16;
// Stage-cut refinement (stage_refine.h refine_best_candidates): the best split of each stage count among `coarse`
// (solutions over `blocks`) with its cuts moved off block edges and solved exactly at component granularity, as
// candidates over their own runs of components, their source `source` + " refined" (or the refinement's kind).
// The stage counts are refined on `threads` threads (the same candidates whatever the count); `exact` keeps the
// exact cuts for the next call of the same search (stage_refine.h ExactCutCache; nullptr: none kept).
CandidateSet refined_candidates(const AtomicGraph& atomic, const BlockAssignment& blocks, const StageSolutions& coarse,
                                const PartitionOptions& options, const std::string& source, int threads = 1,
                                ExactCutCache* exact = nullptr);
CandidateSet block_candidates(const AtomicGraph& atomic, const BlockAssignment& blocks,
                              const PartitionOptions& options, const SearchGrid& grid, const SearchClock& clock,
                              CutRefinement refinement);
// A baseline split (uniform, params, gpipe-balance; baselines.h baseline_split) for every stage count; the DP
// over its S blocks only chooses replicas, m and recomputation.
CandidateSet fixed_split_candidates(const AtomicGraph& atomic, Method method, const PartitionOptions& options,
                                    const SearchGrid& grid, const SearchClock& clock);
// PipeDream's DP fixes the split and the replicas; apart's estimate then picks m and recomputation (all stages or
// none). Empty when PipeDream finds nothing that fits, or its stage count differs from --stages.
CandidateSet pipedream_candidates(const AtomicGraph& atomic, const PartitionOptions& options, const SearchGrid& grid);

// ---------------- apart's candidates (partition_graph's script up to the choice) ----------------
// The atomic and block levels, the candidates over apart's blocks and, with StageOptions::include_baselines, each
// baseline split's candidates kept by method, so that baselines.json's rows for those methods can choose among
// them without solving them again (methods.h partition_with_baselines).
struct ApartCandidates {
  AtomicGraph atomic;
  BlockLevel blocks;
  CandidateSet own;  // block_candidates over apart's blocks, cut refinement on
  struct BaselineSplit {
    Method method = Method::kUniform;
    CandidateSet found;
    BlockLevel blocks;            // METIS's blocks; none for the others
    bool same_as_method = true;   // found is what --method <method> chooses among (METIS: only without --blocks)
    double seconds = 0;           // what solving them took (wall)
  };
  // uniform, params, gpipe-balance, pipedream, metis; empty without include_baselines
  std::vector<BaselineSplit> baseline_splits;
  // own, then every baseline split's, in that order: what partition_graph chooses among (&&: moved out, not copied)
  CandidateSet all() const&;
  CandidateSet all() &&;
};
ApartCandidates apart_candidates(const TaskGraph& graph, const CostTable& costs, const PartitionOptions& options,
                                 const SearchGrid& grid, const SearchClock& clock,
                                 const CostTable* costs_at_other_size = nullptr);

// ---------------- Schedules (--schedule auto) ----------------
// The stage DP plans 1F1B (the interleaved and ZB-H1 tables cost one DP per stage count, stage_dp.h); under
// --schedule auto every candidate that pipelines is then offered again:
// - re-scheduled: ZB-H1, and (where m is a multiple of S) the interleaved order at each of kAutoVirtualStages
//   chunks (or the pinned --virtual-stages; at most a stage's fewest atomic components), with the same split,
//   replicas, degrees, placement and ZeRO. Their in-flight counts are higher (docs/cost-model.md §4): a stage that
//   no longer fits recomputes, unless --recompute off. Kept only if it fits and its estimate beats the original's.
// - re-solved: where memory binds the 1F1B split cannot take more in flight, so for the kScheduleResolves best
//   (split, S, m) of the stage-major 1F1B candidates by estimate over at most kScheduleResolveBlocks blocks (the
//   block levels and the baselines' splits, not the refined splits' component runs, whose DP costs O(k²) over
//   hundreds), the stage DP again at that S under ZB-H1 at m, and under the interleaved order at (S, the least
//   micro-batch count ≥ m that S divides) and at (the stage counts nearest S below and above that divide m, m);
//   each DP's solution also with its cuts refined at component granularity (refined_candidates).
inline constexpr size_t kScheduleResolves = 8;
inline constexpr size_t kScheduleResolveBlocks = 128;
// The re-solves' candidates by (split, source, schedule, chunks, S, m), kept across the choose_plan calls of one
// search (partition_with_baselines: apart's row and each baseline's re-solve the best (split, S, m) of their own
// candidates, and a split's best are often the same in several rows). A re-solve is a function of its split, that
// key and the options, so a search whose options differ only in --method (the rows) gets from the cache exactly what
// it would solve. Not for options that differ otherwise; filled on the caller's thread.
class ScheduleResolveCache {
 public:
  struct Key {
    const StageEvaluator* split;
    std::string source;
    Schedule schedule;
    int chunks, stages;
    int64_t microbatches;
    auto operator<=>(const Key&) const = default;
  };
  const std::vector<Candidate>* find(const Key& key) const;
  void add(const Key& key, std::shared_ptr<const StageEvaluator> split, std::vector<Candidate> found);
  size_t hits() const { return hits_; }

 private:
  struct Entry {
    std::shared_ptr<const StageEvaluator> split;  // keeps the key's address from being reused
    std::vector<Candidate> found;
  };
  std::map<Key, Entry> entries_;
  mutable size_t hits_ = 0;
};
// `cache` (may be null): re-solves found there are not solved again, and the ones solved are added.
std::vector<Candidate> schedule_variants(const AtomicGraph& atomic, const std::vector<Candidate>& candidates,
                                         const PartitionOptions& options, const SearchClock& clock,
                                         ScheduleResolveCache* cache = nullptr);

// ---------------- Simulated selection → the Plan ----------------
// With --schedule auto the candidates and their schedule_variants.
// Throws Infeasible (with what would fit) when there is no candidate; else simulates them (select_by_simulation
// under --time-limit and the simulation cap) and assembles the plan of the fastest, with the search statistics.
// `found` by value: a caller done with its candidates moves them in (they are many, each with its stage costs).
Plan choose_plan(const TaskGraph& graph, const AtomicGraph& atomic, CandidateSet found, const BlockLevel& blocks,
                 const PartitionOptions& options, const SearchClock& clock, ScheduleResolveCache* resolves = nullptr);
// The Plan of one candidate and its replay: chosen options, stages with their tasks and boundary values.
// Leaves Plan::search to the caller.
Plan assemble_plan(const TaskGraph& graph, const AtomicGraph& atomic, const Candidate& chosen,
                   const sim::SimResult& replay, const PartitionOptions& options);
// The boundary values of groups of batch tasks (stages, or an interleaved plan's chunks): a value a batch task of
// group a produces (a model input: a = -1) and batch tasks of later groups read is an input of each of them and an
// output of a (also when only the model outputs it), in bytes per micro-batch at `precision` as one device sends it
// (boundary_samples of the group's cost). `group_of_task[t]`: batch task t's group, -1 for constant tasks.
void add_stage_boundaries(const TaskGraph& graph, const std::vector<int>& group_of_task, int64_t graph_batch,
                          Precision precision, std::vector<PlanStage>& groups);

}  // namespace apart
