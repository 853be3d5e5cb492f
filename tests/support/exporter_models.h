// Small models laid out as exporters other than torch write them, built in code: paddle2onnx stores weights as
// Constant nodes at opset 9–11 with dims named p2o.DynamicDimension.N; tf2onnx works in NHWC behind Transposes with
// folded Constant weights, Relu6 as Clip and names like "StatefulPartitionedCall/…:0"; torch 1.13 exports an
// nn.Embedding as Gather at its default opset 14.
#pragma once

#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/support/onnx_builder.h"

namespace apart::testing {

// Deterministic values in [-scale, scale) (a fixed LCG: the same bytes on every run and machine).
inline std::vector<float> lcg_values(int64_t n, uint32_t seed, float scale) {
  std::vector<float> out(static_cast<size_t>(n));
  uint32_t s = seed * 2654435761u + 1;
  for (auto& v : out) {
    s = s * 1664525u + 1013904223u;
    v = scale * (static_cast<float>(s >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f);
  }
  return out;
}

// A Constant node writing `output`: its `value` tensor, to fill.
inline onnx::TensorProto& constant_node(OnnxBuilder& b, const std::string& output) {
  auto* a = b.node("Constant", {}, {output}).add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  return *a->mutable_t();
}

// A Constant node holding a float tensor (raw_data, as paddle2onnx writes it).
inline void constant_floats(OnnxBuilder& b, const std::string& output, const std::vector<int64_t>& dims, uint32_t seed,
                            float scale = 0.3f) {
  onnx::TensorProto* t = &constant_node(b, output);
  t->set_data_type(onnx::TensorProto::FLOAT);
  int64_t count = 1;
  for (int64_t d : dims) {
    t->add_dims(d);
    count *= d;
  }
  const std::vector<float> values = lcg_values(count, seed, scale);
  t->set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
}

// A Constant node holding int64 values (shape arithmetic: stays a constant).
inline void constant_ints(OnnxBuilder& b, const std::string& output, const std::vector<int64_t>& values) {
  onnx::TensorProto* t = &constant_node(b, output);
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(static_cast<int64_t>(values.size()));
  for (int64_t v : values) t->add_int64_data(v);
}

// Weights of the paddle2onnx-style model, as Constant nodes; `shape` (Reshape's target) is a Constant too.
inline constexpr const char* kPaddleWeights[] = {"conv_w", "conv_b", "fc_w", "fc_b", "proj_w"};
// conv_w 2×3×3×3 + conv_b 2 + fc_w 32×5 + fc_b 5 + proj_w 5×3 floats.
inline constexpr int64_t kPaddleParams = 54 + 2 + 160 + 5 + 15;
inline constexpr int64_t kPaddleParamBytes = kPaddleParams * 4;

// x [p2o.DynamicDimension.0, 3, 4, 4] → Conv(conv_w, conv_b, pads 1) → Relu → Reshape(shape = [-1, 32]) →
// Gemm(fc_w, fc_b) → MatMul(proj_w) → loss = ReduceMean(y·y), every weight a Constant node, nodes unnamed.
inline OnnxBuilder paddle_style_model(int64_t opset) {
  OnnxBuilder b(opset, /*ir_version=*/opset >= 11 ? 6 : 4);
  b.model().set_producer_name("PaddlePaddle");
  b.input("x", {"p2o.DynamicDimension.0", 3, 4, 4});
  constant_floats(b, "conv_w", {2, 3, 3, 3}, 1);
  constant_floats(b, "conv_b", {2}, 2);
  OnnxBuilder::set_ints(b.node("Conv", {"x", "conv_w", "conv_b"}, {"conv"}), "pads", {1, 1, 1, 1});
  b.node("Relu", {"conv"}, {"relu"});
  constant_ints(b, "shape", {-1, 32});
  b.node("Reshape", {"relu", "shape"}, {"flat"});
  constant_floats(b, "fc_w", {32, 5}, 3);
  constant_floats(b, "fc_b", {5}, 4);
  b.node("Gemm", {"flat", "fc_w", "fc_b"}, {"fc"});
  constant_floats(b, "proj_w", {5, 3}, 5);
  b.node("MatMul", {"fc", "proj_w"}, {"y"});
  b.node("Mul", {"y", "y"}, {"sq"});
  OnnxBuilder::set_int(b.node("ReduceMean", {"sq"}, {"loss"}), "keepdims", 0);
  b.output({"loss", DType::kFloat32, {}});
  return b;
}

// ids [batch, 4] (int64) → Gather(emb [10, 6]) → MatMul(w [6, 3]) → loss = ReduceMean(y·y): an nn.Embedding at
// `opset` (torch 1.13 exports at 14), its weights as Constant nodes (so the table is Gather's data slot too).
inline OnnxBuilder embedding_model(int64_t opset) {
  OnnxBuilder b(opset);
  b.input("ids", {"batch", 4}, onnx::TensorProto::INT64);
  constant_floats(b, "emb", {10, 6}, 7, 1.0f);
  b.node("Gather", {"emb", "ids"}, {"e"});
  constant_floats(b, "w", {6, 3}, 8, 0.5f);
  b.node("MatMul", {"e", "w"}, {"y"});
  b.node("Mul", {"y", "y"}, {"sq"});
  OnnxBuilder::set_int(b.node("ReduceMean", {"sq"}, {"loss"}), "keepdims", 0);
  b.output({"loss", DType::kFloat32, {}});
  return b;
}

// Weights of the tf2onnx-style model: folded constants as Constant nodes, the rest initializers, all named as
// tf2onnx names them (the TF op's path and output ":0").
inline constexpr const char* kTfConvW = "StatefulPartitionedCall/model/conv2d/Conv2D/ReadVariableOp:0";
inline constexpr const char* kTfConvB = "StatefulPartitionedCall/model/conv2d/BiasAdd/ReadVariableOp:0";
inline constexpr const char* kTfDenseW = "const_fold_opt__21";
inline constexpr const char* kTfDenseB = "StatefulPartitionedCall/model/dense/BiasAdd/ReadVariableOp:0";
// conv 2×3×3×3 + 2, dense 32×5 + 5 floats.
inline constexpr int64_t kTfParams = 54 + 2 + 160 + 5;

// As tf2onnx (opset 13) lays out a Keras Conv2D(2, 3, strides 2, padding "same", activation relu6) → Flatten → Dense:
// input "input_1:0" [unk__7, 8, 8, 3] in NHWC → Transpose to NCHW → Conv → Clip(0, 6) as Relu6 (bounds as Constant
// inputs) → Transpose back to NHWC → Reshape(Constant [-1, 32]) → MatMul + Add → loss = ReduceMean(y·y). The conv
// weight is an initializer and the dense weight a folded Constant node.
inline OnnxBuilder tf_style_model() {
  OnnxBuilder b(13, 7);
  b.model().set_producer_name("tf2onnx");
  b.model().set_producer_version("1.9.3 1190aa");
  b.input("input_1:0", {"unk__7", 8, 8, 3});
  OnnxBuilder::set_ints(b.node("Transpose", {"input_1:0"}, {"input_1:0_nchw"}, "StatefulPartitionedCall/model/conv2d/Conv2D__6"),
                        "perm", {0, 3, 1, 2});
  {  // the conv weight: an initializer with float_data, as tf2onnx writes small ones
    auto* t = b.graph().add_initializer();
    t->set_name(kTfConvW);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : {2, 3, 3, 3}) t->add_dims(d);
    for (float v : lcg_values(54, 11, 0.3f)) t->add_float_data(v);
  }
  constant_floats(b, kTfConvB, {2}, 12);
  auto& conv = b.node("Conv", {"input_1:0_nchw", kTfConvW, kTfConvB}, {"conv:0"}, "StatefulPartitionedCall/model/conv2d/BiasAdd");
  OnnxBuilder::set_ints(conv, "strides", {2, 2});
  auto* pad = conv.add_attribute();
  pad->set_name("auto_pad");
  pad->set_type(onnx::AttributeProto::STRING);
  pad->set_s("SAME_UPPER");
  {
    onnx::TensorProto& lo = constant_node(b, "relu6_min:0");
    lo.set_data_type(onnx::TensorProto::FLOAT);
    lo.add_float_data(0.0f);
    onnx::TensorProto& hi = constant_node(b, "relu6_max:0");
    hi.set_data_type(onnx::TensorProto::FLOAT);
    hi.add_float_data(6.0f);
  }
  b.node("Clip", {"conv:0", "relu6_min:0", "relu6_max:0"}, {"relu6:0"}, "StatefulPartitionedCall/model/conv2d/Relu6");
  OnnxBuilder::set_ints(b.node("Transpose", {"relu6:0"}, {"relu6_nhwc:0"}, "StatefulPartitionedCall/model/conv2d/Relu6__9"),
                        "perm", {0, 2, 3, 1});
  constant_ints(b, "const_fold_opt__19", {-1, 32});
  b.node("Reshape", {"relu6_nhwc:0", "const_fold_opt__19"}, {"flatten:0"}, "StatefulPartitionedCall/model/flatten/Reshape");
  constant_floats(b, kTfDenseW, {32, 5}, 13);
  b.node("MatMul", {"flatten:0", kTfDenseW}, {"dense_mm:0"}, "StatefulPartitionedCall/model/dense/MatMul");
  constant_floats(b, kTfDenseB, {5}, 14);
  b.node("Add", {"dense_mm:0", kTfDenseB}, {"dense:0"}, "StatefulPartitionedCall/model/dense/BiasAdd");
  b.node("Mul", {"dense:0", "dense:0"}, {"sq:0"}, "loss/Square");
  OnnxBuilder::set_int(b.node("ReduceMean", {"sq:0"}, {"loss"}, "loss/Mean"), "keepdims", 0);
  b.output({"loss", DType::kFloat32, {}});
  return b;
}

}  // namespace apart::testing
