// graph/threads.h run_indexed: every index once, the same results on any thread count, the single-thread exception.
// (The thread count from the environment is tested through the runtime's default: tests/runtime/threads_test.cpp.)
#include "graph/threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace apart {
namespace {

TEST(RunIndexed, RunsEveryIndexExactlyOnceOnAnyThreadCount) {
  for (int threads : {1, 2, 3, 8, 64}) {
    std::vector<std::atomic<int>> runs(100);
    run_indexed(runs.size(), threads, [&](size_t i) { runs[i].fetch_add(1); });
    for (size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(runs[i].load(), 1) << "index " << i << ", " << threads << " threads";
  }
  run_indexed(0, 4, [](size_t) { ADD_FAILURE() << "no index to run"; });
}

TEST(RunIndexed, GivesTheSameSlotsWhateverTheThreadCount) {
  auto squares = [](int threads) {
    std::vector<long> out(257);
    run_indexed(out.size(), threads, [&](size_t i) { out[i] = static_cast<long>(i * i); });
    return out;
  };
  EXPECT_EQ(squares(1), squares(2));
  EXPECT_EQ(squares(1), squares(7));
}

TEST(RunIndexed, UsesMoreThanTheCallersThreadWhenGivenSeveral) {
  std::set<std::thread::id> seen;
  std::mutex lock;
  std::atomic<int> waiting{0};
  run_indexed(2, 2, [&](size_t) {
    {
      const std::lock_guard<std::mutex> guard(lock);
      seen.insert(std::this_thread::get_id());
    }
    // Both tasks wait for each other, so one thread alone could not finish them: they run at the same time.
    waiting.fetch_add(1);
    while (waiting.load() < 2) std::this_thread::yield();
  });
  EXPECT_EQ(seen.size(), 2u);
}

TEST(RunIndexed, RethrowsTheExceptionOfTheLowestFailingIndex) {
  for (int threads : {1, 2, 4}) {
    std::atomic<int> started{0};
    try {
      run_indexed(50, threads, [&](size_t i) {
        started.fetch_add(1);
        if (i == 3 || i == 4 || i == 40) throw std::runtime_error("index " + std::to_string(i));
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      });
      ADD_FAILURE() << "nothing thrown";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "index 3") << threads << " threads";
    }
    EXPECT_LT(started.load(), 40) << "indices after a failure do not start";
  }
}

}  // namespace
}  // namespace apart
