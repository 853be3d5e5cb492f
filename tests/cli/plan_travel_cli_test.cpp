// Plans that travel: a plan folder copied elsewhere with its model beside it at the same relative place checks,
// simulates and runs from another working directory, though the path it was made with no longer leads anywhere.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "tests/support/onnx_builder.h"
#include "tests/support/run_apart.h"
#include "tests/support/temp_dir.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using testing::run_command;

TEST(ACopiedPlanFolder, ChecksSimulatesAndRunsFromAnotherWorkingDirectory) {
  testing::TempDir dir("travel");
  const fs::path laptop = dir.path() / "laptop", cluster = dir.path() / "cluster", elsewhere = dir.path() / "elsewhere";
  fs::create_directories(laptop / "models");
  fs::create_directories(elsewhere);
  fs::copy_file(fs::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx", laptop / "models" / "gpt.onnx");
  const std::string apart = std::string(APART_BINARY);
  // Made with a relative path, from the laptop folder: plan.json's path is "models/gpt.onnx".
  const auto made = run_command("cd " + laptop.string() + " && " + apart +
                                " partition models/gpt.onnx --batch 4 --devices 2 --device cpu --stages 2 "
                                "--microbatches 2 -q -o plans/p 2>&1");
  ASSERT_EQ(made.code, 0) << made.out;
  const auto doc = nlohmann::json::parse(testing::read_file(laptop / "plans" / "p" / "plan.json"));
  EXPECT_EQ(doc["model"]["path"], "models/gpt.onnx");
  EXPECT_EQ(doc["model"]["relative_path"], "../../models/gpt.onnx");
  EXPECT_EQ(fs::path(doc["model"]["absolute_path"].get<std::string>()),
            fs::weakly_canonical(laptop / "models" / "gpt.onnx"));

  // The whole laptop folder moves to the cluster; nothing is left at the absolute path.
  fs::copy(laptop, cluster, fs::copy_options::recursive);
  fs::remove_all(laptop);
  const std::string plan = (cluster / "plans" / "p").string();
  const std::string from = "cd " + elsewhere.string() + " && ";
  const auto check = run_command(from + apart + " check " + plan + " 2>&1");
  EXPECT_EQ(check.code, 0) << check.out;
  EXPECT_NE(check.out.find("the plan folder"), std::string::npos) << check.out;
  const auto simulate = run_command(from + apart + " simulate " + plan + " 2>&1");
  EXPECT_EQ(simulate.code, 0) << simulate.out;
  const auto run = run_command(from + apart + " run " + plan + " --in-process --steps 2 2>&1");
  EXPECT_EQ(run.code, 0) << run.out;
  EXPECT_NE(run.out.find("ran 2 steps"), std::string::npos) << run.out;

  // Another model at the same place is refused, naming both places it looked.
  fs::copy_file(fs::path(APART_SOURCE_DIR) / "tests" / "data" / "engines" / "deepspeed_0.16.5_names.txt",
                cluster / "models" / "gpt.onnx", fs::copy_options::overwrite_existing);
  const auto wrong = run_command(from + apart + " run " + plan + " --in-process --steps 1 2>&1");
  EXPECT_EQ(wrong.code, 2) << wrong.out;
  EXPECT_NE(wrong.out.find("not the one the plan was made for"), std::string::npos) << wrong.out;
  EXPECT_NE(wrong.out.find((cluster / "models" / "gpt.onnx").string()), std::string::npos) << wrong.out;
}

}  // namespace
}  // namespace apart
