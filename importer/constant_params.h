// Weights stored as Constant nodes (paddle2onnx, tf2onnx, some torch exports) turned into initializers, so that
// every later phase (task graph, costs, memory, autodiff, runtime) sees them as the trainable parameters they are.
#pragma once

#include <onnx/onnx_pb.h>

#include "importer/importer.h"  // ConstantParams

namespace apart {

// Turns every default-domain Constant node of the main graph whose output feeds a weight slot into an initializer of
// the same name, and removes the node. A weight slot: Conv/ConvTranspose W and B, a MatMul/Gemm operand,
// BatchNormalization/LayerNormalization/InstanceNormalization scale and bias, Gather's data (an embedding table), the
// other operand of an Add to a MatMul/Gemm/Conv output (a bias, as tf2onnx writes Keras' BiasAdd);
// the Constant must be a float tensor of rank ≥ 1 (`value`, or `value_floats`). A Constant that feeds only
// shape and index inputs (Reshape's shape, Slice's starts, Gather's indices, Pad's pads…) stays a node.
// Deterministic and idempotent, so every reader of the same file (importer, stage files, training graphs, the
// trained model written back) removes the same nodes and agrees on node indices. Under IR < 4, where every
// initializer is also a graph input, each new initializer gets its graph input too.
// Throws Unsupported for a Constant with `sparse_value` in a weight slot (no sparse parameters).
// ConstantParams and constant_params_note are in importer.h (no ONNX headers there).
ConstantParams constants_to_initializers(onnx::ModelProto& model);

}  // namespace apart
