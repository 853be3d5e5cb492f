// The baselines (gpipe-balance, pipedream, metis) against hand-computed splits and brute force, apart against
// all of them, and baselines.json.
#include <gtest/gtest.h>
#include <metis.h>

#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

#include "graph/error.h"
#include "partition/baselines.h"
#include "partition/methods.h"
#include "partition/partition.h"
#include "random_models.h"
#include "test_cluster.h"

namespace apart {
namespace {

using testing::random_model;

PartitionOptions small_options(int devices, int64_t batch, int64_t memory) {
  PartitionOptions o;
  o.cluster = testing::test_cluster(devices, 2, memory);
  o.training.global_batch = batch;
  return o;
}

// ---------------- gpipe-balance ----------------

TEST(TheGpipeBalanceSplit, MatchesTorchgpipeOnAChainWithKnownTimes) {
  // torchgpipe.balance.blockpartition.solve([1, 2, 3, 4, 5, 6], 2) → [[1, 2, 3, 4], [5, 6]]:
  // normalised 0, .2, .4, .6, .8, 1; start [1,2,3 | 4,5,6] = 0.6 | 2.4; moving the 4 gives 1.2 | 1.8: done.
  EXPECT_EQ(block_partition({1, 2, 3, 4, 5, 6}, 2), (std::vector<size_t>{4, 2}));
  // Equal costs: equal counts, the remainder in the last block (torchgpipe's initial split is already balanced).
  EXPECT_EQ(block_partition({5, 5, 5, 5, 5, 5, 5}, 3), (std::vector<size_t>{2, 2, 3}));
  // Blocks within one normalised (= heaviest) element of each other count as balanced: normalised
  // 0,0,0 | 0,1,0 stops at once, as torchgpipe does, though [1,1,1,1 | 10,1] would be better balanced.
  EXPECT_EQ(block_partition({1, 1, 1, 1, 10, 1}, 2), (std::vector<size_t>{3, 3}));
  EXPECT_EQ(block_partition({3, 1, 4, 1, 5}, 1), (std::vector<size_t>{5}));
  EXPECT_EQ(block_partition({3, 1, 4}, 3), (std::vector<size_t>{1, 1, 1}));
}

TEST(TheGpipeBalanceSplit, StopsWhenBlocksDifferByAtMostOneNormalisedElement) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 40);
    const int parts = 1 + static_cast<int>(rng() % n);
    std::vector<double> costs(n);
    for (double& c : costs) c = std::uniform_real_distribution<double>(0.1, 5.0)(rng);
    const std::vector<size_t> sizes = block_partition(costs, parts);
    ASSERT_EQ(sizes.size(), static_cast<size_t>(parts));
    EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), size_t{0}), static_cast<size_t>(n));
    for (size_t s : sizes) EXPECT_GE(s, 1u);
  }
}

TEST(TheGpipeBalanceSplit, RunsThroughPartitionWithTheSameCostModel) {
  const auto model = random_model(11, 12, true);
  PartitionOptions o = small_options(4, 16, 1'000'000'000);
  o.method = Method::kGpipeBalance;
  const Plan plan = partition_by_method(model.graph, model.costs, o);
  EXPECT_GT(plan.estimate.iteration_s, 0);
  EXPECT_EQ(plan.options.method, Method::kGpipeBalance);
}

// ---------------- pipedream ----------------

// Least bottleneck over every contiguous split × replica vector using ≤ units workers, with the same costs.
double pipedream_brute_force(const PipeDreamCosts& c) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<size_t> bounds{0};
  std::function<void(size_t, int, double)> go = [&](size_t i, int left, double worst) {
    for (size_t j = i + 1; j <= c.layers; ++j)
      for (int r = 1; r <= left; ++r) {
        if (!c.fits(i, j, r)) continue;
        double w = std::max(worst, c.stage_s(i, j, r));
        if (i > 0) w = std::max(w, c.comm_s(i));
        if (j == c.layers) best = std::min(best, w);
        else go(j, left - r, w);
      }
  };
  go(0, c.units, 0);
  return best;
}

