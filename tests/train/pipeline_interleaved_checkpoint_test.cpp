// apart run's checkpoints of interleaved plans: each rank writes one shard per chunk it holds (rank_R.chunk_C.apart:
// the chunk's params, optimizer state and ZeRO pieces) and the manifest records the chunk layout; a resume on the
// same plan continues bitwise (with tensor-parallel stages too), one at another ZeRO stage of the same chunks
// reshards, and one on a plan of other chunks or stages is refused naming both layouts.
#include <gtest/gtest.h>

#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/error.h"
#include "train/checkpoint.h"
#include "runtime/communicator.h"
#include "train/run_checkpoint_files.h"
#include "tests/train/pipeline_fixture.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using namespace apart::testing;

fs::path checkpoint_scratch(const std::string& name) {
  return testing::scratch("pipeline_interleaved_checkpoint_test", name);
}

struct CheckpointCase {
  const char* name;
  Shape shape;
};

// gpt-tiny on an interleaved plan of 2 stages × 2 chunks (one replica per stage, or ZeRO-1/3 over two), Adam: 4
// steps straight, and 2 steps checkpointed then resumed for 2 more, give the same losses and the same weights, bit
// for bit (the random state and the data are functions of the step; every chunk's params and optimizer state come
// back).
class InterleavedCheckpoints : public ::testing::TestWithParam<CheckpointCase> {};

TEST_P(InterleavedCheckpoints, FourStepsStraightEqualTwoPlusAResumedTwoBitwise) {
  const fs::path dir = checkpoint_scratch(GetParam().name);
  const fs::path plan = make_plan(gpt_tiny(), GetParam().shape, 8, dir / "plan");
  ASSERT_NO_FATAL_FAILURE(expect_resumes_bitwise(plan, plan, dir, Optimizer::kAdam, 1e-3, GetParam().name));
  const fs::path ck = dir / "ck";

  // One shard per rank and chunk it holds (chunk c on the ranks of stage c mod 2), and the manifest's chunk layout.
  const PlanDocument view = virtual_stage_view(read_plan(plan));
  ASSERT_EQ(view.stages.size(), 4u);
  int shards = 0;
  for (const PlanStageRecord& chunk : view.stages)
    for (int rank : chunk.devices) {
      const fs::path shard = ck / "step_2" / ("rank_" + std::to_string(rank) + ".chunk_" + std::to_string(chunk.id) + ".apart");
      ASSERT_TRUE(fs::exists(shard)) << shard;
      EXPECT_EQ(read_checkpoint(shard).meta.value("stage", -1), chunk.id) << shard;
      ++shards;
    }
  EXPECT_FALSE(fs::exists(ck / "step_2" / "rank_0.apart"));
  std::ifstream in(ck / "manifest.json");
  const nlohmann::json manifest = nlohmann::json::parse(in);
  EXPECT_EQ(manifest.at("shards"), shards);
  EXPECT_EQ(manifest.at("layout").at("positions"), 2);
  EXPECT_EQ(manifest.at("layout").at("stages").size(), 4u);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, InterleavedCheckpoints,
    ::testing::Values(CheckpointCase{"one_replica_per_stage", {{1, 1}, 2, Schedule::kInterleaved}},
                      // Each chunk's optimizer state in halves over its stage's pair.
                      CheckpointCase{"zero1_over_two_replicas_per_stage", {{2, 2}, 2, Schedule::kInterleaved, {}, 1}},
                      // And of the params: each chunk's files hold its pieces ("param/<name>[begin:end]").
                      CheckpointCase{"zero3_over_two_replicas_per_stage", {{2, 2}, 2, Schedule::kInterleaved, {}, 3}}),
    [](const ::testing::TestParamInfo<CheckpointCase>& info) { return std::string(info.param.name); });

// Tensor-parallel stages in the interleaved plan (TP 2 × PP 2, v = 2, as apart partition writes it): each TP rank's
// chunk files hold its slices, and 2 + resumed 2 Adam steps equal 4 straight, bit for bit.
TEST(AnInterleavedCheckpointWithTensorParallelStages, ResumesBitwiseFromEachTpRanksSlices) {
  const fs::path dir = checkpoint_scratch("tp2_pp2_v2");
  const fs::path plan = dir / "plan";
  const auto partitioned = testing::run_apart("partition " + gpt_tiny() + " --device cpu --devices 4 --stages 2 --tp 2 "
                                              "--replicas 1 --microbatches 2 --batch 8 --schedule interleaved "
                                              "--no-baselines -o " + plan.string());
  ASSERT_EQ(partitioned.code, 0) << partitioned.out;
  ASSERT_EQ(plan_world(plan), 4);
  ASSERT_NO_FATAL_FAILURE(expect_resumes_bitwise(plan, plan, dir, Optimizer::kAdam, 1e-3, "TP 2 x PP 2, v = 2"));
  const fs::path ck = dir / "ck";
  // Both TP ranks of stage 1 (ranks 2 and 3) wrote their slices of chunk 3, which differ.
  const Checkpoint a = read_checkpoint(ck / "step_2" / "rank_2.chunk_3.apart");
  const Checkpoint b = read_checkpoint(ck / "step_2" / "rank_3.chunk_3.apart");
  EXPECT_EQ(a.meta.value("tp_rank", -1), 0);
  EXPECT_EQ(b.meta.value("tp_rank", -1), 1);
}

