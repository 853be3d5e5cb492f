// apart never loses a user's file: `partition -o` replaces only a plan folder it wrote, no command writes over
// one of its own inputs, and train checks its output paths before step 1 (issue 11).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/onnx_builder.h"
#include "tests/support/run_apart.h"

namespace {

namespace fs = std::filesystem;
using apart::testing::CommandRun;
using apart::testing::OnnxBuilder;
using apart::testing::read_file;
using apart::testing::run_apart;
using apart::testing::run_command;
using apart::testing::TempDir;

const std::string kSafePlanFlags = " --devices 2 --batch 4 --no-baselines --no-stage-models";

// A tiny model with a symbolic batch (partition binds it; the other commands get --dim batch=2).
fs::path write_model(const fs::path& file) {
  fs::create_directories(file.parent_path());
  return apart::testing::write_tiny_mlp(file);
}

CommandRun partition_into(const fs::path& model, const std::string& out, const std::string& extra = "") {
  return run_apart("partition " + model.string() + kSafePlanFlags + extra + " -o " + out);
}

// A plan folder written by apart, for the commands that read one.
fs::path write_plan(const TempDir& dir) {
  const fs::path model = write_model(dir / "m.onnx");
  const CommandRun r = partition_into(model, (dir / "plan").string());
  EXPECT_EQ(r.code, 0) << r.out;
  return dir / "plan";
}

// Every entry of `dir` whose name starts with '.' (a temporary or old copy left behind).
std::vector<std::string> hidden_entries(const fs::path& dir) {
  std::vector<std::string> hidden;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with(".")) hidden.push_back(e.path().filename().string());
  return hidden;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// --- partition -o DIR --------------------------------------------------------------------------------------

TEST(PartitionOutput, RefusesTheFolderThatHoldsTheModelAndKeepsIt) {
  TempDir dir;
  const fs::path model = write_model(dir / "proj" / "m.onnx");
  std::ofstream(dir / "proj" / "notes.txt") << "mine";
  for (const char* force : {"", " --force"}) {
    const CommandRun r = partition_into(model, (dir / "proj").string(), force);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(contains(r.out, "the model")) << r.out;
    EXPECT_TRUE(fs::exists(model));
    EXPECT_EQ(read_file(dir / "proj" / "notes.txt"), "mine");
  }
  EXPECT_TRUE(hidden_entries(dir.path()).empty());
}

TEST(PartitionOutput, RefusesTheWorkingFolderByAnotherNameEvenWithForce) {
  TempDir dir;
  const fs::path model = write_model(dir / "m.onnx");
  fs::create_directories(dir / "cwd");
  std::ofstream(dir / "cwd" / "work.txt") << "mine";
  for (const char* out : {"../cwd", ".", "..", "./"}) {
    const CommandRun r = run_command("cd " + (dir / "cwd").string() + " && " + APART_BINARY + " partition " +
                                     model.string() + kSafePlanFlags + " --force -o " + out + " 2>&1");
    EXPECT_EQ(r.code, 2) << out << ": " << r.out;
    EXPECT_TRUE(contains(r.out, "working folder")) << r.out;
  }
  EXPECT_EQ(read_file(dir / "cwd" / "work.txt"), "mine");
  EXPECT_TRUE(fs::exists(model));
}

TEST(PartitionOutput, RefusesAFolderHoldingTheModelsExternalDataOrTheProfile) {
  TempDir dir;
  // proj/m.onnx keeps its weights in proj/w/m.data: -o proj/w would delete them.
  fs::create_directories(dir / "proj" / "w");
  OnnxBuilder b;
  b.input("x", {"batch", 3}).output("y");
  b.external_weight("w", {3, 4}, "w/m.data");
  b.node("MatMul", {"x", "w"}, {"y"});
  b.save(dir / "proj" / "m.onnx");
  std::ofstream(dir / "proj" / "w" / "m.data", std::ios::binary) << std::string(48, '\0');
  CommandRun r = partition_into(dir / "proj" / "m.onnx", (dir / "proj" / "w").string(), " --force");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "external-data")) << r.out;
  EXPECT_TRUE(fs::exists(dir / "proj" / "w" / "m.data"));

  // An old plan's costs.json given as --profile: replacing that plan would delete the input.
  const fs::path plan = write_plan(dir);
  r = partition_into(dir / "m.onnx", plan.string(), " --profile " + (plan / "costs.json").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "--profile")) << r.out;
  EXPECT_TRUE(fs::exists(plan / "costs.json"));
}