TEST(ThePipeDreamDp, MatchesBruteForceOverContiguousSplitsAndReplicas) {
  std::mt19937 rng(3);
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  int compared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = 1 + rng() % 8;
    const int units = 1 + static_cast<int>(rng() % 4);
    std::vector<double> t(n), w(n), cut(n + 1);
    for (size_t l = 0; l < n; ++l) {
      t[l] = uniform(1, 10);
      w[l] = uniform(0, 4);
    }
    for (double& x : cut) x = uniform(0, 6);
    const double memory = uniform(5, 30);
    PipeDreamCosts c;
    c.layers = n;
    c.units = units;
    c.stage_s = [&](size_t i, size_t j, int r) {
      double time = 0, weights = 0;
      for (size_t l = i; l < j; ++l) {
        time += t[l];
        weights += w[l];
      }
      return std::max(time, 4.0 * (r - 1) * weights / r) / r;
    };
    c.comm_s = [&](size_t i) { return 2 * cut[i]; };
    c.fits = [&](size_t i, size_t j, int) {
      double weights = 0;
      for (size_t l = i; l < j; ++l) weights += 3 * w[l];
      return weights <= memory;
    };
    const double expected = pipedream_brute_force(c);
    const PipeDreamSplit split = pipedream_dp(c);
    if (std::isinf(expected)) {
      EXPECT_TRUE(split.replicas.empty()) << "trial " << trial;
      continue;
    }
    ASSERT_FALSE(split.replicas.empty()) << "trial " << trial;
    EXPECT_NEAR(split.bottleneck_s, expected, 1e-12 * expected) << "trial " << trial;
    // The returned split really has that bottleneck and uses ≤ units workers.
    ASSERT_EQ(split.boundaries.size(), split.replicas.size() + 1);
    EXPECT_EQ(split.boundaries.front(), 0u);
    EXPECT_EQ(split.boundaries.back(), n);
    double worst = 0;
    for (size_t s = 0; s < split.replicas.size(); ++s) {
      EXPECT_TRUE(c.fits(split.boundaries[s], split.boundaries[s + 1], split.replicas[s]));
      worst = std::max(worst, c.stage_s(split.boundaries[s], split.boundaries[s + 1], split.replicas[s]));
      if (s > 0) worst = std::max(worst, c.comm_s(split.boundaries[s]));
    }
    EXPECT_NEAR(worst, expected, 1e-12 * expected);
    EXPECT_LE(std::accumulate(split.replicas.begin(), split.replicas.end(), 0), units);
    ++compared;
  }
  EXPECT_GT(compared, 150);
}

TEST(ThePipeDreamDp, ReplicatesOneStageWhenCommunicationIsExpensive) {
  PipeDreamCosts c;
  c.layers = 4;
  c.units = 4;
  c.stage_s = [](size_t i, size_t j, int r) { return static_cast<double>(j - i) / r; };
  c.comm_s = [](size_t) { return 100.0; };
  c.fits = [](size_t, size_t, int) { return true; };
  const PipeDreamSplit split = pipedream_dp(c);
  EXPECT_EQ(split.boundaries, (std::vector<size_t>{0, 4}));
  EXPECT_EQ(split.replicas, (std::vector<int>{4}));
  EXPECT_DOUBLE_EQ(split.bottleneck_s, 1.0);
}

TEST(ThePipeDreamMethod, PlansRandomGraphsWithinTheDevices) {
  for (uint32_t seed = 50; seed < 56; ++seed) {
    const auto model = random_model(seed, 12, seed % 2 == 0);
    PartitionOptions o = small_options(4, 16, 1'000'000'000);
    o.method = Method::kPipeDream;
    const Plan plan = partition_by_method(model.graph, model.costs, o);
    int devices = 0;
    for (const PlanStage& s : plan.stages) devices += s.replicas;
    EXPECT_LE(devices, 4) << "seed " << seed;
    EXPECT_GT(plan.estimate.iteration_s, 0);
  }
}

// ---------------- metis ----------------

TEST(TheCycleRepair, MovesANodeAfterItsLatePredecessor) {
  // 0 → 1 → 2 → 3, METIS put {0, 2} in part 0 and {1, 3} in part 1: means 1 and 2, so part 0 ranks first;
  // node 1 stays in part 1 (rank 1), node 2 must follow its predecessor 1 into rank 1, node 3 too.
  const BlockAssignment a = repair_part_order(4, {{0, 1}, {1, 2}, {2, 3}}, {0, 1, 0, 1});
  EXPECT_EQ(a.blocks, 2u);
  EXPECT_EQ(a.block_of, (std::vector<BlockId>{BlockId(0), BlockId(1), BlockId(1), BlockId(1)}));
}

TEST(TheCycleRepair, LeavesEveryEdgeForwardAndEveryNodeInOnePartOnRandomDags) {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t n = 1 + rng() % 30;
    std::vector<std::pair<uint32_t, uint32_t>> edges;
    for (uint32_t v = 1; v < n; ++v)
      for (int e = 0; e < 3; ++e)
        if (rng() % 2) edges.emplace_back(rng() % v, v);
    const uint32_t parts = 1 + rng() % 6;
    std::vector<uint32_t> part(n);
    for (uint32_t& p : part) p = rng() % parts;
    const BlockAssignment a = repair_part_order(n, edges, part);
    ASSERT_EQ(a.block_of.size(), n);
    std::vector<int> used(a.blocks, 0);
    for (BlockId b : a.block_of) {
      ASSERT_LT(b.value(), a.blocks);
      used[b.value()] = 1;
    }
    for (int u : used) EXPECT_EQ(u, 1) << "empty part " << trial;
    for (const auto& [from, to] : edges) EXPECT_LE(a.block_of[from], a.block_of[to]) << "trial " << trial;
  }
}

