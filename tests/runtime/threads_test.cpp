// The kernels' thread budget: where its default comes from, its range, and parallel_for keeping to it.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "graph/error.h"
#include "runtime/cpu/threads.h"
#include "runtime/kernel.h"

namespace apart {
namespace {

// Sets or clears an environment variable for one test and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Restores the process's thread count after a test that sets it.
class ThreadBudget : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = compute_threads(); }
  void TearDown() override { set_compute_threads(saved_); }
  int saved_ = 1;
};

TEST(TheDefaultThreadCount, IsAPART_NUM_THREADSThenOMP_NUM_THREADSThenTheCores) {
  ScopedEnv apart("APART_NUM_THREADS", nullptr), omp("OMP_NUM_THREADS", nullptr);
  EXPECT_EQ(default_compute_threads(), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  {
    ScopedEnv o("OMP_NUM_THREADS", "3");
    EXPECT_EQ(default_compute_threads(), 3);
    ScopedEnv a("APART_NUM_THREADS", "5");
    EXPECT_EQ(default_compute_threads(), 5);
  }
}

TEST(TheDefaultThreadCount, RefusesAVariableThatIsNoCountNamingIt) {
  ScopedEnv apart("APART_NUM_THREADS", nullptr);
  for (const char* bad : {"0", "-2", "two", "4097", "3x", "99999999999999999999"}) {
    ScopedEnv omp("OMP_NUM_THREADS", bad);
    try {
      default_compute_threads();
      ADD_FAILURE() << "OMP_NUM_THREADS=" << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("OMP_NUM_THREADS"), std::string::npos) << e.what();
    }
  }
}

TEST_F(ThreadBudget, IsRangeChecked) {
  EXPECT_THROW(set_compute_threads(0), InvalidArgument);
  EXPECT_THROW(set_compute_threads(4097), InvalidArgument);
  set_compute_threads(7);
  EXPECT_EQ(compute_threads(), 7);
}

// How many pieces parallel_for cut [0, n) into, checking they tile it exactly once.
int pieces(int64_t n, int64_t cost) {
  std::atomic<int> calls{0};
  std::atomic<int64_t> covered{0};
  parallel_for(n, cost, [&](int64_t b, int64_t e) {
    ++calls;
    covered += e - b;
  });
  EXPECT_EQ(covered.load(), n);
  return calls.load();
}

TEST_F(ThreadBudget, BoundsTheThreadsParallelForStarts) {
  constexpr int64_t kBig = 1 << 20, kCost = 1 << 10;  // far more work than one thread's minimum
  set_compute_threads(1);
  EXPECT_EQ(pieces(kBig, kCost), 1);
  set_compute_threads(3);
  EXPECT_EQ(pieces(kBig, kCost), 3);  // the budget, not the machine's cores
  EXPECT_EQ(pieces(2, 1 << 20), 2);   // never more pieces than items
  EXPECT_EQ(pieces(16, 1), 1);        // too little work to split
  EXPECT_EQ(pieces(0, kCost), 0);
}

}  // namespace
}  // namespace apart
