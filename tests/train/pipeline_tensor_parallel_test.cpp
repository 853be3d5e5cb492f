// apart run with tensor-parallel stages (codegen/tensor_parallel_shard.h: column/row-split linears, heads divided,
// ai.apart.TpCopy/TpAllReduce over each replica's TP group, and under sequence parallelism TpAllGather/
// TpReduceScatter/TpScatter): against apart train on the whole batch (TP 2 × PP 1, TP 2 × PP 2, TP 2 × DP 2, ZB-H1,
// ZeRO, sequence parallelism), what each rank holds, --save-model's gathered weights, checkpoints and resume, and one
// process per rank under mpirun.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "plan/plan.h"
#include "plan/trace.h"
#include "train/checkpoint.h"
#include "train/pipeline.h"
#include "tests/support/read_model.h"
#include "tests/train/pipeline_fixture.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using namespace apart::testing;

fs::path scratch(const std::string& name) { return testing::scratch("pipeline_tensor_parallel_test", name); }
// The folder scratch(name) made, as a test left it.
fs::path scratch_path(const std::string& name) {
  return testing::process_temp_dir("pipeline_tensor_parallel_test") / name;
}

struct Case {
  const char* name;
  TpShape shape;
  std::vector<int> degrees = {};  // per stage (with_stage_degrees); empty: every stage shape.tp
};

class TensorParallelPlans : public ::testing::TestWithParam<Case> {};

