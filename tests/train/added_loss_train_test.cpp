// `--loss cross_entropy --labels NAME` end to end: a logits-only export (apart zoo --loss none) trains, under apart
// train and a 2-stage apart run, to the same losses bit for bit as the same model exported with its loss.
#include <gtest/gtest.h>

#include "train/pipeline.h"
#include "train/trainer.h"
#include "tests/train/pipeline_fixture.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using testing::run_apart;

struct Pair {
  fs::path with_loss, logits_only;
};

// The same gpt (weights from the same seed) written with the zoo's loss and without one.
Pair zoo_pair(const fs::path& dir) {
  const std::string flags = " --layers 2 --hidden 32 --heads 2 --seq 16 --vocab 64 -q -o ";
  Pair p{dir / "with_loss.onnx", dir / "logits.onnx"};
  EXPECT_EQ(run_apart("zoo gpt" + flags + p.with_loss.string()).code, 0);
  EXPECT_EQ(run_apart("zoo gpt --loss none" + flags + p.logits_only.string()).code, 0);
  return p;
}

std::vector<double> train_losses(const fs::path& model, const AddedLoss& loss) {
  TrainOptions o;
  o.model = model.string();
  o.import.loss = loss;
  o.batch = 4;
  o.steps = 4;
  o.optimizer.kind = Optimizer::kAdamW;
  o.optimizer.lr = 1e-2;
  o.seed = 3;
  std::vector<double> losses;
  for (const StepRecord& s : train(o).steps) losses.push_back(s.loss);
  return losses;
}

const AddedLoss kCrossEntropy{AddedLossForm::kCrossEntropy, "labels"};

TEST(ALogitsOnlyExport, TrainsWithAnAddedCrossEntropyToTheZooLossesBitwise) {
  const fs::path dir = testing::scratch("added_loss", "train");
  const Pair p = zoo_pair(dir);
  const std::vector<double> reference = train_losses(p.with_loss, {});
  const std::vector<double> added = train_losses(p.logits_only, kCrossEntropy);
  ASSERT_EQ(added.size(), 4u);
  EXPECT_EQ(added, reference);  // bitwise: the same ops on the same values
  EXPECT_LT(added.back(), added.front());
}

TEST(ALogitsOnlyExport, TrainsWithTheShiftedNextTokenLoss) {
  const fs::path dir = testing::scratch("added_loss", "shifted");
  const Pair p = zoo_pair(dir);
  const std::vector<double> shifted = train_losses(p.logits_only, {AddedLossForm::kCrossEntropyShifted, "labels"});
  ASSERT_EQ(shifted.size(), 4u);
  EXPECT_NE(shifted, train_losses(p.logits_only, kCrossEntropy));
  EXPECT_LT(shifted.back(), shifted.front());
}

fs::path two_stage_plan(const fs::path& model, const std::string& flags, const fs::path& dir) {
  const auto r = run_apart("partition " + model.string() + " --device cpu --devices 2 --stages 2 --replicas 1 " +
                           "--microbatches 2 --batch 4 --no-baselines -q " + flags + " -o " + dir.string());
  EXPECT_EQ(r.code, 0) << r.out;
  return dir;
}

std::vector<double> run_losses(const fs::path& plan) {
  RunOptions o = testing::run_options_like_reference(plan, 4, Optimizer::kAdamW, 1e-2);
  std::vector<RunResult> ranks(2);
  const auto errors = testing::run_ranks(2, CommOptions{60}, [&](int r, Communicator& comm) {
    ranks[static_cast<size_t>(r)] = run_plan(o, comm);
  });
  for (const auto& e : errors) EXPECT_EQ(testing::error_message(e), "");
  std::vector<double> losses;
  for (const StepRecord& s : ranks[0].steps) losses.push_back(s.loss);
  return losses;
}

TEST(ALogitsOnlyExport, RunsTwoStagesInProcessWithAnAddedLossToTheZooLossesBitwise) {
  const fs::path dir = testing::scratch("added_loss", "run");
  const Pair p = zoo_pair(dir);
  const fs::path reference_plan = two_stage_plan(p.with_loss, "", dir / "reference_plan");
  const fs::path added_plan = two_stage_plan(p.logits_only, "--loss cross_entropy --labels labels", dir / "added_plan");
  const PlanDocument plan = read_plan(added_plan);
  ASSERT_TRUE(plan.model && plan.model->added_loss);
  EXPECT_EQ(plan.model->added_loss->labels, "labels");
  const std::vector<double> reference = run_losses(reference_plan);
  const std::vector<double> added = run_losses(added_plan);
  ASSERT_EQ(added.size(), 4u);
  EXPECT_EQ(added, reference);
}

TEST(ALogitsOnlyPlan, IsRunWithTheLossItWasPlannedWithAndRefusesAnother) {
  const fs::path dir = testing::scratch("added_loss", "refuse");
  const Pair p = zoo_pair(dir);
  const fs::path bare = two_stage_plan(p.logits_only, "", dir / "bare_plan");
  RunOptions o = testing::run_options_like_reference(bare, 1);
  o.added_loss = kCrossEntropy;
  const auto errors = testing::run_ranks(2, CommOptions{60}, [&](int, Communicator& comm) { run_plan(o, comm); });
  testing::expect_every_rank_refuses(errors, "partition the model again with the --loss you mean");
}

}  // namespace
}  // namespace apart
