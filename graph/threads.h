// How many threads a process uses (APART_NUM_THREADS, OMP_NUM_THREADS, the cores), and independent tasks run on a
// few of them: the one home of both for the runtime's kernels and the planner's search.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>

namespace apart {

inline constexpr int kMaxThreads = 4096;

// APART_NUM_THREADS, else OMP_NUM_THREADS, when one is set and not empty; InvalidArgument naming the variable when
// it is not a count in [1, kMaxThreads].
std::optional<int> thread_count_from_environment();
// thread_count_from_environment(), else the cores (hardware_concurrency, at least 1).
int default_thread_count();

// Runs task(0) … task(n − 1) on up to `threads` threads, the caller's among them, and returns when all are done.
// Indices are claimed in ascending order, so a task that writes only its own slot gives the same result whatever
// `threads` is. When a task throws, no further index starts, and once the running ones end the exception of the
// lowest index is rethrown: the one a single thread would have thrown.
void run_indexed(size_t n, int threads, const std::function<void(size_t index)>& task);

}  // namespace apart
