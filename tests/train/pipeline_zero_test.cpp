// apart run with ZeRO-1, 2 and 3 (a stage's replicas shard the optimizer state, under ZeRO-2 the gradients, under
// ZeRO-3 the params between passes, runtime/zero_shards.h): against apart train on the whole batch, against the
// unsharded run bitwise (ZeRO-1, where the in-process reduce-scatter adds in the all-reduce's order), ZeRO-3 against
// ZeRO-2 bitwise (the same sums; only where the params live differs), checkpoints, what each rank holds, mpirun.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "graph/error.h"
#include "plan/plan.h"
#include "train/checkpoint.h"
#include "train/pipeline.h"
#include "tests/runtime/host_device_backend.h"
#include "tests/train/pipeline_fixture.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using namespace apart::testing;

fs::path scratch(const std::string& name) { return testing::scratch("pipeline_zero_test", name); }

struct Case {
  const char* name;
  Shape shape;
};

class ZeroPlans : public ::testing::TestWithParam<Case> {};

// SGD as train_reference runs it; AdamW below, where the sharded state matters.
TEST_P(ZeroPlans, TrainAsOneProcessTrainsOnTheWholeBatch) {
  const Case& c = GetParam();
  const fs::path dir = scratch(c.name);
  constexpr int64_t kBatch = 8, kSteps = 3;
  const Outcome reference = train_reference(gpt_tiny(), kBatch, kSteps, dir);
  const fs::path plan = make_plan(gpt_tiny(), c.shape, kBatch, dir / "plan");
  const Outcome run = run_threads(plan, kSteps, dir);
  expect_same_training(reference, run, read_weights(gpt_tiny()), c.name);
  for (const RunResult& r : run.ranks)
    EXPECT_EQ(r.zero, c.shape.replicas[static_cast<size_t>(r.role.stage)] > 1 ? c.shape.zero : 0) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ZeroPlans,
    ::testing::Values(Case{"zero1_one_stage_two_replicas_m2", {{2}, 2, Schedule::k1F1B, {}, 1}},
                      Case{"zero2_one_stage_two_replicas_m2", {{2}, 2, Schedule::k1F1B, {}, 2}},
                      // Two stages of two replicas: the tied embedding stays whole (all-reduced), the rest sharded.
                      Case{"zero1_two_stages_of_two_replicas_m2", {{2, 2}, 2, Schedule::k1F1B, {}, 1}},
                      Case{"zero2_two_stages_of_two_replicas_m4", {{2, 2}, 4, Schedule::k1F1B, {}, 2}},
                      // Three replicas: buckets padded to a multiple of 3, slices of 3, 3 and 2 samples.
                      Case{"zero2_stages_of_three_and_two_uneven_replicas_m2", {{3, 2}, 2, Schedule::k1F1B, {}, 2}},
                      Case{"zero1_gpipe_with_recompute_m2", {{2, 1}, 2, Schedule::kGPipe, {true, false}, 1}},
                      // ZB-H1's W passes produce the gradients that ZeRO-2 reduce-scatters.
                      Case{"zero2_zb_h1_two_stages_of_two_replicas_m4", {{2, 2}, 4, Schedule::kZbH1, {}, 2}},
                      // ZeRO-3: each forward and backward gathers the params it reads, and drops them after.
                      Case{"zero3_one_stage_two_replicas_m2", {{2}, 2, Schedule::k1F1B, {}, 3}},
                      Case{"zero3_two_stages_of_two_replicas_m4", {{2, 2}, 4, Schedule::k1F1B, {}, 3}},
                      Case{"zero3_stages_of_three_and_two_uneven_replicas_m2", {{3, 2}, 2, Schedule::k1F1B, {}, 3}},
                      // A recomputing stage's backward re-runs its forward: it gathers for that too.
                      Case{"zero3_gpipe_with_recompute_m2", {{2, 2}, 2, Schedule::kGPipe, {true, false}, 3}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(ZeroOne, TrainsWithAdamWBitwiseAsTheUnshardedRunAndHoldsHalfTheState) {
  const fs::path dir = scratch("zero1_bitwise");
  const fs::path plain = make_plan(gpt_tiny(), {{2, 2}, 2, Schedule::k1F1B, {}, 0}, 8, dir / "plain");
  const fs::path sharded = make_plan(gpt_tiny(), {{2, 2}, 2, Schedule::k1F1B, {}, 1}, 8, dir / "sharded");
  const Outcome a = run_threads(plain, 3, dir / "a", Optimizer::kAdamW, 1e-3);
  const Outcome b = run_threads(sharded, 3, dir / "b", Optimizer::kAdamW, 1e-3);
  ASSERT_EQ(b.losses.size(), 3u);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_TRUE(bitwise_equal(a.weights, b.weights));
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    // Half the state but for the tied embedding (whole on both replicas) and a bucket's padding.
    EXPECT_LT(b.ranks[r].optimizer_state_bytes, a.ranks[r].optimizer_state_bytes * 3 / 4) << "rank " << r;
    EXPECT_GE(b.ranks[r].optimizer_state_bytes, a.ranks[r].optimizer_state_bytes / 2 - 64) << "rank " << r;
    EXPECT_EQ(b.ranks[r].gradient_bytes, a.ranks[r].gradient_bytes) << "ZeRO-1 keeps whole gradients";
  }
}

TEST(ZeroTwo, TrainsWithAdamWAsTheUnshardedRunAndKeepsAShareOfTheGradients) {
  const fs::path dir = scratch("zero2_adamw");
  const Outcome reference = train_reference(gpt_tiny(), 8, 3, dir, 1e-3, Optimizer::kAdamW);
  const fs::path plain = make_plan(gpt_tiny(), {{2}, 4, Schedule::k1F1B, {}, 0}, 8, dir / "plain");
  const fs::path sharded = make_plan(gpt_tiny(), {{2}, 4, Schedule::k1F1B, {}, 2}, 8, dir / "sharded");
  const Outcome a = run_threads(plain, 3, dir / "a", Optimizer::kAdamW, 1e-3);
  const Outcome b = run_threads(sharded, 3, dir / "b", Optimizer::kAdamW, 1e-3);
  expect_same_training(reference, b, read_weights(gpt_tiny()), "zero2 adamw");
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    const double whole = static_cast<double>(a.ranks[r].gradient_bytes);
    EXPECT_NEAR(static_cast<double>(b.ranks[r].gradient_bytes), whole / 2, 64) << "rank " << r;
    EXPECT_NEAR(static_cast<double>(b.ranks[r].optimizer_state_bytes), a.ranks[r].optimizer_state_bytes / 2.0, 64);
  }
}

// ZeRO-3 adds the same gradients in the same order as ZeRO-2 and steps the same pieces; only where the params live
// between passes differs (pieces of their own, gathered whole for each pass): bitwise the same training.
void expect_zero3_bitwise_as_zero2(const Shape& shape, const std::string& name) {
  const fs::path dir = scratch(name);
  Shape two = shape, three = shape;
  two.zero = 2;
  three.zero = 3;
  const fs::path plan2 = make_plan(gpt_tiny(), two, 8, dir / "zero2");
  const fs::path plan3 = make_plan(gpt_tiny(), three, 8, dir / "zero3");
  const Outcome a = run_threads(plan2, 3, dir / "a", Optimizer::kAdamW, 1e-3);
  const Outcome b = run_threads(plan3, 3, dir / "b", Optimizer::kAdamW, 1e-3);
  ASSERT_EQ(b.losses.size(), 3u) << name;
  EXPECT_EQ(a.losses, b.losses) << name;
  EXPECT_TRUE(bitwise_equal(a.weights, b.weights)) << name;
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    EXPECT_EQ(b.ranks[r].zero, 3) << name;
    EXPECT_EQ(b.ranks[r].gradient_bytes, a.ranks[r].gradient_bytes) << name << ": the gradients shard as ZeRO-2's";
    EXPECT_EQ(b.ranks[r].optimizer_state_bytes, a.ranks[r].optimizer_state_bytes) << name;
    EXPECT_EQ(a.ranks[r].param_bytes, a.ranks[r].params * 4) << name << ": ZeRO-2 holds its params whole";
  }
}

