// Device presets, the cached CPU probe, memory reserves and default precisions (cluster JSON: tests/plan).
#include "profiler/device.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "graph/error.h"

namespace apart {
namespace {

TEST(DevicePresets, HaveMemoryPeaksAndBandwidth) {
  for (const std::string name : {"v100-32gb", "a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb"}) {
    const Device d = device_preset(name);
    EXPECT_EQ(d.name, name);
    EXPECT_GT(d.memory_bytes, 30LL << 30) << name;
    EXPECT_GT(d.peak_fp32_flops, 1e13) << name;
    EXPECT_GE(d.peak_tf32_flops, d.peak_fp32_flops) << name;
    EXPECT_GT(d.peak_fp16_flops, d.peak_tf32_flops) << name;
    EXPECT_GT(d.memory_bandwidth, 5e11) << name;
    EXPECT_GT(d.intra_node.bandwidth, d.inter_node.bandwidth) << name;
  }
  EXPECT_DOUBLE_EQ(device_preset("a100-80gb").peak_fp16_flops, 312e12);
}

TEST(DevicePresets, RejectUnknownNamesListingTheKnownOnes) {
  try {
    device_preset("tpu-v9");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("h100-80gb"), std::string::npos);
  }
}

class CpuDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("apart_cache_test_" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    setenv("APART_CACHE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    unsetenv("APART_CACHE_DIR");
  }
  std::filesystem::path dir_;
};

TEST_F(CpuDevice, IsProbedOnceAndThenReadFromTheCache) {
  EXPECT_EQ(cpu_cache_path(), dir_ / "cpu.json");
  const Device first = device_preset("cpu");
  EXPECT_TRUE(first.measured);
  EXPECT_GT(first.peak_fp32_flops, 1e8);
  EXPECT_GT(first.memory_bandwidth, 1e8);
  ASSERT_TRUE(std::filesystem::exists(dir_ / "cpu.json"));
  // Overwrite the cache with known figures: the next call must use them instead of probing.
  auto j = nlohmann::json::parse(std::ifstream(dir_ / "cpu.json"));
  j["fp32_flops"] = 123e9;
  j["bandwidth_bytes_per_s"] = 45e9;
  std::ofstream(dir_ / "cpu.json") << j.dump();
  const Device cached = device_preset("cpu");
  EXPECT_DOUBLE_EQ(cached.peak_fp32_flops, 123e9);
  EXPECT_DOUBLE_EQ(cached.memory_bandwidth, 45e9);
}

TEST_F(CpuDevice, ReprobesWhenTheCacheIsCorrupt) {
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ / "cpu.json") << "{not json";
  const Device d = device_preset("cpu");
  EXPECT_GT(d.peak_fp32_flops, 1e8);
}

}  // namespace
}  // namespace apart

namespace memory_reserve_tests {

using apart::parse_memory_reserve;
constexpr int64_t kGiB = int64_t{1} << 30;

TEST(DevicePresets, CarryTheMemoryTheCardIsSoldWith) {
  // NVIDIA's "80GB" is 80 GiB of HBM (nvidia-smi: 81920 MiB).
  EXPECT_EQ(apart::device_preset("a100-80gb").memory_bytes, 80 * kGiB);
}

TEST(MemoryReserve, ParsesSizesPercentagesAndBoth) {
  EXPECT_EQ(parse_memory_reserve("0").bytes(80 * kGiB), 0);
  EXPECT_EQ(parse_memory_reserve("4GiB").fixed_bytes, 4 * kGiB);
  EXPECT_EQ(parse_memory_reserve("3GB").fixed_bytes, 3'000'000'000);
  EXPECT_DOUBLE_EQ(parse_memory_reserve("10%").fraction, 0.10);
  const auto both = parse_memory_reserve("2GiB+5%");
  EXPECT_EQ(both.bytes(80 * kGiB), 2 * kGiB + 4 * kGiB);
  EXPECT_EQ(both.text(), "2GiB+5%");
}

TEST(MemoryReserve, RejectsMalformedAndOutOfRangeValues) {
  for (const char* bad : {"", "abc", "-1GiB", "4XB", "100%", "5%+6%", "1GiB+2GiB", "2GiB+", "nan", "2e30"})
    EXPECT_THROW(parse_memory_reserve(bad), apart::InvalidArgument) << bad;
}

TEST(MemoryReserve, DefaultsTo2GiBPlus5PercentAndMustLeaveMemory) {
  apart::Cluster c = apart::make_cluster(apart::device_preset("a100-80gb"), 8, 8);
  EXPECT_EQ(c.reserve.text(), "2GiB+5%");
  EXPECT_EQ(c.usable_memory_bytes(), 80 * kGiB - 2 * kGiB - 4 * kGiB);
  c.reserve = parse_memory_reserve("80GiB");
  EXPECT_THROW(c.validate(), apart::InvalidArgument);
}

TEST(DefaultPrecision, IsMixedOnGpusAndFp32OnTheCpu) {
  EXPECT_EQ(apart::default_precision(apart::device_preset("a100-80gb")), apart::Precision::kMixed);
  apart::Device cpu;
  cpu.name = "cpu";
  cpu.measured = true;
  EXPECT_EQ(apart::default_precision(cpu), apart::Precision::kFp32);
  EXPECT_EQ(apart::resolve_precision("fp32", apart::device_preset("a100-80gb")), apart::Precision::kFp32);
}

}  // namespace memory_reserve_tests
