// apart run against apart train: a plan's ranks (threads over the in-process communicator) compute what one
// process computes on the whole batch — per-step losses and the weights after K steps — for pipelines, replicas,
// stages with different replica counts, recomputation, GPipe and 1F1B, several micro-batch counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "graph/error.h"
#include "models/zoo.h"
#include "plan/plan.h"
#include "runtime/pipeline.h"
#include "tests/runtime/pipeline_fixture.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using namespace apart::testing;

fs::path scratch(const std::string& name) { return testing::scratch("pipeline_test", name); }

struct Case {
  const char* name;
  Shape shape;
};

class GptTinyPlans : public ::testing::TestWithParam<Case> {};

TEST_P(GptTinyPlans, TrainAsOneProcessTrainsOnTheWholeBatch) {
  const Case& c = GetParam();
  const fs::path dir = scratch(c.name);
  constexpr int64_t kBatch = 8, kSteps = 3;
  const Outcome reference = train_reference(gpt_tiny(), kBatch, kSteps, dir);
  const fs::path plan = make_plan(gpt_tiny(), c.shape, kBatch, dir / "plan");
  const Outcome run = run_threads(plan, kSteps, dir);
  expect_same_training(reference, run, read_weights(gpt_tiny()), c.name);
  expect_split(run, total_params(reference.weights));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GptTinyPlans,
    ::testing::Values(Case{"two_stages_1f1b_m4", {{1, 1}, 4, Schedule::k1F1B, {}}},
                      Case{"two_stages_gpipe_m2", {{1, 1}, 2, Schedule::kGPipe, {}}},
                      Case{"one_stage_two_replicas_m2", {{2}, 2, Schedule::k1F1B, {}}},
                      Case{"stages_of_two_and_one_replicas_m2", {{2, 1}, 2, Schedule::k1F1B, {}}},
                      Case{"stages_of_one_and_two_replicas_gpipe_m1", {{1, 2}, 1, Schedule::kGPipe, {}}},
                      Case{"four_stages_1f1b_m4", {{1, 1, 1, 1}, 4, Schedule::k1F1B, {}}},
                      Case{"recompute_on_the_first_of_two_stages_m4", {{1, 1}, 4, Schedule::k1F1B, {true, false}}},
                      Case{"recompute_everywhere_gpipe_m2", {{1, 1}, 2, Schedule::kGPipe, {true, true}}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(ApartRun, GivesTheSameResultTwice) {
  const fs::path dir = scratch("determinism");
  const fs::path plan = make_plan(gpt_tiny(), {{2, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const Outcome a = run_threads(plan, 2, dir / "a");
  const Outcome b = run_threads(plan, 2, dir / "b");
  ASSERT_EQ(a.losses.size(), 2u);
  EXPECT_EQ(a.losses, b.losses);
}

TEST(ApartRun, RefusesAWorldOfAnotherSizeBeforeAnyWork) {
  const fs::path dir = scratch("world_size");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  auto comms = make_in_process_communicators(1);
  RunOptions o;
  o.plan = plan.string();
  o.steps = 1;
  try {
    run_plan(o, *comms[0]);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("mpirun -np 2"), std::string::npos) << e.what();
  }
}

TEST(ApartRun, RefusesAModelWhoseBytesAreNotThePlans) {
  const fs::path dir = scratch("sha");
  const fs::path plan = make_plan(gpt_tiny(), {{1}, 1, Schedule::k1F1B, {}}, 8, dir / "plan");
  models::ZooOptions z = models::options_for("gpt-tiny");
  z.seed = 99;
  const fs::path other = dir / "other.onnx";
  models::write_zoo_model(z, other.string());
  auto comms = make_in_process_communicators(1);
  RunOptions o;
  o.plan = plan.string();
  o.model = other.string();
  o.steps = 1;
  try {
    run_plan(o, *comms[0]);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("not the one the plan was made for"), std::string::npos) << e.what();
  }
}

TEST(ApartRunCli, TrainsAPlanInProcessAndPrintsEachStep) {
  const fs::path dir = scratch("cli");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const auto r = testing::run_apart("run " + plan.string() + " --steps 2 --in-process");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[rank 1/2 stage 1 replica 0] step=2 loss="), std::string::npos) << r.out;
  const auto refused = testing::run_apart("run " + plan.string() + " --steps 2");
  EXPECT_EQ(refused.code, 2) << refused.out;
  EXPECT_NE(refused.out.find("mpirun -np 2"), std::string::npos) << refused.out;
}

TEST(ApartRunCli, RunsUnderMpirunWithOneProcessPerRank) {
  if (testing::run_command("command -v mpirun >/dev/null 2>&1").code != 0 || !mpi_available()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("mpi");
  const fs::path plan = make_plan(gpt_tiny(), {{2, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const auto r = testing::run_command(
      "ASAN_OPTIONS=detect_leaks=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --timeout 120 "
      "--oversubscribe -np 3 " + std::string(APART_BINARY) + " run " + plan.string() + " --steps 2 --optimizer sgd --lr 0.05 --seed 3 "
      "--save-model " + (dir / "mpi.onnx").string() + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[rank 2/3 stage 1 replica 0] step=2 loss="), std::string::npos) << r.out;
  // The same plan on threads: the same losses to the printed digits.
  const Outcome threads = run_threads(plan, 2, dir / "threads");
  ASSERT_EQ(threads.losses.size(), 2u);
  char expected[64];
  std::snprintf(expected, sizeof expected, "step=2 loss=%.6f", threads.losses[1]);
  EXPECT_NE(r.out.find(expected), std::string::npos) << r.out;
}

}  // namespace
}  // namespace apart
