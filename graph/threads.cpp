// Thread counts from the environment, and run_indexed (threads.h).
#include "graph/threads.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "graph/error.h"

namespace apart {

std::optional<int> thread_count_from_environment() {
  for (const char* name : {"APART_NUM_THREADS", "OMP_NUM_THREADS"}) {
    const char* v = std::getenv(name);
    if (!v || !*v) continue;
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v, &end, 10);
    if (errno != 0 || *end != '\0' || n < 1 || n > kMaxThreads)
      throw InvalidArgument(std::string("environment variable ") + name + "='" + v + "': expected a thread count in [1, " +
                            std::to_string(kMaxThreads) + "]");
    return static_cast<int>(n);
  }
  return std::nullopt;
}

int default_thread_count() {
  return thread_count_from_environment().value_or(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

void run_indexed(size_t n, int threads, const std::function<void(size_t index)>& task) {
  const size_t workers = std::min(n, static_cast<size_t>(std::max(1, threads)));
  if (workers <= 1) {
    for (size_t i = 0; i < n; ++i) task(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  size_t failed_index = n;
  std::exception_ptr failure;
  auto work = [&] {
    for (;;) {
      if (failed.load(std::memory_order_acquire)) return;
      const size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) return;
      try {
        task(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (i < failed_index) {
          failed_index = i;
          failure = std::current_exception();
        }
        failed.store(true, std::memory_order_release);
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (size_t t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace apart
