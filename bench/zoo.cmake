# bench_zoo: time and peak memory of generating each big zoo preset (apart zoo), one child process per preset.
add_executable(bench_zoo ${CMAKE_CURRENT_LIST_DIR}/zoo_bench.cpp)
target_link_libraries(bench_zoo PRIVATE apart_models)
