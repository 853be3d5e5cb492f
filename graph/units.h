// The one home of human-readable numbers: times, memory sizes, counts (every command and file apart writes).
#pragma once

#include <cstddef>
#include <string>

namespace apart {

// Seconds with 4 significant digits in the unit that fits: "812.3 µs", "1.212 ms", "2.500 s", "9.881 min",
// "164.7 h". 0 prints "0 s".
std::string format_seconds(double seconds);
// Bytes in binary units, the unit device memory is sold and reported in (an "80GB" A100 has 80 GiB of HBM;
// nvidia-smi and the CUDA runtime count in MiB): "512 B", "1.50 KiB", "80.00 GiB".
std::string format_bytes(double bytes);
// A count with decimal suffixes: "512", "167.68K", "124.44M", "175.00B".
std::string format_count(double n);
// At least `digits` significant digits, no exponent (a rate or ratio of any size): with digits = 3,
// 27920.3 → "27920", 12.345 → "12.3", 0.0123456 → "0.0123".
std::string format_significant(double value, int digits = 3);

// How every output counts tasks: "145 tasks (109 batch, 36 constant)" (constant tasks run once, not per sample).
std::string format_task_counts(size_t tasks, size_t batch_tasks);

}  // namespace apart
