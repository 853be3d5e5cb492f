// apart run of interleaved plans (Megatron-LM's virtual stages: device d holds chunks d, d + P, …): each rank runs its
// chunks in Megatron's order and steps them together, computing what apart train computes on the whole batch (gpt-tiny,
// apart zoo's BERT and T5; threads and mpirun); the chunks the runtime runs are the ones the plan lists and the
// simulator replays.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/error.h"
#include "plan/plan.h"
#include "runtime/communicator.h"
#include "schedule/schedule.h"
#include "simulator/simulate.h"
#include "tests/train/pipeline_fixture.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using namespace apart::testing;

fs::path scratch(const std::string& name) { return testing::scratch("pipeline_interleaved_test", name); }

struct Case {
  const char* name;
  Shape shape;
};

// `model` on an interleaved plan of `shape`, 3 SGD steps on batch 8 against apart train's, at the suite's tolerance
// (pipeline_fixture.h expect_same_training): losses to 2e-5 relative, each param's update to 1e-3 of its norm.
void expect_trains_as_apart_train(const std::string& model, const Shape& shape, const fs::path& dir, const std::string& what) {
  constexpr int64_t kBatch = 8, kSteps = 3;
  const Outcome reference = train_reference(model, kBatch, kSteps, dir);
  const fs::path plan = make_plan(model, shape, kBatch, dir / "plan");
  ASSERT_EQ(read_plan(plan).virtual_stages.size(), shape.replicas.size() * static_cast<size_t>(std::max(2, shape.virtual_stages)));
  const Outcome run = run_threads(plan, kSteps, dir);
  expect_same_training(reference, run, read_weights(model), what);
  expect_split(run, total_params(reference.weights));
}

class GptTinyInterleavedPlans : public ::testing::TestWithParam<Case> {};

