// Generated models are valid ONNX: the checker passes and strict shape inference types every value.
#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <map>

#include "models/zoo.h"
#include "tests/models/zoo_test_util.h"

namespace apart::models {
namespace {

struct Case {
  std::string label;
  ZooOptions options;
};

ZooOptions with(std::string name, const std::function<void(ZooOptions&)>& edit = {}) {
  ZooOptions o = options_for(name);
  if (edit) edit(o);
  return o;
}

// Small models with real weights, in every dtype / loss / layer-norm style the zoo offers.
std::vector<Case> small_cases() {
  return {
      {"gpt-tiny", with("gpt-tiny")},
      {"gpt fused fp16", with("gpt", [](ZooOptions& o) { o.layernorm = LayerNormStyle::kFused; o.dtype = FloatType::kFp16; })},
      {"gpt bf16 no loss", with("gpt", [](ZooOptions& o) { o.dtype = FloatType::kBf16; o.loss = Loss::kNone; })},
      {"gpt mse batch 4", with("gpt", [](ZooOptions& o) { o.loss = Loss::kMse; o.batch = 4; })},
      {"bert", with("bert")},
      {"bert fused bf16", with("bert", [](ZooOptions& o) { o.layernorm = LayerNormStyle::kFused; o.dtype = FloatType::kBf16; })},
      {"t5", with("t5")},
      {"t5 fp16 head_dim", with("t5", [](ZooOptions& o) { o.dtype = FloatType::kFp16; o.head_dim = 48; })},
      {"llama-tiny", with("llama-tiny")},
      {"llama bf16 no loss no gqa", with("llama", [](ZooOptions& o) { o.dtype = FloatType::kBf16; o.loss = Loss::kNone; o.kv_heads = 4; })},
      {"mlp-tiny", with("mlp-tiny")},
      {"mlp cross_entropy", with("mlp", [](ZooOptions& o) { o.loss = Loss::kCrossEntropy; })},
      {"resnet50 small image", with("resnet50", [](ZooOptions& o) { o.image = 64; o.classes = 10; })},
      {"resnet101 fp16 no loss", with("resnet101", [](ZooOptions& o) { o.image = 32; o.dtype = FloatType::kFp16; o.loss = Loss::kNone; })},
  };
}

void check_and_infer(onnx::ModelProto& m) {
  onnx::checker::check_model(m);
  onnx::ShapeInferenceOptions strict{/*check_type=*/true, /*error_mode=*/1, /*enable_data_propagation=*/false};
  onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(), strict);
}

// Every node output ends up with a known element type (shape inference reached it).
void expect_all_values_typed(const onnx::ModelProto& m) {
  std::map<std::string, bool> typed;
  for (const auto& v : m.graph().value_info()) typed[v.name()] = v.type().tensor_type().elem_type() != 0;
  for (const auto& v : m.graph().output()) typed[v.name()] = true;
  for (const auto& n : m.graph().node())
    for (const auto& out : n.output()) EXPECT_TRUE(typed[out]) << "no inferred type for " << out;
}

TEST(AZooModel, PassesTheOnnxCheckerAndStrictShapeInference) {
  for (auto& c : small_cases()) {
    SCOPED_TRACE(c.label);
    ASSERT_EQ(c.options.weights, WeightsMode::kRandom);
    onnx::ModelProto m = build_zoo_model(c.options);
    EXPECT_NO_THROW(check_and_infer(m));
    expect_all_values_typed(m);
  }
}

// The checker insists that external data exists; for shapes-only models check the same graph with the
// parameters turned into typed graph inputs (what they are to a planner).
void params_to_inputs(onnx::ModelProto& m) {
  auto* g = m.mutable_graph();
  for (const auto& t : g->initializer()) {
    auto* in = g->add_input();
    in->set_name(t.name());
    auto* tt = in->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(t.data_type());
    for (int64_t d : t.dims()) tt->mutable_shape()->add_dim()->set_dim_value(d);
  }
  g->clear_initializer();
}

TEST(AZooModel, PassesTheCheckerWithShapesOnlyWeightsAtFullSize) {
  for (const char* name : {"gpt2-small", "bert-base", "t5-small", "resnet50", "gpt3-175b"}) {
    SCOPED_TRACE(name);
    ZooOptions o = options_for(name);
    o.weights = WeightsMode::kNone;
    onnx::ModelProto m = build_zoo_model(o);
    params_to_inputs(m);
    EXPECT_NO_THROW(check_and_infer(m));
  }
}

TEST(AGptTinyModel, HasSymbolicBatchInputIdsLabelsAndAScalarLoss) {
  const onnx::ModelProto m = build_zoo_model(options_for("gpt-tiny"));
  ASSERT_EQ(m.graph().input_size(), 2);
  const auto& ids = m.graph().input(0);
  EXPECT_EQ(ids.name(), "input_ids");
  EXPECT_EQ(ids.type().tensor_type().elem_type(), onnx::TensorProto::INT64);
  ASSERT_EQ(ids.type().tensor_type().shape().dim_size(), 2);
  EXPECT_EQ(ids.type().tensor_type().shape().dim(0).dim_param(), "batch");
  EXPECT_EQ(ids.type().tensor_type().shape().dim(1).dim_value(), 32);
  EXPECT_EQ(m.graph().input(1).name(), "labels");
  ASSERT_EQ(m.graph().output_size(), 1);
  EXPECT_EQ(m.graph().output(0).name(), "loss");
  EXPECT_EQ(m.graph().output(0).type().tensor_type().shape().dim_size(), 0);
}

TEST(AGptModel, InfersLogitsShapeWithoutALoss) {
  ZooOptions o = options_for("gpt");
  o.loss = Loss::kNone;
  onnx::ModelProto m = build_zoo_model(o);
  check_and_infer(m);
  const auto& out = m.graph().output(0);
  EXPECT_EQ(out.name(), "logits");
  ASSERT_EQ(out.type().tensor_type().shape().dim_size(), 3);
  EXPECT_EQ(out.type().tensor_type().shape().dim(0).dim_param(), "batch");
  EXPECT_EQ(out.type().tensor_type().shape().dim(2).dim_value(), o.vocab);
}

TEST(AZooModel, UsesTheOpsTorchExportsEmit) {
  std::map<std::string, int> ops;
  const onnx::ModelProto tiny = build_zoo_model(options_for("gpt-tiny"));
  for (const auto& n : tiny.graph().node()) ++ops[n.op_type()];
  for (const char* op : {"Gather", "MatMul", "Add", "ReduceMean", "Sub", "Pow", "Sqrt", "Div", "Erf", "Softmax",
                         "Where", "Reshape", "Transpose", "Split", "SoftmaxCrossEntropyLoss"})
    EXPECT_GT(ops[op], 0) << op;
  ZooOptions fused = options_for("gpt-tiny");
  fused.layernorm = LayerNormStyle::kFused;
  ops.clear();
  const onnx::ModelProto fused_model = build_zoo_model(fused);
  for (const auto& n : fused_model.graph().node()) ++ops[n.op_type()];
  EXPECT_EQ(ops["LayerNormalization"], 5);  // 2 per block + the final one
  EXPECT_EQ(ops["ReduceMean"], 0);
  ops.clear();
  ZooOptions resnet = options_for("resnet50");
  resnet.weights = WeightsMode::kNone;
  const onnx::ModelProto resnet_model = build_zoo_model(resnet);
  for (const auto& n : resnet_model.graph().node()) ++ops[n.op_type()];
  EXPECT_EQ(ops["Conv"], 53);  // as in torchvision's export
  EXPECT_EQ(ops["BatchNormalization"], 53);
  EXPECT_EQ(ops["Gemm"], 1);
}

TEST(AShapesOnlyModel, DeclaresEveryInitializerAsAlignedExternalData) {
  ZooOptions o = options_for("gpt-tiny");
  o.weights = WeightsMode::kNone;
  const onnx::ModelProto m = build_zoo_model(o, "gpt-tiny.weights");
  ASSERT_GT(m.graph().initializer_size(), 0);
  for (const auto& t : m.graph().initializer()) {
    EXPECT_EQ(t.data_location(), onnx::TensorProto::EXTERNAL) << t.name();
    EXPECT_TRUE(t.raw_data().empty());
    std::map<std::string, std::string> kv;
    for (const auto& e : t.external_data()) kv[e.key()] = e.value();
    EXPECT_EQ(kv["location"], "gpt-tiny.weights");
    EXPECT_EQ(std::stoll(kv["offset"]) % 4096, 0) << t.name();
    int64_t n = 4;
    for (int64_t d : t.dims()) n *= d;
    EXPECT_EQ(std::stoll(kv["length"]), n);
  }
}

}  // namespace
}  // namespace apart::models
