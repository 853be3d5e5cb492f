// `apart zoo` end to end: the binary writes, lists, rejects bad flags, and agrees with `apart inspect` on params.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "models/zoo.h"
#include "tests/models/zoo_test_util.h"

namespace apart::models {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kApart = APART_BINARY;

TEST(TheZooCommand, ListsPresetsWithParameterCounts) {
  const auto r = run_command(kApart + " zoo --list");
  ASSERT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("gpt3-175b"), std::string::npos);
  EXPECT_NE(r.out.find("174.6B"), std::string::npos);
  EXPECT_NE(r.out.find("resnet152x8"), std::string::npos);
}

TEST(TheZooCommand, RejectsBadFlagsWithExitCode2AndNoFile) {
  TempDir dir("zoo_cli_bad");
  const std::string out = dir.file("x.onnx");
  for (const std::string args : {"gpt --heads 3", "gpt --dtype fp8", "resnet --layers 34", "nosuchmodel",
                                 "gpt --loss hinge", "gpt --batch 0"}) {
    SCOPED_TRACE(args);
    EXPECT_EQ(run_command(kApart + " zoo " + args + " -o " + out + " 2>/dev/null").code, 2);
    EXPECT_FALSE(std::filesystem::exists(out));
  }
}

TEST(TheZooCommand, PrintsAOneLineSummary) {
  TempDir dir("zoo_cli_summary");
  const auto r = run_command(kApart + " zoo gpt-tiny -o " + dir.file("t.onnx").string());
  ASSERT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("134.9K params"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nodes"), std::string::npos) << r.out;
}

// What `apart inspect --json` counts as params must be exactly the generator's count.
TEST(TheZooCommand, AgreesWithApartInspectOnParams) {
  TempDir dir("zoo_cli_inspect");
  for (const std::string args : {"gpt-tiny", "bert --layers 3", "t5", "mlp-tiny", "resnet50 --weights none",
                                 "gpt3-175b", "bert-large --weights none --dtype fp16"}) {
    SCOPED_TRACE(args);
    const std::string path = dir.file("m.onnx");
    ASSERT_EQ(run_command(kApart + " zoo " + args + " -q -o " + path + " >/dev/null").code, 0);
    const auto r = run_command(kApart + " inspect " + path + " --json --dim batch=1");
    ASSERT_EQ(r.code, 0) << "apart inspect failed on " << args;
    const auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out.substr(0, 200);
    ASSERT_TRUE(j.contains("params"));
    const std::string name = args.substr(0, args.find(' '));
    ZooOptions o = options_for(name);
    if (args == "bert --layers 3") o.layers = 3;
    EXPECT_EQ(j["params"].get<int64_t>(), closed_form_params(o));
  }
}

}  // namespace
}  // namespace apart::models
