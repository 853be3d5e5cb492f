// The importer on well-formed models: binding, shape inference, folding, external data, opaque ops.
#include "importer/importer.h"

#include <gtest/gtest.h>

#include <fstream>

#include "graph/error.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {

using testing::OnnxBuilder;
using testing::TempDir;

const Value& value(const ImportedModel& m, const std::string& name) {
  auto id = m.graph.find_value(name);
  EXPECT_TRUE(id.has_value()) << name;
  return m.graph.value(*id);
}
const Task& task(const ImportedModel& m, const std::string& name) {
  auto id = m.graph.find_task(name);
  EXPECT_TRUE(id.has_value()) << name;
  return m.graph.task(*id);
}

// The exporter idiom: y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])).
OnnxBuilder flatten_by_shape_arithmetic() {
  OnnxBuilder b(14);
  b.input("x", {"batch", 4, 5}).output("y");
  b.int_initializer("zero", {0}).int_initializer("minus_one", {-1}).int_initializer("axes", {0});
  b.graph().mutable_initializer(0)->clear_dims();  // scalar index
  b.node("Shape", {"x"}, {"shape"}, "shape");
  b.node("Gather", {"shape", "zero"}, {"batch_dim"}, "gather");
  b.node("Unsqueeze", {"batch_dim", "axes"}, {"batch_1d"}, "unsqueeze");
  auto& concat = b.node("Concat", {"batch_1d", "minus_one"}, {"target"}, "concat");
  OnnxBuilder::set_int(concat, "axis", 0);
  b.node("Reshape", {"x", "target"}, {"y"}, "reshape");
  return b;
}

TEST(TheImporter, FoldsExporterShapeArithmeticToConstants) {
  ImportOptions o;
  o.dims = {{"batch", 8}};
  auto m = import_model_bytes(flatten_by_shape_arithmetic().bytes(), ".", "m", o);
  EXPECT_EQ(value(m, "target").known_ints, (std::vector<int64_t>{8, -1}));
  EXPECT_EQ(value(m, "y").shape, (std::vector<int64_t>{8, 20}));
  for (const char* name : {"shape", "gather", "unsqueeze", "concat"}) EXPECT_TRUE(task(m, name).constant) << name;
  EXPECT_FALSE(task(m, "reshape").constant);
  EXPECT_EQ(m.graph.num_batch_tasks(), 1u);
  EXPECT_TRUE(m.unknown_shape_values.empty());
}

TEST(TheImporter, FoldsRangeSoThatLaterShapesBecomeKnown) {
  // Position ids as GPT-2 exports them: Gather(wpe, Unsqueeze(Range(0, Shape(x)[1], 1))).
  OnnxBuilder b(14);
  b.input("x", {"batch", "seq"}, onnx::TensorProto::INT64).output("pos");
  b.weight("wpe", {32, 4});
  b.int_initializer("one_idx", {1}).int_initializer("start", {0}).int_initializer("step", {1}).int_initializer("axes", {0});
  for (int i : {0, 1, 2}) b.graph().mutable_initializer(1 + i)->clear_dims();
  b.node("Shape", {"x"}, {"shape"});
  b.node("Gather", {"shape", "one_idx"}, {"seq_len"});
  b.node("Range", {"start", "seq_len", "step"}, {"range"});
  b.node("Unsqueeze", {"range", "axes"}, {"ids"});
  b.node("Gather", {"wpe", "ids"}, {"pos"});
  ImportOptions o;
  o.dims = {{"batch", 2}, {"seq", 6}};
  auto m = import_model_bytes(b.bytes(), ".", "m", o);
  EXPECT_EQ(value(m, "pos").shape, (std::vector<int64_t>{1, 6, 4}));
  EXPECT_TRUE(m.unknown_shape_values.empty());
}

