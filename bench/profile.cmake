# bench_profile_fidelity: analytic `cpu` preset vs measured (apart profile) per op type and per model.
# bench_profile_speed: forward+backward samples/s of gpt2-small (seq 128, batch 1) vs measured sgemm;
# bench/speed_vs_torch.py runs it beside the same GPT in torch. Release builds; docs/profiling.md.
if(TARGET apart_train AND TARGET apart_models)
  add_executable(bench_profile_fidelity ${CMAKE_CURRENT_LIST_DIR}/profile_fidelity.cpp)
  target_link_libraries(bench_profile_fidelity PRIVATE apart_train apart_profiler apart_importer apart_models apart_blas)
  target_compile_definitions(bench_profile_fidelity PRIVATE APART_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  add_executable(bench_profile_speed ${CMAKE_CURRENT_LIST_DIR}/profile_speed.cpp)
  target_link_libraries(bench_profile_speed PRIVATE apart_train apart_profiler apart_importer apart_models apart_blas)
endif()
