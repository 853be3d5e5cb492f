// Constant nodes that feed weight slots become params (importer/constant_params.h), as paddle2onnx and tf2onnx
// models need; those that feed shape and index inputs stay constants; --constants-as-params off keeps today's import.
#include <gtest/gtest.h>

#include "graph/error.h"
#include "importer/constant_params.h"
#include "importer/importer.h"
#include "tests/support/exporter_models.h"

namespace apart {
namespace {

using testing::OnnxBuilder;

int64_t param_elements(const TaskGraph& g, int64_t* bytes = nullptr) {
  int64_t n = 0, b = 0;
  for (const Value& v : g.values())
    if (v.kind == ValueKind::kParam) {
      n += v.elements;
      b += v.bytes;
    }
  if (bytes) *bytes = b;
  return n;
}

ImportedModel import_at_batch(const OnnxBuilder& b, bool constants_as_params) {
  ImportOptions o;
  o.batch = 2;
  o.constants_as_params = constants_as_params;
  return import_model_bytes(b.bytes(), {}, "paddle.onnx", o);
}

class APaddleStyleModel : public ::testing::TestWithParam<int64_t> {};

TEST_P(APaddleStyleModel, CountsItsConstantWeightsAsParamsToTheByte) {
  const ImportedModel m = import_at_batch(testing::paddle_style_model(GetParam()), true);
  int64_t bytes = 0;
  EXPECT_EQ(param_elements(m.graph, &bytes), testing::kPaddleParams);
  EXPECT_EQ(bytes, testing::kPaddleParamBytes);
  EXPECT_EQ(m.constant_params.count, 5);
  EXPECT_EQ(m.constant_params.bytes, testing::kPaddleParamBytes);
  for (const char* name : testing::kPaddleWeights) {
    ASSERT_TRUE(m.graph.find_value(name)) << name;
    EXPECT_EQ(m.graph.value(*m.graph.find_value(name)).kind, ValueKind::kParam) << name;
  }
  EXPECT_EQ(m.batch_dim, "p2o.DynamicDimension.0");
  EXPECT_EQ(m.batch, 2);
  EXPECT_TRUE(m.unknown_shape_values.empty());
}

TEST_P(APaddleStyleModel, KeepsTheConstantThatFeedsReshapesShapeAConstant) {
  const ImportedModel m = import_at_batch(testing::paddle_style_model(GetParam()), true);
  const Value& shape = m.graph.value(*m.graph.find_value("shape"));
  EXPECT_NE(shape.kind, ValueKind::kParam);
  EXPECT_TRUE(shape.producer.valid());  // still produced by its Constant node
  EXPECT_EQ(m.graph.num_tasks(), 8u);   // Conv Relu Constant(shape) Reshape Gemm MatMul Mul ReduceMean
}

TEST_P(APaddleStyleModel, HasNoParamsWithConstantsAsParamsOff) {
  const ImportedModel m = import_at_batch(testing::paddle_style_model(GetParam()), false);
  EXPECT_EQ(param_elements(m.graph), 0);
  EXPECT_EQ(m.constant_params.count, 0);
  EXPECT_EQ(m.graph.num_tasks(), 13u);  // the five weight Constants are tasks again
}

INSTANTIATE_TEST_SUITE_P(AtOpsets, APaddleStyleModel, ::testing::Values(9, 11),
                         [](const auto& info) { return "Opset" + std::to_string(info.param); });

TEST(AConstantWeight, CountsAsAParameterWhenItFeedsAnEmbeddingTable) {
  const ImportedModel m = import_model_bytes(testing::embedding_model(14).bytes(), {}, "emb.onnx", [] {
    ImportOptions o;
    o.batch = 2;
    return o;
  }());
  EXPECT_EQ(m.graph.value(*m.graph.find_value("emb")).kind, ValueKind::kParam);
  EXPECT_EQ(m.constant_params.count, 2);
  EXPECT_EQ(m.constant_params.bytes, (60 + 18) * 4);
}

TEST(AConstantWeight, StaysAConstantWhenItFeedsOnlyAShapeOrIndexInput) {
  OnnxBuilder b(11);
  b.input("x", {2, 3});
  b.input("ids", {2}, onnx::TensorProto::INT64);
  testing::constant_floats(b, "scale", {3}, 1);  // a float Constant that feeds a Mul: not a weight slot
  b.node("Mul", {"x", "scale"}, {"m"});
  testing::constant_ints(b, "idx", {0, 1});  // Gather's indices
  b.node("Gather", {"m", "idx"}, {"y"});
  b.output("y");
  ImportedModel m = import_model_bytes(b.bytes(), {}, "t.onnx");
  EXPECT_EQ(m.constant_params.count, 0);
  EXPECT_EQ(param_elements(m.graph), 0);
}

TEST(AConstantWeight, AddedToALinearOpsOutputIsABiasAndAddedToAnythingElseStaysAConstant) {
  OnnxBuilder b(13);
  b.input("x", {2, 3});
  testing::constant_floats(b, "w", {3, 4}, 1);
  b.node("MatMul", {"x", "w"}, {"mm"});
  testing::constant_floats(b, "bias", {4}, 2);  // BiasAdd, as tf2onnx writes it: Add(MatMul output, Constant)
  b.node("Add", {"bias", "mm"}, {"h"});
  b.node("Relu", {"h"}, {"r"});
  testing::constant_floats(b, "shift", {4}, 3);  // added to a Relu's output: not a bias
  b.node("Add", {"r", "shift"}, {"y"});
  b.output("y");
  ImportedModel m = import_model_bytes(b.bytes(), {}, "t.onnx");
  EXPECT_EQ(m.constant_params.count, 2);
  EXPECT_EQ(param_elements(m.graph), 12 + 4);
  EXPECT_EQ(m.graph.value(*m.graph.find_value("shift")).kind, ValueKind::kConstant);
}

TEST(AConstantWeight, UnderIrVersion3IsAlsoAGraphInput) {
  onnx::ModelProto model = testing::paddle_style_model(9).model();
  model.set_ir_version(3);
  const ConstantParams converted = constants_to_initializers(model);
  EXPECT_EQ(converted.count, 5);
  int inputs = 0;
  for (const auto& in : model.graph().input())
    for (const char* name : testing::kPaddleWeights) inputs += in.name() == name;
  EXPECT_EQ(inputs, 5);
  ImportOptions o;
  o.batch = 2;
  EXPECT_EQ(param_elements(import_model_bytes(model.SerializeAsString(), {}, "ir3.onnx", o).graph), testing::kPaddleParams);
}

TEST(AConstantWeight, ConvertsOnceSoASecondPassChangesNothing) {
  onnx::ModelProto model = testing::paddle_style_model(11).model();
  EXPECT_EQ(constants_to_initializers(model).count, 5);
  const std::string once = model.SerializeAsString();
  EXPECT_EQ(constants_to_initializers(model).count, 0);
  EXPECT_EQ(model.SerializeAsString(), once);
}

TEST(AConstantWeight, HeldAsASparseTensorIsRefusedWithATypedError) {
  OnnxBuilder b(11);
  b.input("x", {2, 3});
  auto& n = b.node("Constant", {}, {"w"});
  auto* a = n.add_attribute();
  a->set_name("sparse_value");
  a->set_type(onnx::AttributeProto::SPARSE_TENSOR);
  a->mutable_sparse_tensor()->add_dims(3);
  a->mutable_sparse_tensor()->add_dims(4);
  b.node("MatMul", {"x", "w"}, {"y"});
  b.output("y");
  EXPECT_THROW(import_model_bytes(b.bytes(), {}, "sparse.onnx"), Unsupported);
  ImportOptions off;
  off.constants_as_params = false;
  EXPECT_NO_THROW(import_model_bytes(b.bytes(), {}, "sparse.onnx", off));
}

TEST(AConstantWeight, NoteNamesTheCountAndTheBytes) {
  const std::string note = constant_params_note({5, 944});
  EXPECT_NE(note.find("5 Constant nodes"), std::string::npos) << note;
  EXPECT_NE(note.find("944 bytes"), std::string::npos) << note;
  EXPECT_NE(note.find("--constants-as-params off"), std::string::npos) << note;
  EXPECT_EQ(constant_params_note({}), "");
}

}  // namespace
}  // namespace apart
