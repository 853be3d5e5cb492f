// The ranges every number apart reads from a file or a flag is checked against (README "Limits"), and checked
// conversions from double to integers: a value out of range is a typed error that names it, never UB.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "graph/error.h"

namespace apart {

namespace limits {
// Physics and the model bound every figure: nothing apart plans or replays takes longer than a year, weighs more
// than 2^60 bytes (an exbibyte) or runs faster than an exaFLOP/s (or an exabyte/s) on one device or link.
inline constexpr double kMaxSeconds = 3.2e7;
inline constexpr double kMaxBytes = 1152921504606846976.0;  // 2^60
inline constexpr int64_t kMaxByteCount = int64_t{1} << 60;  // the same, as an integer
inline constexpr double kMaxRate = 1e18;                    // FLOP/s and bytes/s
inline constexpr double kMaxFlops = kMaxRate * kMaxSeconds; // FLOPs of one task: a year at an exaFLOP/s
inline constexpr int64_t kMaxDevices = int64_t{1} << 20;    // 1,048,576 devices (and devices per node, stages)
inline constexpr int64_t kMaxBatch = int64_t{1} << 24;      // 16,777,216 samples per iteration (and micro-batches)
inline constexpr int64_t kMaxDim = int64_t{1} << 40;        // one bound tensor dim (--dim, --shape)
inline constexpr int64_t kMaxVirtualStages = 64;            // chunks per device of an interleaved schedule
inline constexpr int64_t kMaxSteps = int64_t{1} << 40;      // training steps
// One replay (apart simulate, report, partition's final choice) runs micro-batches × stages × chunks forward and
// as many backward operations, each a few events of ~100 bytes: 2^22 of them is ~2 GB and seconds of work.
inline constexpr int64_t kMaxSimulatedOps = int64_t{1} << 22;
inline constexpr int64_t kMaxReportStages = 1024;           // stages `apart report` draws
}  // namespace limits

// "[0, 3.2e+07]": a range as the messages print it.
std::string range_text(double lo, double hi);

// What is wrong with `value` for a finite number in [lo, hi], or "" when nothing is:
// "must be a finite number in [0, 3.2e+07] (got 1e+308)".
std::string number_range_error(double value, double lo, double hi);
// The same for an integer in [lo, hi]; an integral double counts ("must be an integer in [1, 1048576] (got 7.5)").
std::string integer_range_error(double value, int64_t lo, int64_t hi);
std::string integer_range_error(int64_t value, int64_t lo, int64_t hi);

// `value` as an int64 when it is integral and representable, else nullopt (a cast would be undefined).
std::optional<int64_t> to_int64(double value);

// Throws `kind` with "NAME must be …" when out of range; returns the value otherwise.
double checked_number(double value, double lo, double hi, const std::string& name,
                      ErrorKind kind = ErrorKind::kInvalidArgument);
int64_t checked_integer(double value, int64_t lo, int64_t hi, const std::string& name,
                        ErrorKind kind = ErrorKind::kInvalidArgument);
int64_t checked_integer(int64_t value, int64_t lo, int64_t hi, const std::string& name,
                        ErrorKind kind = ErrorKind::kInvalidArgument);
inline int64_t checked_integer(int value, int64_t lo, int64_t hi, const std::string& name,
                               ErrorKind kind = ErrorKind::kInvalidArgument) {
  return checked_integer(static_cast<int64_t>(value), lo, hi, name, kind);
}
// An int, for counts the code keeps as int (devices, stages): [lo, hi] must lie inside int's range.
int checked_int(int64_t value, int64_t lo, int64_t hi, const std::string& name,
                ErrorKind kind = ErrorKind::kInvalidArgument);

// `value` rounded up to an int64, saturating at limits::kMaxByteCount × 4 (NaN too): for sizes a model computes in
// doubles, where "more than any device holds" is the only thing a caller compares.
inline int64_t saturated_bytes(double value) {
  constexpr double kCap = 4 * limits::kMaxBytes;
  if (!(value < kCap)) return static_cast<int64_t>(kCap);  // also NaN
  return value <= 0 ? 0 : static_cast<int64_t>(std::ceil(value));
}

// a × b and a + b, or nullopt on int64 overflow.
std::optional<int64_t> checked_mul(int64_t a, int64_t b);
std::optional<int64_t> checked_add(int64_t a, int64_t b);

}  // namespace apart
