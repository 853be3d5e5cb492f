// The phases of the partition search (partition/phases.h), each on its own plain data.
#include <gtest/gtest.h>

#include <set>

#include "graph/error.h"
#include "partition/baselines.h"
#include "partition/phases.h"
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
  EXPECT_EQ(search_grid(o).recomputes, (std::vector<StageRecompute>{StageRecompute::kOff, StageRecompute::kWhereNeeded}));
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

}  // namespace
}  // namespace apart
