// The plans apart writes do not drift: plan.json, report.txt and plan.dot of gpt-tiny and of every model in
// ../shared/models on 8, 64 and 1024 A100s equal goldens byte for byte (apart from the search's wall-clock
// seconds and their figures' last bits: 1e-9 relative). A refactor of the compile path must keep them; an intended
// change regenerates them with APART_UPDATE_GOLDENS=1, and the diff is read in review.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/onnx_builder.h"
#include "tests/support/printed_numbers.h"
#include "tests/support/run_apart.h"

namespace {

namespace fs = std::filesystem;
using apart::testing::first_difference_beyond;
using apart::testing::read_file;
using apart::testing::run_command;
using apart::testing::TempDir;

struct Case {
  std::string model;  // relative to the source directory, as the plan names it
  int devices = 8;
  std::string name() const {
    std::string n = fs::path(model).stem().string() + "_" + std::to_string(devices) + "dev";
    for (char& c : n)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    return n;
  }
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " on " << c.devices << " devices"; }

std::vector<Case> cases() {
  std::vector<std::string> models = {"models/gpt-tiny.onnx"};
  for (const char* m : {"resnet50.onnx", "densenet121.onnx", "inception_v3.onnx", "gpt2_small.onnx"})
    models.push_back(std::string("../shared/models/") + m);
  std::vector<Case> out;
  for (const auto& m : models)
    for (int devices : {8, 64, 1024}) out.push_back({m, devices});
  return out;
}

// The wall-clock parts: plan.json's search.seconds and report.txt's search line end.
std::string without_wall_clock(const std::string& file, const std::string& text) {
  if (file == "plan.json") {  // and where the model is seen from the plan's temporary folder
    const std::string here = std::regex_replace(text, std::regex(R"(\n *"(relative|absolute)_path": "[^"]*",)"), "");
    return std::regex_replace(here, std::regex(R"("seconds": [-0-9.e+]+)"), "\"seconds\": 0");
  }
  if (file == "report.txt")
    return std::regex_replace(text, std::regex(R"(, [0-9.]+ s( \(stopped by --time-limit\))?\n)"), ", <seconds>$1\n");
  return text;
}

class APlan : public ::testing::TestWithParam<Case> {};

TEST_P(APlan, EqualsItsGoldenByteForByte) {
  const Case& c = GetParam();
  const fs::path source(APART_SOURCE_DIR);
  if (!fs::exists(source / c.model)) GTEST_SKIP() << c.model << " is not present";
  TempDir dir;
  // Eight samples per device: enough micro-batches to pipeline at every size.
  const std::string args = " partition " + c.model + " --devices " + std::to_string(c.devices) +
                           " --device a100-80gb --devices-per-node 8 --batch " + std::to_string(8 * c.devices) +
                           " --no-baselines --no-stage-models -o " + (dir / "plan").string();
  const auto run = run_command("cd " + source.string() + " && " + APART_BINARY + args + " 2>&1");
  ASSERT_EQ(run.code, 0) << run.out;
  const fs::path golden = source / "tests" / "data" / "golden" / "plans" / c.name();
  for (const char* file : {"plan.json", "report.txt", "plan.dot"}) {
    const std::string actual = without_wall_clock(file, read_file(dir / "plan" / file));
    if (std::getenv("APART_UPDATE_GOLDENS")) {
      fs::create_directories(golden);
      std::ofstream(golden / file, std::ios::binary) << actual;
      continue;
    }
    ASSERT_TRUE(fs::exists(golden / file)) << "missing golden " << (golden / file);
    // Every figure to 1e-9 relative (first_difference_beyond: libm's last bit may differ by CPU), the rest exactly.
    const std::string difference = first_difference_beyond(actual, read_file(golden / file), 1e-9);
    EXPECT_EQ(difference, "") << c.name() << "/" << file << " differs from its golden; diff it against "
                              << (golden / file)
                              << " and, if the change is intended, rerun with APART_UPDATE_GOLDENS=1";
  }
}

// The comparison the goldens use: a figure's last bits pass, another figure, word or layout does not.
TEST(AGoldenComparison, AcceptsOnlyTheLastBitsOfFigures) {
  EXPECT_EQ(first_difference_beyond("\"iteration_s\": 0.30000000000000004,", "\"iteration_s\": 0.3,", 1e-9), "");
  EXPECT_EQ(first_difference_beyond("stage_1 Gemm_12 -1.5e-3 s", "stage_1 Gemm_12 -1.5000000001e-3 s", 1e-9), "");
  EXPECT_NE(first_difference_beyond("\"iteration_s\": 0.3001,", "\"iteration_s\": 0.3,", 1e-9), "");
  EXPECT_NE(first_difference_beyond("stage_2", "stage_1", 1e-9), "");
  EXPECT_NE(first_difference_beyond("1 stage", "1 stages", 1e-9), "");
  EXPECT_NE(first_difference_beyond("-0.5", "0.5", 1e-9), "");
  EXPECT_EQ(first_difference_beyond("\"sha256\": \"9a276547e752\"", "\"sha256\": \"9a276547e752\"", 1e-9), "");
  EXPECT_NE(first_difference_beyond("\"sha256\": \"276547e752\"", "\"sha256\": \"276547e751\"", 1e-9), "");
}

INSTANTIATE_TEST_SUITE_P(GptTinyAndTheSharedModels, APlan, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name(); });

}  // namespace

namespace {

// `apart partition` runs itself again with glibc's malloc tunables (cli/main.cpp; Release builds only, as this suite):
// the re-run writes the same plan, report and stage files as a run without it (APART_MALLOC_TUNING=0), gpt-tiny on
// 8 devices with baselines and stage files.
TEST(APartitionRerunWithMallocTunables, WritesWhatARunWithoutThemWrites) {
  const fs::path source(APART_SOURCE_DIR);
  TempDir dir;
  std::map<std::string, std::string> written[2];
  for (int tuned = 0; tuned < 2; ++tuned) {
    const fs::path out = dir / (tuned ? "tuned" : "plain");
    const std::string env = tuned ? "env -u APART_MALLOC_TUNING -u GLIBC_TUNABLES " : "env APART_MALLOC_TUNING=0 ";
    const auto run = run_command("cd " + source.string() + " && " + env + APART_BINARY +
                                 " partition models/gpt-tiny.onnx --device cpu --devices 8 --batch 64 -q -o " +
                                 out.string() + " 2>&1");
    ASSERT_EQ(run.code, 0) << run.out;
    for (const auto& entry : fs::directory_iterator(out))
      if (entry.is_regular_file()) {
        const std::string name = entry.path().filename().string();
        written[tuned][name] = without_wall_clock(name, read_file(entry.path()));
      }
  }
  ASSERT_GE(written[0].size(), 5u);
  EXPECT_EQ(written[0].size(), written[1].size());
  for (const auto& [name, text] : written[0]) {
    if (name == "baselines.json") continue;  // each method's planning seconds
    EXPECT_TRUE(written[1].count(name) && written[1][name] == text) << name;
  }
}

}  // namespace
