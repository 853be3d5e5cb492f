// graph/units.h: the one formatter for times, memory sizes, counts and task counts.
#include "graph/units.h"

#include <gtest/gtest.h>

namespace {

using namespace apart;

TEST(FormatSeconds, PrintsFourSignificantDigitsInTheUnitThatFits) {
  EXPECT_EQ(format_seconds(0), "0 s");
  EXPECT_EQ(format_seconds(812.3e-6), "812.3 µs");
  EXPECT_EQ(format_seconds(0.0012124), "1.212 ms");
  EXPECT_EQ(format_seconds(2.5), "2.500 s");
  // The "592866.586 ms" (GPT-3 175B in fp32).
  EXPECT_EQ(format_seconds(592.866586), "9.881 min");
  EXPECT_EQ(format_seconds(7200), "2.000 h");
}

TEST(FormatBytes, UsesBinaryUnitsLikeTheDeviceDatasheets) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  // An A100-80GB has 80 GiB (81920 MiB, what nvidia-smi reports), not "86 GB".
  EXPECT_EQ(format_bytes(81920.0 * 1024 * 1024), "80.00 GiB");
}

TEST(FormatCount, UsesDecimalSuffixes) {
  EXPECT_EQ(format_count(512), "512");
  EXPECT_EQ(format_count(167680), "167.68K");
}

TEST(FormatSignificant, KeepsSlowRatesReadable) {
  EXPECT_EQ(format_significant(0.0123456), "0.0123");
  EXPECT_EQ(format_significant(12.345), "12.3");
  EXPECT_EQ(format_significant(27920.3), "27920");
}

TEST(FormatTaskCounts, NamesBatchAndConstantTasks) {
  EXPECT_EQ(format_task_counts(145, 109), "145 tasks (109 batch, 36 constant)");
}

}  // namespace
