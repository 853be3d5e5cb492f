# bench_runtime: forward time of gpt-tiny and gpt2-small (batch 1) on the CPU runtime vs measured cblas_sgemm GFLOP/s.
if(TARGET apart_runtime)
  add_executable(bench_runtime ${CMAKE_CURRENT_LIST_DIR}/runtime_bench.cpp)
  target_link_libraries(bench_runtime PRIVATE apart_runtime apart_importer apart_profiler apart_models apart_blas)
  target_compile_definitions(bench_runtime PRIVATE APART_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
endif()
