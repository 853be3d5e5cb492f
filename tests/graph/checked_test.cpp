// graph/checked.h: range checks name the value and the range; conversions from double never hit undefined behaviour.
#include "graph/checked.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace apart {
namespace {

TEST(ACheckedConversion, RefusesEveryDoubleAnInt64CannotHold) {
  EXPECT_EQ(to_int64(42.0), 42);
  EXPECT_EQ(to_int64(-9223372036854775808.0), std::numeric_limits<int64_t>::min());
  EXPECT_FALSE(to_int64(9223372036854775808.0));  // 2^63: one past the largest int64
  EXPECT_FALSE(to_int64(1e300));
  EXPECT_FALSE(to_int64(7.5));
  EXPECT_FALSE(to_int64(std::nan("")));
  EXPECT_FALSE(to_int64(std::numeric_limits<double>::infinity()));
  EXPECT_FALSE(checked_mul(int64_t{1} << 62, 2));
  EXPECT_FALSE(checked_add(std::numeric_limits<int64_t>::max(), 1));
  EXPECT_EQ(saturated_bytes(1e300), saturated_bytes(std::nan("")));
  EXPECT_GT(saturated_bytes(1e300), limits::kMaxByteCount);
}

TEST(ARangeCheck, NamesTheValueTheRangeAndWhatItGot) {
  EXPECT_EQ(number_range_error(5, 0, 10), "");
  EXPECT_EQ(number_range_error(1e308, 0, limits::kMaxSeconds), "must be a finite number in [0, 32000000] (got 1e+308)");
  EXPECT_EQ(number_range_error(std::nan(""), 0, 1), "must be a finite number in [0, 1] (got nan)");
  EXPECT_EQ(integer_range_error(4611686018427387904.0, 1, limits::kMaxDevices),
            "must be an integer in [1, 1048576] (got 4611686018427387904)");
  EXPECT_EQ(integer_range_error(7.5, 1, 8), "must be an integer in [1, 8] (got 7.5)");
  try {
    checked_integer(int64_t{99999999999}, 1, limits::kMaxDevices, "--devices");
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "--devices must be an integer in [1, 1048576] (got 99999999999)");
  }
  EXPECT_THROW(checked_number(-1, 0, 1, "x", ErrorKind::kInvalidModel), InvalidModel);
}

}  // namespace
}  // namespace apart