TEST(ZeroThree, TrainsBitwiseAsZeroTwoAndHoldsHalfTheParamsBetweenPasses) {
  expect_zero3_bitwise_as_zero2({{2}, 4, Schedule::k1F1B, {}, 3}, "zero3_one_stage");
  // One stage: every param is sharded (the tied embedding is tied within the stage), so each replica keeps half
  // of the params' bytes, but for a bucket's padding.
  const fs::path dir = scratch("zero3_half");
  const Outcome run = run_threads(make_plan(gpt_tiny(), {{2}, 2, Schedule::k1F1B, {}, 3}, 8, dir / "plan"), 1, dir / "run");
  ASSERT_EQ(run.ranks.size(), 2u);
  for (const RunResult& r : run.ranks) EXPECT_NEAR(static_cast<double>(r.param_bytes), r.params * 4 / 2.0, 64);
}

TEST(ZeroThree, KeepsTheTiedEmbeddingWholeAcrossTwoStagesAndTrainsBitwiseAsZeroTwo) {
  expect_zero3_bitwise_as_zero2({{2, 2}, 2, Schedule::k1F1B, {}, 3}, "zero3_two_stages");
}

// ZB-H1 splits each backward into a B pass (input gradients) and a W pass (weight gradients) that runs later: both
// read params, so each gathers its own, while a bucket the B pass began may still be filling.
TEST(ZeroThree, GathersForZbH1sWeightPassAndTrainsAsApartTrainAndBitwiseAsZeroTwo) {
  const Shape shape{{2, 2}, 4, Schedule::kZbH1, {}, 3};
  const fs::path dir = scratch("zero3_zb_h1");
  const Outcome reference = train_reference(gpt_tiny(), 8, 3, dir);
  const Outcome run = run_threads(make_plan(gpt_tiny(), shape, 8, dir / "plan"), 3, dir / "run");
  expect_same_training(reference, run, read_weights(gpt_tiny()), "zero3 zb-h1");
  expect_zero3_bitwise_as_zero2(shape, "zero3_zb_h1_bitwise");
}

