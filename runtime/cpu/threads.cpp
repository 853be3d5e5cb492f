// The CPU kernels' threads (runtime/cpu/threads.h).
#include "runtime/cpu/threads.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "graph/error.h"
#include "graph/threads.h"
#include "runtime/blas_info.h"

namespace apart {

namespace {
std::atomic<int> g_compute_threads{0};  // 0: not set yet (default_compute_threads on first use)
}  // namespace

int default_compute_threads() { return default_thread_count(); }

int compute_threads() {
  int n = g_compute_threads.load(std::memory_order_relaxed);
  if (n == 0) {
    n = default_compute_threads();
    g_compute_threads.store(n, std::memory_order_relaxed);
  }
  return n;
}

void set_compute_threads(int threads) {
  if (threads < 1 || threads > kMaxThreads)
    throw InvalidArgument("--threads " + std::to_string(threads) + ": expected a thread count in [1, " +
                          std::to_string(kMaxThreads) + "]");
  g_compute_threads.store(threads, std::memory_order_relaxed);
  set_blas_threads(threads);
}

void parallel_for(int64_t n, int64_t cost_per_item, const std::function<void(int64_t, int64_t)>& body) {
  constexpr int64_t kMinWorkPerThread = 1 << 16;
  const int64_t hw = compute_threads();
  const int64_t threads =
      std::min<int64_t>({hw, n, std::max<int64_t>(1, n * std::max<int64_t>(cost_per_item, 1) / kMinWorkPerThread)});
  if (threads <= 1) {
    if (n > 0) body(0, n);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t b = t * chunk, e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back([&body, b, e] { body(b, e); });
  }
  body(0, std::min(n, chunk));
  for (auto& th : pool) th.join();
}

}  // namespace apart
