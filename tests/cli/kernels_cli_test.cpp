// `apart kernels`: the kernel program of one training step of a zoo GPT as JSON, its totals the sums of its kernels,
// the cost model's launches equal to the program's, and no tensor as large as one seq × seq score per head.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/run_apart.h"
#include "tests/support/temp_dir.h"

namespace {

using apart::testing::run_apart;
using apart::testing::TempDir;
using json = nlohmann::json;

TEST(TheKernelsCommand, ListsAGptStepWhoseTotalsAreItsKernelsAndWhatTheCostModelPrices) {
  TempDir dir;
  const std::string model = (dir / "gpt.onnx").string();
  constexpr int64_t kSeq = 128, kHeads = 4, kBatch = 2;
  ASSERT_EQ(run_apart("zoo gpt --layers 2 --hidden 32 --heads 4 --seq 128 --vocab 64 -q -o " + model).code, 0);
  for (const std::string device : {"cpu", "h100-80gb"}) {
    const auto r = run_apart("kernels " + model + " --batch 2 --device " + device + " --json", false);
    ASSERT_EQ(r.code, 0) << r.out;
    const json j = json::parse(r.out);
    int64_t launches = 0;
    double bytes = 0, flops = 0;
    for (const auto& k : j.at("kernels")) {
      launches += k.at("launch").get<bool>() ? 1 : 0;
      bytes += k.at("bytes_read").get<double>() + k.at("bytes_written").get<double>();
      flops += k.at("flops").get<double>();
    }
    const json& totals = j.at("totals");
    EXPECT_EQ(totals.at("launches").get<int64_t>(), launches) << device;
    EXPECT_NEAR(totals.at("bytes").get<double>(), bytes, 1e-9 * bytes) << device;
    EXPECT_NEAR(totals.at("flops").get<double>(), flops, 1e-9 * flops) << device;
    EXPECT_LT(totals.at("largest_tensor_bytes").get<int64_t>(), kSeq * kSeq * 4 * kHeads * kBatch) << device;
    EXPECT_GT(totals.at("fp32_activation_fraction").get<double>(), 0) << device;
    EXPECT_EQ(j.at("priced").at("launches").get<int64_t>(), launches) << device;
    EXPECT_GT(j.at("priced").at("bytes").get<double>(), 0) << device;
  }
}

TEST(TheKernelsCommand, RefusesAnUnknownDeviceNamingTheFlag) {
  TempDir dir;
  const std::string model = (dir / "gpt.onnx").string();
  ASSERT_EQ(run_apart("zoo gpt --layers 1 --hidden 16 --heads 2 --seq 8 --vocab 32 -q -o " + model).code, 0);
  const auto r = run_apart("kernels " + model + " --device no-such-gpu");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("no-such-gpu"), std::string::npos) << r.out;
}

}  // namespace
