// Range checks and checked conversions for numbers read from files and flags.
#include "graph/checked.h"

#include <cmath>
#include <cstdio>
#include <limits>

namespace apart {
namespace {
std::optional<int64_t> integral(double value) {
  // 2^63 is exactly representable; every double below it (and ≥ −2^63) converts without UB.
  if (!std::isfinite(value) || std::floor(value) != value) return std::nullopt;
  if (value < -9223372036854775808.0 || value >= 9223372036854775808.0) return std::nullopt;
  return static_cast<int64_t>(value);
}

// Integral values exactly (2^60 as 1152921504606846976), others as %g ("1e+308", "7.5", "nan").
std::string show(double v) {
  if (const auto i = integral(v)) return std::to_string(*i);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}
}  // namespace

std::string range_text(double lo, double hi) { return "[" + show(lo) + ", " + show(hi) + "]"; }

std::optional<int64_t> to_int64(double value) { return integral(value); }

std::string number_range_error(double value, double lo, double hi) {
  if (std::isfinite(value) && value >= lo && value <= hi) return "";
  return "must be a finite number in " + range_text(lo, hi) + " (got " + show(value) + ")";
}

std::string integer_range_error(int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return "";
  return "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "] (got " + std::to_string(value) +
         ")";
}

std::string integer_range_error(double value, int64_t lo, int64_t hi) {
  const auto i = to_int64(value);
  if (i) return integer_range_error(*i, lo, hi);
  return "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "] (got " + show(value) + ")";
}

double checked_number(double value, double lo, double hi, const std::string& name, ErrorKind kind) {
  if (const std::string e = number_range_error(value, lo, hi); !e.empty()) throw_error(kind, name + " " + e);
  return value;
}

int64_t checked_integer(double value, int64_t lo, int64_t hi, const std::string& name, ErrorKind kind) {
  if (const std::string e = integer_range_error(value, lo, hi); !e.empty()) throw_error(kind, name + " " + e);
  return *to_int64(value);
}

int64_t checked_integer(int64_t value, int64_t lo, int64_t hi, const std::string& name, ErrorKind kind) {
  if (const std::string e = integer_range_error(value, lo, hi); !e.empty()) throw_error(kind, name + " " + e);
  return value;
}

int checked_int(int64_t value, int64_t lo, int64_t hi, const std::string& name, ErrorKind kind) {
  APART_CHECK(lo >= std::numeric_limits<int>::min() && hi <= std::numeric_limits<int>::max(), "checked_int range");
  return static_cast<int>(checked_integer(value, lo, hi, name, kind));
}

std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

}  // namespace apart
