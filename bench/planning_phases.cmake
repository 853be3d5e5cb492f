# bench/planning_phases.cmake: where `apart partition` spends its time, phase by phase (wall and CPU seconds).
# Run: build/release/bench/planning_phases MODEL.onnx DEVICES BATCH [--no-baselines] [--no-stage-models]
add_executable(planning_phases ${CMAKE_CURRENT_LIST_DIR}/planning_phases.cpp)
target_link_libraries(planning_phases PRIVATE apart_driver apart_graph)
