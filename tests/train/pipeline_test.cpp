// apart run against apart train: a plan's ranks (threads over the in-process communicator) compute what one
// process computes on the whole batch — per-step losses and the weights after K steps — for pipelines, replicas,
// stages with different replica counts, recomputation, GPipe and 1F1B, several micro-batch counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "graph/error.h"
#include "models/zoo.h"
#include "plan/plan.h"
#include "train/pipeline.h"
#include "train/trainer.h"
#include "tests/runtime/host_device_backend.h"
#include "tests/train/pipeline_fixture.h"

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
                      // Micro-batches of 8 samples over 3 replicas: slices of 3, 3 and 2 (weighted by their size).
                      Case{"one_stage_three_uneven_replicas_m1", {{3}, 1, Schedule::k1F1B, {}}},
                      // Slices 3+3+2 meet 2+2 (micro-batches of 4 over 3 and 2 replicas): overlapping ranges move.
                      Case{"stages_of_three_and_two_uneven_replicas_m2", {{3, 2}, 2, Schedule::k1F1B, {}}},
                      Case{"recompute_on_the_first_of_two_stages_m4", {{1, 1}, 4, Schedule::k1F1B, {true, false}}},
                      Case{"recompute_everywhere_gpipe_m2", {{1, 1}, 2, Schedule::kGPipe, {true, true}}},
                      // ZB-H1: each backward as its input-gradient pass, the weight-gradient pass deferred.
                      Case{"zb_h1_two_stages_m4", {{1, 1}, 4, Schedule::kZbH1, {}}},
                      Case{"zb_h1_four_stages_m4", {{1, 1, 1, 1}, 4, Schedule::kZbH1, {}}},
                      Case{"zb_h1_stages_of_two_and_one_replicas_m2", {{2, 1}, 2, Schedule::kZbH1, {}}},
                      Case{"zb_h1_recompute_on_the_second_of_two_stages_m4", {{1, 1}, 4, Schedule::kZbH1, {false, true}}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(ApartRun, GivesTheSameResultTwice) {
  const fs::path dir = scratch("determinism");
  const fs::path plan = make_plan(gpt_tiny(), {{2, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const Outcome a = run_threads(plan, 2, dir / "a");
  const Outcome b = run_threads(plan, 2, dir / "b");
  ASSERT_EQ(a.losses.size(), 2u);
  EXPECT_EQ(a.losses, b.losses);
}

// ZB-H1 runs the same nodes as 1F1B, split between two passes, and adds each micro-batch's weight gradients in the
// same order: the same bits.
TEST(ApartRunZbH1, TrainsBitwiseAs1F1BWithAdamW) {
  const fs::path dir = scratch("zb_h1_bitwise");
  const fs::path one_f_one_b = make_plan(gpt_tiny(), {{1, 2, 1}, 3, Schedule::k1F1B, {}}, 6, dir / "1f1b");
  const fs::path zb = make_plan(gpt_tiny(), {{1, 2, 1}, 3, Schedule::kZbH1, {}}, 6, dir / "zb");
  const Outcome a = run_threads(one_f_one_b, 3, dir / "a", Optimizer::kAdamW, 1e-3);
  const Outcome b = run_threads(zb, 3, dir / "b", Optimizer::kAdamW, 1e-3);
  ASSERT_EQ(b.losses.size(), 3u);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_TRUE(bitwise_equal(a.weights, b.weights));
}

TEST(ApartRunCheckpoints, TenStepsStraightEqualFivePlusAResumedFiveBitwise) {
  const fs::path dir = scratch("resume");
  const fs::path plan = make_plan(gpt_tiny(), {{2, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  // The resumed run is told 10 steps; resumed at 5, it does steps 6..10.
  Outcome rest;
  ASSERT_NO_FATAL_FAILURE(expect_resumes_bitwise(plan, plan, dir, Optimizer::kAdam, 0.05, "2 + 1 ranks", 10, &rest));
  const fs::path ck = dir / "ck";
  EXPECT_TRUE(fs::exists(ck / "manifest.json"));
  EXPECT_TRUE(fs::exists(ck / "step_5" / "rank_2.apart"));
  EXPECT_EQ(rest.ranks[0].first_step, 5);
}

// Each rank on a device backend of its own (host_device_backend.h: separate buffers, some ops on the CPU kernel),
// messages and all-reduces through the host: the same losses and weights as on the CPU, bitwise, and a checkpoint
// written from device tensors resumes there as well.
TEST(ApartRunOnADeviceBackend, TrainsBitwiseAsOnTheCpuAndResumesFromItsCheckpoint) {
  const fs::path dir = scratch("device");
  const fs::path plan = make_plan(gpt_tiny(), {{2, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  std::vector<std::unique_ptr<HostDeviceBackend>> devices;
  for (int r = 0; r < 3; ++r) devices.push_back(std::make_unique<HostDeviceBackend>());
  auto device_of = [&](int rank) -> Backend* { return devices[static_cast<size_t>(rank)].get(); };
  const Outcome cpu = run_threads(plan, 4, dir / "cpu", Optimizer::kAdamW);
  const Outcome straight = run_threads(plan, 4, dir / "straight", Optimizer::kAdamW, 0.05, "", "", device_of);
  ASSERT_EQ(straight.losses.size(), 4u);
  EXPECT_EQ(straight.losses, cpu.losses);
  EXPECT_TRUE(bitwise_equal(straight.weights, cpu.weights));
  for (const RunResult& r : straight.ranks) EXPECT_FALSE(r.fallback_ops.empty()) << "rank of stage " << r.role.stage;
  const fs::path ck = dir / "ck";
  fs::create_directories(ck);
  run_threads(plan, 2, dir / "first", Optimizer::kAdamW, 0.05, ck.string(), "", device_of);
  const Outcome rest = run_threads(plan, 4, dir / "rest", Optimizer::kAdamW, 0.05, "", ck.string(), device_of);
  ASSERT_EQ(rest.losses.size(), 2u);
  EXPECT_EQ(rest.losses[1], straight.losses[3]);
  EXPECT_TRUE(bitwise_equal(rest.weights, straight.weights));
}

// A checkpoint resumes at another rank count only on a plan of the same stages (docs/runtime.md "Checkpoints"):
// one of other stages is refused naming the stage counts, and a manifest from before layouts were recorded keeps the
// old rule (the same plan and rank count).
TEST(ApartRunCheckpoints, RefuseAPlanOfOtherStagesOrAnOldManifestAtAnotherRankCountSayingWhy) {
  const fs::path dir = scratch("resume_refused");
  const fs::path plan = make_plan(gpt_tiny(), {{2, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const fs::path ck = dir / "ck";
  fs::create_directories(ck);
  run_threads(plan, 1, dir / "first", Optimizer::kSgd, 0.05, ck.string());
  auto refusals = [&](const fs::path& other) {
    RunOptions o = run_options_like_reference(other, 2);
    o.resume = ck.string();
    std::vector<std::string> messages;
    for (const auto& e : run_ranks(2, CommOptions{60}, [&](int, Communicator& comm) { run_plan(o, comm); }))
      messages.push_back(error_message(e));
    return messages;
  };
  for (const std::string& m : refusals(make_plan(gpt_tiny(), {{2}, 2, Schedule::k1F1B, {}}, 8, dir / "one_stage")))
    EXPECT_NE(m.find("written for a plan of 2 stages (this plan has 1 stage)"), std::string::npos) << m;
  nlohmann::json manifest = nlohmann::json::parse(std::ifstream(ck / "manifest.json"));
  // As a writer before layouts wrote it: none of the fields that came later (the checksum seals the rest).
  for (const char* later : {"layout", "ranks", "lr_schedule_steps", "kept", "crc32c"}) manifest.erase(later);
  std::ofstream(ck / "manifest.json") << manifest.dump(2);
  for (const std::string& m : refusals(make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "other")))
    EXPECT_NE(m.find("written by a run on 3 ranks of another plan (this run has 2)"), std::string::npos) << m;
}

TEST(ApartRun, SavesOneStandardModelThatApartTrainContinuesFrom) {
  const fs::path dir = scratch("save_model");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const Outcome run = run_threads(plan, 2, dir / "run");
  ASSERT_EQ(run.losses.size(), 2u);
  TrainOptions o;
  o.model = (dir / "run" / "run.onnx").string();
  o.batch = 8;
  o.steps = 1;
  const TrainResult continued = train(o);
  ASSERT_EQ(continued.steps.size(), 1u);
  EXPECT_TRUE(std::isfinite(continued.steps[0].loss));
  // Every initializer of the model is there, the trained ones moved from the file's values.
  const Weights original = read_weights(gpt_tiny());
  EXPECT_EQ(run.weights.by_name.size(), original.by_name.size());
  EXPECT_FALSE(bitwise_equal(run.weights, original));
}

// run_plan on one rank throws InvalidArgument whose message has `expected`.
void expect_refused(const RunOptions& o, const std::string& expected) {
  auto comms = make_in_process_communicators(1);
  try {
    run_plan(o, *comms[0]);
    FAIL() << "expected InvalidArgument with: " << expected;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

TEST(ApartRun, RefusesAWorldOfAnotherSizeBeforeAnyWork) {
  const fs::path dir = scratch("world_size");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  RunOptions o;
  o.plan = plan.string();
  o.steps = 1;
  expect_refused(o, "mpirun -np 2");
}

TEST(ApartRun, RefusesAModelWhoseBytesAreNotThePlans) {
  const fs::path dir = scratch("sha");
  const fs::path plan = make_plan(gpt_tiny(), {{1}, 1, Schedule::k1F1B, {}}, 8, dir / "plan");
  models::ZooOptions z = models::options_for("gpt-tiny");
  z.seed = 99;
  const fs::path other = dir / "other.onnx";
  models::write_zoo_model(z, other.string());
  RunOptions o;
  o.plan = plan.string();
  o.model = other.string();
  o.steps = 1;
  expect_refused(o, "not the one the plan was made for");
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

// A plan priced at mixed precision (any GPU preset) runs at it unless --precision says otherwise, and says so; the
// step lines carry tokens/s and --metrics gets one object per step.
TEST(ApartRunCli, RunsAtThePlansPrecisionUnlessToldAndWritesMetrics) {
  const fs::path dir = scratch("cli_precision");
  const std::string model = gpt_tiny();
  const std::string plan = (dir / "plan").string();
  ASSERT_EQ(testing::run_apart("partition " + model + " --device h100 --devices 1 --batch 4 -q -o " + plan).code, 0);
  const std::string metrics = (dir / "metrics.jsonl").string();
  const auto planned = testing::run_apart("run " + plan + " --steps 2 --metrics " + metrics);
  const auto mixed = testing::run_apart("run " + plan + " --steps 2 --precision mixed");
  const auto fp32 = testing::run_apart("run " + plan + " --steps 2 --precision fp32");
  ASSERT_EQ(planned.code, 0) << planned.out;
  EXPECT_NE(planned.out.find("running at the plan's precision, mixed"), std::string::npos) << planned.out;
  EXPECT_NE(planned.out.find(" tokens/s="), std::string::npos) << planned.out;
  const auto loss = [](const testing::CommandRun& r) { return testing::number_after(r.out, "step=2 loss="); };
  ASSERT_TRUE(loss(planned) && loss(mixed) && loss(fp32)) << planned.out << mixed.out << fp32.out;
  EXPECT_EQ(*loss(planned), *loss(mixed));  // the same computation, printed alike
  EXPECT_NE(*loss(planned), *loss(fp32));   // bf16-rounded GEMM operands change the digits
  std::ifstream in(metrics);
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 2);
}

TEST(ApartRunCli, RunsUnderMpirunWithOneProcessPerRank) {
  if (testing::run_command("command -v mpirun >/dev/null 2>&1").code != 0 || !mpi_available()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("mpi");
  const fs::path plan = make_plan(gpt_tiny(), {{2, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const auto r = mpirun_apart_run(3, plan.string() + " --steps 2 --optimizer sgd --lr 0.05 --seed 3 --save-model " +
                                         (dir / "mpi.onnx").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[rank 2/3 stage 1 replica 0] step=2 loss="), std::string::npos) << r.out;
  // The same plan on threads: the same losses to the stated tolerance of printed ones (MPI may sum in another order).
  const Outcome threads = run_threads(plan, 2, dir / "threads");
  ASSERT_EQ(threads.losses.size(), 2u);
  const auto printed = testing::number_after(r.out, "[rank 2/3 stage 1 replica 0] step=2 loss=");
  ASSERT_TRUE(printed.has_value()) << r.out;
  EXPECT_NEAR(*printed, threads.losses[1], testing::printed_loss_tolerance(threads.losses[1])) << r.out;
}

}  // namespace
}  // namespace apart
