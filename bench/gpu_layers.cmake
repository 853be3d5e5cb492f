# bench_gpu_layers: forward+backward TFLOP/s and MFU of GPT-3-1.3B-shaped layers on the CUDA backend, next to
# cuBLASLt's best bf16 GEMM (scripts/gpu_check.sh runs it on an H200). Built with APART_CUDA only.
if(APART_HAVE_CUDA AND TARGET apart_runtime AND TARGET apart_models)
  add_executable(bench_gpu_layers ${CMAKE_CURRENT_LIST_DIR}/gpu_layers_bench.cpp)
  target_link_libraries(bench_gpu_layers PRIVATE apart_runtime apart_autodiff apart_models apart_profiler apart_importer
                        onnx_proto protobuf::libprotobuf)
endif()
