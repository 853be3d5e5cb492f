// `--loss cross_entropy --labels NAME` (importer/added_loss.h) on logits-only models, and the module paths the
// dynamo exporter keeps in node metadata (Task::scope, module_path).
#include <gtest/gtest.h>

#include <google/protobuf/unknown_field_set.h>

#include <map>

#include "graph/error.h"
#include "importer/added_loss.h"
#include "importer/importer.h"
#include "importer/model_proto.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {

using testing::OnnxBuilder;

// ids[batch, 8] → Gather(table[10, 6]) → MatMul(w[6, 10]) → logits[batch, 8, 10]: a logits-only LM export.
OnnxBuilder logits_model(const std::string& output = "logits") {
  OnnxBuilder b;
  b.input("input_ids", {"batch", 8}, onnx::TensorProto::INT64);
  auto* out = b.graph().add_output();
  out->set_name(output);
  auto* tt = out->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_param("batch");
  tt->mutable_shape()->add_dim()->set_dim_value(8);
  tt->mutable_shape()->add_dim()->set_dim_value(10);
  b.weight("table", {10, 6}).weight("w", {6, 10});
  b.node("Gather", {"table", "input_ids"}, {"h"}, "/embed/Gather");
  b.node("MatMul", {"h", "w"}, {output}, "/head/MatMul");
  return b;
}

ImportedModel import_with(const OnnxBuilder& b, AddedLossForm form, const std::string& labels = "labels") {
  ImportOptions o;
  o.batch = 2;
  o.loss = AddedLoss{form, labels};
  return import_model_bytes(b.bytes(), {}, "lm.onnx", o);
}

const Value& value_named(const TaskGraph& g, const std::string& name) {
  const auto id = g.find_value(name);
  EXPECT_TRUE(id.has_value()) << name;
  return g.value(*id);
}

TEST(AnAddedCrossEntropy, AddsAnInt64LabelsInputAndAScalarLossAsTorchExportsFCrossEntropy) {
  const ImportedModel m = import_with(logits_model(), AddedLossForm::kCrossEntropy);
  const Value& labels = value_named(m.graph, "labels");
  EXPECT_EQ(labels.kind, ValueKind::kInput);
  EXPECT_EQ(labels.dtype, DType::kInt64);
  EXPECT_EQ(labels.shape, (std::vector<int64_t>{2, 8}));  // the batch binds it as it binds the logits
  const Value& loss = value_named(m.graph, "loss");
  EXPECT_EQ(loss.kind, ValueKind::kOutput);
  EXPECT_TRUE(loss.shape_known);
  EXPECT_EQ(loss.elements, 1);
  ASSERT_EQ(m.graph.graph_outputs().size(), 1u);  // the loss replaces the logits among the outputs
  EXPECT_TRUE(m.unknown_shape_values.empty());
  std::vector<std::string> ops;
  for (const Task& t : m.graph.tasks())
    if (t.name.starts_with("/loss/") && t.op_type != "Constant") ops.push_back(t.op_type);
  EXPECT_EQ(ops, (std::vector<std::string>{"Reshape", "Reshape", "SoftmaxCrossEntropyLoss"}));
}

TEST(AnAddedShiftedCrossEntropy, ComparesEachPositionsLogitsWithTheNextLabel) {
  const ImportedModel m = import_with(logits_model(), AddedLossForm::kCrossEntropyShifted);
  EXPECT_EQ(value_named(m.graph, "labels").shape, (std::vector<int64_t>{2, 8}));
  int slices = 0;
  for (const Task& t : m.graph.tasks())
    if (t.op_type == "SoftmaxCrossEntropyLoss") {
      // logits[:, :-1].view(-1, 10) against labels[:, 1:].view(-1): 2 x 7 positions.
      EXPECT_EQ(m.graph.value(t.inputs[0]).shape, (std::vector<int64_t>{14, 10}));
      EXPECT_EQ(m.graph.value(t.inputs[1]).shape, (std::vector<int64_t>{14}));
    } else if (t.op_type == "Slice") {
      ++slices;
    }
  EXPECT_EQ(slices, 2);
}

TEST(AnAddedLoss, IsTheSameForEveryReaderOfTheFile) {
  const auto path = logits_model().write("added_loss_same.onnx");
  ImportOptions o;
  o.loss = AddedLoss{AddedLossForm::kCrossEntropy, "y"};
  const onnx::ModelProto a = load_model_proto(path, o), b = load_model_proto(path, o);
  EXPECT_EQ(a.SerializeAsString(), b.SerializeAsString());
  EXPECT_EQ(a.graph().input(a.graph().input_size() - 1).name(), "y");
  EXPECT_EQ(a.graph().output(0).name(), kAddedLossOutput);
}