TEST(TheImporter, FoldsTorchsExpandThroughConstantOfShapeSoThatRepeatKvHasStaticShapes) {
  // Hugging Face's repeat_kv as torch exports it: x[:, :, None].expand(B, Hkv, n_rep, S, D).reshape(B, Hkv·n_rep, S, D),
  // the expand's shape through Where(Equal(shape, −1), ConstantOfShape(Shape(shape), 1), shape).
  OnnxBuilder b(18);
  b.input("x", {"batch", 2, "seq", 4}).output("y");
  b.int_initializer("zero", {0}).int_initializer("one", {1}).int_initializer("two", {2}).int_initializer("four", {4});
  b.int_initializer("minus_one", {-1}).int_initializer("axis2", {2});
  b.node("Shape", {"x"}, {"shape_x"});
  b.node("Slice", {"shape_x", "zero", "one"}, {"batch_1d"});
  b.node("Slice", {"shape_x", "two", "four"}, {"seq_head"});
  OnnxBuilder::set_int(b.node("Concat", {"batch_1d", "two", "two", "seq_head"}, {"target"}), "axis", 0);
  b.node("Equal", {"target", "minus_one"}, {"is_free"});
  b.node("Shape", {"target"}, {"target_rank"});
  auto& ones = b.node("ConstantOfShape", {"target_rank"}, {"ones"}, "ones");
  auto* fill = ones.add_attribute();
  fill->set_name("value"), fill->set_type(onnx::AttributeProto::TENSOR);
  fill->mutable_t()->set_data_type(onnx::TensorProto::INT64), fill->mutable_t()->add_dims(1);
  fill->mutable_t()->add_int64_data(1);
  b.node("Where", {"is_free", "ones", "target"}, {"expand_shape"});
  b.node("Unsqueeze", {"x", "axis2"}, {"x5"});
  b.node("Expand", {"x5", "expand_shape"}, {"expanded"}, "expand");
  OnnxBuilder::set_int(b.node("Concat", {"batch_1d", "four", "seq_head"}, {"merged"}), "axis", 0);
  b.node("Reshape", {"expanded", "merged"}, {"y"});
  ImportOptions o;
  o.dims = {{"batch", 3}, {"seq", 5}};
  auto m = import_model_bytes(b.bytes(), ".", "m", o);
  EXPECT_EQ(value(m, "ones").known_ints, (std::vector<int64_t>{1, 1, 1, 1, 1}));
  EXPECT_EQ(value(m, "expand_shape").known_ints, (std::vector<int64_t>{3, 2, 2, 5, 4}));
  EXPECT_EQ(value(m, "expanded").shape, (std::vector<int64_t>{3, 2, 2, 5, 4}));
  EXPECT_EQ(value(m, "y").shape, (std::vector<int64_t>{3, 4, 5, 4}));
  EXPECT_TRUE(m.unknown_shape_values.empty());
}

