// Fuzz target: raw bytes as model.onnx through the whole compile path apart partition runs — import (protobuf parse,
// external-data checks, dim binding, shape inference, folding), analytic costs, the three-level search — on a tiny
// cluster (2 A100s, global batch 4), writing nothing (CompileOptions::output unset, no baselines).
#include <cstddef>
#include <cstdint>

#include "driver/compile.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return apart::fuzz::run_one([&] {
    apart::CompileOptions options;
    options.model = apart::fuzz::write_scratch("model.onnx", data, size);
    options.cluster.devices = 2;
    options.partition.training.global_batch = 4;
    options.partition.threads = 1;
    options.baselines = false;
    apart::compile(options);
  });
}