// Each rank on a device backend of its own (host_device_backend.h: buffers the host may not touch): ZeRO-1's
// gathered shards are copied into the device params, ZeRO-3's gathered params uploaded for each pass; the same
// losses and weights as on the CPU, bitwise.
TEST(ZeroOnADeviceBackend, TrainsBitwiseAsOnTheCpu) {
  for (int zero : {1, 3}) {
    const fs::path dir = scratch("device_zero" + std::to_string(zero));
    const fs::path plan = make_plan(gpt_tiny(), {{2, 2}, 2, Schedule::k1F1B, {}, zero}, 8, dir / "plan");
    std::vector<std::unique_ptr<HostDeviceBackend>> devices;
    for (int r = 0; r < 4; ++r) devices.push_back(std::make_unique<HostDeviceBackend>());
    auto device_of = [&](int rank) -> Backend* { return devices[static_cast<size_t>(rank)].get(); };
    const Outcome cpu = run_threads(plan, 3, dir / "cpu", Optimizer::kAdamW, 1e-3);
    const Outcome device = run_threads(plan, 3, dir / "device", Optimizer::kAdamW, 1e-3, "", "", device_of);
    ASSERT_EQ(device.losses.size(), 3u) << "ZeRO-" << zero;
    EXPECT_EQ(device.losses, cpu.losses) << "ZeRO-" << zero;
    EXPECT_TRUE(bitwise_equal(device.weights, cpu.weights)) << "ZeRO-" << zero;
  }
}

