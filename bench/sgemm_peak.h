// This machine's measured cblas_sgemm GFLOP/s: the yardstick the CPU-runtime benchmarks report against.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace apart::bench {

// Best of `reps` n×n×n single-precision GEMMs after one warm-up.
inline double sgemm_gflops(int n, int reps) {
  using Clock = std::chrono::steady_clock;
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a), c(a.size());
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t).count());
  }
  return 2.0 * n * n * n / best / 1e9;
}

}  // namespace apart::bench
