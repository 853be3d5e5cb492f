// The phases of the partition search (partition/phases.h), each on its own plain data.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "graph/error.h"
#include "partition/baselines.h"
#include "partition/phases.h"
#include "brute_force.h"
#include "random_models.h"
#include "test_cluster.h"

namespace apart {
namespace {

using testing::random_model;

PartitionOptions options_for(int devices, int devices_per_node, int64_t batch) {
  PartitionOptions o;
  o.cluster = testing::test_cluster(devices, devices_per_node, 1'000'000'000);
  o.training.global_batch = batch;
  return o;
}

std::set<std::string> sources_of(const CandidateSet& found) {
  std::set<std::string> sources;
  for (const Candidate& c : found.candidates) sources.insert(c.source);
  return sources;
}

TEST(TheSearchGrid, TriesNoRecomputationAndRecomputationWhereNeededUnderAuto) {
  PartitionOptions o = options_for(4, 4, 16);
  // At the default --tp 1 auto recomputes whole stages only (what apart run executes); selective joins with TP.
  EXPECT_EQ(search_grid(o).recomputes,
            (std::vector<StageRecompute>{StageRecompute::kOff, StageRecompute::kWholeWhereNeeded}));
  o.stage.tp = std::nullopt;
  EXPECT_EQ(search_grid(o).recomputes, (std::vector<StageRecompute>{StageRecompute::kOff, StageRecompute::kWhereNeeded}));
  o.stage.tp = 2;
  EXPECT_EQ(search_grid(o).recomputes, (std::vector<StageRecompute>{StageRecompute::kOff, StageRecompute::kWhereNeeded}));
  o.stage.tp = 1;
  o.stage.recompute = Recompute::kSelective;
  EXPECT_EQ(search_grid(o).recomputes, (std::vector<StageRecompute>{StageRecompute::kSelective}));
  o.stage.recompute = Recompute::kOn;
  EXPECT_EQ(search_grid(o).recomputes, (std::vector<StageRecompute>{StageRecompute::kAll}));
  o.stage.recompute = Recompute::kOff;
  EXPECT_EQ(search_grid(o).recomputes, (std::vector<StageRecompute>{StageRecompute::kOff}));
}

TEST(TheSearchGrid, HoldsThePinnedScheduleAndMicrobatchesOrElse1F1BAndEveryDivisor) {
  PartitionOptions o = options_for(4, 4, 12);
  EXPECT_EQ(search_grid(o).schedules, (std::vector<Schedule>{Schedule::k1F1B}));
  EXPECT_EQ(search_grid(o).microbatches, (std::vector<int64_t>{1, 2, 3, 4, 6, 12}));
  o.stage.schedule = Schedule::kGPipe;
  o.stage.microbatches = 3;
  EXPECT_EQ(search_grid(o).schedules, (std::vector<Schedule>{Schedule::kGPipe}));
  EXPECT_EQ(search_grid(o).microbatches, (std::vector<int64_t>{3}));
}

TEST(TheSearchGrid, WeighsTasksAtTheBatchPerDeviceButNeverBelowOneSample) {
  EXPECT_EQ(search_grid(options_for(8, 8, 64)).reference_microbatch, 8);
  EXPECT_EQ(search_grid(options_for(8, 8, 4)).reference_microbatch, 1);
}

TEST(TheRequestCheck, RefusesMicrobatchesThatDoNotDivideTheBatchAndReplicasBeyondTheDevices) {
  PartitionOptions o = options_for(4, 4, 12);
  o.stage.microbatches = 5;
  EXPECT_THROW(check_request(o), Infeasible);
  o.stage.microbatches = 4;
  EXPECT_NO_THROW(check_request(o));
  o.stage.replicas = 5;
  EXPECT_THROW(check_request(o), Infeasible);
}

TEST(TheAtomicLevel, GivesOneComponentPerBatchTaskAndRefusesMoreStagesThanThat) {
  const auto model = random_model(3, 8, true);
  PartitionOptions o = options_for(16, 8, 16);
  const AtomicGraph atomic = atomic_level(model.graph, model.costs, o);
  size_t batch_tasks = 0;
  for (uint32_t t = 0; t < model.graph.num_tasks(); ++t) batch_tasks += !model.graph.task(TaskId(t)).constant;
  EXPECT_EQ(atomic.size(), batch_tasks);
  o.stage.stages = static_cast<int>(batch_tasks) + 1;
  EXPECT_THROW(atomic_level(model.graph, model.costs, o), Infeasible);
}

TEST(TheBlockLevel, GivesTheRequestedBlocksButAtLeastThePinnedStagesAndAtMostTheComponents) {
  const auto model = random_model(4, 12, false);
  PartitionOptions o = options_for(4, 4, 16);
  const AtomicGraph atomic = atomic_level(model.graph, model.costs, o);
  o.block.blocks = 3;
  EXPECT_EQ(block_count(atomic, o), 3);
  o.stage.stages = 4;
  EXPECT_EQ(block_count(atomic, o), 4);
  o.block.blocks = 1000;
  EXPECT_EQ(block_count(atomic, o), static_cast<int>(atomic.size()));
  o.block.blocks = 3;
  o.stage.stages.reset();
  const BlockLevel level = block_level(atomic, o, search_grid(o));
  EXPECT_LE(level.assignment.blocks, 3u);
  EXPECT_EQ(level.assignment.block_of.size(), atomic.size());
}

TEST(TheFixedSplitCandidates, AreTheBaselineSplitForEveryStageCountTheDpFits) {
  const auto model = random_model(5, 7, true);
  PartitionOptions o = options_for(4, 4, 8);
  o.stage.recompute = Recompute::kOff;
  const AtomicGraph atomic = atomic_level(model.graph, model.costs, o);
  const SearchGrid grid = search_grid(o);
  const CandidateSet found = fixed_split_candidates(atomic, Method::kUniform, o, grid, SearchClock{});
  ASSERT_FALSE(found.candidates.empty());
  // Stage counts 1..min(components, devices), each DP over the grid's micro-batch counts.
  const int stage_counts = std::min<int>(static_cast<int>(atomic.size()), 4);
  EXPECT_EQ(found.solved, stage_counts * static_cast<int>(grid.microbatches.size()));
  for (const Candidate& c : found.candidates) {
    EXPECT_EQ(c.source, "uniform");
    EXPECT_EQ(c.assignment->blocks, static_cast<uint32_t>(c.solution.stages));
    EXPECT_EQ(c.assignment->block_of, baseline_split(atomic, Method::kUniform, c.solution.stages).block_of);
  }
}

TEST(TheBlockCandidates, AddPipelineMajorOnlyWhenTheJobSpansNodes) {
  const auto model = random_model(6, 10, true);
  PartitionOptions one_node = options_for(4, 4, 16);
  const AtomicGraph atomic = atomic_level(model.graph, model.costs, one_node);
  const BlockLevel blocks = block_level(atomic, one_node, search_grid(one_node));
  EXPECT_EQ(sources_of(block_candidates(atomic, blocks.assignment, one_node, search_grid(one_node), SearchClock{},
                                        CutRefinement::kOff)),
            (std::set<std::string>{"apart"}));
  PartitionOptions two_nodes = options_for(4, 2, 16);
  EXPECT_TRUE(sources_of(block_candidates(atomic, blocks.assignment, two_nodes, search_grid(two_nodes),
                                          SearchClock{}, CutRefinement::kOff))
                  .contains("apart pipeline-major"));
}

TEST(TheSelectionPhase, SaysWhatWouldFitWhenThereIsNoCandidate) {
  const auto model = random_model(7, 6, true);
  const PartitionOptions o = options_for(2, 2, 4);
  const AtomicGraph atomic = atomic_level(model.graph, model.costs, o);
  EXPECT_THROW(choose_plan(model.graph, atomic, CandidateSet{}, BlockLevel{}, o, SearchClock{}), Infeasible);
}

TEST(TheSelectionPhase, ChoosesACandidateItWasGivenAndCountsTheSearch) {
  const auto model = random_model(8, 9, false);
  const PartitionOptions o = options_for(4, 4, 16);
  const AtomicGraph atomic = atomic_level(model.graph, model.costs, o);
  const SearchGrid grid = search_grid(o);
  const CandidateSet found = fixed_split_candidates(atomic, Method::kParams, o, grid, SearchClock{});
  const Plan plan = choose_plan(model.graph, atomic, found, BlockLevel{}, o, SearchClock{});
  EXPECT_EQ(plan.search.chosen_split, "params");
  EXPECT_EQ(plan.search.candidates, found.solved);
  EXPECT_EQ(plan.search.candidates_placed, static_cast<int>(found.candidates.size()));
  EXPECT_EQ(plan.search.blocks, 0u);
  EXPECT_EQ(plan.search.atomic_components, atomic.size());
  size_t batch_tasks = 0;
  for (const PlanStage& s : plan.stages) batch_tasks += s.batch_tasks;
  EXPECT_EQ(batch_tasks, atomic.size());
}

// Memory tight enough that some ZB-H1 or interleaved variants need recomputation (or do not fit).
TEST(TheScheduleVariants, KeepTheirOriginalsSplitFitMemoryAndBeatTheirOriginalsEstimate) {
  int rescheduled = 0, resolved = 0, recomputing = 0;
  for (uint32_t seed = 60; seed < 66; ++seed) {
    const auto model = random_model(seed, 12, seed % 2 == 0);
    for (int64_t memory : {int64_t{1'000'000'000}, int64_t{1'500'000}, int64_t{1'000'000}}) {
      for (Recompute recompute : {Recompute::kAuto, Recompute::kOff}) {
        PartitionOptions o = options_for(4, 4, 16);
        o.cluster.device.memory_bytes = memory;
        o.stage.schedule.reset();
        o.stage.recompute = recompute;
        const AtomicGraph atomic = atomic_level(model.graph, model.costs, o);
        const BlockLevel blocks = block_level(atomic, o, search_grid(o));
        const CandidateSet found =
            block_candidates(atomic, blocks.assignment, o, search_grid(o), SearchClock{}, CutRefinement::kOn);
        const std::vector<Candidate> variants = schedule_variants(atomic, found.candidates, o, SearchClock{});
        for (const Candidate& v : variants) {
          const StageSolution& sol = v.solution;
          EXPECT_NE(sol.schedule, Schedule::k1F1B);
          EXPECT_GE(sol.stages, 2);
          EXPECT_EQ(sol.schedule == Schedule::kInterleaved, sol.virtual_stages > 1);
          if (sol.schedule == Schedule::kInterleaved) {
            EXPECT_EQ(sol.microbatches % sol.stages, 0) << v.source;
            EXPECT_TRUE(std::ranges::find(kAutoVirtualStages, sol.virtual_stages) != std::end(kAutoVirtualStages));
          }
          for (const StageCost& c : sol.costs) EXPECT_LE(c.memory_bytes, o.cluster.usable_memory_bytes()) << v.source;
          if (recompute == Recompute::kOff) EXPECT_FALSE(sol.any_recompute()) << v.source;
          if (sol.any_recompute()) ++recomputing;
          if (v.source.find(" dp") != std::string::npos) {  // "… dp", or "… dp refined" and the other refinements
            ++resolved;
            continue;
          }
          // Re-scheduled: an original with the same split, m, replicas and degrees, a slower estimate, and recomputing
          // at least where the variant does not.
          ++rescheduled;
          const auto original = std::ranges::find_if(found.candidates, [&](const Candidate& c) {
            return c.evaluator == v.evaluator && c.solution.boundaries == sol.boundaries &&
                   c.solution.replicas == sol.replicas && c.solution.microbatches == sol.microbatches &&
                   c.solution.stage_tp == sol.stage_tp && c.solution.schedule == Schedule::k1F1B &&
                   v.source.starts_with(c.source + " ");
          });
          ASSERT_NE(original, found.candidates.end()) << v.source;
          EXPECT_LT(sol.estimate.iteration_s, original->solution.estimate.iteration_s);
          for (int s = 0; s < sol.stages; ++s)
            if (original->solution.recomputes(s)) EXPECT_TRUE(sol.recomputes(s));
        }
        // The same variants in the same order again.
        const std::vector<Candidate> again = schedule_variants(atomic, found.candidates, o, SearchClock{});
        ASSERT_EQ(again.size(), variants.size());
        for (size_t i = 0; i < variants.size(); ++i) {
          EXPECT_EQ(again[i].source, variants[i].source);
          EXPECT_EQ(again[i].solution.estimate.iteration_s, variants[i].solution.estimate.iteration_s);
        }
      }
    }
  }
  EXPECT_GT(rescheduled, 20);
  EXPECT_GT(resolved, 5);
  EXPECT_GT(recomputing, 0);
}

TEST(TheSharedScheduleDp, SolvesEachOrderAsItsOwnStageDpDoes) {
  // solve_stage_dp_orders (the re-solves' one DP per split and m) against solve_stage_dp per order, the search
  // before the tables were shared: the same solutions in the same order, figure for figure.
  int compared = 0, solutions = 0;
  for (uint32_t seed = 70; seed < 73; ++seed) {
    const auto model = random_model(seed, 14, seed % 2 == 0);
    for (int64_t memory : {int64_t{1'000'000'000}, int64_t{1'500'000}}) {
      PartitionOptions o = options_for(8, 4, 24);
      o.cluster.device.memory_bytes = memory;
      o.stage.schedule.reset();
      o.stage.zero.reset();
      o.stage.tp.reset();
      const AtomicGraph atomic = atomic_level(model.graph, model.costs, o);
      const BlockLevel blocks = block_level(atomic, o, search_grid(o));
      const Split split = make_split(atomic, blocks.assignment, o, "apart");
      const int k = static_cast<int>(split.evaluator->blocks());
      for (int64_t m : {2, 6, 12}) {
        SearchGrid grid = search_grid(o);
        grid.microbatches = {m};
        std::vector<PipelineOrder> orders;
        for (int stages = 2; stages <= k; ++stages) {
          orders.push_back({Schedule::kZbH1, 1, stages});
          for (int chunks : {2, 3}) orders.push_back({Schedule::kInterleaved, chunks, stages});
        }
        orders.push_back({Schedule::kGPipe, 1, 2});
        const std::vector<StageSolutions> shared =
            solve_stage_dp_orders(*split.evaluator, grid, orders, o.stage, SearchClock{});
        ASSERT_EQ(shared.size(), orders.size());
        for (size_t j = 0; j < orders.size(); ++j) {
          SearchGrid at = grid;
          at.schedules = {orders[j].schedule};
          at.virtual_stages = orders[j].chunks;
          const StageSolutions own = solve_stage_dp(*split.evaluator, at, {orders[j].stages}, o.stage, SearchClock{});
          const std::string where =
              "seed " + std::to_string(seed) + " m=" + std::to_string(m) + " S=" + std::to_string(orders[j].stages) +
              " " + std::string(schedule_name(orders[j].schedule)) + " v=" + std::to_string(orders[j].chunks);
          EXPECT_EQ(shared[j].solved, own.solved) << where;
          ASSERT_EQ(shared[j].solutions.size(), own.solutions.size()) << where;
          for (size_t i = 0; i < own.solutions.size(); ++i) {
            testing::expect_same_solution(shared[j].solutions[i], own.solutions[i], where);
            ++solutions;
          }
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 100);
  EXPECT_GT(solutions, 50);
}

// The re-solve cache of partition_with_baselines: a search's second choose_plan (another row of baselines.json) gets
// from it exactly what it would solve again, whether the first call saw all of its candidates or only some.
TEST(TheScheduleVariants, AreTheSameFromTheResolveCacheAsSolvedAgain) {
  size_t hits = 0, compared = 0;
  for (uint32_t seed = 80; seed < 84; ++seed) {
    const auto model = random_model(seed, 12, seed % 2 == 0);
    for (int64_t memory : {int64_t{1'000'000'000}, int64_t{1'500'000}}) {
      PartitionOptions o = options_for(8, 4, 24);
      o.cluster.device.memory_bytes = memory;
      o.stage.schedule.reset();
      o.stage.zero.reset();
      const AtomicGraph atomic = atomic_level(model.graph, model.costs, o);
      const BlockLevel blocks = block_level(atomic, o, search_grid(o));
      CandidateSet found =
          block_candidates(atomic, blocks.assignment, o, search_grid(o), SearchClock{}, CutRefinement::kOn);
      found.add(fixed_split_candidates(atomic, Method::kParams, o, search_grid(o), SearchClock{}));
      const std::vector<Candidate> solved = schedule_variants(atomic, found.candidates, o, SearchClock{});
      // First the params split's candidates alone (the params row), then all of them (apart's), as two rows would.
      std::vector<Candidate> params;
      for (const Candidate& c : found.candidates)
        if (c.source == "params") params.push_back(c);
      ScheduleResolveCache cache;
      const std::vector<Candidate> first = schedule_variants(atomic, params, o, SearchClock{}, &cache);
      EXPECT_EQ(first.size(), schedule_variants(atomic, params, o, SearchClock{}).size());
      const std::vector<Candidate> cached = schedule_variants(atomic, found.candidates, o, SearchClock{}, &cache);
      hits += cache.hits();
      ASSERT_EQ(cached.size(), solved.size()) << "seed " << seed;
      for (size_t i = 0; i < solved.size(); ++i) {
        const std::string where = "seed " + std::to_string(seed) + " " + solved[i].source;
        EXPECT_EQ(cached[i].source, solved[i].source) << where;
        EXPECT_EQ(cached[i].assignment->block_of, solved[i].assignment->block_of) << where;  // the same split
        testing::expect_same_solution(cached[i].solution, solved[i].solution, where);
        ++compared;
      }
    }
  }
  EXPECT_GT(hits, 0u);
  EXPECT_GT(compared, 20u);
}

TEST(TheScheduleVariants, AreNoneForAPinnedScheduleOrASingleStage) {
  const auto model = random_model(61, 8, true);
  PartitionOptions o = options_for(1, 1, 8);
  o.stage.schedule.reset();
  const AtomicGraph atomic = atomic_level(model.graph, model.costs, o);
  const BlockLevel blocks = block_level(atomic, o, search_grid(o));
  const CandidateSet found =
      block_candidates(atomic, blocks.assignment, o, search_grid(o), SearchClock{}, CutRefinement::kOn);
  ASSERT_FALSE(found.candidates.empty());
  EXPECT_TRUE(schedule_variants(atomic, found.candidates, o, SearchClock{}).empty());  // one device: one stage
  o.stage.schedule = Schedule::k1F1B;
  const Plan plan = choose_plan(model.graph, atomic, found, blocks, o, SearchClock{});
  EXPECT_EQ(plan.search.candidates_placed, static_cast<int>(found.candidates.size()));
}

}  // namespace
}  // namespace apart