class ZeroCheckpoints : public ::testing::TestWithParam<int> {};

TEST_P(ZeroCheckpoints, FourStepsStraightEqualTwoPlusAResumedTwoBitwise) {
  const int zero = GetParam();
  const fs::path dir = scratch("zero_resume_" + std::to_string(zero));
  const fs::path plan = make_plan(gpt_tiny(), {{2, 2}, 2, Schedule::k1F1B, {}, zero}, 8, dir / "plan");
  ASSERT_NO_FATAL_FAILURE(expect_resumes_bitwise(plan, plan, dir, Optimizer::kAdam, 1e-3, "ZeRO-" + std::to_string(zero)));
  const fs::path ck = dir / "ck";
  // ZeRO-1/2 ranks save their params whole; ZeRO-3 ranks their pieces ("param/<name>[begin:end]") of all but the
  // tied embedding, as they hold them.
  int pieces = 0;
  for (const auto& [name, t] : read_checkpoint(ck / "step_2" / "rank_0.apart").tensors)
    if (name.rfind("param/", 0) == 0 && name.find('[') != std::string::npos) ++pieces;
  if (zero >= 3) EXPECT_GT(pieces, 0);
  else EXPECT_EQ(pieces, 0);
}

INSTANTIATE_TEST_SUITE_P(Zero, ZeroCheckpoints, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) { return "zero" + std::to_string(info.param); });

// A checkpoint written over 2 replicas under ZeRO-1 or ZeRO-3 (each rank its pieces of the optimizer state, under
// ZeRO-3 of the params too) resumes on a plan of the same stage with 1 replica (no ZeRO) and with 4 (the same ZeRO
// stage): the shards are put together and cut anew. 2 + 2 AdamW steps train as apart train's 4 within the suite's
// tolerance; not bitwise, because the resumed steps add the gradients over another number of replicas (another order).
class ZeroCheckpointsAtAnotherReplicaCount : public ::testing::TestWithParam<int> {};

TEST_P(ZeroCheckpointsAtAnotherReplicaCount, ResumeOnOneAndOnFourReplicasAsApartTrainTrains) {
  const int zero = GetParam();
  const fs::path dir = scratch("zero_reshard_" + std::to_string(zero));
  const Outcome reference = train_reference(gpt_tiny(), 8, 4, dir, 1e-3, Optimizer::kAdamW);
  const fs::path two = make_plan(gpt_tiny(), {{2}, 2, Schedule::k1F1B, {}, zero}, 8, dir / "two");
  const fs::path ck = dir / "ck";
  fs::create_directories(ck);
  const Outcome first = run_threads(two, 2, dir / "first", Optimizer::kAdamW, 1e-3, ck.string());
  ASSERT_EQ(first.losses.size(), 2u);
  for (int replicas : {1, 4}) {
    const std::string what = "ZeRO-" + std::to_string(zero) + " on 2 replicas resumed on " + std::to_string(replicas);
    const fs::path plan = make_plan(gpt_tiny(), {{replicas}, 2, Schedule::k1F1B, {}, zero}, 8,
                                    dir / ("plan" + std::to_string(replicas)));
    Outcome rest = run_threads(plan, 4, dir / ("rest" + std::to_string(replicas)), Optimizer::kAdamW, 1e-3, "", ck.string());
    ASSERT_EQ(rest.losses.size(), 2u) << what;
    rest.losses.insert(rest.losses.begin(), first.losses.begin(), first.losses.end());
    expect_same_training(reference, rest, read_weights(gpt_tiny()), what);
  }
}

INSTANTIATE_TEST_SUITE_P(Zero, ZeroCheckpointsAtAnotherReplicaCount, ::testing::Values(1, 3),
                         [](const ::testing::TestParamInfo<int>& info) { return "zero" + std::to_string(info.param); });