TEST(AnAddedLoss, RefusesAModelThatHasOneOrLabelsThatClash) {
  OnnxBuilder with_loss = logits_model();
  with_loss.output("mean");
  with_loss.graph().mutable_output(1)->mutable_type()->mutable_tensor_type()->mutable_shape();
  with_loss.node("ReduceMean", {"logits"}, {"mean"}, "/ReduceMean");
  EXPECT_THROW(import_with(with_loss, AddedLossForm::kCrossEntropy), InvalidArgument);
  EXPECT_THROW(import_with(logits_model(), AddedLossForm::kCrossEntropy, "input_ids"), InvalidArgument);
  EXPECT_THROW(import_with(logits_model(), AddedLossForm::kCrossEntropy, ""), InvalidArgument);
  try {
    import_with(logits_model(), AddedLossForm::kCrossEntropy, "h");
    ADD_FAILURE() << "a labels name the model uses was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--labels h"), std::string::npos) << e.what();
  }
}

TEST(AnAddedLoss, ReadsTheOnlyRankTwoOrMoreFloatOutputAsTheLogitsWhateverItsName) {
  const ImportedModel m = import_with(logits_model("scores"), AddedLossForm::kCrossEntropy);
  EXPECT_EQ(value_named(m.graph, "loss").elements, 1);
  EXPECT_EQ(value_named(m.graph, "scores").kind, ValueKind::kActivation);
}

TEST(AnAddedLoss, NamesTheFormsItKnows) {
  EXPECT_EQ(parse_added_loss_form("cross_entropy"), AddedLossForm::kCrossEntropy);
  EXPECT_EQ(parse_added_loss_form("cross_entropy_shifted"), AddedLossForm::kCrossEntropyShifted);
  EXPECT_EQ(parse_added_loss_form("mse"), std::nullopt);
  EXPECT_EQ(added_loss_form_name(AddedLossForm::kCrossEntropyShifted), "cross_entropy_shifted");
}

// NodeProto.metadata_props as the dynamo exporter writes it: field 9, newer than the ONNX 1.12 protos, so written
// as that field's bytes (a StringStringEntryProto each).
void add_meta(onnx::NodeProto& n, const std::string& key, const std::string& value) {
  onnx::StringStringEntryProto p;
  p.set_key(key);
  p.set_value(value);
  n.GetReflection()->MutableUnknownFields(&n)->AddLengthDelimited(9, p.SerializeAsString());
}

TEST(ADynamoExport, GivesGenericallyNamedNodesTheModulePathOfTheirMetadata) {
  OnnxBuilder b;
  b.input("x", {"batch", 4}).output("y");
  b.weight("w0", {4, 4}).weight("w1", {4, 4});
  add_meta(b.node("MatMul", {"x", "w0"}, {"h"}, "node_MatMul_0"), "pkg.torch.onnx.name_scopes",
           "['', 'model', 'model.layers.0', 'model.layers.0.mlp', 'model.layers.0.mlp.up_proj', 'linear']");
  add_meta(b.node("MatMul", {"h", "w1"}, {"y"}, "node_MatMul_1"), "namespace",
           "model: transformers.LlamaModel/layers.1: transformers.LlamaDecoderLayer/mlp: transformers.LlamaMLP/"
           "linear_1: aten.linear.default");
  b.output("r");
  b.node("Relu", {"x"}, {"r"}, "/already/scoped/Relu");
  ImportOptions o;
  o.batch = 2;
  const ImportedModel m = import_model_bytes(b.bytes(), {}, "dynamo.onnx", o);
  std::map<std::string, std::string> paths;
  for (const Task& t : m.graph.tasks()) paths[t.name] = module_path(t);
  EXPECT_EQ(paths["node_MatMul_0"], "/model/layers.0/mlp/up_proj/node_MatMul_0");
  EXPECT_EQ(paths["node_MatMul_1"], "/model/layers.1/mlp/node_MatMul_1");
  EXPECT_EQ(paths["/already/scoped/Relu"], "/already/scoped/Relu");
}

TEST(ADynamoExport, NamesNoScopeWhereItsMetadataHoldsNoModule) {
  EXPECT_EQ(scope_from_metadata("['', 'add']", ""), "");
  EXPECT_EQ(scope_from_metadata("", ""), "");
  EXPECT_EQ(scope_from_metadata("['', 'h.0', 'h.0.attn', 'matmul_3']", ""), "/h.0/attn");
  EXPECT_EQ(scope_from_metadata("", ": GPT2/h.0: Block/matmul: aten.matmul"), "/h.0");
}

}  // namespace
}  // namespace apart
