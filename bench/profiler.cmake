# bench_profiler: estimate_costs time on synthetic chains of 10k–1M tasks, and the CPU probe's figures.
add_executable(bench_profiler ${CMAKE_CURRENT_LIST_DIR}/profiler_bench.cpp)
target_link_libraries(bench_profiler PRIVATE apart_profiler)