// Where the sums run in the same order, resharding is exact: ZeRO-1 trains bitwise as the unsharded run and ZeRO-3 as
// ZeRO-2, so a ZeRO-1 checkpoint resumed on the same replicas without ZeRO, and a ZeRO-3 one under ZeRO-2 (another
// plan.json, so through the resharding path), continue bitwise as the uninterrupted run.
TEST(ZeroCheckpointsAtAnotherZeroStage, ContinueBitwiseWhereTheSumsRunInTheSameOrder) {
  const fs::path dir = scratch("zero_reshard_bitwise");
  for (const auto& [saved, resumed] : {std::pair{1, 0}, std::pair{3, 2}}) {
    const std::string what = "ZeRO-" + std::to_string(saved) + " resumed under ZeRO-" + std::to_string(resumed);
    const fs::path from = make_plan(gpt_tiny(), {{2}, 2, Schedule::k1F1B, {}, saved}, 8, dir / ("from" + std::to_string(saved)));
    const fs::path to = make_plan(gpt_tiny(), {{2}, 2, Schedule::k1F1B, {}, resumed}, 8, dir / ("to" + std::to_string(saved)));
    expect_resumes_bitwise(from, to, dir / ("run" + std::to_string(saved)), Optimizer::kAdamW, 1e-3, what);
  }
}

// A plan whose stages differ from the checkpoint's is refused on every rank, naming what differs.
TEST(AZeroCheckpoint, OnAPlanOfOtherStagesIsRefusedNamingThem) {
  const fs::path dir = scratch("zero_reshard_refused");
  const fs::path one_stage = make_plan(gpt_tiny(), {{2}, 2, Schedule::k1F1B, {}, 1}, 8, dir / "one");
  const fs::path two_stages = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}, 1}, 8, dir / "two");
  const fs::path ck = dir / "ck";
  fs::create_directories(ck);
  run_threads(one_stage, 1, dir / "first", Optimizer::kAdamW, 1e-3, ck.string());
  RunOptions o = run_options_like_reference(two_stages, 2, Optimizer::kAdamW, 1e-3);
  o.resume = ck.string();
  expect_every_rank_refuses(run_ranks(2, CommOptions{60}, [&](int, Communicator& comm) { run_plan(o, comm); }),
                            "of 1 stage (this plan has 2 stages)");
}

