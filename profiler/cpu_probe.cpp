// Measures the CPU's fp32 throughput (a small sgemm loop) and memory bandwidth (a streaming copy)
// on every hardware thread at once, in well under a second.
#include "profiler/cpu_probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace apart::detail {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kN = 128;  // 3 × 64 KiB matrices: the working set of one thread stays in L2

// C += A·B, i-k-j order so the inner loop vectorises; cloned for AVX2+FMA where the CPU has it.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
void sgemm(const float* a, const float* b, float* c) {
  for (int i = 0; i < kN; ++i)
    for (int k = 0; k < kN; ++k) {
      const float aik = a[i * kN + k];
      float* __restrict crow = c + i * kN;
      const float* __restrict brow = b + k * kN;
      for (int j = 0; j < kN; ++j) crow[j] += aik * brow[j];
    }
}

double gemm_thread(double seconds) {
  std::vector<float> a(kN * kN, 1.0f), b(kN * kN, 0.5f), c(kN * kN, 0.0f);
  int64_t reps = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  do {
    sgemm(a.data(), b.data(), c.data());
    ++reps;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < seconds);
  volatile float sink = c[0];
  (void)sink;
  return 2.0 * kN * kN * kN * static_cast<double>(reps) / elapsed;
}

double copy_thread(size_t bytes, int reps) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);  // fault the pages in before timing
  const auto start = Clock::now();
  for (int r = 0; r < reps; ++r) {
    std::memcpy(dst.data(), src.data(), bytes);
    src[static_cast<size_t>(r) % bytes] = static_cast<char>(r);  // keep the copies observable
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  volatile char sink = dst[bytes / 2];
  (void)sink;
  return 2.0 * static_cast<double>(bytes) * reps / elapsed;  // read + write
}

template <class F>
double on_all_threads(int threads, F f) {
  std::vector<double> result(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { result[static_cast<size_t>(t)] = f(); });
  for (auto& th : pool) th.join();
  double sum = 0;
  for (double r : result) sum += r;
  return sum;
}

}  // namespace

CpuProbe measure_cpu() {
  CpuProbe p;
  p.threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 256u));
  const auto start = Clock::now();
  p.fp32_flops = on_all_threads(p.threads, [] { return gemm_thread(0.15); });
  // 64 MiB in all, far beyond the caches, split among the threads.
  const size_t per_thread = std::max<size_t>(size_t{4} << 20, (size_t{64} << 20) / static_cast<size_t>(p.threads));
  p.bandwidth = on_all_threads(p.threads, [per_thread] { return copy_thread(per_thread, 4); });
  p.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return p;
}

}  // namespace apart::detail