TEST_P(GptTinyInterleavedPlans, TrainAsOneProcessTrainsOnTheWholeBatch) {
  expect_trains_as_apart_train(gpt_tiny(), GetParam().shape, scratch(GetParam().name), GetParam().name);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GptTinyInterleavedPlans,
    ::testing::Values(Case{"two_stages_v2_m2", {{1, 1}, 2, Schedule::kInterleaved}},
                      Case{"two_stages_v2_m4", {{1, 1}, 4, Schedule::kInterleaved}},
                      // Two replicas per stage: each chunk all-reduces over its stage's pair, chunk by chunk.
                      Case{"two_stages_of_two_replicas_v2_m2", {{2, 2}, 2, Schedule::kInterleaved}},
                      Case{"two_stages_v3_m2", {{1, 1}, 2, Schedule::kInterleaved, {}, 0, 3}},
                      // Stages of 2 and 1 replicas: the wrap hands chunk 1's whole micro-batch to chunk 2's halves.
                      Case{"stages_of_two_and_one_replicas_v2_m2", {{2, 1}, 2, Schedule::kInterleaved}},
                      // ZeRO over each stage's pair: every chunk shards its own buckets over its own replica group.
                      Case{"two_stages_of_two_replicas_zero1_v2_m2", {{2, 2}, 2, Schedule::kInterleaved, {}, 1}},
                      Case{"two_stages_of_two_replicas_zero3_v2_m2", {{2, 2}, 2, Schedule::kInterleaved, {}, 3}},
                      // Whole-stage recomputation on the first stage: its chunks re-run their forwards.
                      Case{"recompute_on_the_first_stage_v2_m2", {{1, 1}, 2, Schedule::kInterleaved, {true, false}}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// apart zoo's `family` at 2 layers, 4 heads, hidden 64, 16 positions, on an interleaved plan of 2 stages × 2 chunks:
// 3 SGD steps as apart train's.
class ZooModelsUnderInterleaving : public ::testing::TestWithParam<std::string> {};

TEST_P(ZooModelsUnderInterleaving, TrainAsApartTrainOnTheWholeBatch) {
  const fs::path dir = scratch("zoo_" + GetParam());
  expect_trains_as_apart_train(zoo_model(GetParam(), dir).string(), {{1, 1}, 2, Schedule::kInterleaved}, dir, "zoo " + GetParam());
}

INSTANTIATE_TEST_SUITE_P(Families, ZooModelsUnderInterleaving, ::testing::Values("bert", "t5"));

// Under mpirun -np 2 (one process per device, each with its two chunks): the losses and the saved weights of the
// threads (3 AdamW steps), which equal apart train's above.
TEST(AnInterleavedRunUnderMpirun, EqualsTheSameRunOnThreads) {
  if (testing::run_command("command -v mpirun >/dev/null 2>&1").code != 0 || !mpi_available()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("mpirun");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::kInterleaved}, 8, dir / "plan");
  Outcome threads;
  Weights saved;
  ASSERT_NO_FATAL_FAILURE(run_under_mpirun_and_on_threads(2, plan, dir, "interleaved", &threads, &saved));
  Outcome mpi;
  mpi.losses = threads.losses;  // compared above to the printed digits
  mpi.weights = saved;
  expect_same_training(threads, mpi, read_weights(gpt_tiny()), "mpirun vs threads");
}

// The chunks are one layout for the plan, the simulator and the runtime: chunk c's tasks are plan.json's
// virtual_stages[c] (and chunk_c.onnx's nodes) on stage c mod P's devices; each device runs its chunks' forwards and
// backwards in the order the simulator replays them; and each chunk carries 1/v of its stage's time (the simulator's
// share) to within the largest task's.
TEST(TheChunksOfAnInterleavedPlan, AreTheSameTasksAndOrderInThePlanTheSimulatorAndTheRuntime) {
  const fs::path dir = scratch("layout");
  const fs::path plan_dir = make_plan(gpt_tiny(), {{1, 1}, 4, Schedule::kInterleaved}, 8, dir / "plan");
  const PlanDocument plan = read_plan(plan_dir);
  const int p = static_cast<int>(plan.stages.size()), v = plan.training.virtual_stages.value_or(0);
  ASSERT_EQ(v, 2);
  ASSERT_EQ(static_cast<int>(plan.virtual_stages.size()), p * v);
  const PlanDocument view = virtual_stage_view(plan);
  std::map<std::string, double> cost;  // forward + backward per task, as the cut weighed them
  {
    std::ifstream in(plan_dir / "costs.json");
    const nlohmann::json costs = nlohmann::json::parse(in);
    for (const auto& t : costs.at("tasks")) cost[t.at("name")] = t.at("forward_s").get<double>() + t.at("backward_s").get<double>();
  }
  double total = 0, largest = 0;
  for (int c = 0; c < p * v; ++c) {
    const PlanVirtualStage& chunk = plan.virtual_stages[static_cast<size_t>(c)];
    const PlanStageRecord& runs = view.stages[static_cast<size_t>(c)];
    EXPECT_EQ(runs.tasks, chunk.tasks) << "chunk " << c;
    EXPECT_EQ(runs.devices, plan.stages[static_cast<size_t>(c % p)].devices) << "chunk " << c;
    EXPECT_EQ(chunk.stage, c % p);
    const onnx::ModelProto file = testing::read_proto(plan_dir / ("chunk_" + std::to_string(c) + ".onnx"));
    std::vector<std::string> nodes;
    for (const auto& node : file.graph().node()) nodes.push_back(node.name());
    EXPECT_EQ(nodes.size(), chunk.tasks.size()) << "chunk_" << c << ".onnx";
  }
  // The runtime's order (rank_actions) is the simulator's replay, device by device.
  const sim::SimResult replay = sim::simulate(sim::sim_plan(plan));
  for (int d = 0; d < p; ++d) {
    std::vector<std::string> simulated, executed;
    for (const sim::SimEvent& e : replay.events)
      if (e.stage == d && (e.kind == sim::EventKind::kForward || e.kind == sim::EventKind::kBackward))
        simulated.push_back((e.kind == sim::EventKind::kForward ? "fwd chunk " : "bwd chunk ") +
                            std::to_string(e.virtual_stage) + " mb=" + std::to_string(e.microbatch));
    for (const Action& a : rank_actions(plan, plan.stages[static_cast<size_t>(d)].devices.front()))
      if (a.kind == ActionKind::kForward || a.kind == ActionKind::kBackward) executed.push_back(to_string(a));
    EXPECT_EQ(executed, simulated) << "device " << d;
  }
  // Each chunk about 1/v of its stage's forward + backward, in the cost table's units.
  std::vector<double> chunk_cost(static_cast<size_t>(p * v), 0.0);
  std::map<std::string, int> holders;
  for (const PlanVirtualStage& chunk : plan.virtual_stages)
    for (const std::string& t : chunk.tasks) ++holders[t];
  for (const PlanVirtualStage& chunk : plan.virtual_stages)
    for (const std::string& t : chunk.tasks)
      if (holders[t] == 1 && cost.count(t)) {  // constant tasks may repeat; they weigh ~0
        chunk_cost[static_cast<size_t>(chunk.id)] += cost[t];
        total += cost[t];
        largest = std::max(largest, cost[t]);
      }
  double planned = 0;
  for (const PlanStageRecord& stage : plan.stages) planned += stage.forward_s + stage.backward_s;
  for (int c = 0; c < p * v; ++c) {
    const PlanStageRecord& stage = plan.stages[static_cast<size_t>(c % p)];
    const double target = (stage.forward_s + stage.backward_s) / v / planned * total;
    EXPECT_NEAR(chunk_cost[static_cast<size_t>(c)], target, 2 * largest) << "chunk " << c;
  }
}

// --trace names each chunk's ops as the simulator's trace does ("2F0": virtual stage 2's forward of micro-batch 0, on
// stage 0's rank), and apart simulate --compare reads it against the replay, stage by stage.
TEST(AnInterleavedRunsTrace, NamesEachChunksOpsAsTheSimulatorAndComparesWithItsReplay) {
  const fs::path dir = scratch("trace");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::kInterleaved}, 8, dir / "plan");
  const fs::path trace = dir / "run.json";
  const auto r = testing::run_apart("run " + plan.string() + " --steps 2 --in-process --trace " + trace.string());
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(trace);
  const nlohmann::json t = nlohmann::json::parse(in);
  std::set<std::string> names;
  for (const auto& e : t.at("traceEvents"))
    if (e.contains("name") && e.at("name").is_string()) names.insert(e.at("name").get<std::string>());
  for (const char* op : {"0F0", "1F0", "2F0", "3F1", "3B1", "2B0", "0B1"}) EXPECT_TRUE(names.count(op)) << op;
  const auto compared = testing::run_apart("simulate " + plan.string() + " --compare " + trace.string());
  EXPECT_EQ(compared.code, 0) << compared.out;
}

}  // namespace
}  // namespace apart