TEST(TheImporter, GivesACausalMaskBuiltFromShapesStaticShapes) {
  // A causal mask as torch exports Hugging Face's: torch.full((S, S), min) through ConstantOfShape of a folded shape,
  // Trilu above the diagonal, the same from arange(S) > arange(S)[:, None] (Range, Unsqueeze, Greater, Where), summed
  // and expanded to [B, 1, S, S] by a folded Concat of Shape(x), then added to scores [B, H, S, S].
  OnnxBuilder b(18);
  b.input("x", {"batch", 2, "seq", "seq"}).output("y");
  b.int_initializer("zero", {0}).int_initializer("one", {1}).int_initializer("three", {3});
  b.int_initializer("axis0", {0}).int_initializer("axis1", {1});
  b.int_initializer("start", {0}).int_initializer("step", {1});
  for (int i : {5, 6}) b.graph().mutable_initializer(i)->clear_dims();  // scalar Range bounds
  for (const auto& [name, v] : {std::pair{"lowest", -1e9f}, std::pair{"nothing", 0.f}}) {  // float scalars
    auto* t = b.graph().add_initializer();
    t->set_name(name), t->set_data_type(onnx::TensorProto::FLOAT), t->add_float_data(v);
  }
  b.node("Shape", {"x"}, {"shape_x"});
  b.node("Slice", {"shape_x", "zero", "one"}, {"batch_1d"});
  b.node("Slice", {"shape_x", "three", "seq_end"}, {"seq_1d"});
  b.int_initializer("seq_end", {4});
  OnnxBuilder::set_int(b.node("Concat", {"seq_1d", "seq_1d"}, {"square"}), "axis", 0);
  auto& full = b.node("ConstantOfShape", {"square"}, {"full"});
  auto* fill = full.add_attribute();
  fill->set_name("value"), fill->set_type(onnx::AttributeProto::TENSOR);
  fill->mutable_t()->set_data_type(onnx::TensorProto::FLOAT), fill->mutable_t()->add_dims(1);
  fill->mutable_t()->add_float_data(-1e9f);
  b.node("Trilu", {"full", "one"}, {"above"});  // upper, diagonal 1
  b.node("Squeeze", {"seq_1d", "axis0"}, {"seq_len"});
  b.node("Range", {"start", "seq_len", "step"}, {"positions"});
  b.node("Unsqueeze", {"positions", "axis0"}, {"row"});
  b.node("Unsqueeze", {"positions", "axis1"}, {"column"});
  b.node("Greater", {"row", "column"}, {"future"});
  b.node("Where", {"future", "lowest", "nothing"}, {"masked"});
  b.node("Add", {"above", "masked"}, {"mask"});
  OnnxBuilder::set_int(b.node("Concat", {"batch_1d", "one", "seq_1d", "seq_1d"}, {"mask_shape"}), "axis", 0);
  b.node("Expand", {"mask", "mask_shape"}, {"mask4"}, "expand_mask");
  b.node("Add", {"x", "mask4"}, {"y"});
  ImportOptions o;
  o.dims = {{"batch", 3}, {"seq", 6}};
  auto m = import_model_bytes(b.bytes(), ".", "m", o);
  EXPECT_EQ(value(m, "full").shape, (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(value(m, "positions").known_ints, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(value(m, "mask4").shape, (std::vector<int64_t>{3, 1, 6, 6}));
  EXPECT_EQ(value(m, "y").shape, (std::vector<int64_t>{3, 2, 6, 6}));
  EXPECT_TRUE(m.unknown_shape_values.empty()) << m.unknown_shape_values.front();
}

TEST(TheImporter, BindsADimEverywhereItAppears) {
  OnnxBuilder b;
  b.input("a", {"batch", 3}).input("b", {"batch", 3}).output("y");
  b.node("Add", {"a", "b"}, {"y"});
  ImportOptions o;
  o.dims = {{"batch", 5}};
  auto m = import_model_bytes(b.bytes(), ".", "m", o);
  EXPECT_EQ(value(m, "a").shape, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(value(m, "b").shape, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(value(m, "y").shape, (std::vector<int64_t>{5, 3}));
  ASSERT_EQ(m.bindings.size(), 1u);
  EXPECT_EQ(m.bindings[0].source, "--dim batch=5");
}

// stage_K.onnx writes a dim that is k times the batch as "<k>*batch" (onnxruntime's symbolic-shape style).
TEST(TheImporter, BindsAMultipleOfADimFromThatDim) {
  OnnxBuilder b;
  b.input("flat", {"32*batch", 3}).output("y");
  b.node("Relu", {"flat"}, {"y"});
  ImportOptions o;
  o.dims = {{"batch", 3}};
  auto m = import_model_bytes(b.bytes(), ".", "m", o);
  EXPECT_EQ(value(m, "flat").shape, (std::vector<int64_t>{96, 3}));
  EXPECT_EQ(value(m, "y").shape, (std::vector<int64_t>{96, 3}));
  ASSERT_GE(m.bindings.size(), 1u);
  EXPECT_EQ(m.bindings[0].dim, "batch");
  EXPECT_EQ(m.bindings[0].source, "--dim batch=3");

  ImportOptions by_full_name;
  by_full_name.dims = {{"32*batch", 64}};
  EXPECT_EQ(value(import_model_bytes(b.bytes(), ".", "m", by_full_name), "y").shape, (std::vector<int64_t>{64, 3}));

  OnnxBuilder unbound;
  unbound.input("flat", {"32*batch", 3}).output("y");
  unbound.node("Relu", {"flat"}, {"y"});
  try {
    import_model_bytes(unbound.bytes(), ".", "m", {});
    FAIL() << "an unbound multiple imported";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("pass --dim batch=<size>"), std::string::npos) << e.what();
  }
}

TEST(TheImporter, BindsAShapeFlagIncludingAnonymousDims) {
  OnnxBuilder b;
  b.input("x", {"batch", 3}).output("y");
  b.graph().mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)->clear_dim_param();
  b.node("Relu", {"x"}, {"y"});
  ImportOptions o;
  o.input_shapes = {{"x", {7, 3}}};
  auto m = import_model_bytes(b.bytes(), ".", "m", o);
  EXPECT_EQ(value(m, "y").shape, (std::vector<int64_t>{7, 3}));
  EXPECT_EQ(value(m, "y").bytes, 7 * 3 * 4);
}

TEST(TheImporter, RecordsValueKindsAndParamSizes) {
  OnnxBuilder b;
  b.input("x", {2, 3}).output("y");
  b.weight("w", {3, 4});
  b.node("MatMul", {"x", "w"}, {"h"});
  b.node("Relu", {"h"}, {"y"});
  auto m = import_model_bytes(b.bytes(), ".", "m");
  EXPECT_EQ(value(m, "x").kind, ValueKind::kInput);
  EXPECT_EQ(value(m, "w").kind, ValueKind::kParam);
  EXPECT_EQ(value(m, "w").bytes, 48);
  EXPECT_EQ(value(m, "h").kind, ValueKind::kActivation);
  EXPECT_EQ(value(m, "y").kind, ValueKind::kOutput);
  EXPECT_EQ(task(m, "MatMul_0").onnx_node_index, 0);
  EXPECT_EQ(m.node_count, 2);
}

TEST(TheImporter, NotesAMissingExternalDataFileWithoutReadingWeights) {
  TempDir dir;
  OnnxBuilder b;
  b.input("x", {2, 3}).output("y");
  b.external_weight("w", {3, 4}, "model.weights");
  b.node("MatMul", {"x", "w"}, {"y"});
  b.save(dir / "m.onnx");
  auto m = import_model(dir / "m.onnx");
  EXPECT_FALSE(m.external_data_present);
  ASSERT_EQ(m.notes.size(), 1u);
  EXPECT_NE(m.notes[0].find("model.weights"), std::string::npos);
  EXPECT_TRUE(value(m, "w").external_data);
  EXPECT_EQ(value(m, "w").bytes, 48);
  ImportOptions need;
  need.require_external_data = true;
  EXPECT_THROW(import_model(dir / "m.onnx", need), InvalidModel);
}

TEST(TheImporter, ChecksThatAPresentExternalDataFileIsLargeEnough) {
  TempDir dir;
  OnnxBuilder b;
  b.input("x", {2, 3}).output("y");
  b.external_weight("w", {3, 4}, "model.weights", 16);
  b.node("MatMul", {"x", "w"}, {"y"});
  b.save(dir / "m.onnx");
  { std::ofstream(dir / "model.weights") << std::string(64, '\0'); }
  EXPECT_TRUE(import_model(dir / "m.onnx").external_data_present);
  { std::ofstream(dir / "model.weights") << std::string(20, '\0'); }
  EXPECT_THROW(import_model(dir / "m.onnx"), InvalidModel);
}

TEST(TheImporter, ImportsUnknownOpsAsOpaqueTasksWithAWarning) {
  OnnxBuilder b;
  auto* os = b.model().add_opset_import();
  os->set_domain("com.example");
  os->set_version(1);
  b.input("x", {2, 3}).output("y");
  b.node("FancyOp", {"x"}, {"y"}, "fancy").set_domain("com.example");
  auto m = import_model_bytes(b.bytes(), ".", "m");
  EXPECT_TRUE(task(m, "fancy").opaque);
  ASSERT_FALSE(m.warnings.empty());
  EXPECT_NE(m.warnings[0].find("com.example::FancyOp"), std::string::npos);
  EXPECT_EQ(m.unknown_shape_values, (std::vector<std::string>{"y"}));
  // Said up front, naming the node: the training graph apart train and apart run build needs every shape.
  EXPECT_NE(m.warnings.back().find("apart train and apart run will refuse the model"), std::string::npos) << m.warnings.back();
  EXPECT_NE(m.warnings.back().find("node 'fancy' (FancyOp)"), std::string::npos) << m.warnings.back();
}

TEST(TheImporter, MakesValuesReadInsideSubgraphsExplicitInputs) {
  OnnxBuilder b;
  b.input("cond", {}, onnx::TensorProto::BOOL).input("x", {2}).output("y");
  b.node("Relu", {"x"}, {"outer"}, "producer");
  auto& if_node = b.node("If", {"cond"}, {"y"}, "branch");
  for (const char* branch : {"then_branch", "else_branch"}) {
    auto* a = if_node.add_attribute();
    a->set_name(branch);
    a->set_type(onnx::AttributeProto::GRAPH);
    auto* g = a->mutable_g();
    g->set_name(branch);
    auto* n = g->add_node();
    n->set_op_type("Identity");
    n->add_input("outer");
    n->add_output(std::string(branch) + "_out");
    auto* o = g->add_output();
    o->set_name(std::string(branch) + "_out");
    o->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  }
  auto m = import_model_bytes(b.bytes(), ".", "m");
  const TaskId branch = *m.graph.find_task("branch");
  ASSERT_EQ(m.graph.predecessors(branch).size(), 1u);
  EXPECT_EQ(m.graph.task(m.graph.predecessors(branch)[0]).name, "producer");
}

TEST(TheImporter, IsDeterministic) {
  ImportOptions o;
  o.dims = {{"batch", 3}};
  const std::string bytes = flatten_by_shape_arithmetic().bytes();
  auto a = import_model_bytes(bytes, ".", "m", o);
  auto b = import_model_bytes(bytes, ".", "m", o);
  ASSERT_EQ(a.graph.num_tasks(), b.graph.num_tasks());
  ASSERT_EQ(a.graph.num_values(), b.graph.num_values());
  for (size_t i = 0; i < a.graph.num_tasks(); ++i) {
    const TaskId t(static_cast<uint32_t>(i));
    EXPECT_EQ(a.graph.task(t).name, b.graph.task(t).name);
    EXPECT_EQ(a.graph.task(t).constant, b.graph.task(t).constant);
  }
  for (size_t i = 0; i < a.graph.num_values(); ++i) {
    const ValueId v(static_cast<uint32_t>(i));
    EXPECT_EQ(a.graph.value(v).shape, b.graph.value(v).shape);
    EXPECT_EQ(a.graph.value(v).known_ints, b.graph.value(v).known_ints);
  }
}

}  // namespace
}  // namespace apart
