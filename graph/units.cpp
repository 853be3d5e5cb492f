// Human-readable times, memory sizes and counts (graph/units.h).
#include "graph/units.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace apart {
namespace {

// 4 significant digits for a value in [1, 1000): 812.3, 12.34, 1.212.
std::string four_digits(double v, const char* unit) {
  const double a = std::fabs(v);
  const int decimals = a >= 100 ? 1 : a >= 10 ? 2 : 3;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f %s", decimals, v, unit);
  return buf;
}

std::string scaled(double v, const char* const* units, int n, double step) {
  int u = 0;
  while (u + 1 < n && std::fabs(v) >= step) {
    v /= step;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 && std::floor(v) == v ? "%.0f%s" : "%.2f%s", v, units[u]);
  return buf;
}

}  // namespace

std::string format_seconds(double s) {
  if (!std::isfinite(s)) return s > 0 ? "inf s" : s < 0 ? "-inf s" : "nan s";
  const double a = std::fabs(s);
  if (a == 0) return "0 s";
  if (a < 1e-3) return four_digits(s * 1e6, "µs");
  if (a < 1) return four_digits(s * 1e3, "ms");
  if (a < 60) return four_digits(s, "s");
  if (a < 3600) return four_digits(s / 60, "min");
  return a < 3600.0 * 1000 ? four_digits(s / 3600, "h") : format_significant(s / 3600, 4) + " h";
}

std::string format_bytes(double bytes) {
  static const char* const units[] = {" B", " KiB", " MiB", " GiB", " TiB", " PiB", " EiB"};
  return scaled(bytes, units, 7, 1024.0);
}

std::string format_count(double n) {
  static const char* const units[] = {"", "K", "M", "B", "T"};
  return scaled(n, units, 5, 1000.0);
}

std::string format_significant(double v, int digits) {
  if (!std::isfinite(v)) return v > 0 ? "inf" : v < 0 ? "-inf" : "nan";
  if (v == 0) return "0";
  const int magnitude = static_cast<int>(std::floor(std::log10(std::fabs(v))));
  const int decimals = std::max(0, digits - 1 - magnitude);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string format_task_counts(size_t tasks, size_t batch_tasks) {
  return std::to_string(tasks) + " tasks (" + std::to_string(batch_tasks) + " batch, " +
         std::to_string(tasks - std::min(tasks, batch_tasks)) + " constant)";
}

}  // namespace apart
