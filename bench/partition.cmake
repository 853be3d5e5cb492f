# bench/partition.cmake: apart vs the compute lower bound, the uniform split and the parameter-balanced split,
# on zoo models × 8/64/512/1024 devices, plus planning time. Run: build/<dir>/bench/partition_bench
add_executable(partition_bench ${CMAKE_CURRENT_LIST_DIR}/partition_bench.cpp)
target_link_libraries(partition_bench PRIVATE apart_driver apart_models apart_graph)