TEST(PartitionOutput, RefusesAReadOnlyFolderAndLeavesNoHiddenCopy) {
  TempDir dir;
  const fs::path plan = write_plan(dir);
  const std::string before = read_file(plan / "plan.json");
  fs::permissions(plan, fs::perms(0555));
  const CommandRun r = partition_into(dir / "m.onnx", plan.string(), " --force");
  EXPECT_EQ(r.code, 6) << r.out;
  EXPECT_TRUE(contains(r.out, "read-only")) << r.out;
  EXPECT_EQ(fs::status(plan).permissions() & fs::perms::all, fs::perms(0555));
  EXPECT_EQ(read_file(plan / "plan.json"), before);
  EXPECT_TRUE(hidden_entries(dir.path()).empty()) << hidden_entries(dir.path()).front();
  fs::permissions(plan, fs::perms(0755));
}

TEST(PartitionOutput, RefusesASymlinkNamingItsTargetAndLeavesBoth) {
  TempDir dir;
  const fs::path plan = write_plan(dir);
  fs::create_directory_symlink(plan, dir / "link");
  for (const char* force : {"", " --force"}) {
    const CommandRun r = partition_into(dir / "m.onnx", (dir / "link").string(), force);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(contains(r.out, "symlink")) << r.out;
    EXPECT_TRUE(contains(r.out, plan.string())) << r.out;
    EXPECT_TRUE(fs::is_symlink(dir / "link"));
    EXPECT_TRUE(fs::exists(plan / "plan.json"));
  }
}

TEST(PartitionOutput, RefusesAFolderWithForeignFilesNamingThemAndTheForceFlag) {
  TempDir dir;
  const fs::path model = write_model(dir / "m.onnx");
  fs::create_directories(dir / "data" / "raw");
  std::ofstream(dir / "data" / "thesis.tex") << "years of work";
  std::ofstream(dir / "data" / "plan.json") << R"({"schema": "apart.plan/1"})";  // a plan.json alone is not enough
  const CommandRun r = partition_into(model, (dir / "data").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "thesis.tex")) << r.out;
  EXPECT_TRUE(contains(r.out, "raw/")) << r.out;
  EXPECT_TRUE(contains(r.out, "--force")) << r.out;
  EXPECT_EQ(read_file(dir / "data" / "thesis.tex"), "years of work");
  EXPECT_TRUE(hidden_entries(dir.path()).empty());
}

TEST(PartitionOutput, RefusesAFolderWhosePlanJsonIsNotAnApartPlan) {
  TempDir dir;
  const fs::path model = write_model(dir / "m.onnx");
  fs::create_directories(dir / "p");
  std::ofstream(dir / "p" / "plan.json") << R"({"schema": "someone.else/1"})";
  const CommandRun r = partition_into(model, (dir / "p").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "plan.json")) << r.out;
}

TEST(PartitionOutput, ReplacesAForeignFolderWithForce) {
  TempDir dir;
  const fs::path model = write_model(dir / "m.onnx");
  fs::create_directories(dir / "data" / "raw");
  std::ofstream(dir / "data" / "old.txt") << "scratch";
  const CommandRun r = partition_into(model, (dir / "data").string(), " --force");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir / "data" / "plan.json"));
  EXPECT_FALSE(fs::exists(dir / "data" / "old.txt"));
  EXPECT_TRUE(hidden_entries(dir.path()).empty());
}

