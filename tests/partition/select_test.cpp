// Placement on nodes, the links it implies, the overlapped all-reduce, and the final choice by simulation
// against simulating every candidate.
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "partition/placement.h"
#include "partition/select.h"
#include "random_models.h"
#include "test_cluster.h"

namespace apart {
namespace {

Cluster cluster(int devices, int per_node) { return testing::test_cluster(devices, per_node); }

std::vector<int> range(int first, int count, int step = 1) {
  std::vector<int> r;
  for (int i = 0; i < count; ++i) r.push_back(first + i * step);
  return r;
}

TEST(APlacement, KeepsEveryStageThatFitsANodeInsideOneWhenTheDevicesAllow) {
  const std::vector<int> replicas{6, 4, 6};
  const Placement p = place_stages(replicas, cluster(24, 8), Layout::kStageMajor);
  EXPECT_EQ(p.layout, Layout::kStageMajor);
  EXPECT_EQ(p.devices[0], range(0, 6));
  EXPECT_EQ(p.devices[1], range(8, 4));
  EXPECT_EQ(p.devices[2], range(16, 6));
  for (const StageLinks& l : placed_links(p, cluster(24, 8))) EXPECT_EQ(l.replicas.bandwidth, 300e9);
}

TEST(APlacement, LetsAStageStraddleNodesOnlyWhenSkippingWouldRunOutOfDevices) {
  const std::vector<int> replicas{6, 4, 6};
  const Placement p = place_stages(replicas, cluster(16, 8), Layout::kStageMajor);
  EXPECT_EQ(p.devices[0], range(0, 6));
  EXPECT_EQ(p.devices[1], range(6, 4));  // 6..9 crosses into node 1: no room to skip
  EXPECT_EQ(p.devices[2], range(10, 6));
  const std::vector<StageLinks> links = placed_links(p, cluster(16, 8));
  EXPECT_EQ(links[0].replicas.bandwidth, 300e9);
  EXPECT_EQ(links[1].replicas.bandwidth, 25e9) << "its ring crosses nodes";
}

TEST(APlacement, StartsAStageLargerThanANodeOnANodeBoundary) {
  const std::vector<int> replicas{2, 16};
  const Placement p = place_stages(replicas, cluster(24, 8), Layout::kStageMajor);
  EXPECT_EQ(p.devices[1], range(8, 16));
}

TEST(APlacement, PutsWholePipelinesInsideANodeWhenPipelineMajor) {
  const std::vector<int> replicas{4, 4, 4, 4};
  const Placement p = place_stages(replicas, cluster(16, 8), Layout::kPipelineMajor);
  EXPECT_EQ(p.layout, Layout::kPipelineMajor);
  EXPECT_EQ(p.devices[0], (std::vector<int>{0, 4, 8, 12}));
  EXPECT_EQ(p.devices[3], (std::vector<int>{3, 7, 11, 15}));
  const std::vector<StageLinks> links = placed_links(p, cluster(16, 8));
  for (const StageLinks& l : links) {
    EXPECT_EQ(l.previous.bandwidth, 300e9);
    EXPECT_EQ(l.next.bandwidth, 300e9);
    EXPECT_EQ(l.replicas.bandwidth, 25e9);
  }
  // Three stages do not divide a node of 8: two pipelines per node, the rest of the node left free.
  const std::vector<int> three{4, 4, 4};
  const Placement q = place_stages(three, cluster(16, 8), Layout::kPipelineMajor);
  EXPECT_EQ(q.devices[0], (std::vector<int>{0, 3, 8, 11}));
  for (const StageLinks& l : placed_links(q, cluster(16, 8))) EXPECT_EQ(l.next.bandwidth, 300e9);
}

TEST(APlacement, FallsBackToStageMajorForUnequalReplicaCounts) {
  const std::vector<int> replicas{4, 2};
  EXPECT_EQ(place_stages(replicas, cluster(16, 8), Layout::kPipelineMajor).layout, Layout::kStageMajor);
}

TEST(TheOverlappedAllReduce, ExposesOnlyWhatDoesNotFitBehindTheLastBackwardAndAtLeastTheLastBucket) {
  BlockSequence seq;
  BlockCost c;
  c.forward = {0, 1e-3};
  c.backward = {0, 2e-3};
  c.param_bytes = 1'000'000'000;  // 1 GB of fp32 gradients: 40 buckets of 25 MB
  seq.blocks.push_back(c);
  TrainingSpec t;
  t.global_batch = 64;
  for (int samples : {1, 64}) {
    t.global_batch = 4 * samples;
    t.overlap_allreduce = false;
    const StageCost serial = StageEvaluator(seq, cluster(4, 8), t).evaluate(0, 1, 4, 1, 1, RecomputeScope::kNone);
    t.overlap_allreduce = true;
    const StageCost overlapped = StageEvaluator(seq, cluster(4, 8), t).evaluate(0, 1, 4, 1, 1, RecomputeScope::kNone);
    EXPECT_EQ(serial.allreduce_exposed_s, serial.allreduce_s);
    EXPECT_EQ(overlapped.allreduce_s, serial.allreduce_s);
    const double last_bucket = serial.allreduce_s * 25e6 / 1e9;
    EXPECT_DOUBLE_EQ(overlapped.allreduce_exposed_s,
                     std::max(last_bucket, serial.allreduce_s - overlapped.backward_s));
    EXPECT_LT(overlapped.h, serial.h);
  }
}

// Every candidate the DP gives for a random block sequence, both layouts, several m, S and recomputation.
std::vector<Candidate> random_candidates(uint32_t seed) {
  std::mt19937 rng(seed);
  auto seq = std::make_shared<const BlockSequence>(testing::random_sequence(rng, 7));
  auto assignment = std::make_shared<BlockAssignment>();
  assignment->blocks = 7;
  for (uint32_t b = 0; b < 7; ++b) assignment->block_of.push_back(BlockId(b));
  const Cluster c = testing::test_cluster(12, 4, 40'000'000'000);
  TrainingSpec t;
  t.global_batch = 24;
  t.overlap_allreduce = seed % 2 == 0;
  std::vector<Candidate> out;
  for (Layout layout : {Layout::kStageMajor, Layout::kPipelineMajor}) {
    auto ev = std::make_shared<const StageEvaluator>(*seq, c, t, layout);
    for (int64_t m : {1, 2, 4, 8})
      for (bool recompute : {false, true}) {
        const std::optional<int> pinned = layout == Layout::kPipelineMajor ? std::optional<int>(2) : std::nullopt;
        const StageDp dp(*ev, {.microbatches = m,
                          .recompute = recompute ? StageRecompute::kAll : StageRecompute::kOff,
                          .pinned_replicas = pinned});
        for (int s = 1; s <= 4; ++s)
          if (auto sol = dp.solve(s)) {
            if (!pinned) dp.spend_leftover_devices(*sol);
            out.push_back(place_candidate(std::move(*sol), seq, assignment, ev, "test"));
          }
      }
  }
  return out;
}

TEST(ASelection, PicksTheLeastSimulatedTimeExactlyAsSimulatingEveryCandidateDoes) {
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(seed);
    const std::vector<Candidate> candidates = random_candidates(seed);
    ASSERT_FALSE(candidates.empty());
    double best = std::numeric_limits<double>::infinity();
    for (const Candidate& c : candidates) best = std::min(best, sim::simulate(candidate_sim_plan(c)).iteration_s);
    const Selection s = select_by_simulation(candidates);
    EXPECT_NEAR(s.result.iteration_s, best, best * 1e-12);
    EXPECT_EQ(s.result.iteration_s, sim::simulate(candidate_sim_plan(candidates[s.index])).iteration_s);
    EXPECT_EQ(s.stats.simulated + s.stats.pruned, static_cast<int>(candidates.size()));
    EXPECT_EQ(s.stats.not_simulated, 0);
    EXPECT_GT(s.stats.pruned, 0) << "the bound rules some candidates out";
  }
}

TEST(ASimulatedLowerBound, NeverExceedsTheSimulatedTime) {
  for (uint32_t seed = 20; seed < 30; ++seed)
    for (const Candidate& c : random_candidates(seed)) {
      const double simulated = sim::simulate(candidate_sim_plan(c)).iteration_s;
      EXPECT_LE(simulated_lower_bound(c), simulated * (1 + 1e-12));
      EXPECT_LE(simulated, c.solution.estimate.iteration_s * (1 + 1e-12)) << "the estimate serialises transfers";
    }
}

// The same candidates re-scheduled: ZB-H1, and interleaved at 2 and 3 chunks where S divides m.
std::vector<Candidate> rescheduled(const std::vector<Candidate>& candidates) {
  std::vector<Candidate> out;
  for (const Candidate& c : candidates) {
    if (c.solution.stages < 2) continue;
    Candidate zb = c;
    zb.solution.schedule = Schedule::kZbH1;
    out.push_back(std::move(zb));
    if (c.solution.microbatches % c.solution.stages != 0) continue;
    for (int chunks : {2, 3}) {
      Candidate il = c;
      il.solution.schedule = Schedule::kInterleaved;
      il.solution.virtual_stages = chunks;
      out.push_back(std::move(il));
    }
  }
  return out;
}

TEST(ASimulatedLowerBound, NeverExceedsTheSimulatedTimeUnderZbH1AndInterleaved) {
  int interleaved = 0, tight = 0;
  for (uint32_t seed = 20; seed < 30; ++seed)
    for (const Candidate& c : rescheduled(random_candidates(seed))) {
      const double simulated = sim::simulate(candidate_sim_plan(c)).iteration_s;
      const double bound = simulated_lower_bound(c);
      EXPECT_LE(bound, simulated * (1 + 1e-12)) << schedule_name(c.solution.schedule) << " v=" << c.solution.virtual_stages;
      if (c.solution.schedule != Schedule::kInterleaved) continue;
      ++interleaved;
      tight += bound > 0.9 * simulated;
    }
  EXPECT_GT(interleaved, 20);
  EXPECT_GT(tight, interleaved / 2) << "the interleaved chain bound is mostly within 10 % of the replay";
}

TEST(ASelection, IsDeterministicAndRespectsItsCap) {
  const std::vector<Candidate> candidates = random_candidates(7);
  const Selection a = select_by_simulation(candidates), b = select_by_simulation(candidates);
  EXPECT_EQ(a.index, b.index);
  EXPECT_EQ(a.result.iteration_s, b.result.iteration_s);
  const Selection capped = select_by_simulation(candidates, 1);
  EXPECT_EQ(capped.stats.simulated, 1);
  EXPECT_GE(capped.result.iteration_s, a.result.iteration_s);
  EXPECT_EQ(capped.stats.simulated + capped.stats.pruned + capped.stats.not_simulated,
            static_cast<int>(candidates.size()));
}

TEST(ACandidateSimPlan, SendsEachBoundaryOnceToEveryLaterStageThatReadsIt) {
  const std::vector<Candidate> candidates = random_candidates(3);
  for (const Candidate& c : candidates) {
    const sim::SimPlan plan = candidate_sim_plan(c);
    ASSERT_EQ(plan.stages.size(), static_cast<size_t>(c.solution.stages));
    for (const sim::SimStage& st : plan.stages) {
      double in = 0;
      for (const sim::SimInput& i : st.inputs) {
        EXPECT_LT(i.from_stage, st.id);
        in += i.bytes;
      }
      EXPECT_NEAR(in, c.solution.costs[st.id].in_bytes, 1e-6 * (1 + in));
      EXPECT_EQ(st.devices, c.placement().devices[st.id]);
    }
  }
}

}  // namespace
}  // namespace apart