TEST(TheMetisBlocks, AreAcyclicOnRandomDagsAndCoverEveryComponentOnce) {
  for (uint32_t seed = 60; seed < 80; ++seed) {
    const auto model = random_model(seed, 30, false);
    const AtomicGraph atomic = build_atomic_graph(model.graph, model.costs, {});
    for (int k : {1, 2, 3, 5, 8}) {
      const BlockAssignment a = metis_blocks(atomic, k, 1.0);
      ASSERT_EQ(a.block_of.size(), atomic.size());
      EXPECT_GE(a.blocks, 1u);
      EXPECT_LE(a.blocks, static_cast<uint32_t>(k));
      for (BlockId b : a.block_of) EXPECT_LT(b.value(), a.blocks);
      for (const Transfer& t : atomic.transfers)
        for (uint32_t c : t.consumers) EXPECT_LE(a.block_of[t.producer], a.block_of[c]) << "seed " << seed;
      EXPECT_NO_THROW(make_block_sequence(atomic, a));
    }
  }
}

// A chain of six components, the first holding all the work: METIS's recursive bisection runs out of
// vertices for four parts and printf()s "***Cannot bisect a graph with 0 vertices!" to stdout.
AtomicGraph one_heavy_component_chain() {
  AtomicGraph atomic;
  for (int c = 0; c < 6; ++c) {
    AtomicComponent component;
    component.cost.forward.per_sample_s = c == 0 ? 1.0 : 1e-9;
    atomic.components.push_back(component);
    if (c > 0) atomic.transfers.push_back(Transfer{static_cast<uint32_t>(c - 1), {static_cast<uint32_t>(c)}, 64});
  }
  return atomic;
}

TEST(TheMetisBlocks, KeepWhatMetisPrintsOffStdout) {
  // The same weights metis_blocks passes (times scaled to sum to 10⁷, equal edges at 10⁶), straight to
  // METIS: it does print, so the input reproduces the message.
  std::vector<idx_t> xadj{0}, adjncy, adjwgt, vwgt{10'000'000, 1, 1, 1, 1, 1};
  for (idx_t v = 0; v < 6; ++v) {
    for (idx_t u : {v - 1, v + 1})
      if (u >= 0 && u < 6) adjncy.push_back(u), adjwgt.push_back(1'000'000);
    xadj.push_back(static_cast<idx_t>(adjncy.size()));
  }
  idx_t options[METIS_NOPTIONS];
  METIS_SetDefaultOptions(options);
  options[METIS_OPTION_SEED] = 1;
  idx_t nvtxs = 6, ncon = 1, nparts = 4, objval = 0;
  std::vector<idx_t> part(6);
  ::testing::internal::CaptureStdout();
  METIS_PartGraphKway(&nvtxs, &ncon, xadj.data(), adjncy.data(), vwgt.data(), nullptr, adjwgt.data(), &nparts, nullptr,
                      nullptr, options, &objval, part.data());
  ASSERT_NE(::testing::internal::GetCapturedStdout().find("***"), std::string::npos) << "METIS no longer prints here";

  const AtomicGraph atomic = one_heavy_component_chain();
  ::testing::internal::CaptureStdout();
  const BlockAssignment a = metis_blocks(atomic, 4, 1.0);
  std::printf("after\n");  // stdout works again afterwards
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "after\n");
  ASSERT_EQ(a.block_of.size(), atomic.size());
  EXPECT_LE(a.blocks, 4u);
  EXPECT_NO_THROW(make_block_sequence(atomic, a));
}

