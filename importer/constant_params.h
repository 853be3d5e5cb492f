// Weights stored as Constant nodes (paddle2onnx, tf2onnx, some torch exports) turned into initializers, so that
// every later phase (task graph, costs, memory, autodiff, runtime) sees them as the trainable parameters they are.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>

namespace apart {

// What constants_to_initializers converted.
struct ConstantParams {
  int64_t count = 0;  // Constant nodes that became initializers
  int64_t bytes = 0;  // their bytes
};

// Turns every default-domain Constant node of the main graph whose output feeds a weight slot into an initializer of
// the same name, and removes the node. A weight slot: Conv/ConvTranspose W and B, a MatMul/Gemm operand,
// BatchNormalization/LayerNormalization/InstanceNormalization scale and bias, Gather's data (an embedding table);
// the Constant must be a float tensor of rank ≥ 1 (`value`, or `value_floats`). A Constant that feeds only
// shape and index inputs (Reshape's shape, Slice's starts, Gather's indices, Pad's pads…) stays a node.
// Deterministic and idempotent, so every reader of the same file (importer, stage files, training graphs, the
// trained model written back) removes the same nodes and agrees on node indices. Under IR < 4, where every
// initializer is also a graph input, each new initializer gets its graph input too.
// Throws Unsupported for a Constant with `sparse_value` in a weight slot (no sparse parameters).
ConstantParams constants_to_initializers(onnx::ModelProto& model);

// "3 Constant nodes feed weight slots and are trained as parameters (1.5 KiB); --constants-as-params off keeps
// them constants", or "" when none did.
std::string constant_params_note(const ConstantParams& converted);

}  // namespace apart
