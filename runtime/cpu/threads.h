// The CPU kernels' threads: how many one process uses, and the parallel loop they run with.
#pragma once

#include <cstdint>
#include <functional>

namespace apart {

// The threads one process's kernels use: parallel_for's and OpenBLAS's (set through openblas_set_num_threads when
// the BLAS is OpenBLAS). Default: APART_NUM_THREADS, else OMP_NUM_THREADS, else the cores (hardware_concurrency).
// `apart run` gives each of the ranks sharing a node its share of the cores, so that two ranks on two cores do not
// run four threads (and a profile measured with --threads matches what each rank gets).
int compute_threads();
// InvalidArgument unless 1 ≤ threads ≤ 4096. Call before kernels run (not while another thread runs them).
void set_compute_threads(int threads);
// The default of compute_threads(): graph/threads.h default_thread_count, APART_NUM_THREADS, else OMP_NUM_THREADS
// (each checked: InvalidArgument naming the variable when it is not a count in [1, 4096]), else hardware_concurrency.
int default_compute_threads();

// Runs body(begin, end) over [0, n) on up to compute_threads() threads when n·cost is large.
void parallel_for(int64_t n, int64_t cost_per_item, const std::function<void(int64_t, int64_t)>& body);

}  // namespace apart