TEST(PartitionOutput, ReplacesItsOwnOlderPlanWithReportAndTraceAndAnEmptyFolder) {
  TempDir dir;
  const fs::path plan = write_plan(dir);
  ASSERT_EQ(run_apart("report " + plan.string()).code, 0);
  ASSERT_EQ(run_apart("simulate " + plan.string() + " --trace " + (plan / "trace.json").string()).code, 0);
  ASSERT_TRUE(fs::exists(plan / "report.html"));
  CommandRun r = partition_into(dir / "m.onnx", plan.string(), " --stages 1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(fs::exists(plan / "report.html"));  // the new plan replaced the whole folder
  r = partition_into(dir / "m.onnx", plan.string());
  EXPECT_EQ(r.code, 0) << r.out;
  // With stage files too.
  r = run_apart("partition " + (dir / "m.onnx").string() + " --devices 2 --batch 4 --no-baselines -o " + plan.string());
  EXPECT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(fs::exists(plan / "stage_0.onnx"));
  r = run_apart("partition " + (dir / "m.onnx").string() + " --devices 2 --batch 4 -o " + plan.string() + "/");
  EXPECT_EQ(r.code, 0) << r.out;
  fs::create_directories(dir / "empty");
  r = partition_into(dir / "m.onnx", (dir / "empty").string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir / "empty" / "plan.json"));
  EXPECT_TRUE(hidden_entries(dir.path()).empty());
}

// --- outputs that are inputs -------------------------------------------------------------------------------

TEST(AnOutputPath, ThatIsTheModelIsRefusedByCostsAndProfile) {
  TempDir dir;
  const fs::path model = write_model(dir / "m.onnx");
  const std::string bytes = read_file(model);
  fs::create_symlink(model, dir / "link.onnx");
  fs::create_hard_link(model, dir / "hard.onnx");
  for (const char* cmd : {"costs", "profile"})
    for (const fs::path& out : {model, dir.path() / "." / "m.onnx", dir / "link.onnx", dir / "hard.onnx"}) {
      const CommandRun r = run_apart(std::string(cmd) + " " + model.string() + " --dim batch=2 -o " + out.string());
      EXPECT_EQ(r.code, 2) << cmd << " -o " << out << ": " << r.out;
      EXPECT_TRUE(contains(r.out, "the model")) << r.out;
      EXPECT_EQ(read_file(model), bytes);
    }
}

TEST(AnOutputPath, ThatIsThePlanIsRefusedByReportVizAndSimulate) {
  TempDir dir;
  const fs::path plan = write_plan(dir);
  const std::string bytes = read_file(plan / "plan.json");
  fs::create_hard_link(plan / "plan.json", dir / "hard.json");
  const std::vector<std::string> commands = {
      "report " + plan.string() + " -o " + (plan / "plan.json").string(),
      "viz " + plan.string() + " -o " + (plan / "plan.json").string(),
      "viz " + plan.string() + " --format json -o " + (plan / "costs.json").string(),
      "simulate " + plan.string() + " --trace " + (plan / "plan.json").string(),
      "simulate " + (plan / "plan.json").string() + " --trace " + (dir / "hard.json").string(),
      "report " + (dir / "hard.json").string() + " -o " + (plan / "." / "plan.json").string(),
  };
  for (const std::string& c : commands) {
    const CommandRun r = run_apart(c);
    EXPECT_EQ(r.code, 2) << c << ": " << r.out;
    EXPECT_TRUE(contains(r.out, "the plan")) << c << ": " << r.out;
    EXPECT_EQ(read_file(plan / "plan.json"), bytes) << c;
  }
  EXPECT_TRUE(fs::exists(plan / "costs.json"));
}

TEST(AnOutputPath, ThatIsAFolderOrInAMissingFolderIsRefusedBeforeTheWork) {
  TempDir dir;
  const fs::path plan = write_plan(dir);
  CommandRun r = run_apart("simulate " + plan.string() + " --trace " + (dir / "nowhere" / "t.json").string());
  EXPECT_EQ(r.code, 6) << r.out;
  EXPECT_FALSE(contains(r.out, "iteration")) << "the table was printed before the failure: " << r.out;
  r = run_apart("viz " + plan.string() + " -o " + plan.string());
  EXPECT_EQ(r.code, 2) << r.out;
}

// --- train checks every output path before step 1 ----------------------------------------------------------

class TrainOutput : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(run_apart("zoo mlp-tiny -q -o " + model().string()).code, 0); }
  fs::path model() const { return dir_ / "mlp.onnx"; }
  CommandRun train(const std::string& flags) {
    return run_apart("train " + model().string() + " --steps 2 --batch 4 " + flags);
  }
  TempDir dir_;
};

