// The --method dispatch above the phases (partition/methods.h): every method's plan on small models is the one the
// search gave before partition_graph became a script of phases, on any thread count, apart goes through
// partition_graph, and baselines.json's rows are the same in one search with apart's.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "graph/error.h"
#include "partition/methods.h"
#include "plan_fingerprint.h"
#include "random_models.h"

namespace apart {
namespace {

// What partition_graph (which then dispatched on the method itself) gave at commit 11318e9 for
// method_cases() × kAllMethods, one line each, by plan_fingerprint. Issue 15 (task-granular cuts, every baseline's
// candidates in apart's search) changed apart's lines in their candidate counts and chosen split only: every
// iteration time is the same. Issue 13's optimizer step (docs/cost-model.md §4) then raised every iteration and
// estimate by 0.001–0.006 % (these models' few params) and changed no split. The default optimizer became AdamW
// (as apart train's; the same state), which renamed it in the infeasibility lines and changed no plan.
constexpr const char* kPlansBeforeThePhaseScript = R"plans(apart m=1 1f1b stages 9x4@0[1,1] blocks=9 solved=226 placed=226 simulated=2 pruned=224 iteration=0.19316510839 estimate=0.19316510839 peak=2851420
uniform m=1 1f1b stages 9x4@0[1,1] blocks=0 solved=40 placed=40 simulated=2 pruned=38 iteration=0.19316510839 estimate=0.19316510839 peak=2851420
params m=1 1f1b stages 9x4@0[1,1] blocks=0 solved=40 placed=40 simulated=2 pruned=38 iteration=0.19316510839 estimate=0.19316510839 peak=2851420
gpipe-balance m=1 1f1b stages 9x4@0[1,1] blocks=0 solved=40 placed=40 simulated=2 pruned=38 iteration=0.19316510839 estimate=0.19316510839 peak=2851420
pipedream m=1 1f1b stages 9x4@0[1,1] blocks=0 solved=6 placed=6 simulated=2 pruned=4 iteration=0.19316510839 estimate=0.19316510839 peak=2851420
metis m=1 1f1b stages 9x4@0[1,1] blocks=4 solved=50 placed=50 simulated=2 pruned=48 iteration=0.19316510839 estimate=0.19316510839 peak=2851420
apart m=1 1f1b stages 14x8@0[1,1] blocks=14 solved=522 placed=522 simulated=2 pruned=520 iteration=0.279504803351 estimate=0.279504803351 peak=3429736
uniform m=1 1f1b stages 14x8@0[1,1] blocks=0 solved=96 placed=96 simulated=2 pruned=94 iteration=0.279504803351 estimate=0.279504803351 peak=3429736
params m=1 1f1b stages 14x8@0[1,1] blocks=0 solved=96 placed=96 simulated=2 pruned=94 iteration=0.279504803351 estimate=0.279504803351 peak=3429736
gpipe-balance m=1 1f1b stages 14x8@0[1,1] blocks=0 solved=96 placed=96 simulated=2 pruned=94 iteration=0.279504803351 estimate=0.279504803351 peak=3429736
pipedream m=1 1f1b stages 14x8@0[1,1] blocks=0 solved=6 placed=6 simulated=2 pruned=4 iteration=0.279504803351 estimate=0.279504803351 peak=3429736
metis m=1 1f1b stages 14x8@0[1,1] blocks=5 solved=96 placed=96 simulated=2 pruned=94 iteration=0.279504803351 estimate=0.279504803351 peak=3429736
apart m=2 1f1b stages 6x4@0[1,1] 3x2@4[1,1] blocks=9 solved=236 placed=198 simulated=2 pruned=196 iteration=0.078748762713 estimate=0.0858492128836 peak=2362287
uniform m=4 1f1b stages 3x2@0[1,1] 3x2@2[1,1] 3x2@4[1,1] blocks=0 solved=48 placed=40 simulated=2 pruned=38 iteration=0.0857840526703 estimate=0.0930100914372 peak=1677138
params m=4 1f1b stages 3x2@0[1,1] 4x2@2[1,1] 2x2@4[1,1] blocks=0 solved=48 placed=40 simulated=2 pruned=38 iteration=0.0876302290996 estimate=0.0933817655985 peak=1677138
gpipe-balance m=4 1f1b stages 3x2@0[1,1] 3x2@2[1,1] 3x2@4[1,1] blocks=0 solved=48 placed=40 simulated=2 pruned=38 iteration=0.0857840526703 estimate=0.0930100914372 peak=1677138
pipedream m=2 1f1b stages 4x3@0[1,1] 5x3@3[1,1] blocks=0 solved=4 placed=4 simulated=2 pruned=2 iteration=0.127670854652 estimate=0.129618613386 peak=2360618
metis m=2 1f1b stages 6x4@0[1,1] 3x2@4[1,1] blocks=3 solved=32 placed=24 simulated=2 pruned=22 iteration=0.078748762713 estimate=0.0858492128836 peak=2362287
metis m=1 1f1b recompute stages 15x3@0r[1,1] blocks=13 solved=78 placed=80 simulated=2 pruned=78 iteration=0.622142416619 estimate=0.622142416619 peak=3279554
uniform m=1 1f1b recompute stages 15x3@0r[1,1] blocks=0 solved=15 placed=15 simulated=2 pruned=13 iteration=0.622142416619 estimate=0.622142416619 peak=3279554
params m=1 1f1b recompute stages 15x3@0r[1,1] blocks=0 solved=15 placed=15 simulated=2 pruned=13 iteration=0.622142416619 estimate=0.622142416619 peak=3279554
gpipe-balance m=1 1f1b recompute stages 15x3@0r[1,1] blocks=0 solved=15 placed=15 simulated=2 pruned=13 iteration=0.622142416619 estimate=0.622142416619 peak=3279554
pipedream m=1 1f1b recompute stages 15x3@0r[1,1] blocks=0 solved=3 placed=3 simulated=2 pruned=1 iteration=0.622142416619 estimate=0.622142416619 peak=3279554
metis m=1 1f1b recompute stages 15x3@0r[1,1] blocks=4 solved=15 placed=15 simulated=2 pruned=13 iteration=0.622142416619 estimate=0.622142416619 peak=3279554
apart m=1 1f1b stages 7x16@0[1,0] blocks=4 solved=342 placed=342 simulated=2 pruned=340 iteration=0.0981999268726 estimate=0.0981999268726 peak=2387904
uniform m=1 1f1b stages 7x16@0[1,0] blocks=0 solved=56 placed=56 simulated=2 pruned=54 iteration=0.0981999268726 estimate=0.0981999268726 peak=2387904
params m=1 1f1b stages 7x16@0[1,0] blocks=0 solved=56 placed=56 simulated=2 pruned=54 iteration=0.0981999268726 estimate=0.0981999268726 peak=2387904
gpipe-balance m=1 1f1b stages 7x16@0[1,0] blocks=0 solved=56 placed=56 simulated=2 pruned=54 iteration=0.0981999268726 estimate=0.0981999268726 peak=2387904
pipedream m=1 1f1b stages 7x16@0[1,0] blocks=0 solved=6 placed=6 simulated=2 pruned=4 iteration=0.0981999268726 estimate=0.0981999268726 peak=2387904
metis m=1 1f1b stages 7x16@0[1,0] blocks=3 solved=70 placed=70 simulated=2 pruned=68 iteration=0.0981999268726 estimate=0.0981999268726 peak=2387904
apart task cuts m=4 1f1b stages 6x4@0[1,1] 5x4@4[1,1] blocks=11 solved=14 placed=16 simulated=10 pruned=6 iteration=0.167615941991 estimate=0.168220332501 peak=2257272
uniform m=4 1f1b stages 6x4@0[1,1] 5x4@4[1,1] blocks=0 solved=2 placed=2 simulated=2 pruned=0 iteration=0.167615941991 estimate=0.168220332501 peak=2257272
params m=4 1f1b stages 7x4@0[1,1] 4x4@4[1,1] blocks=0 solved=2 placed=2 simulated=2 pruned=0 iteration=0.174022218336 estimate=0.187436575696 peak=2303454
gpipe-balance m=4 1f1b stages 6x4@0[1,1] 5x4@4[1,1] blocks=0 solved=2 placed=2 simulated=2 pruned=0 iteration=0.167615941991 estimate=0.168220332501 peak=2257272
infeasible: no split of the model fits 8 devices of 1 GB at global batch 16 with these pins; it needs more than 8 devices of 1 GB, a smaller micro-batch (more --microbatches, or auto), ZeRO (--zero auto shards optimizer state, gradients and weights among replicas), tensor parallelism (--tp auto splits a layer's weights across a node's devices), or --precision mixed
metis m=4 1f1b stages 7x4@0[1,1] 4x4@4[1,1] blocks=4 solved=4 placed=4 simulated=2 pruned=2 iteration=0.174022218336 estimate=0.187436575696 peak=2303454
infeasible: task n2 alone needs 0.0 GB (weights, gradients and adamw state) but a device has 0 GB; apart does not split a single operator: use devices with more memory, --precision mixed, or a lighter --optimizer
infeasible: task n2 alone needs 0.0 GB (weights, gradients and adamw state) but a device has 0 GB; apart does not split a single operator: use devices with more memory, --precision mixed, or a lighter --optimizer
infeasible: task n2 alone needs 0.0 GB (weights, gradients and adamw state) but a device has 0 GB; apart does not split a single operator: use devices with more memory, --precision mixed, or a lighter --optimizer
infeasible: task n2 alone needs 0.0 GB (weights, gradients and adamw state) but a device has 0 GB; apart does not split a single operator: use devices with more memory, --precision mixed, or a lighter --optimizer
infeasible: task n2 alone needs 0.0 GB (weights, gradients and adamw state) but a device has 0 GB; apart does not split a single operator: use devices with more memory, --precision mixed, or a lighter --optimizer
infeasible: task n2 alone needs 0.0 GB (weights, gradients and adamw state) but a device has 0 GB; apart does not split a single operator: use devices with more memory, --precision mixed, or a lighter --optimizer
metis m=1 1f1b stages 10x8@0[1,1] blocks=10 solved=474 placed=474 simulated=2 pruned=472 iteration=0.241656563644 estimate=0.241656563644 peak=1235548
uniform m=1 1f1b stages 10x8@0[1,1] blocks=0 solved=96 placed=96 simulated=2 pruned=94 iteration=0.241656563644 estimate=0.241656563644 peak=1235548
params m=1 1f1b stages 10x8@0[1,1] blocks=0 solved=96 placed=96 simulated=2 pruned=94 iteration=0.241656563644 estimate=0.241656563644 peak=1235548
gpipe-balance m=1 1f1b stages 10x8@0[1,1] blocks=0 solved=96 placed=96 simulated=2 pruned=94 iteration=0.241656563644 estimate=0.241656563644 peak=1235548
pipedream m=1 1f1b stages 10x8@0[1,1] blocks=0 solved=6 placed=6 simulated=2 pruned=4 iteration=0.241656563644 estimate=0.241656563644 peak=1235548
metis m=1 1f1b stages 10x8@0[1,1] blocks=5 solved=72 placed=72 simulated=2 pruned=70 iteration=0.241656563644 estimate=0.241656563644 peak=1235548
gpipe-balance m=6 1f1b stages 5x4@0[1,1] 3x4@4[1,1] 4x4@8[1,1] blocks=12 solved=936 placed=650 simulated=2 pruned=648 iteration=0.145621209477 estimate=0.156957838036 peak=1583376
uniform m=6 1f1b stages 3x2@0[1,1] 3x4@2[1,1] 3x4@6[1,1] 3x2@10[1,1] blocks=0 solved=192 placed=144 simulated=4 pruned=140 iteration=0.171595947478 estimate=0.179190950011 peak=1700371
params m=6 1f1b stages 4x4@0[1,1] 3x4@4[1,1] 5x4@8[1,1] blocks=0 solved=192 placed=160 simulated=2 pruned=158 iteration=0.151099521814 estimate=0.151240079814 peak=1348142
gpipe-balance m=6 1f1b stages 5x4@0[1,1] 3x4@4[1,1] 4x4@8[1,1] blocks=0 solved=192 placed=144 simulated=2 pruned=142 iteration=0.145621209477 estimate=0.156957838036 peak=1583376
pipedream m=3 1f1b stages 4x3@0[1,1] 3x4@3[1,1] 5x5@7[1,1] blocks=0 solved=8 placed=8 simulated=2 pruned=6 iteration=0.196134067574 estimate=0.196291796214 peak=1352284
infeasible: no split of the model fits 12 devices of 0 GB at global batch 24 with these pins; it needs more than 12 devices of 0 GB, ZeRO (--zero auto shards optimizer state, gradients and weights among replicas), tensor parallelism (--tp auto splits a layer's weights across a node's devices), or --precision mixed
)plans";

std::string fingerprint_of(const testing::MethodCase& c, Method method) {
  const auto model = testing::random_model(c.seed, c.tasks, c.chain);
  try {
    return testing::plan_fingerprint(
        partition_by_method(model.graph, model.costs, testing::method_case_options(c, method)));
  } catch (const Infeasible& e) {
    return std::string("infeasible: ") + e.what();
  }
}

TEST(TheMethodDispatch, GivesEveryMethodThePlanItGaveBeforeThePhaseScript) {
  std::istringstream expected(kPlansBeforeThePhaseScript);
  std::string line;
  for (const auto& c : testing::method_cases())
    for (Method method : kAllMethods) {
      ASSERT_TRUE(std::getline(expected, line));
      EXPECT_EQ(fingerprint_of(c, method), line) << "seed " << c.seed << ", --method " << method_name(method);
    }
}

TEST(TheMethodDispatch, GivesEveryMethodTheSamePlanOnOneThreadAndOnSeveral) {
  for (const auto& c : testing::method_cases()) {
    const auto model = testing::random_model(c.seed, c.tasks, c.chain);
    for (Method method : kAllMethods) {
      auto on = [&](int threads) {
        PartitionOptions o = testing::method_case_options(c, method);
        o.threads = threads;
        try {
          return testing::plan_fingerprint(partition_by_method(model.graph, model.costs, o));
        } catch (const Infeasible& e) {
          return std::string("infeasible: ") + e.what();
        }
      };
      const std::string one = on(1);
      EXPECT_EQ(on(2), one) << "seed " << c.seed << ", --method " << method_name(method);
      EXPECT_EQ(on(5), one) << "seed " << c.seed << ", --method " << method_name(method);
    }
  }
}

// baselines.json's rows without their planning time, one line each.
std::string rows_of(const std::vector<MethodResult>& results) {
  std::string rows;
  for (const MethodResult& r : results) {
    rows += std::string(method_name(r.method)) + (r.feasible ? " " : " infeasible: " + r.reason) +
            std::to_string(r.iteration_s) + " " + std::to_string(r.stages) + " " + std::to_string(r.devices_used) +
            " " + std::to_string(r.microbatches) + (r.recompute ? " recompute" : "") + " " +
            std::to_string(r.peak_memory_bytes) + "\n";
  }
  return rows;
}

TEST(APlanWithBaselines, IsPartitionGraphAndCompareMethodsInOneSearch) {
  for (const auto& c : testing::method_cases()) {
    const auto model = testing::random_model(c.seed, c.tasks, c.chain);
    const PartitionOptions o = testing::method_case_options(c, Method::kApart);
    try {
      const Plan apart = partition_graph(model.graph, model.costs, o);
      const PlanWithBaselines both = partition_with_baselines(model.graph, model.costs, o);
      EXPECT_EQ(testing::plan_fingerprint(both.plan), testing::plan_fingerprint(apart)) << "seed " << c.seed;
      EXPECT_EQ(rows_of(both.baselines), rows_of(compare_methods(model.graph, model.costs, o, nullptr, &apart)))
          << "seed " << c.seed;
    } catch (const Infeasible&) {
      EXPECT_THROW(partition_with_baselines(model.graph, model.costs, o), Infeasible) << "seed " << c.seed;
    }
  }
}

TEST(TheMethodDispatch, RunsApartThroughPartitionGraph) {
  const testing::MethodCase c = testing::method_cases().front();
  const auto model = testing::random_model(c.seed, c.tasks, c.chain);
  const PartitionOptions o = testing::method_case_options(c, Method::kApart);
  EXPECT_EQ(testing::plan_fingerprint(partition_by_method(model.graph, model.costs, o)),
            testing::plan_fingerprint(partition_graph(model.graph, model.costs, o)));
}

TEST(PartitionGraph, RunsOnlyApartsOwnMethod) {
  const testing::MethodCase c = testing::method_cases().front();
  const auto model = testing::random_model(c.seed, c.tasks, c.chain);
  EXPECT_ANY_THROW(partition_graph(model.graph, model.costs, testing::method_case_options(c, Method::kUniform)));
}

}  // namespace
}  // namespace apart
