// plan/model_location.h: a plan finds its model from the plan folder first, then its absolute path, by hash.
#include "plan/model_location.h"

#include <gtest/gtest.h>

#include <fstream>

#include "graph/error.h"
#include "graph/sha256.h"
#include "tests/support/temp_dir.h"

namespace apart {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

PlanDocument plan_of(const fs::path& model, const fs::path& plan_dir) {
  PlanDocument plan;
  plan.model = PlanModel{};
  plan.model->path = "somewhere/else/model.onnx";  // as given where apart partition ran: not from here
  plan.model->sha256 = sha256_file_hex(model);
  record_model_location(*plan.model, model, plan_dir);
  return plan;
}

TEST(ARecordedModelLocation, IsRelativeToThePlanFolderAndAbsolute) {
  testing::TempDir dir;
  write(dir.path() / "run" / "model.onnx", "model bytes");
  const PlanDocument plan = plan_of(dir.path() / "run" / "model.onnx", dir.path() / "run" / "plans" / "p1");
  EXPECT_EQ(*plan.model->relative_path, "../../model.onnx");
  EXPECT_EQ(fs::path(*plan.model->absolute_path), fs::weakly_canonical(dir.path() / "run" / "model.onnx"));
}

TEST(ALocatedModel, IsFoundBesideACopiedPlanFolderBeforeItsAbsolutePath) {
  testing::TempDir dir;
  write(dir.path() / "a" / "model.onnx", "model bytes");
  const PlanDocument plan = plan_of(dir.path() / "a" / "model.onnx", dir.path() / "a" / "plan");
  // The folder and its model copied elsewhere; the original stays, so both places hold it.
  write(dir.path() / "b" / "model.onnx", "model bytes");
  const PlanModelLocation found = locate_plan_model(plan, dir.path() / "b" / "plan");
  EXPECT_EQ(found.path, dir.path() / "b" / "model.onnx");
  EXPECT_EQ(found.found_by, "the plan folder");
  EXPECT_EQ(found.sha256, plan.model->sha256);
}

TEST(ALocatedModel, FallsBackToTheAbsolutePathWhenNothingIsBesideThePlan) {
  testing::TempDir dir;
  write(dir.path() / "a" / "model.onnx", "model bytes");
  const PlanDocument plan = plan_of(dir.path() / "a" / "model.onnx", dir.path() / "a" / "plan");
  const PlanModelLocation found = locate_plan_model(plan, dir.path() / "elsewhere" / "plan");
  EXPECT_EQ(found.found_by, "the absolute path");
  EXPECT_TRUE(fs::equivalent(found.path, dir.path() / "a" / "model.onnx"));
}

TEST(ALocatedModel, SkipsAFileOfOtherBytesForTheOneWithThePlansHash) {
  testing::TempDir dir;
  write(dir.path() / "a" / "model.onnx", "model bytes");
  const PlanDocument plan = plan_of(dir.path() / "a" / "model.onnx", dir.path() / "a" / "plan");
  write(dir.path() / "b" / "model.onnx", "another model");
  const PlanModelLocation found = locate_plan_model(plan, dir.path() / "b" / "plan");
  EXPECT_EQ(found.found_by, "the absolute path");
}

TEST(ALocatedModel, IsRefusedNamingBothPathsWhenBothHoldOtherBytes) {
  testing::TempDir dir;
  write(dir.path() / "a" / "model.onnx", "model bytes");
  const PlanDocument plan = plan_of(dir.path() / "a" / "model.onnx", dir.path() / "a" / "plan");
  write(dir.path() / "a" / "model.onnx", "edited model");
  write(dir.path() / "b" / "model.onnx", "another model");
  try {
    locate_plan_model(plan, dir.path() / "b" / "plan");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find((dir.path() / "b" / "model.onnx").string()), std::string::npos) << what;
    EXPECT_NE(what.find(*plan.model->absolute_path), std::string::npos) << what;
    EXPECT_NE(what.find("not the one the plan was made for"), std::string::npos) << what;
  }
}

TEST(ALocatedModel, IsRefusedNamingEveryPlaceTriedWhenMissing) {
  testing::TempDir dir;
  write(dir.path() / "a" / "model.onnx", "model bytes");
  const PlanDocument plan = plan_of(dir.path() / "a" / "model.onnx", dir.path() / "a" / "plan");
  fs::remove(dir.path() / "a" / "model.onnx");
  try {
    locate_plan_model(plan, dir.path() / "b" / "plan");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the plan folder"), std::string::npos) << what;
    EXPECT_NE(what.find("the absolute path"), std::string::npos) << what;
    EXPECT_NE(what.find("--model"), std::string::npos) << what;
  }
}

TEST(ALocatedModel, TakesAnExplicitModelOnlyWithThePlansHash) {
  testing::TempDir dir;
  write(dir.path() / "a" / "model.onnx", "model bytes");
  const PlanDocument plan = plan_of(dir.path() / "a" / "model.onnx", dir.path() / "a" / "plan");
  write(dir.path() / "mine.onnx", "model bytes");
  EXPECT_EQ(locate_plan_model(plan, dir.path() / "b", dir.path() / "mine.onnx").found_by, "--model");
  write(dir.path() / "other.onnx", "other bytes");
  EXPECT_THROW(locate_plan_model(plan, dir.path() / "a" / "plan", dir.path() / "other.onnx"), InvalidArgument);
}

}  // namespace
}  // namespace apart