// A ZeRO-1 checkpoint of the interleaved plan resumed on the same chunks and replicas without ZeRO (another plan.json,
// so through the resharding path: each chunk's pieces put together from both replicas' files of that chunk) continues
// bitwise as the uninterrupted ZeRO-1 run, which trains bitwise as the unsharded one.
TEST(AnInterleavedZeroCheckpoint, ResumesWithoutZeroOnTheSameChunksBitwise) {
  const fs::path dir = checkpoint_scratch("zero1_resumed_without_zero");
  const fs::path from = make_plan(gpt_tiny(), {{2, 2}, 2, Schedule::kInterleaved, {}, 1}, 8, dir / "from");
  const fs::path to = make_plan(gpt_tiny(), {{2, 2}, 2, Schedule::kInterleaved, {}, 0}, 8, dir / "to");
  expect_resumes_bitwise(from, to, dir, Optimizer::kAdamW, 1e-3, "ZeRO-1 resumed without ZeRO");
}

// A checkpoint resumed on a plan whose chunks or stages differ is refused on every rank (InvalidArgument), naming the
// checkpoint's layout and this plan's: the interleaved 2 × 2 checkpoint on the 1F1B plan of the same 2 stages and on
// 2 stages × 3 chunks, and the 1F1B checkpoint on the interleaved plan.
TEST(AnInterleavedCheckpoint, OnAPlanOfOtherChunksOrStagesIsRefusedNamingBothLayouts) {
  const fs::path dir = checkpoint_scratch("refused");
  const fs::path interleaved = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::kInterleaved}, 8, dir / "interleaved");
  const fs::path three_chunks = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::kInterleaved, {}, 0, 3}, 8, dir / "v3");
  const fs::path one_f_one_b = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B}, 8, dir / "1f1b");
  const fs::path ck_interleaved = dir / "ck_interleaved", ck_1f1b = dir / "ck_1f1b";
  fs::create_directories(ck_interleaved);
  fs::create_directories(ck_1f1b);
  run_threads(interleaved, 1, dir / "first_interleaved", Optimizer::kSgd, 0.05, ck_interleaved.string());
  run_threads(one_f_one_b, 1, dir / "first_1f1b", Optimizer::kSgd, 0.05, ck_1f1b.string());
  const std::string two_by_two = "4 chunks over 2 stages (interleaved, v = 2)";
  struct Refusal {
    fs::path plan, checkpoint;
    std::string expected;
  };
  for (const Refusal& r : {Refusal{one_f_one_b, ck_interleaved, "of " + two_by_two + " (this plan has 2 stages)"},
                           Refusal{three_chunks, ck_interleaved,
                                   "of " + two_by_two + " (this plan has 6 chunks over 2 stages (interleaved, v = 3))"},
                           Refusal{interleaved, ck_1f1b, "of 2 stages (this plan has " + two_by_two + ")"}}) {
    RunOptions o = run_options_like_reference(r.plan, 2);
    o.resume = r.checkpoint.string();
    expect_every_rank_refuses(run_ranks(2, CommOptions{60}, [&](int, Communicator& comm) { run_plan(o, comm); }),
                              r.expected);
  }
}

// A manifest whose layout is not an object (hand-edited, or not apart's) is refused on every rank as InvalidArgument
// naming the field, not read as an empty layout or left to throw from the JSON library.
TEST(ACheckpointManifest, WhoseLayoutIsNotAnObjectIsRefusedNamingTheField) {
  const fs::path dir = checkpoint_scratch("bad_layout");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::kInterleaved}, 8, dir / "plan");
  const fs::path ck = dir / "ck";
  fs::create_directories(ck);
  run_threads(plan, 1, dir / "first", Optimizer::kSgd, 0.05, ck.string());
  nlohmann::ordered_json manifest;
  {
    std::ifstream in(ck / "manifest.json");
    manifest = nlohmann::ordered_json::parse(in);
  }
  manifest["layout"] = nlohmann::ordered_json::array();
  // Sealed again: a manifest apart wrote wrong, not one damaged after (that is CorruptData, pipeline_preemption_test).
  std::ofstream(ck / "manifest.json") << sealed_manifest_text(manifest);
  RunOptions o = run_options_like_reference(plan, 2);
  o.resume = ck.string();
  expect_every_rank_refuses(run_ranks(2, CommOptions{60}, [&](int, Communicator& comm) { run_plan(o, comm); }),
                            "layout");
}

// One process per rank: the threads' interleaved checkpoint resumed under mpirun -np 2 prints the threads' resumed
// step-4 loss (to MPI's summation order).
TEST(AnInterleavedCheckpointUnderMpirun, ResumesAsOnThreads) {
  if (testing::run_command("command -v mpirun >/dev/null 2>&1").code != 0 || !mpi_available()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = checkpoint_scratch("mpirun");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::kInterleaved}, 8, dir / "plan");
  const fs::path ck = dir / "ck";
  fs::create_directories(ck);
  run_threads(plan, 2, dir / "first", Optimizer::kAdamW, 1e-3, ck.string());
  const Outcome threads = run_threads(plan, 4, dir / "threads", Optimizer::kAdamW, 1e-3, "", ck.string());
  ASSERT_EQ(threads.losses.size(), 2u);
  const auto r = mpirun_apart_run(2, plan.string() + " --steps 4 --optimizer adamw --lr 1e-3 --seed 3 --resume " + ck.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto printed = testing::number_after(r.out, "step=4 loss=");
  ASSERT_TRUE(printed.has_value()) << r.out;
  EXPECT_NEAR(*printed, threads.losses[1], testing::printed_loss_tolerance(threads.losses[1])) << r.out;
}

}  // namespace
}  // namespace apart