// SGD, lr 0.05, 3 steps (train_reference): losses within 2e-5 relative, each param's change within 1e-3 of
// apart train's (expect_same_training); every rank trains a strict part of its stage's params.
TEST_P(TensorParallelPlans, TrainAsOneProcessTrainsOnTheWholeBatch) {
  const Case& c = GetParam();
  const fs::path dir = scratch(c.name);
  constexpr int64_t kBatch = 8, kSteps = 3;
  const Outcome reference = train_reference(gpt_tiny(), kBatch, kSteps, dir);
  fs::path plan = make_tp_plan(c.shape, kBatch, dir / "plan");
  if (!c.degrees.empty()) plan = with_stage_degrees(plan, c.degrees);
  const Outcome run = run_threads(plan, kSteps, dir);
  expect_same_training(reference, run, read_weights(gpt_tiny()), c.name);
  ASSERT_EQ(run.ranks.size(), static_cast<size_t>(plan_devices(read_plan(plan))));
  const int64_t whole = total_params(read_weights(gpt_tiny()));
  // The pair holds about one copy of the model between them, not two: everything is split but the norms, the
  // position embeddings, a region a stage (or chunk) boundary cuts and the tied table's copy in a second stage.
  int64_t held = 0;
  for (const RunResult& r : run.ranks) held += r.params;
  EXPECT_LT(static_cast<double>(held) / c.shape.replicas, 1.5 * static_cast<double>(whole)) << c.name;
  for (const RunResult& r : run.ranks) {
    EXPECT_LT(r.params, whole) << c.name;
    if (c.shape.schedule == Schedule::kInterleaved) {  // the chunks are cut between regions (partition/virtual_stages.h)
      EXPECT_TRUE(r.tp_whole_regions.empty()) << c.name << ": " << r.tp_whole_regions.front();
    }
    EXPECT_EQ(r.reports, r.role.tp_rank == 0 && r.role.replica == 0 && r.role.stage == c.shape.stages - 1)
        << c.name << " rank stage " << r.role.stage << " tp " << r.role.tp_rank;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, TensorParallelPlans,
    ::testing::Values(Case{"tp2_pp1_m2", {1, 1, 2, 2}},
                      // The tied embedding is in both stages: its gradient is summed per TP rank.
                      Case{"tp2_pp2_m4", {2, 1, 2, 4}},
                      Case{"tp2_pp2_gpipe_m2", {2, 1, 2, 2, Schedule::kGPipe}},
                      // ZB-H1: the input-gradient pass holds TpCopy's backward all-reduce, the W pass none.
                      Case{"tp2_pp2_zb_h1_m4", {2, 1, 2, 4, Schedule::kZbH1}},
                      // Two replicas of a TP pair: each TP rank's replicas all-reduce their slices.
                      Case{"tp2_dp2_m2", {1, 2, 2, 2}},
                      Case{"tp2_dp2_zero1_m2", {1, 2, 2, 2, Schedule::k1F1B, 1}},
                      // ZeRO-3: each TP rank's replicas gather their slices before every pass.
                      Case{"tp2_dp2_zero3_m2", {1, 2, 2, 2, Schedule::k1F1B, 3}},
                      // Whole-stage recomputation: the backward re-runs the forward, its all-reduces with it. The
                      // planner cuts this plan inside /blocks.1/attn: both stages compute that region whole.
                      Case{"tp2_pp2_recompute_m2", {2, 1, 2, 2, Schedule::k1F1B, 0, "on"}},
                      // Sequence parallelism: the values between regions in halves of the sequence; the norms'
                      // params' gradients summed over the TP pair (their TpCopy) before the step and the norm.
                      Case{"tp2_pp1_sp_m2", {1, 1, 2, 2, Schedule::k1F1B, 0, "off", true}},
                      Case{"tp2_pp2_sp_m4", {2, 1, 2, 4, Schedule::k1F1B, 0, "off", true}},
                      Case{"tp2_pp2_sp_zb_h1_m4", {2, 1, 2, 4, Schedule::kZbH1, 0, "off", true}},
                      Case{"tp2_dp2_sp_m2", {1, 2, 2, 2, Schedule::k1F1B, 0, "off", true}},
                      // The backward re-runs the forward's reduce-scatters and all-gathers; ZeRO-2 reduce-scatters
                      // the norms' gradients over the replicas after their TpCopy summed them over the TP pair.
                      Case{"tp2_pp2_sp_recompute_m2", {2, 1, 2, 2, Schedule::k1F1B, 0, "on", true}},
                      Case{"tp2_dp2_sp_zero2_m2", {1, 2, 2, 2, Schedule::k1F1B, 2, "off", true}},
                      // Interleaved (v = 2): each chunk_C.onnx cut into its TP pair's shards, every chunk of a rank on
                      // its stage's TP group; the tied embedding (chunks 0 and 3) summed per TP rank.
                      Case{"tp2_pp2_interleaved_v2_m2", {2, 1, 2, 2, Schedule::kInterleaved}},
                      Case{"tp2_pp2_interleaved_v2_m4", {2, 1, 2, 4, Schedule::kInterleaved}},
                      Case{"tp2_pp2_sp_interleaved_v2_m2", {2, 1, 2, 2, Schedule::kInterleaved, 0, "off", true}},
                      Case{"tp2_pp2_dp2_interleaved_v2_m2", {2, 2, 2, 2, Schedule::kInterleaved}},
                      // Stages of different degrees: a pair's TP rank 0 sends each activation to the one rank, which
                      // sends each gradient to both TP ranks (and the other way round: tp_send_targets); the tied
                      // embedding, cut by the pair's vocabulary regions and whole on the other stage, summed whole.
                      Case{"tp2_then_tp1_m2", {2, 1, 2, 2}, {2, 1}},
                      Case{"tp1_then_tp2_m4", {2, 1, 2, 4}, {1, 2}},
                      Case{"tp2_sp_then_tp1_m2", {2, 1, 2, 2, Schedule::k1F1B, 0, "off", true}, {2, 1}},
                      Case{"tp1_then_tp2_dp2_m2", {2, 2, 2, 2}, {1, 2}},
                      Case{"tp2_then_tp1_interleaved_v2_m2", {2, 1, 2, 2, Schedule::kInterleaved}, {2, 1}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// apart zoo's GPT, BERT and T5 (2 layers, 4 heads, hidden 64, random weights): T5's relative position bias, computed
// from its table and read sliced by every attention, goes through TpCopy and a Slice per reader.
// apart zoo's `family` at 2 layers, 4 heads, hidden 64, 16 positions, on a `shape` plan: 3 SGD steps as apart train's.
// `ranks`: where to put each rank's RunResult.
// `zoo_args`: more apart zoo flags; `seq`: the positions.
void expect_zoo_model_trains_as_apart_train(const std::string& family, const TpShape& shape, const std::string& name,
                                            int64_t vocab = 128, std::vector<RunResult>* ranks = nullptr,
                                            const std::string& zoo_args = "", int64_t seq = 16) {
  const fs::path dir = scratch(name);
  const fs::path model = dir / (family + ".onnx");
  const auto z = testing::run_apart("zoo " + family + " --layers 2 --hidden 64 --heads 4 --seq " + std::to_string(seq) +
                                    " --vocab " + std::to_string(vocab) + " " + zoo_args + " -q -o " + model.string());
  ASSERT_EQ(z.code, 0) << z.out;
  constexpr int64_t kBatch = 8, kSteps = 3;
  const Outcome reference = train_reference(model.string(), kBatch, kSteps, dir);
  const fs::path plan = make_tp_plan(shape, kBatch, dir / "plan", model.string());
  const Outcome run = run_threads(plan, kSteps, dir);
  expect_same_training(reference, run, read_weights(model), name);
  if (ranks) *ranks = run.ranks;
}

class ZooModelsUnderTensorParallelism : public ::testing::TestWithParam<std::string> {};

TEST_P(ZooModelsUnderTensorParallelism, TrainAsApartTrainOnTheWholeBatch) {
  expect_zoo_model_trains_as_apart_train(GetParam(), {2, 1, 2, 2}, "zoo_" + GetParam());
}

INSTANTIATE_TEST_SUITE_P(Families, ZooModelsUnderTensorParallelism, ::testing::Values("gpt", "bert", "t5"));

// Sequence parallelism on apart zoo's BERT (post-norm: the norm after each residual add runs on halves of the
// sequence, the pooler reads the first token all-gathered) and T5 (RMS norms as ReduceMean chains, the relative
// position bias computed whole), TP 2 × PP 2, 3 SGD steps.
class ZooModelsUnderSequenceParallelism : public ::testing::TestWithParam<std::string> {};

TEST_P(ZooModelsUnderSequenceParallelism, TrainAsApartTrainOnTheWholeBatch) {
  TpShape shape{2, 1, 2, 2};
  shape.sequence_parallel = true;
  expect_zoo_model_trains_as_apart_train(GetParam(), shape, "zoo_sp_" + GetParam());
}

INSTANTIATE_TEST_SUITE_P(Families, ZooModelsUnderSequenceParallelism, ::testing::Values("bert", "t5"));

// AdamW (lr 1e-3, 3 steps) under sequence parallelism: its update divides by the gradient's running RMS, so a
// norm's param whose gradient missed the other rank's half of the sequence would step visibly apart.
class ASequenceParallelRun : public ::testing::TestWithParam<Case> {};

TEST_P(ASequenceParallelRun, TrainsWithAdamWAsApartTrainDoes) {
  const Case& c = GetParam();
  const fs::path dir = scratch(std::string("adamw_") + c.name);
  const Outcome reference = train_reference(gpt_tiny(), 8, 3, dir, 1e-3, Optimizer::kAdamW);
  const fs::path plan = make_tp_plan(c.shape, 8, dir / "plan");
  const Outcome run = run_threads(plan, 3, dir, Optimizer::kAdamW, 1e-3);
  expect_same_training(reference, run, read_weights(gpt_tiny()), c.name);
}

INSTANTIATE_TEST_SUITE_P(Plans, ASequenceParallelRun,
                         ::testing::Values(Case{"tp2_pp1_sp", {1, 1, 2, 2, Schedule::k1F1B, 0, "off", true}},
                                           Case{"tp2_pp2_sp", {2, 1, 2, 4, Schedule::k1F1B, 0, "off", true}}),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// Reshape targets computed at run time (as torch exports write them: Shape → Gather → Concat) are divided by an
// inserted Div: gpt-tiny's stage file with every attention target behind a Concat (so no longer a constant the shard
// pass can rewrite) trains as apart train does.
TEST(ATensorParallelRunWithComputedReshapeTargets, TrainsAsApartTrain) {
  const fs::path dir = scratch("computed_targets");
  const fs::path plan = make_tp_plan({1, 1, 2, 2}, 8, dir / "plan");
  const fs::path file = plan / "stage_0.onnx";
  onnx::ModelProto stage = testing::read_proto(file);
  int wrapped = 0;
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;  // each Concat right before its Reshape
  for (const auto& n : stage.graph().node()) {
    onnx::NodeProto reshape = n;
    if (n.op_type() == "Reshape" && n.name().find("/attn/") != std::string::npos) {
      onnx::NodeProto* id = nodes.Add();
      id->set_op_type("Concat");
      id->set_name(n.name() + "/computed_target");
      id->add_input(n.input(1));
      id->add_output(n.name() + "/computed_target_output");
      onnx::AttributeProto* axis = id->add_attribute();
      axis->set_name("axis");
      axis->set_type(onnx::AttributeProto::INT);
      axis->set_i(0);
      reshape.set_input(1, id->output(0));
      ++wrapped;
    }
    *nodes.Add() = reshape;
  }
  ASSERT_EQ(wrapped, 8);  // 4 reshapes per attention, 2 blocks
  stage.mutable_graph()->mutable_node()->Swap(&nodes);
  std::ofstream(file, std::ios::binary) << stage.SerializeAsString();
  const Outcome reference = train_reference(gpt_tiny(), 8, 3, dir);
  const Outcome run = run_threads(plan, 3, dir);
  expect_same_training(reference, run, read_weights(gpt_tiny()), "computed targets");
}

// The two TP ranks of a stage hold complementary halves of each split weight: apart run's trained params per rank
// add up to the stage's with the replicated ones counted on both.
TEST(ATensorParallelStage, HoldsHalfOfEverySplitLinearAndOfTheVocabularyOnEachRank) {
  const fs::path dir = scratch("halves");
  const fs::path plan = make_tp_plan({1, 1, 2, 2}, 8, dir / "plan");
  const Outcome run = run_threads(plan, 1, dir);
  ASSERT_EQ(run.ranks.size(), 2u);
  EXPECT_EQ(run.ranks[0].params, run.ranks[1].params);
  const Weights w = read_weights(gpt_tiny());
  // The attention and MLP linears and their column biases of gpt-tiny's two blocks, and the tied embedding table
  // (the embedding's and the LM head's vocabulary rows).
  int64_t split = 0;
  for (const auto& [name, t] : w.by_name)
    if (name.find(".attn.") != std::string::npos || name.find(".mlp.0.") != std::string::npos ||
        (name.find(".mlp.2.weight") != std::string::npos) || name == "wte.weight")
      split += t.elements();
  // Row linears' biases (attn.proj.bias) are added after the all-reduce: replicated.
  for (const auto& [name, t] : w.by_name)
    if (name.find(".attn.proj.bias") != std::string::npos) split -= t.elements();
  EXPECT_EQ(run.ranks[0].params, total_params(w) - split / 2);
}

// AdamW over TP 2 × PP 2, over stages of TP degrees 2 and 1 (and 1 and 2 over 2 replicas), and over TP 2 × DP 2
// under ZeRO-2: four steps straight equal two, a checkpoint (each rank its own slices, under ZeRO its pieces of their
// optimizer state), and two resumed, every loss and weight bit for bit.
class ATensorParallelRun : public ::testing::TestWithParam<Case> {};

TEST_P(ATensorParallelRun, ResumesFromItsCheckpointBitwise) {
  const fs::path dir = scratch(std::string("resume_") + GetParam().name);
  fs::path plan = make_tp_plan(GetParam().shape, 8, dir / "plan");
  if (!GetParam().degrees.empty()) plan = with_stage_degrees(plan, GetParam().degrees);
  ASSERT_NO_FATAL_FAILURE(expect_resumes_bitwise(plan, plan, dir, Optimizer::kAdamW, 1e-3, GetParam().name));
  // The TP ranks of the first stage of degree 2 (its replica 0) saved different halves of its split params under one
  // name each.
  const PlanDocument p = read_plan(plan);
  const auto pair = std::find_if(p.stages.begin(), p.stages.end(), [](const PlanStageRecord& s) { return s.tp == 2; });
  ASSERT_NE(pair, p.stages.end());
  const Checkpoint a = read_checkpoint(dir / "ck" / "step_2" / ("rank_" + std::to_string(pair->devices[0]) + ".apart"));
  const Checkpoint b = read_checkpoint(dir / "ck" / "step_2" / ("rank_" + std::to_string(pair->devices[1]) + ".apart"));
  EXPECT_EQ(a.meta.value("tp_rank", -1), 0);
  EXPECT_EQ(b.meta.value("tp_rank", -1), 1);
  const Weights whole = read_weights(gpt_tiny());
  std::map<std::string, const Tensor*> other;
  for (const auto& [name, t] : b.tensors) other[name] = &t;
  int halves = 0;
  for (const auto& [name, slice] : a.tensors) {
    const auto w = whole.by_name.find(name.substr(name.find('/') + 1));
    if (name.rfind("param/", 0) != 0 || w == whole.by_name.end() || slice.elements() * 2 != w->second.elements()) continue;
    ASSERT_TRUE(other.count(name)) << name;
    EXPECT_EQ(other[name]->shape(), slice.shape()) << name;
    EXPECT_NE(std::memcmp(other[name]->raw(), slice.raw(), static_cast<size_t>(slice.bytes())), 0) << name;
    ++halves;
  }
  EXPECT_GT(halves, 0);
}

INSTANTIATE_TEST_SUITE_P(Plans, ATensorParallelRun,
                         ::testing::Values(Case{"tp2_pp2", {2, 1, 2, 2}}, Case{"tp2_then_tp1", {2, 1, 2, 2}, {2, 1}},
                                           Case{"tp1_then_tp2_dp2", {2, 2, 2, 2}, {1, 2}},
                                           Case{"tp2_dp2_zero2", {1, 2, 2, 2, Schedule::k1F1B, 2}}),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// A checkpoint of stages of TP degrees 2 and 1 over 2 replicas resumes under ZeRO-1 (another plan.json: the
// resharding path, each TP rank's replicas' shards put together and cut as ZeRO-1 lays them out) bitwise as the
// uninterrupted run (ZeRO-1 adds the gradients as the unsharded run does; ZeRO-2's reduce-scatter rounds otherwise); on stages of degrees 1 and 2, or 2 and 2, it is refused on every rank naming both plans' degrees
// (the slices would be re-cut: not yet).
TEST(AMixedDegreeTensorParallelCheckpoint, ResumesBitwiseUnderZeroOneAndIsRefusedOnOtherDegreesNamingBoth) {
  const fs::path dir = scratch("mixed_degree_reshard");
  const fs::path plan = with_stage_degrees(make_tp_plan({2, 2, 2, 2}, 8, dir / "plan"), {2, 1});
  const fs::path zero1 = dir / "zero1";
  fs::copy(plan, zero1, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  PlanDocument sharded = read_plan(zero1);
  for (PlanStageRecord& stage : sharded.stages) stage.zero = 1;
  std::ofstream(zero1 / "plan.json") << plan_to_json(sharded).dump(2) << "\n";
  ASSERT_NO_FATAL_FAILURE(expect_resumes_bitwise(plan, zero1, dir / "zero", Optimizer::kAdamW, 1e-3, "tp 2, 1 under ZeRO-1"));

  const fs::path ck = dir / "zero" / "ck";
  for (const std::vector<int>& degrees : {std::vector<int>{1, 2}, std::vector<int>{2, 2}}) {
    const std::string name = "tp" + std::to_string(degrees[0]) + std::to_string(degrees[1]);
    fs::copy(plan, dir / name, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    const fs::path other = with_stage_degrees(dir / name, degrees);  // the same tasks per stage, other degrees
    RunOptions o = run_options_like_reference(other, 4, Optimizer::kAdamW, 1e-3);
    o.resume = ck.string();
    expect_every_rank_refuses(run_ranks(plan_world(other), CommOptions{60}, [&](int, Communicator& comm) { run_plan(o, comm); }),
                              "whose stages have TP degrees [2, 1] (this plan's: [" + std::to_string(degrees[0]) + ", " +
                                  std::to_string(degrees[1]) + "])");
  }
}

// --init random draws every param whole (seeded per name) before the shard is cut, so each rank's slices are slices
// of apart train's random weights: the same losses over 3 SGD steps as apart train --init random.
TEST(ATensorParallelRunFromRandomWeights, TrainsAsApartTrainFromTheSameRandomWeights) {
  const fs::path dir = scratch("random");
  const fs::path plan = make_tp_plan({2, 1, 2, 2}, 8, dir / "plan");
  TrainOptions t;
  t.model = gpt_tiny();
  t.batch = 8;
  t.steps = 3;
  t.optimizer.kind = Optimizer::kSgd;
  t.optimizer.lr = 0.05;
  t.seed = 3;
  t.init = ParamInit::kRandom;
  std::vector<double> reference;
  for (const StepRecord& s : train(t).steps) reference.push_back(s.loss);
  RunOptions o = run_options_like_reference(plan, 3);
  o.init = ParamInit::kRandom;
  std::vector<RunResult> ranks(4);
  const auto errors = run_ranks(4, CommOptions{60}, [&](int r, Communicator& comm) { ranks[static_cast<size_t>(r)] = run_plan(o, comm); });
  for (const auto& e : errors) ASSERT_EQ(error_message(e), "");
  ASSERT_EQ(ranks[0].steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(ranks[0].steps[i].loss, reference[i], 2e-5 * reference[i]) << "step " << i + 1;
}

// A TP plan written before plan.json carried the regions' shard layout is refused on every rank, saying to re-plan.
TEST(ATensorParallelPlan, WithoutItsShardLayoutIsRefusedNamingTheFix) {
  const fs::path dir = scratch("no_layout");
  const fs::path plan_dir = make_tp_plan({1, 1, 2, 2}, 8, dir / "plan");
  PlanDocument plan = read_plan(plan_dir);
  ASSERT_TRUE(plan.tensor_parallel.has_value());
  for (PlanTpRegion& r : plan.tensor_parallel->regions) r.column_tasks.clear();
  std::ofstream(plan_dir / "plan.json") << plan_to_json(plan).dump(2) << "\n";
  const auto errors = run_ranks(2, CommOptions{30}, [&](int, Communicator& comm) {
    run_plan(run_options_like_reference(plan_dir, 1), comm);
  });
  for (const auto& e : errors) EXPECT_NE(error_message(e).find("re-run apart partition"), std::string::npos) << error_message(e);
}

// One process per rank: MPI's all-reduces inside the forward and backward give the threads' losses and weights.
TEST(ATensorParallelRunUnderMpirun, GivesTheThreadsLossesAndWeights) {
  if (testing::run_command("command -v mpirun >/dev/null 2>&1").code != 0 || !mpi_available()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("mpi");
  const fs::path plan = make_tp_plan({2, 1, 2, 4}, 8, dir / "plan");
  Outcome threads;
  Weights saved;
  ASSERT_NO_FATAL_FAILURE(run_under_mpirun_and_on_threads(4, plan, dir, "mpi", &threads, &saved));
  expect_same_training(threads, Outcome{threads.losses, saved, {}}, read_weights(gpt_tiny()), "mpirun tp2 pp2");
}

// Sequence parallelism under mpirun: MPI's reduce-scatters and all-gathers inside the passes give the threads' run.
TEST(ASequenceParallelRunUnderMpirun, GivesTheThreadsLossesAndWeights) {
  if (testing::run_command("command -v mpirun >/dev/null 2>&1").code != 0 || !mpi_available()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("mpi_sp");
  TpShape shape{2, 1, 2, 4};
  shape.sequence_parallel = true;
  const fs::path plan = make_tp_plan(shape, 8, dir / "plan");
  Outcome threads;
  Weights saved;
  ASSERT_NO_FATAL_FAILURE(run_under_mpirun_and_on_threads(4, plan, dir, "mpi_sp", &threads, &saved));
  expect_same_training(threads, Outcome{threads.losses, saved, {}}, read_weights(gpt_tiny()), "mpirun tp2 pp2 sp");
}

// TP 2 × DP 2 under ZeRO-2 resumed on TP 2 × DP 1 (the plan partitioned with --dp 1): each TP rank puts its replicas'
// pieces of its slices' optimizer state together (docs/runtime.md "Checkpoints"); 2 + 2 AdamW steps train as apart
// train's 4 within the suite's tolerance (the resumed steps sum over one replica: another order).
TEST(ATensorParallelZeroCheckpoint, ResumesOnOneReplicaPerTpRankAsApartTrainTrains) {
  const fs::path dir = scratch("tp_zero_reshard");
  const Outcome reference = train_reference(gpt_tiny(), 8, 4, dir, 1e-3, Optimizer::kAdamW);
  const fs::path two = make_tp_plan({1, 2, 2, 2, Schedule::k1F1B, 2}, 8, dir / "two");
  const fs::path one = make_tp_plan({1, 1, 2, 2}, 8, dir / "one");
  const fs::path ck = dir / "ck";
  fs::create_directories(ck);
  const Outcome first = run_threads(two, 2, dir / "first", Optimizer::kAdamW, 1e-3, ck.string());
  ASSERT_EQ(first.losses.size(), 2u);
  Outcome rest = run_threads(one, 4, dir / "rest", Optimizer::kAdamW, 1e-3, "", ck.string());
  ASSERT_EQ(rest.losses.size(), 2u);
  rest.losses.insert(rest.losses.begin(), first.losses.begin(), first.losses.end());
  expect_same_training(reference, rest, read_weights(gpt_tiny()), "tp2 dp2 zero2 resumed on tp2 dp1");
}

// A vocabulary the degree does not divide: 127 rows cut into 64 and 63 (tp_vocabulary_rows), the last rank's
// embedding rows, logits and loss columns one fewer; TP 2 × PP 1 and TP 2 × PP 2 (the tied table in both stages, its
// uneven slices summed per TP rank), with SP too, train as apart train, and --save-model puts the rows back together.
// No region is left whole, and TP rank 1 of each stage holds one row of the tied table (64 floats) fewer than rank 0.
TEST(AnUnevenVocabulary, IsCutIntoCeilingPartsAndTrainsAsApartTrain) {
  TpShape sp{1, 1, 2, 2};
  sp.sequence_parallel = true;
  for (const auto& [shape, name] : {std::pair{TpShape{1, 1, 2, 2}, "uneven_pp1"}, std::pair{TpShape{2, 1, 2, 2}, "uneven_pp2"},
                                    std::pair{sp, "uneven_pp1_sp"}}) {
    std::vector<RunResult> ranks;
    expect_zoo_model_trains_as_apart_train("gpt", shape, name, 127, &ranks);
    ASSERT_EQ(static_cast<int>(ranks.size()), shape.stages * 2) << name;
    for (int stage = 0; stage < shape.stages; ++stage) {
      const RunResult& first = ranks[static_cast<size_t>(stage * 2)];
      const RunResult& second = ranks[static_cast<size_t>(stage * 2 + 1)];
      EXPECT_EQ(first.params - second.params, 64) << name << " stage " << stage;
      for (const RunResult* r : {&first, &second})
        EXPECT_TRUE(r->tp_whole_regions.empty()) << name << ": " << r->tp_whole_regions.front();
    }
  }
}

// A sequence of 5 positions under sequence parallelism at TP 2: the values between regions are cut into 3 and 2
// positions (tp_sequence_part; before, apart partition chose the plan and apart run refused it, "5 positions … do not
// cut into 2 equal parts"). GPT with fused LayerNormalization and Llama (RMS norms, rotary tables read sliced along
// the sequence), TP 2 × PP 1 and TP 2 × PP 2, train as apart train: losses within 2e-5, every param's update within
// 1e-3 (expect_same_training).
TEST(AnOddSequenceUnderSequenceParallelism, IsCutIntoUnevenPartsAndTrainsAsApartTrain) {
  for (const int stages : {1, 2}) {
    TpShape shape{stages, 1, 2, 2};
    shape.sequence_parallel = true;
    const std::string pp = "_pp" + std::to_string(stages);
    expect_zoo_model_trains_as_apart_train("gpt", shape, "odd_seq_gpt" + pp, 128, nullptr, "--layernorm fused", 5);
    expect_zoo_model_trains_as_apart_train("llama", shape, "odd_seq_llama" + pp, 128, nullptr, "--kv-heads 2", 5);
  }
}

// apart zoo's Llama (RMS norms, rotary embeddings through rotate_half's Concat, grouped-query attention through
// repeat_kv's Expand + Reshape: 4 heads, 2 kv heads; SwiGLU; untied head), TP 2 × PP 1 with and without sequence
// parallelism and TP 2 × PP 2 with it: plan.json lays out both attentions, both MLPs, the embedding and the head;
// under PP 1 every rank cuts every region (none left whole; under PP 2 the planner's cut falls inside the second
// attention, which both stages then compute whole) and the runs train as apart train (3 SGD steps: losses within
// 2e-5, updates within 1e-3). Before, the attention was never found (the Concat and the Expand failed it).
TEST(ALlamaUnderTensorParallelism, SplitsAttentionMlpEmbeddingAndHeadAndTrainsAsApartTrain) {
  for (const auto& [stages, sp] : {std::pair{1, false}, std::pair{1, true}, std::pair{2, true}}) {
    TpShape shape{stages, 1, 2, 2};
    shape.sequence_parallel = sp;
    const std::string name = "llama_pp" + std::to_string(stages) + (sp ? "_sp" : "");
    std::vector<RunResult> ranks;
    expect_zoo_model_trains_as_apart_train("llama", shape, name, 128, &ranks, "--kv-heads 2");
    const PlanDocument plan = read_plan(scratch_path(name) / "plan");
    ASSERT_TRUE(plan.tensor_parallel.has_value()) << name;
    EXPECT_EQ(plan.tensor_parallel->summary, "2 attention, 2 MLP, embedding, LM head") << name;
    for (const PlanTpRegion& r : plan.tensor_parallel->regions)
      if (r.kind == TpRegionKind::kAttention) {
        EXPECT_EQ(r.degrees, (std::vector<int>{1, 2})) << r.name;
        EXPECT_EQ(r.column_tasks.size(), 3u) << r.name;
      }
    ASSERT_EQ(static_cast<int>(ranks.size()), 2 * stages) << name;
    for (const RunResult& r : ranks)
      if (stages == 1) EXPECT_TRUE(r.tp_whole_regions.empty()) << name << ": " << r.tp_whole_regions.front();
  }
}

// `model` written as torch.onnx.export(do_constant_folding=False) leaves linears: every MatMul weight W [in, out]
// stored as its transpose [out, in] (nn.Linear's layout) and read through a Transpose node. Returns the file.
fs::path with_transposed_weights(const fs::path& model, const fs::path& out) {
  onnx::ModelProto proto = testing::read_proto(model);
  onnx::GraphProto& g = *proto.mutable_graph();
  std::map<std::string, int> init;
  for (int i = 0; i < g.initializer_size(); ++i) init[g.initializer(i).name()] = i;
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (onnx::NodeProto n : g.node()) {
    const auto it = n.op_type() == "MatMul" ? init.find(n.input(1)) : init.end();
    if (it != init.end() && g.initializer(it->second).dims_size() == 2) {
      onnx::TensorProto& w = *g.mutable_initializer(it->second);
      const Tensor whole = tensor_from_proto(w, model.parent_path());
      const int64_t rows = whole.dim(0), cols = whole.dim(1);
      std::vector<float> t(static_cast<size_t>(rows * cols));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = whole.data<float>()[r * cols + c];
      w.clear_float_data();
      w.clear_dims();
      w.add_dims(cols);
      w.add_dims(rows);
      w.set_raw_data(std::string(reinterpret_cast<const char*>(t.data()), t.size() * sizeof(float)));
      onnx::NodeProto& tr = *nodes.Add();
      tr.set_name(n.name() + "/weight_t");
      tr.set_op_type("Transpose");
      tr.add_input(w.name());
      tr.add_output(n.name() + "/Transpose_output_0");
      onnx::AttributeProto* perm = tr.add_attribute();
      perm->set_name("perm");
      perm->set_type(onnx::AttributeProto::INTS);
      perm->add_ints(1);
      perm->add_ints(0);
      n.set_input(1, tr.output(0));
      init.erase(it);  // one Transpose per weight
    }
    *nodes.Add() = n;
  }
  g.mutable_node()->Swap(&nodes);
  std::ofstream(out, std::ios::binary) << proto.SerializeAsString();
  return out;
}

// A Llama exported without constant folding (every linear's weight behind a Transpose): the planner finds the same
// regions and apart run cuts each weight through its Transpose (the column linears' output columns and the row
// linears' input rows are the transposed initializer's rows and columns), TP 2 with sequence parallelism training as
// apart train. Before, the run refused it ("row linear …'s weight that is not an initializer of the stage").
TEST(ALlamaWithWeightsBehindTransposes, IsCutThroughTheTransposesAndTrainsAsApartTrain) {
  const fs::path dir = scratch("llama_transposed");
  const fs::path zoo = dir / "llama.onnx";
  const auto z = testing::run_apart(
      "zoo llama --layers 2 --hidden 64 --heads 4 --kv-heads 2 --seq 16 --vocab 128 -q -o " + zoo.string());
  ASSERT_EQ(z.code, 0) << z.out;
  const fs::path model = with_transposed_weights(zoo, dir / "llama_unfolded.onnx");
  TpShape shape{1, 1, 2, 2};
  shape.sequence_parallel = true;
  const Outcome reference = train_reference(model.string(), 8, 3, dir);
  const fs::path plan = make_tp_plan(shape, 8, dir / "plan", model.string());
  const PlanDocument doc = read_plan(plan);
  ASSERT_TRUE(doc.tensor_parallel.has_value());
  EXPECT_EQ(doc.tensor_parallel->summary, "2 attention, 2 MLP, embedding, LM head");
  const Outcome run = run_threads(plan, 3, dir);
  expect_same_training(reference, run, read_weights(model), "llama with transposed weights");
  for (const RunResult& r : run.ranks) EXPECT_TRUE(r.tp_whole_regions.empty()) << r.tp_whole_regions.front();
}

// gpt-tiny with its logits also a model output, over TP 2 × PP 2: the last stage computes its LM head whole (the
// planner lays out no vocabulary region for logits read by more than the loss) while the first cuts the embedding's
// rows, so the tied table is cut in one stage and whole in the other; its gradient is summed whole-size over every
// holder (RankTies::split), and the run trains as apart train. (Summed per TP rank as before, the stages'
// gradients differ in size, 16384 and 32768 floats, and the in-process all-reduce refused the run.)
TEST(ATiedTableCutInOneStageAndWholeInAnother, TrainsAsApartTrain) {
  const fs::path dir = scratch("tied_cut_and_whole");
  fs::create_directories(dir);
  onnx::ModelProto model = testing::read_proto(gpt_tiny());
  model.mutable_graph()->add_output()->set_name("/Reshape_output_0");
  const fs::path path = dir / "gpt_tiny_logits.onnx";
  {
    std::ofstream out(path, std::ios::binary);
    ASSERT_TRUE(model.SerializeToOstream(&out));
  }
  constexpr int64_t kBatch = 8, kSteps = 3;
  const Outcome reference = train_reference(path.string(), kBatch, kSteps, dir);
  const fs::path plan = make_tp_plan({2, 1, 2, 2}, kBatch, dir / "plan", path.string());
  const Outcome run = run_threads(plan, kSteps, dir);
  expect_same_training(reference, run, read_weights(path.string()), "tied table cut and whole");
}

// gpt-tiny with its final norm's output reshaped to the shape of the embeddings' sum (the same [batch, 32, 64]: a
// no-op, as torch exports read an attention input's shape, Shape -> Gather -> Concat): the last stage reads
// /wpe/Add_output_0, computed in the first, only through a Shape task replicated into it. Its stage file declares the
// value as an input, the plan sends nothing for it, and the run folds that Shape at each rank's micro-batch: TP 1 and
// TP 2 × PP 2 train as apart train. (Before, every rank of the last stage stopped at its first forward: "input
// '/wpe/Add_output_0' was not given", as GPT-2 small's export did cut inside /blocks.8/attn, issue 17.)
TEST(AStageReadingAnEarlierStagesValueOnlyForItsShape, TrainsAsApartTrainWithAndWithoutTensorParallelism) {
  const fs::path dir = scratch("shape_only_input");
  fs::create_directories(dir);
  onnx::ModelProto model = testing::read_proto(gpt_tiny());
  const std::string norm = "/lnf/Add_1_output_0", probe = "/probe/Shape_output_0", reshaped = "/probe/Reshape_output_0";
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;  // Shape and Reshape right before the norm's reader
  int readers = 0;
  for (const onnx::NodeProto& n : model.graph().node()) {
    onnx::NodeProto reader = n;
    for (std::string& in : *reader.mutable_input()) {
      if (in != norm) continue;
      in = reshaped;
      ++readers;
      onnx::NodeProto* shape = nodes.Add();
      shape->set_name("/probe/Shape");
      shape->set_op_type("Shape");
      shape->add_input("/wpe/Add_output_0");
      shape->add_output(probe);
      onnx::NodeProto* reshape = nodes.Add();
      reshape->set_name("/probe/Reshape");
      reshape->set_op_type("Reshape");
      reshape->add_input(norm);
      reshape->add_input(probe);
      reshape->add_output(reshaped);
    }
    *nodes.Add() = reader;
  }
  ASSERT_EQ(readers, 1);  // the LM head
  model.mutable_graph()->mutable_node()->Swap(&nodes);
  const fs::path path = dir / "gpt_tiny_shape_probe.onnx";
  {
    std::ofstream out(path, std::ios::binary);
    ASSERT_TRUE(model.SerializeToOstream(&out));
  }
  constexpr int64_t kBatch = 8, kSteps = 3;
  const Outcome reference = train_reference(path.string(), kBatch, kSteps, dir);
  for (const int tp : {1, 2}) {
    const std::string name = "tp" + std::to_string(tp) + "_pp2";
    const fs::path plan = make_tp_plan({2, 1, tp, 2}, kBatch, dir / name, path.string());
    // The case this test is about: the last stage's file reads the value, its plan record does not.
    const PlanDocument doc = read_plan(plan);
    bool sent = false;
    for (const PlanInput& in : doc.stages[1].inputs) sent = sent || in.value == "/wpe/Add_output_0";
    EXPECT_FALSE(sent) << name;
    bool declared = false;
    const onnx::ModelProto last = testing::read_proto(plan / "stage_1.onnx");
    for (const auto& in : last.graph().input())
      declared = declared || in.name() == "/wpe/Add_output_0";
    EXPECT_TRUE(declared) << name;
    const Outcome run = run_threads(plan, kSteps, dir / (name + "_run"));
    expect_same_training(reference, run, read_weights(path.string()), name);
  }
}

// Between two TP stages of one degree each TP rank sends its part of a boundary message and the receiving pair
// all-gathers it (docs/runtime.md "Boundary messages in TP parts"): in the measured traces of gpt-tiny TP 1 × PP 2
// and TP 2 × PP 2 each send carries what plan.json says one device of stage 1 receives per micro-batch (its inputs'
// bytes: under TP 2 half of the boundary, partition/stage_cost.h boundary_share), both TP ranks send (the whole
// message padded to a multiple of 8 bytes, in halves), and the run trains as apart train (TensorParallelPlans above).
TEST(ATensorParallelPipeline, SendsEachTpRankItsPartOfABoundaryMessage) {
  const fs::path dir = scratch("message_parts");
  constexpr int64_t kBatch = 8;
  for (const int tp : {1, 2}) {
    const std::string name = "tp" + std::to_string(tp);
    const fs::path plan = make_tp_plan({2, 1, tp, 2}, kBatch, dir / name);
    double received = 0;  // by one device of stage 1
    const PlanDocument doc = read_plan(plan);
    for (const PlanInput& in : doc.stages[1].inputs)
      if (in.from_stage == 0) received += in.bytes;
    ASSERT_GT(received, 0) << name;
    const double whole = received * tp;
    const fs::path trace = dir / (name + ".json");
    const auto r = run_apart("run " + plan.string() + " --in-process --steps 1 -q --trace " + trace.string());
    ASSERT_EQ(r.code, 0) << r.out;
    std::map<std::tuple<int64_t, bool>, std::vector<double>> sends;  // (micro-batch, gradient) → each send's bytes
    for (const TimelineEvent& e : read_timeline(trace).events)
      if (e.kind == TimelineKind::kSend) sends[{e.microbatch, e.gradient}].push_back(e.bytes);
    ASSERT_EQ(sends.size(), 4u) << name;  // 2 micro-batches, activations and gradients
    for (const auto& [key, sent] : sends) {
      const std::string what = name + " micro-batch " + std::to_string(std::get<0>(key)) + (std::get<1>(key) ? " gradient" : "");
      ASSERT_EQ(sent.size(), static_cast<size_t>(tp)) << what;
      const double part = std::ceil(whole / (4.0 * tp)) * 4;
      for (double bytes : sent) EXPECT_EQ(bytes, part) << what << " of " << whole << " bytes";
    }
  }
}

// TP 2 × PP 1 under mpirun -np 2, with and without sequence parallelism: the vocabulary-parallel loss's all-gather
// and all-reduce over MPI, and the embedding's all-reduce, give the threads' run.
TEST(ATensorParallelRunUnderMpirun, OnTwoRanksGivesTheThreadsLossesAndWeightsWithAndWithoutSequenceParallelism) {
  if (testing::run_command("command -v mpirun >/dev/null 2>&1").code != 0 || !mpi_available()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("mpi_tp2_pp1");
  for (bool sp : {false, true}) {
    TpShape shape{1, 1, 2, 2};
    shape.sequence_parallel = sp;
    const std::string what = sp ? "mpi_tp2_pp1_sp" : "mpi_tp2_pp1";
    const fs::path plan = make_tp_plan(shape, 8, dir / (what + "_plan"));
    Outcome threads;
    Weights saved;
    ASSERT_NO_FATAL_FAILURE(run_under_mpirun_and_on_threads(2, plan, dir, what, &threads, &saved));
    expect_same_training(threads, Outcome{threads.losses, saved, {}}, read_weights(gpt_tiny()), what);
  }
}

// TP 2 × PP 2 interleaved (v = 2) under mpirun -np 4: each rank's two chunks and their TP collectives over MPI, and
// --save-model gathering the shards chunk by chunk, give the threads' run.
TEST(ATensorParallelRunUnderMpirun, OfAnInterleavedPlanGivesTheThreadsLossesAndWeights) {
  if (testing::run_command("command -v mpirun >/dev/null 2>&1").code != 0 || !mpi_available()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("mpi_tp2_pp2_interleaved");
  const fs::path plan = make_tp_plan({2, 1, 2, 2, Schedule::kInterleaved}, 8, dir / "plan");
  Outcome threads;
  Weights saved;
  ASSERT_NO_FATAL_FAILURE(run_under_mpirun_and_on_threads(4, plan, dir, "mpi_tp2_pp2_interleaved", &threads, &saved));
  expect_same_training(threads, Outcome{threads.losses, saved, {}}, read_weights(gpt_tiny()), "mpi_tp2_pp2_interleaved");
}

// A TP pair feeding one rank under mpirun -np 3: the spread sends and the tie over stages of degrees 2 and 1 (whole-size
// gradient sums over every holder) over MPI give the threads' run.
TEST(ATensorParallelRunUnderMpirun, OfStagesOfDifferentTpDegreesGivesTheThreadsLossesAndWeights) {
  if (testing::run_command("command -v mpirun >/dev/null 2>&1").code != 0 || !mpi_available()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("mpi_tp2_then_tp1");
  const fs::path plan = with_stage_degrees(make_tp_plan({2, 1, 2, 2}, 8, dir / "plan"), {2, 1});
  Outcome threads;
  Weights saved;
  ASSERT_NO_FATAL_FAILURE(run_under_mpirun_and_on_threads(3, plan, dir, "mpi_tp2_then_tp1", &threads, &saved));
  expect_same_training(threads, Outcome{threads.losses, saved, {}}, read_weights(gpt_tiny()), "mpi_tp2_then_tp1");
}

// One process per rank, so each counts its own tensors: what a TP pair saves per rank against the same stage on one
// rank (Adam, m = 2) is what the plan's memory estimate says it saves (gpt-tiny: half the split linears' and the
// embedding table's weights, gradients and Adam state, half their activations and of the logits).
TEST(ATensorParallelRunUnderMpirun, SavesThePeakMemoryThePlanPredicts) {
  if (testing::run_command("command -v mpirun >/dev/null 2>&1").code != 0 || !mpi_available()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("memory");
  std::vector<std::pair<double, double>> figures;
  for (int tp : {1, 2}) {
    const fs::path plan = dir / ("tp" + std::to_string(tp));
    const auto p = testing::run_apart("partition " + gpt_tiny() + " --device cpu --devices " + std::to_string(tp) +
                                      " --tp " + std::to_string(tp) + " --pp 1 --dp 1 --sequence-parallel off "
                                      "--microbatches 2 --batch 8 --optimizer adam --no-baselines -q -o " + plan.string());
    ASSERT_EQ(p.code, 0) << p.out;
    const auto r = mpirun_apart_run(tp, plan.string() + " --steps 2");
    ASSERT_EQ(r.code, 0) << r.out;
    figures.push_back(peak_and_plan(r.out, "[rank 0/" + std::to_string(tp) + " stage 0 replica 0]"));
    ASSERT_GT(figures.back().first, 0) << r.out;
    std::printf("TP %d: peak %.0f B, plan %.0f B\n", tp, figures.back().first, figures.back().second);
  }
  const double measured = figures[0].first - figures[1].first;
  const double planned = figures[0].second - figures[1].second;
  EXPECT_GT(planned, 0);
  // With the vocabulary split as the plan splits it (embedding, tied LM head, parallel loss), each TP 2 rank peaks at
  // its plan's estimate (2.55 MiB against 2.56 MiB measured), and what TP 2 saves is the plan's saving within 15 %
  // (2.08 against 1.88 MiB, 1.11×): the TP 1 run peaks 4 % above its own estimate (the loss's backward: the one-hot
  // labels and the softmax, logits-sized values the plan's working set leaves out), and TP 2 halves those too.
  EXPECT_NEAR(figures[1].first, figures[1].second, 0.05 * figures[1].second);
  EXPECT_LE(measured, 1.15 * planned);
  EXPECT_GE(measured, 0.9 * planned);
}

}  // namespace
}  // namespace apart
