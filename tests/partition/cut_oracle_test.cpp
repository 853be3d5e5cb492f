// Task-granular cuts (stage_refine.h exact_stage_cuts) against brute force over every contiguous split of the
// components' topological order, and apart's plans for pinned pure pipelines against the brute-force compute-optimal
// split, replayed through the same simulator.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "compute_optimum.h"
#include "partition/partition.h"
#include "partition/stage_refine.h"
#include "random_models.h"
#include "test_cluster.h"

namespace apart {
namespace {

using namespace apart::testing;

// ---------------- Task-granular cuts against brute force ----------------

PartitionOptions small_request(int devices, int64_t batch, int64_t memory) {
  PartitionOptions o;
  o.cluster = testing::test_cluster(devices, 2, memory);
  o.training.global_batch = batch;
  return o;
}

TEST(TheTaskGranularCuts, FindTheLeastBottleneckOverEveryContiguousSplitOfTheTopologicalOrder) {
  int compared = 0, unfit = 0;
  for (uint32_t seed = 0; seed < 24; ++seed) {
    const auto model = random_model(700 + seed, 9 + static_cast<int>(seed % 6), seed % 3 == 0);
    const AtomicGraph atomic = build_atomic_graph(model.graph, model.costs, {});
    const PartitionOptions o = small_request(8, 16, 1'500'000 + 500'000 * (seed % 4));
    // Every component its own block, in index order: StageEvaluator prices any run exactly.
    std::vector<size_t> singles(atomic.size() + 1);
    std::iota(singles.begin(), singles.end(), size_t{0});
    const StageEvaluator ev(make_block_sequence(atomic, assignment_of_cuts(atomic.size(), singles)), o.cluster,
                            o.training);
    const ChainCompute chain(atomic);
    for (int stages : {2, 3, 4})
      for (int64_t m : {1, 4}) {
        StageSolution coarse;
        coarse.stages = stages;
        coarse.microbatches = m;
        coarse.schedule = Schedule::k1F1B;
        for (int s = 0; s < stages; ++s) coarse.replicas.push_back(1 + (s + static_cast<int>(seed)) % 2);
        // Brute force: least max h over every split whose stages fit memory; least max compute over every split.
        double best_h = std::numeric_limits<double>::infinity();
        std::vector<uint32_t> cuts{0};
        std::function<void(int)> place = [&](int s) {
          if (s == stages) {
            double worst = 0;
            for (int i = 0; i < stages; ++i) {
              const StageCost c = ev.evaluate(cuts[i], cuts[i + 1], coarse.replicas[i], m,
                                              stage_in_flight_microbatches(Schedule::k1F1B, i, stages, m),
                                              RecomputeScope::kNone);
              if (c.memory_bytes > o.cluster.usable_memory_bytes()) return;
              worst = std::max(worst, c.h);
            }
            best_h = std::min(best_h, worst);
            return;
          }
          const uint32_t last = static_cast<uint32_t>(atomic.size() - (stages - s - 1));
          for (uint32_t c = s + 1 == stages ? static_cast<uint32_t>(atomic.size()) : cuts.back() + 1; c <= last; ++c) {
            cuts.push_back(c);
            place(s + 1);
            cuts.pop_back();
          }
        };
        place(0);
        const ExactCuts exact = exact_stage_cuts(atomic, coarse, o.cluster, o.training);
        if (std::isinf(best_h)) {
          EXPECT_FALSE(exact.least_bottleneck.has_value()) << "seed " << seed << ": nothing fits, yet a split came back";
          ++unfit;
          continue;
        }
        ASSERT_TRUE(exact.least_bottleneck.has_value()) << "seed " << seed << " S=" << stages << " m=" << m;
        EXPECT_NEAR(exact.least_bottleneck->solution.bottleneck_h, best_h, 1e-12 * best_h)
            << "seed " << seed << " S=" << stages << " m=" << m;
        EXPECT_EQ(exact.least_bottleneck->kind, "task cuts");
        ++compared;
        // The compute-balanced split reaches the brute-force compute optimum (at one replica per stage the
        // micro-batch of every stage is the same, so the oracle's single u applies).
        if (exact.least_compute && std::all_of(coarse.replicas.begin(), coarse.replicas.end(), [](int r) { return r == 1; })) {
          const ComputeOptimum oracle = brute_force_compute_optimum(chain, stages, 16 / m);
          double worst = 0;
          for (const StageCost& c : exact.least_compute->solution.costs) worst = std::max(worst, c.compute_s);
          EXPECT_NEAR(worst, oracle.bottleneck, 1e-12 * oracle.bottleneck) << "seed " << seed;
        }
      }
  }
  EXPECT_GT(compared, 100);
  EXPECT_GT(unfit, 0) << "the memory limits never bit";
}

TEST(TheTaskGranularCuts, GiveUpOnTheLeastBottleneckPastThePairBudgetButStillBalanceCompute) {
  const auto model = random_model(77, 14, true);
  const AtomicGraph atomic = build_atomic_graph(model.graph, model.costs, {});
  const PartitionOptions o = small_request(4, 16, 1'000'000'000);
  StageSolution coarse;
  coarse.stages = 3;
  coarse.microbatches = 4;
  coarse.replicas = {1, 1, 1};
  const ExactCuts unlimited = exact_stage_cuts(atomic, coarse, o.cluster, o.training);
  const ExactCuts starved = exact_stage_cuts(atomic, coarse, o.cluster, o.training, 0);
  EXPECT_TRUE(unlimited.least_bottleneck.has_value());
  EXPECT_FALSE(starved.least_bottleneck.has_value());
  ASSERT_TRUE(starved.least_compute.has_value());
  EXPECT_EQ(starved.least_compute->solution.boundaries, (std::vector<uint32_t>{0, 1, 2, 3}));
}

TEST(ThePartitionPipeline, IsNeverSlowerInSimulationThanTheBruteForceComputeOptimalSplit) {
  int compared = 0;
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const auto model = random_model(800 + seed, 8 + static_cast<int>(seed % 7), seed % 2 == 0);
    const AtomicGraph atomic = build_atomic_graph(model.graph, model.costs, {});
    const ChainCompute chain(atomic);
    for (int stages : {2, 3, 4}) {
      if (static_cast<size_t>(stages) > atomic.size()) continue;
      PartitionOptions o = pinned_pipeline(small_request(stages, 16, 1'000'000'000), stages, 4);
      o.block.blocks = 3;  // coarse blocks: the cuts must come from the component level
      const ComputeOptimum oracle = brute_force_compute_optimum(chain, stages, 4);
      ASSERT_FALSE(oracle.cuts.empty()) << "seed " << seed << " S=" << stages;
      const auto replay = replay_split(atomic, oracle.cuts, o);
      ASSERT_TRUE(replay.has_value());
      const Plan plan = partition_graph(model.graph, model.costs, o);
      EXPECT_LE(plan.simulated.iteration_s, replay->simulated_s * (1 + 1e-9)) << "seed " << seed << " S=" << stages;
      // The exact DP the real models use agrees with brute force.
      EXPECT_NEAR(dp_compute_optimum(chain, stages, 4).bottleneck, oracle.bottleneck, 1e-12 * oracle.bottleneck);
      ++compared;
    }
  }
  EXPECT_GT(compared, 50);
}

}  // namespace
}  // namespace apart