TEST_F(TrainOutput, RefusesAFileAsCheckpointDirBeforeStepOne) {
  std::ofstream(dir_ / "ck") << "a file";
  const CommandRun r = train("--checkpoint-dir " + (dir_ / "ck").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "--checkpoint-dir")) << r.out;
  EXPECT_FALSE(contains(r.out, "step=")) << r.out;
  EXPECT_EQ(read_file(dir_ / "ck"), "a file");
}

TEST_F(TrainOutput, RefusesAnUnwritableCheckpointFolderBeforeStepOne) {
  fs::create_directories(dir_ / "ro");
  fs::permissions(dir_ / "ro", fs::perms(0555));
  for (const fs::path& ck : {dir_ / "ro", dir_ / "ro" / "ck"}) {
    const CommandRun r = train("--checkpoint-dir " + ck.string());
    EXPECT_EQ(r.code, 6) << r.out;
    EXPECT_FALSE(contains(r.out, "step=")) << r.out;
  }
  fs::permissions(dir_ / "ro", fs::perms(0755));
}

TEST_F(TrainOutput, RefusesACheckpointFileItDidNotWrite) {
  fs::create_directories(dir_ / "ck");
  std::ofstream(dir_ / "ck" / "checkpoint.apart") << "someone else's";
  const CommandRun r = train("--checkpoint-dir " + (dir_ / "ck").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_FALSE(contains(r.out, "step=")) << r.out;
  EXPECT_EQ(read_file(dir_ / "ck" / "checkpoint.apart"), "someone else's");
}

TEST_F(TrainOutput, RefusesSaveModelIntoAMissingFolderOrOntoItsInputsBeforeStepOne) {
  const std::string bytes = read_file(model());
  CommandRun r = train("--save-model " + (dir_ / "missing" / "out.onnx").string());
  EXPECT_EQ(r.code, 6) << r.out;
  EXPECT_FALSE(contains(r.out, "step=")) << r.out;
  fs::create_hard_link(model(), dir_ / "hard.onnx");
  for (const fs::path& out : {model(), dir_.path() / "." / "mlp.onnx", dir_ / "hard.onnx"}) {
    r = train("--save-model " + out.string());
    EXPECT_EQ(r.code, 2) << out << ": " << r.out;
    EXPECT_TRUE(contains(r.out, "the model")) << r.out;
    EXPECT_FALSE(contains(r.out, "step=")) << r.out;
  }
  EXPECT_EQ(read_file(model()), bytes);
}

TEST_F(TrainOutput, StillWritesACheckpointAndResumesIntoTheSameFolder) {
  const std::string ck = (dir_ / "ck").string();
  CommandRun r = train("--checkpoint-dir " + ck);
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_apart("train " + model().string() + " --steps 3 --batch 4 --resume " + ck + " --checkpoint-dir " + ck +
                " --save-model " + (dir_ / "trained.onnx").string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir_ / "trained.onnx"));
}

// --- zoo -o over an existing file ---------------------------------------------------------------------------

TEST(ZooOutput, ReplacesOnlyAModelZooWroteUnlessForced) {
  TempDir dir;
  const std::string out = (dir / "m.onnx").string();
  ASSERT_EQ(run_apart("zoo mlp-tiny -q -o " + out).code, 0);
  EXPECT_EQ(run_apart("zoo mlp-tiny -q --seed 2 -o " + out).code, 0) << "its own model is replaced";

  std::ofstream(dir / "notes.onnx") << "not a model";
  CommandRun r = run_apart("zoo mlp-tiny -q -o " + (dir / "notes.onnx").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "--force")) << r.out;
  EXPECT_EQ(read_file(dir / "notes.onnx"), "not a model");
  write_model(dir / "theirs.onnx");  // an ONNX model from elsewhere
  EXPECT_EQ(run_apart("zoo mlp-tiny -q -o " + (dir / "theirs.onnx").string()).code, 2);
  r = run_apart("zoo mlp-tiny -q --force -o " + (dir / "notes.onnx").string());
  EXPECT_EQ(r.code, 0) << r.out;

  // The weights file zoo would write (or point at) beside a new model belongs to someone else.
  std::ofstream(dir / "big.weights") << "their weights";
  r = run_apart("zoo mlp-tiny -q --weights none -o " + (dir / "big.onnx").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "big.weights")) << r.out;
  EXPECT_EQ(read_file(dir / "big.weights"), "their weights");
}

}  // namespace
