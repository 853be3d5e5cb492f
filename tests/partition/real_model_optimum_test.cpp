// The partitioner at the optimum on real models (issue 15): for pinned pure pipelines (S stages × 1 replica) the
// plan's simulated time is never worse than that of the exact compute-optimal contiguous split of the topological
// order, its compute bottleneck within 1 % of that optimum wherever communication is negligible, and raising
// --blocks never makes the plan slower in simulation. Label slow: dozens of searches of real models.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "compute_optimum.h"
#include "driver/compile.h"
#include "graph/error.h"
#include "models/zoo.h"
#include "partition/stage_refine.h"
#include "tests/support/temp_dir.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using namespace apart::testing;

// Real models: the torch exports in ../shared/models, zoo models, and the ONNX test models of Debian's
// libonnx-testdata with ≥ 50 nodes (data/real/*/model.onnx once downloaded; the node tests have ≤ 30 nodes).
struct RealModel {
  std::string name;
  fs::path path;
};
std::vector<RealModel> real_models(const fs::path& scratch) {
  std::vector<RealModel> out;
  for (const char* m : {"resnet50", "densenet121", "inception_v3", "gpt2_small"}) {
    const fs::path p = fs::path(APART_SHARED_MODELS_DIR) / (std::string(m) + ".onnx");
    if (fs::exists(p)) out.push_back({m, p});
  }
  // resnet152x8 (RaNNC's widened ResNet: compute grows with width², activations with width) is the zoo model whose
  // transfers are negligible (0.3 % of its replay at S = 4 and 8), so the 1 % bar is checked on a clean clone
  // without ../shared/models too (there, DenseNet-121 at S = 4 is the only other one: 0.8 %).
  for (const char* zoo : {"gpt2-medium", "bert-base", "t5-small", "resnet101", "resnet152x8"}) {
    models::ZooOptions zo = models::options_for(zoo);
    zo.weights = models::WeightsMode::kNone;
    const fs::path p = scratch / (std::string(zoo) + ".onnx");
    if (!fs::exists(p)) models::write_zoo_model(zo, p.string());
    out.push_back({std::string("zoo ") + zoo, p});
  }
  const fs::path testdata = "/usr/share/libonnx-testdata/data/real";
  if (fs::exists(testdata))
    for (const auto& dir : fs::directory_iterator(testdata))
      if (fs::exists(dir.path() / "model.onnx")) out.push_back({dir.path().filename().string(), dir.path() / "model.onnx"});
  return out;
}

CompileOptions a100_pipeline(const fs::path& model, int stages, int blocks = 0) {
  CompileOptions o;
  o.model = model;
  o.cluster.device = "a100-80gb";
  o.cluster.devices = stages;
  o.cluster.devices_per_node = 8;
  o.precision = Precision::kMixed;
  o.baselines = false;
  o.partition.training.global_batch = 64;
  o.partition = pinned_pipeline(o.partition, stages, 16);
  o.partition.block.blocks = blocks;
  return o;
}

// Communication is negligible for a split when the simulator, replaying it with transfers that take no time, finds
// its iteration less than 1 % shorter: its transfers hide behind compute (the simulator overlaps them with it), so
// no split can gain more than that by trading compute for communication, and the plan's compute bottleneck must be
// within 1 % of the optimum.
constexpr double kNegligibleComm = 0.01;

TEST(ThePartitionPipeline, IsNeverSlowerInSimulationThanTheExactComputeOptimalSplitOfARealModel) {
  const testing::TempDir scratch("optimum_test");
  int compared = 0, negligible = 0;
  for (const RealModel& model : real_models(scratch.path()))
    for (int stages : {4, 8}) {
      const CompileOptions request = a100_pipeline(model.path, stages);
      CompileResult result;
      try {
        result = compile(request);
      } catch (const Infeasible& e) {
        ADD_FAILURE() << model.name << " S=" << stages << ": " << e.what();
        continue;
      }
      const PartitionOptions& po = result.plan.options;
      const AtomicGraph atomic = build_atomic_graph(result.model.graph, result.costs.table, po.atomic,
                                                    result.costs.at_other_size ? &*result.costs.at_other_size : nullptr);
      const ChainCompute chain(atomic);
      const ComputeOptimum oracle = dp_compute_optimum(chain, stages, 64 / 16);
      // partition's compute-balanced split (stage_refine.h; bench/quality_bench's "× exact") is this optimum.
      StageSolution pipeline;
      pipeline.stages = stages;
      pipeline.microbatches = 16;
      pipeline.replicas.assign(stages, 1);
      const ExactCuts exact = exact_stage_cuts(atomic, pipeline, po.cluster, po.training);
      ASSERT_TRUE(exact.least_compute.has_value()) << model.name;
      EXPECT_EQ(exact.least_compute->assignment.block_of, assignment_of_cuts(atomic.size(), oracle.cuts).block_of)
          << model.name << " S=" << stages;
      PartitionOptions replay_options = po;
      replay_options.stage.recompute = request.partition.stage.recompute;
      const auto replay = replay_split(atomic, oracle.cuts, replay_options);
      ASSERT_TRUE(replay.has_value()) << model.name << ": the compute-optimal split does not fit";
      double compute = 0;
      for (const PlanStage& s : result.plan.stages) compute = std::max(compute, s.cost.compute_s);
      const double comm_share = 1 - replay->simulated_without_comm_s / replay->simulated_s;
      const bool comm_negligible = comm_share < kNegligibleComm;
      std::printf("%-18s S=%d  simulated %.6f s vs exact split %.6f s (%.4f×); compute %.4f× the optimum; transfers %.2f %% "
                  "of its replay (%s); %s\n",
                  model.name.c_str(), stages, result.plan.simulated.iteration_s, replay->simulated_s,
                  result.plan.simulated.iteration_s / replay->simulated_s, compute / oracle.bottleneck,
                  100 * comm_share, comm_negligible ? "negligible" : "not negligible",
                  result.plan.search.chosen_split.c_str());
      EXPECT_LE(result.plan.simulated.iteration_s, replay->simulated_s * (1 + 1e-9)) << model.name << " S=" << stages;
      if (comm_negligible) {
        ++negligible;
        EXPECT_LE(compute, oracle.bottleneck * (1 + kNegligibleComm)) << model.name << " S=" << stages;
      }
      ++compared;
    }
  EXPECT_GE(compared, 10) << "the zoo models at least";
  EXPECT_GT(negligible, 0) << "no model where communication is negligible: the 1 % bar was never checked";
}

// ---------------- More blocks never hurt ----------------

TEST(ThePartitionPipeline, NeverGetsSlowerInSimulationWhenGivenMoreBlocks) {
  const testing::TempDir scratch("optimum_test");
  int compared = 0;
  for (const RealModel& model : real_models(scratch.path()))
    for (int stages : {4, 8}) {
      double previous = std::numeric_limits<double>::infinity();
      for (int blocks : {16, 32, 64, 128, 256}) {
        const Plan plan = compile(a100_pipeline(model.path, stages, blocks)).plan;
        EXPECT_LE(plan.simulated.iteration_s, previous * (1 + 1e-9))
            << model.name << " S=" << stages << " --blocks " << blocks;
        previous = plan.simulated.iteration_s;
        ++compared;
      }
    }
  EXPECT_GE(compared, 40);
}

}  // namespace
}  // namespace apart
