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

CommandRun run_loss_cli(const std::string& args) { return apart::testing::run_apart(args); }

// gpt-tiny as apart zoo writes it with --loss none: a logits-only export.
std::string logits_only(const TempDir& dir) {
  const std::string path = (dir / "logits.onnx").string();
  EXPECT_EQ(run_loss_cli("zoo gpt-tiny --loss none -q -o " + path).code, 0);
  return path;
}

TEST(TheLossFlags, AppendALossThatTrainAndPartitionAccept) {
  TempDir dir;
  const std::string model = logits_only(dir);
  const CommandRun trained =
      run_loss_cli("train " + model + " --loss cross_entropy --labels labels --steps 2 --batch 2 -q");
  EXPECT_EQ(trained.code, 0) << trained.out;
  const CommandRun shifted = run_loss_cli("train " + model + " --loss cross_entropy_shifted --steps 2 --batch 2 -q");
  EXPECT_EQ(shifted.code, 0) << shifted.out;
  const CommandRun planned = run_loss_cli("partition " + model +
                                          " --loss cross_entropy --device cpu --devices 2 --batch 4 "
                                          "--no-baselines -q -o " +
                                          (dir / "plan").string());
  EXPECT_EQ(planned.code, 0) << planned.out;
  const CommandRun ran =
      run_loss_cli("run " + (dir / "plan").string() + " --in-process --steps 1 --loss cross_entropy");
  EXPECT_EQ(ran.code, 0) << ran.out;
  for (const char* command : {"partition", "train", "run"})
    EXPECT_NE(run_loss_cli(std::string(command) + " --help").out.find("--labels"), std::string::npos) << command;
}

// An InvalidArgument (exit 2) whose message holds `text`.
void expect_refused(const CommandRun& r, const std::string& text) {
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(text), std::string::npos) << r.out;
}

TEST(TheLossFlags, RefuseWhatTheyCannotAppendNamingTheFlag) {
  TempDir dir;
  const std::string model = logits_only(dir);
  expect_refused(run_loss_cli("partition " + model + " --loss mse --device cpu --batch 4 -o " + (dir / "p").string()),
                 "--loss: 'mse' is not a loss apart appends");
  EXPECT_FALSE(fs::exists(dir / "p"));
  expect_refused(run_loss_cli("train " + model + " --labels y --steps 1 --batch 2"), "--loss cross_entropy --labels y");
  expect_refused(run_loss_cli("train " + model + " --loss cross_entropy --labels input_ids --steps 1 --batch 2"),
                 "--labels input_ids");
  const std::string with_loss = (dir / "with_loss.onnx").string();
  ASSERT_EQ(run_loss_cli("zoo gpt-tiny -q -o " + with_loss).code, 0);
  expect_refused(run_loss_cli("train " + with_loss + " --loss cross_entropy --steps 1 --batch 2"),
                 "already outputs the scalar 'loss'");
}

}  // namespace
