// plan/plan_file.h: whether a file is an apart plan, without reading the plan.
#include "plan/plan_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "plan/plan.h"

namespace apart {
namespace {

namespace fs = std::filesystem;

fs::path write_text(const std::string& name, const std::string& text) {
  const fs::path dir = fs::temp_directory_path() / "apart_plan_file_test";
  fs::create_directories(dir);
  const fs::path file = dir / name;
  std::ofstream(file, std::ios::binary) << text;
  return file;
}

TEST(APlanFile, IsApartsWhenItsSchemaIsAnyVersionOfApartPlan) {
  EXPECT_TRUE(is_apart_plan_json(write_text("current.json", std::string("{\"schema\": \"") + kPlanSchema + "\"}")));
  EXPECT_TRUE(is_apart_plan_json(write_text("later.json", "{\"schema\": \"apart.plan/7\", \"stages\": []}")));
}

TEST(APlanFile, IsNotApartsWhenItIsAnotherSchemaOrNotAJsonObjectOrMissing) {
  EXPECT_FALSE(is_apart_plan_json(write_text("costs.json", "{\"schema\": \"apart.costs/1\"}")));
  EXPECT_FALSE(is_apart_plan_json(write_text("number.json", "{\"schema\": 1}")));
  EXPECT_FALSE(is_apart_plan_json(write_text("array.json", "[\"apart.plan/1\"]")));
  EXPECT_FALSE(is_apart_plan_json(write_text("broken.json", "{\"schema\": \"apart.plan/1\"")));
  EXPECT_FALSE(is_apart_plan_json(fs::temp_directory_path() / "apart_plan_file_test" / "absent.json"));
}

}  // namespace
}  // namespace apart