TEST(TheMetisMethod, GivesTheSamePlanTwice) {
  const auto model = random_model(81, 20, false);
  PartitionOptions o = small_options(4, 16, 1'000'000'000);
  o.method = Method::kMetis;
  o.block.blocks = 5;
  const Plan a = partition_by_method(model.graph, model.costs, o);
  const Plan b = partition_by_method(model.graph, model.costs, o);
  ASSERT_EQ(a.stages.size(), b.stages.size());
  for (size_t s = 0; s < a.stages.size(); ++s) EXPECT_EQ(a.stages[s].tasks, b.stages[s].tasks);
  EXPECT_EQ(a.estimate.iteration_s, b.estimate.iteration_s);
}

// ---------------- apart against all of them ----------------

TEST(TheComparison, NeverShowsApartWorseThanAnyBaselineOnRandomSmallGraphs) {
  for (uint32_t seed = 90; seed < 102; ++seed) {
    const auto model = random_model(seed, 10 + static_cast<int>(seed % 5), seed % 2 == 0);
    PartitionOptions o = small_options(2 + static_cast<int>(seed % 3), 16, 1'000'000'000);
    const std::vector<MethodResult> results = compare_methods(model.graph, model.costs, o);
    ASSERT_EQ(results.size(), kAllMethods.size());
    ASSERT_EQ(results[0].method, Method::kApart);
    ASSERT_TRUE(results[0].feasible);
    for (const MethodResult& r : results)
      if (r.feasible)
        EXPECT_LE(results[0].iteration_s, r.iteration_s * (1 + 1e-9))
            << "seed " << seed << " vs " << method_name(r.method);
  }
}

TEST(TheComparison, MarksAMethodThatCannotFitInfeasibleWithAReason) {
  const auto model = random_model(5, 8, true);
  PartitionOptions o = small_options(2, 4, 10);  // 10 bytes of memory: nothing fits
  const std::vector<MethodResult> results = compare_methods(model.graph, model.costs, o);
  for (const MethodResult& r : results) {
    EXPECT_FALSE(r.feasible);
    EXPECT_FALSE(r.reason.empty());
  }
}

TEST(TheBaselinesJson, ListsEveryMethodAndParsesBack) {
  const auto model = random_model(7, 10, false);
  PartitionOptions o = small_options(4, 16, 1'000'000'000);
  std::vector<MethodResult> results = compare_methods(model.graph, model.costs, o);
  results[4].feasible = false;
  results[4].reason = "does not fit";
  const auto j = nlohmann::json::parse(baselines_json(results, 16, 4));
  EXPECT_EQ(j["schema"], "apart.baselines/1");
  ASSERT_EQ(j["methods"].size(), 6u);
  const std::vector<std::string> names{"apart", "uniform", "params", "gpipe-balance", "pipedream", "metis"};
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& m = j["methods"][i];
    EXPECT_EQ(m["method"], names[i]);
    ASSERT_TRUE(m.contains("planning_s"));
    if (i == 4) {
      EXPECT_FALSE(m["feasible"].get<bool>());
      EXPECT_EQ(m["reason"], "does not fit");
      continue;
    }
    EXPECT_TRUE(m["feasible"].get<bool>());
    EXPECT_NEAR(m["iteration_s"].get<double>(), results[i].iteration_s, 1e-15);
    EXPECT_GT(m["samples_per_s"].get<double>(), 0);
    EXPECT_GE(m["peak_memory_bytes"].get<int64_t>(), 0);
    EXPECT_GE(m["stages"].get<int>(), 1);
  }
}

TEST(TheMethodParser, AcceptsEveryBaselineAndNamesThemAll) {
  for (Method m : kAllMethods) EXPECT_EQ(parse_method(method_name(m)), m);
  try {
    parse_method("random");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("gpipe-balance"), std::string::npos);
  }
}

}  // namespace
}  // namespace apart