// One process per rank: a ZeRO-3 checkpoint of 2 replicas on threads resumed under mpirun -np 4 continues as the
// threads' resumed run (the step-4 loss it prints, to MPI's summation order).
TEST(ZeroUnderMpirun, ResumesATwoReplicaCheckpointOnFourRanks) {
  if (testing::run_command("command -v mpirun >/dev/null 2>&1").code != 0 || !mpi_available()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("zero_reshard_mpirun");
  const fs::path two = make_plan(gpt_tiny(), {{2}, 2, Schedule::k1F1B, {}, 3}, 8, dir / "two");
  const fs::path four = make_plan(gpt_tiny(), {{4}, 2, Schedule::k1F1B, {}, 3}, 8, dir / "four");
  const fs::path ck = dir / "ck";
  fs::create_directories(ck);
  run_threads(two, 2, dir / "first", Optimizer::kAdamW, 1e-3, ck.string());
  const Outcome threads = run_threads(four, 4, dir / "threads", Optimizer::kAdamW, 1e-3, "", ck.string());
  ASSERT_EQ(threads.losses.size(), 2u);
  const auto r = mpirun_apart_run(4, four.string() + " --steps 4 --optimizer adamw --lr 1e-3 --seed 3 --resume " + ck.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto printed = testing::number_after(r.out, "step=4 loss=");
  ASSERT_TRUE(printed.has_value()) << r.out;
  EXPECT_NEAR(*printed, threads.losses[1], testing::printed_loss_tolerance(threads.losses[1])) << r.out;
}

// One process per rank: MPI's reduce-scatter and all-gather (ZeRO-3's before every pass) give the threads' losses,
// and ZeRO-3 writes the same model bytes as ZeRO-2 (the same sums in the same order on the same ranks).
TEST(ZeroUnderMpirun, GivesTheThreadsLossesWithMpisReduceScatterAndAllgather) {
  if (testing::run_command("command -v mpirun >/dev/null 2>&1").code != 0 || !mpi_available()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("zero_mpi");
  std::vector<Weights> saved;
  for (int zero : {2, 3}) {
    const std::string z = "zero" + std::to_string(zero);
    const fs::path plan = make_plan(gpt_tiny(), {{3}, 2, Schedule::k1F1B, {}, zero}, 8, dir / z);
    Outcome threads;
    ASSERT_NO_FATAL_FAILURE(run_under_mpirun_and_on_threads(3, plan, dir, z, &threads, &saved.emplace_back()));
  }
  EXPECT_TRUE(bitwise_equal(saved[0], saved[1])) << "ZeRO-3 under mpirun trained other weights than ZeRO-2";
}

// Two stages of two replicas under 1F1B: each replica pair gathers before every pass while activations and
// gradients cross between the stages: the threads' losses and weights (to the suite's tolerance).
TEST(ZeroUnderMpirun, GathersBeforeEveryPassOfAPipelineWithoutDeadlock) {
  if (testing::run_command("command -v mpirun >/dev/null 2>&1").code != 0 || !mpi_available()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("zero3_mpi_pipeline");
  const fs::path plan = make_plan(gpt_tiny(), {{2, 2}, 4, Schedule::k1F1B, {}, 3}, 8, dir / "plan");
  Outcome threads;
  Weights saved;
  ASSERT_NO_FATAL_FAILURE(run_under_mpirun_and_on_threads(4, plan, dir, "mpi", &threads, &saved));
  // MPI's collectives may add in another order than the threads': not asserted bitwise.
  expect_same_training(threads, Outcome{threads.losses, saved, {}}, read_weights(gpt_tiny()), "mpirun zero3");
}

// One process per rank, so each counts its own tensors: under ZeRO-0, 1, 2 and 3 a rank's measured peak (its
// params, optimizer state, gradients, stash, the passes' transients, the buckets and ZeRO-3's gathered params) is
// the plan's memory estimate for it within 10 % (docs/runtime.md, "ZeRO"), and each ZeRO stage holds less than
// the one before, as the plan says.
TEST(ZeroUnderMpirun, PeaksAtThePlansMemoryEstimate) {
  if (testing::run_command("command -v mpirun >/dev/null 2>&1").code != 0 || !mpi_available()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("zero_memory");
  std::vector<std::pair<double, double>> figures;
  for (int zero : {0, 1, 2, 3}) {
    const fs::path plan = dir / ("z" + std::to_string(zero));
    const auto p = testing::run_apart("partition " + gpt_tiny() + " --device cpu --devices 2 --stages 1 --replicas 2 "
                                      "--microbatches 2 --batch 8 --optimizer adam --zero " + std::to_string(zero) +
                                      " --no-baselines -q -o " + plan.string());
    ASSERT_EQ(p.code, 0) << p.out;
    const auto r = mpirun_apart_run(2, plan.string() + " --steps 2");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto [measured, planned] = peak_and_plan(r.out, "[rank 0/2 stage 0 replica 0]");
    ASSERT_GT(measured, 0) << r.out;
    ASSERT_GT(planned, 0) << r.out;
    std::printf("ZeRO-%d: peak %.0f B, plan %.0f B (%.3f)\n", zero, measured, planned, measured / planned);
    EXPECT_NEAR(measured, planned, 0.1 * planned) << "ZeRO-" << zero;
    if (!figures.empty()) {
      EXPECT_LT(measured, figures.back().first) << "ZeRO-" << zero << " against ZeRO-" << zero - 1;
      EXPECT_LT(planned, figures.back().second) << "ZeRO-" << zero << " against ZeRO-" << zero - 1;
    }
    figures.emplace_back(measured, planned);
  }
}

}  // namespace
}  // namespace apart
