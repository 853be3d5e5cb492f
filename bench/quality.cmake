# bench/quality.cmake: every partition method (apart, uniform, params, gpipe-balance, pipedream, metis) on the
# same cost model and simulator, zoo + shared/models × 8…1024 devices; a Markdown table for bench/RESULTS.md.
# Run: build/<dir>/bench/quality_bench --out bench/RESULTS.table.md
add_executable(quality_bench ${CMAKE_CURRENT_LIST_DIR}/quality_bench.cpp)
target_compile_definitions(quality_bench PRIVATE APART_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
target_link_libraries(quality_bench PRIVATE apart_driver apart_simulator apart_models apart_graph
                      nlohmann_json::nlohmann_json)
