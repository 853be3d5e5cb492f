// The Llama family planned at scale: an 8-layer Llama 3 70B on 1,024 H100s with --tp auto, by the apart binary.
// Its own target, label slow: 43 s under ASan+UBSan, 2.7 s in Release.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/models/zoo_test_util.h"

namespace apart::models {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kApart = APART_BINARY;

TEST(ALlamaModel, PlansLlama3_70bOn1024H100sWithTensorParallelism) {
  TempDir dir("zoo_llama_plan");
  const std::string path = dir.file("llama.onnx");
  ASSERT_EQ(run_command(kApart + " zoo llama3-70b --layers 8 -q -o " + path + " >/dev/null").code, 0);
  const auto r = run_command(kApart + " partition " + path + " --device h100 --devices 1024 --tp auto --batch 1024 -o " +
                             dir.file("plan").string() + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir.file("plan") / "plan.json"));
}

}  // namespace
}  // namespace apart::models
