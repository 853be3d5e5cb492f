// `--loss cross_entropy[_shifted] --labels NAME` on partition, train and run: what each command accepts and the
// errors, naming the flag, for what it does not.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/support/run_apart.h"
#include "tests/support/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using apart::testing::CommandRun;
using apart::testing::TempDir;

CommandRun run(const std::string& args) { return apart::testing::run_apart(args); }

// gpt-tiny as apart zoo writes it with --loss none: a logits-only export.
std::string logits_only(const TempDir& dir) {
  const std::string path = (dir / "logits.onnx").string();
  EXPECT_EQ(run("zoo gpt-tiny --loss none -q -o " + path).code, 0);
  return path;
}

TEST(TheLossFlags, AppendALossThatTrainAndPartitionAccept) {
  TempDir dir;
  const std::string model = logits_only(dir);
  const CommandRun trained = run("train " + model + " --loss cross_entropy --labels labels --steps 2 --batch 2 -q");
  EXPECT_EQ(trained.code, 0) << trained.out;
  const CommandRun shifted = run("train " + model + " --loss cross_entropy_shifted --steps 2 --batch 2 -q");
  EXPECT_EQ(shifted.code, 0) << shifted.out;
  const CommandRun planned = run("partition " + model + " --loss cross_entropy --device cpu --devices 2 --batch 4 "
                                 "--no-baselines -q -o " + (dir / "plan").string());
  EXPECT_EQ(planned.code, 0) << planned.out;
  const CommandRun ran = run("run " + (dir / "plan").string() + " --in-process --steps 1 --loss cross_entropy");
  EXPECT_EQ(ran.code, 0) << ran.out;
  for (const char* command : {"partition", "train", "run"})
    EXPECT_NE(run(std::string(command) + " --help").out.find("--labels"), std::string::npos) << command;
}

TEST(TheLossFlags, RefuseWhatTheyCannotAppendNamingTheFlag) {
  TempDir dir;
  const std::string model = logits_only(dir);
  const CommandRun not_a_form = run("partition " + model + " --loss mse --device cpu --batch 4 -o " + (dir / "p").string());
  EXPECT_EQ(not_a_form.code, 2) << not_a_form.out;
  EXPECT_NE(not_a_form.out.find("--loss: 'mse' is not a loss apart appends"), std::string::npos) << not_a_form.out;
  EXPECT_FALSE(fs::exists(dir / "p"));
  const CommandRun labels_alone = run("train " + model + " --labels y --steps 1 --batch 2");
  EXPECT_EQ(labels_alone.code, 2) << labels_alone.out;
  EXPECT_NE(labels_alone.out.find("--loss cross_entropy --labels y"), std::string::npos) << labels_alone.out;
  const CommandRun clash = run("train " + model + " --loss cross_entropy --labels input_ids --steps 1 --batch 2");
  EXPECT_EQ(clash.code, 2) << clash.out;
  EXPECT_NE(clash.out.find("--labels input_ids"), std::string::npos) << clash.out;
  ASSERT_EQ(run("zoo gpt-tiny -q -o " + (dir / "with_loss.onnx").string()).code, 0);
  const CommandRun twice = run("train " + (dir / "with_loss.onnx").string() + " --loss cross_entropy --steps 1 --batch 2");
  EXPECT_EQ(twice.code, 2) << twice.out;
  EXPECT_NE(twice.out.find("already outputs the scalar 'loss'"), std::string::npos) << twice.out;
}

}  // namespace
