# bench_import: import + shape inference time and peak memory on synthetic chains of 10k–1M nodes.
add_executable(bench_import ${CMAKE_CURRENT_LIST_DIR}/import_bench.cpp)
target_link_libraries(bench_import PRIVATE apart_importer onnx_proto protobuf::libprotobuf)
