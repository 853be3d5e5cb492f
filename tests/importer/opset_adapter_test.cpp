// Models at opsets 18–23 import with the shapes their opset gives them (importer/opset_adapter.h): every op ONNX
// revised after 17 that apart adapts, at opsets 18, 20, 21 and 23; the ops 1.12 lacks; the refusals.
#include "importer/opset_adapter.h"

#include <gtest/gtest.h>

#include "graph/error.h"
#include "importer/importer.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {

using testing::OnnxBuilder;
using Shape = std::vector<int64_t>;

Shape shape_of(const ImportedModel& m, const std::string& name) {
  const auto id = m.graph.find_value(name);
  EXPECT_TRUE(id.has_value()) << name;
  if (!id) return {};
  const Value& v = m.graph.value(*id);
  EXPECT_TRUE(v.shape_known) << name;
  return v.shape;
}

ImportedModel import(const OnnxBuilder& b) { return import_model_bytes(b.bytes(), ".", "m.onnx"); }

template <class Error>
std::string error_of(const OnnxBuilder& b) {
  try {
    import(b);
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "another error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "imported";
  return "";
}

void set_string(onnx::NodeProto& n, const std::string& name, const std::string& v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(v);
}

// An opset-N model with a float input x of `dims`.
OnnxBuilder model_at(int64_t opset, std::initializer_list<testing::Dim> dims) {
  OnnxBuilder b(opset);
  b.input("x", dims);
  return b;
}

class AnOpsetAbove17 : public ::testing::TestWithParam<int64_t> {
 protected:
  int64_t opset() const { return GetParam(); }
};

TEST_P(AnOpsetAbove17, ReadsEveryReductionsAxesFromItsInput) {
  for (const char* op : {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
                         "ReduceLogSumExp", "ReduceSumSquare", "ReduceSum"}) {
    OnnxBuilder b = model_at(opset(), {2, 3, 4});
    b.int_initializer("axes", {1});
    b.node(op, {"x", "axes"}, {"kept"});
    OnnxBuilder::set_int(b.node(op, {"x", "axes"}, {"dropped"}), "keepdims", 0);
    b.node(op, {"x"}, {"all"});
    OnnxBuilder::set_int(b.node(op, {"x", ""}, {"none"}), "noop_with_empty_axes", 1);
    // axes from a Constant node, negative
    auto& c = b.node("Constant", {}, {"last_axis"});
    auto* value = c.add_attribute();
    value->set_name("value");
    value->set_type(onnx::AttributeProto::TENSOR);
    value->mutable_t()->set_data_type(onnx::TensorProto::INT64);
    value->mutable_t()->add_dims(1);
    value->mutable_t()->add_int64_data(-1);
    b.node(op, {"x", "last_axis"}, {"from_constant"});
    for (const char* out : {"kept", "dropped", "all", "none", "from_constant"}) b.output(out);
    const ImportedModel m = import(b);
    EXPECT_EQ(shape_of(m, "kept"), (Shape{2, 1, 4})) << op;
    EXPECT_EQ(shape_of(m, "dropped"), (Shape{2, 4})) << op;
    EXPECT_EQ(shape_of(m, "all"), (Shape{1, 1, 1})) << op;
    EXPECT_EQ(shape_of(m, "none"), (Shape{2, 3, 4})) << op;
    EXPECT_EQ(shape_of(m, "from_constant"), (Shape{2, 3, 1})) << op;
    EXPECT_TRUE(m.warnings.empty()) << op << ": " << m.warnings.front();
  }
}

TEST_P(AnOpsetAbove17, SplitsIntoNumOutputsPartsWithASmallerLast) {
  OnnxBuilder b = model_at(opset(), {2, 7});
  auto& uneven = b.node("Split", {"x"}, {"a", "b", "c"});
  OnnxBuilder::set_int(uneven, "axis", 1);
  OnnxBuilder::set_int(uneven, "num_outputs", 3);
  auto& even = b.node("Split", {"x"}, {"p", "q"});
  OnnxBuilder::set_int(even, "num_outputs", 2);
  b.int_initializer("sizes", {5, 2});
  OnnxBuilder::set_int(b.node("Split", {"x", "sizes"}, {"s5", "s2"}), "axis", -1);
  for (const char* out : {"a", "b", "c", "p", "q", "s5", "s2"}) b.output(out);
  const ImportedModel m = import(b);
  EXPECT_EQ(shape_of(m, "a"), (Shape{2, 3}));
  EXPECT_EQ(shape_of(m, "b"), (Shape{2, 3}));
  EXPECT_EQ(shape_of(m, "c"), (Shape{2, 1}));
  EXPECT_EQ(shape_of(m, "p"), (Shape{1, 7}));
  EXPECT_EQ(shape_of(m, "q"), (Shape{1, 7}));
  EXPECT_EQ(shape_of(m, "s5"), (Shape{2, 5}));
  EXPECT_EQ(shape_of(m, "s2"), (Shape{2, 2}));
}

TEST_P(AnOpsetAbove17, PadsOnlyTheAxesItsAxesInputNames) {
  OnnxBuilder b = model_at(opset(), {2, 3, 4});
  b.int_initializer("pads", {1, 2}).int_initializer("axes", {-2}).int_initializer("all_pads", {0, 0, 1, 0, 0, 1});
  b.node("Pad", {"x", "pads", "", "axes"}, {"some"});
  set_string(b.node("Pad", {"x", "all_pads"}, {"every"}), "mode", opset() >= 19 ? "wrap" : "reflect");
  b.output("some").output("every");
  const ImportedModel m = import(b);
  EXPECT_EQ(shape_of(m, "some"), (Shape{2, 6, 4}));
  EXPECT_EQ(shape_of(m, "every"), (Shape{2, 3, 6}));
}

TEST_P(AnOpsetAbove17, ResizesTheAxesItsAxesAttributeNamesKeepingTheAspectRatio) {
  OnnxBuilder b = model_at(opset(), {1, 3, 8, 6});
  b.int_initializer("sizes", {4, 4});
  auto& fit = b.node("Resize", {"x", "", "", "sizes"}, {"fit"});
  OnnxBuilder::set_ints(fit, "axes", {2, 3});
  set_string(fit, "keep_aspect_ratio_policy", "not_larger");
  auto& cover = b.node("Resize", {"x", "", "", "sizes"}, {"cover"});
  OnnxBuilder::set_ints(cover, "axes", {-2, -1});
  set_string(cover, "keep_aspect_ratio_policy", "not_smaller");
  auto& stretch = b.node("Resize", {"x", "", "", "sizes"}, {"stretch"});
  OnnxBuilder::set_ints(stretch, "axes", {2, 3});
  OnnxBuilder::set_int(stretch, "antialias", 1);
  b.int_initializer("full", {1, 3, 16, 12});
  auto& plain = b.node("Resize", {"x", "", "", "full"}, {"plain"});
  if (opset() >= 19) set_string(plain, "coordinate_transformation_mode", "half_pixel_symmetric");
  for (const char* out : {"fit", "cover", "stretch", "plain"}) b.output(out);
  const ImportedModel m = import(b);
  EXPECT_EQ(shape_of(m, "fit"), (Shape{1, 3, 4, 3}));    // scale min(4/8, 4/6) = 0.5
  EXPECT_EQ(shape_of(m, "cover"), (Shape{1, 3, 5, 4}));  // scale max = 2/3: 8·2/3 = 5.33 → 5
  EXPECT_EQ(shape_of(m, "stretch"), (Shape{1, 3, 4, 4}));
  EXPECT_EQ(shape_of(m, "plain"), (Shape{1, 3, 16, 12}));
}

// The revisions that only widened types (or added attributes that keep the old meaning) read with 1.12's schemas.
TEST_P(AnOpsetAbove17, ReadsTheOpsWhoseRevisionsOnlyWidenedTypes) {
  OnnxBuilder b = model_at(opset(), {"batch", 3, 4});
  auto& cast = b.node("Cast", {"x"}, {"half"});
  OnnxBuilder::set_int(cast, "to", onnx::TensorProto::FLOAT16);
  if (opset() >= 19) OnnxBuilder::set_int(cast, "saturate", 1);
  b.node("CastLike", {"half", "x"}, {"back"});
  b.node("Identity", {"back"}, {"same"});
  b.node("Shape", {"same"}, {"shape"});
  b.node("Size", {"same"}, {"size"});
  b.int_initializer("flat", {0, 12});
  b.node("Reshape", {"same", "flat"}, {"reshaped"});
  b.int_initializer("axes0", {0});
  b.node("Unsqueeze", {"reshaped", "axes0"}, {"unsq"});
  b.node("Squeeze", {"unsq", "axes0"}, {"sq"});
  OnnxBuilder::set_ints(b.node("Transpose", {"sq"}, {"t"}), "perm", {1, 0});
  OnnxBuilder::set_int(b.node("Flatten", {"x"}, {"flat2"}), "axis", 2);
  b.node("ConstantOfShape", {"shape"}, {"zeros"});
  b.node("Relu", {"t"}, {"y"});
  b.output("size", onnx::TensorProto::INT64);
  for (const char* out : {"zeros", "flat2", "y"}) b.output(out);
  ImportOptions o;
  o.dims = {{"batch", 2}};
  const ImportedModel m = import_model_bytes(b.bytes(), ".", "m.onnx", o);
  EXPECT_EQ(shape_of(m, "half"), (Shape{2, 3, 4}));
  EXPECT_EQ(m.graph.value(*m.graph.find_value("half")).dtype, DType::kFloat16);
  EXPECT_EQ(m.graph.value(*m.graph.find_value("back")).dtype, DType::kFloat32);
  EXPECT_EQ(shape_of(m, "shape"), (Shape{3}));
  EXPECT_EQ(shape_of(m, "reshaped"), (Shape{2, 12}));
  EXPECT_EQ(shape_of(m, "t"), (Shape{12, 2}));
  EXPECT_EQ(shape_of(m, "flat2"), (Shape{6, 4}));
  EXPECT_EQ(shape_of(m, "zeros"), (Shape{2, 3, 4}));
  EXPECT_TRUE(m.unknown_shape_values.empty());
  for (const std::string& w : m.warnings) ADD_FAILURE() << w;
}

TEST_P(AnOpsetAbove17, InfersTheNewOpsItDefinesBeyondOnnx112) {
  OnnxBuilder b = model_at(opset(), {2, 4, 6, 5});
  b.weight("scale", {4}).weight("bias", {4});
  auto& gn = b.node("GroupNormalization", {"x", "scale", "bias"}, {"gn"});
  OnnxBuilder::set_int(gn, "num_groups", 2);
  b.node("Mish", {"gn"}, {"mish"});
  b.output("mish");
  if (opset() >= 20) {
    set_string(b.node("Gelu", {"mish"}, {"gelu"}), "approximate", "tanh");
    b.output("gelu");
  }
  const ImportedModel m = import(b);
  EXPECT_EQ(shape_of(m, "gn"), (Shape{2, 4, 6, 5}));
  EXPECT_EQ(shape_of(m, "mish"), (Shape{2, 4, 6, 5}));
  if (opset() >= 20) {
    EXPECT_EQ(shape_of(m, "gelu"), (Shape{2, 4, 6, 5}));
  }
}

INSTANTIATE_TEST_SUITE_P(AtOpsets, AnOpsetAbove17, ::testing::Values(18, 20, 21, 23),
                         [](const auto& info) { return "Opset" + std::to_string(info.param); });

TEST(AnOpset23Model, InfersRmsNormRotaryEmbeddingAndAttention) {
  OnnxBuilder b(23);
  b.input("x", {2, 5, 16});
  b.weight("g", {16}).weight("cos", {5, 2}).weight("sin", {5, 2});
  b.node("RMSNormalization", {"x", "g"}, {"normed"});
  // 4-D: [batch, heads, seq, head]
  b.input("q", {2, 4, 5, 8})
      .input("k", {2, 2, 5, 8})
      .input("v", {2, 2, 5, 6})
      .input("past_k", {2, 2, 3, 8})
      .input("past_v", {2, 2, 3, 6});
  auto& rope = b.node("RotaryEmbedding", {"q", "cos", "sin"}, {"q_rot"});
  OnnxBuilder::set_int(rope, "rotary_embedding_dim", 4);
  auto& att = b.node("Attention", {"q_rot", "k", "v", "", "past_k", "past_v"}, {"y4", "present_k", "present_v", "qk"});
  OnnxBuilder::set_int(att, "is_causal", 1);
  // 3-D: [batch, seq, heads · head], heads as attributes
  b.input("q3", {2, 5, 32}).input("k3", {2, 7, 16}).input("v3", {2, 7, 12});
  auto& att3 = b.node("Attention", {"q3", "k3", "v3"}, {"y3"});
  OnnxBuilder::set_int(att3, "q_num_heads", 4);
  OnnxBuilder::set_int(att3, "kv_num_heads", 2);
  for (const char* out : {"normed", "y4", "present_k", "present_v", "qk", "y3"}) b.output(out);
  const ImportedModel m = import(b);
  EXPECT_EQ(shape_of(m, "normed"), (Shape{2, 5, 16}));
  EXPECT_EQ(shape_of(m, "q_rot"), (Shape{2, 4, 5, 8}));
  EXPECT_EQ(shape_of(m, "y4"), (Shape{2, 4, 5, 6}));
  EXPECT_EQ(shape_of(m, "present_k"), (Shape{2, 2, 8, 8}));
  EXPECT_EQ(shape_of(m, "present_v"), (Shape{2, 2, 8, 6}));
  EXPECT_EQ(shape_of(m, "qk"), (Shape{2, 4, 5, 8}));
  EXPECT_EQ(shape_of(m, "y3"), (Shape{2, 5, 24}));  // 4 heads × v head size 12 / 2
}

TEST(AnOpset18Model, ImportsAsTheSameModelAtOpset17Does) {
  // LayerNorm decomposed as torch exports it: ReduceMean's axes an attribute at 17, input 1 at 18.
  const auto layer_norm = [](int64_t opset) {
    OnnxBuilder b(opset);
    b.input("x", {"batch", 6, 8}).output("y");
    b.int_initializer("axes", {-1});
    auto mean = [&](const std::string& in, const std::string& out) {
      auto& n = opset >= 18 ? b.node("ReduceMean", {in, "axes"}, {out}) : b.node("ReduceMean", {in}, {out});
      if (opset < 18) OnnxBuilder::set_ints(n, "axes", {-1});
    };
    mean("x", "mu");
    b.node("Sub", {"x", "mu"}, {"centred"});
    b.node("Mul", {"centred", "centred"}, {"sq"});
    mean("sq", "var");
    b.node("Sqrt", {"var"}, {"std"});
    b.node("Div", {"centred", "std"}, {"y"});
    return b;
  };
  ImportOptions o;
  o.dims = {{"batch", 3}};
  const ImportedModel at17 = import_model_bytes(layer_norm(17).bytes(), ".", "m17", o);
  const ImportedModel at18 = import_model_bytes(layer_norm(18).bytes(), ".", "m18", o);
  ASSERT_EQ(at17.graph.num_tasks(), at18.graph.num_tasks());
  for (const char* v : {"mu", "centred", "var", "y"}) EXPECT_EQ(shape_of(at17, v), shape_of(at18, v)) << v;
  EXPECT_EQ(shape_of(at18, "mu"), (Shape{3, 6, 1}));
  EXPECT_EQ(at18.opsets.at(""), 18);
}

// --- Refusals ---------------------------------------------------------------------------------------------------

TEST(AnOpsetAbove17Model, RefusesARevisionApartDoesNotAdaptNamingTheOp) {
  OnnxBuilder b(18);
  b.input("x", {1, 4, 9}).output("y");
  b.int_initializer("image", {3, 3}).int_initializer("block", {2, 2});
  b.node("Col2Im", {"x", "image", "block"}, {"y"}, "fold");
  const std::string msg = error_of<Unsupported>(b);
  EXPECT_NE(msg.find("'fold'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Col2Im-18"), std::string::npos) << msg;
  EXPECT_NE(msg.find("up to opset 23"), std::string::npos) << msg;
}

TEST(AnOpsetAbove17Model, RefusesANewAttributeThatWouldChangeShapesUnseen) {
  OnnxBuilder b(19);
  b.input("x", {1, 1, 8, 8}).output("y");
  auto& pool = b.node("AveragePool", {"x"}, {"y"}, "pool");
  OnnxBuilder::set_ints(pool, "kernel_shape", {2, 2});
  OnnxBuilder::set_ints(pool, "dilations", {2, 2});
  const std::string msg = error_of<Unsupported>(b);
  EXPECT_NE(msg.find("dilations"), std::string::npos) << msg;
}

TEST(AnOpsetAbove17Model, RejectsAnOpItsOpsetDoesNotDefineYet) {
  OnnxBuilder b(19);  // Gelu is new at 20
  b.input("x", {2}).output("y");
  b.node("Gelu", {"x"}, {"y"}, "gelu");
  const std::string msg = error_of<InvalidModel>(b);
  EXPECT_NE(msg.find("no operator 'Gelu'"), std::string::npos) << msg;
}

TEST(AnOpsetAbove17Model, RejectsAReductionThatKeepsItsAxesAttribute) {
  OnnxBuilder b(18);
  b.input("x", {2, 3}).output("y");
  OnnxBuilder::set_ints(b.node("ReduceMean", {"x"}, {"y"}, "mean"), "axes", {1});
  const std::string msg = error_of<InvalidModel>(b);
  EXPECT_NE(msg.find("ReduceMean-18"), std::string::npos) << msg;
}

TEST(AModelNewerThanOpset23, IsRefusedNamingTheFirstOpRevisedSince) {
  OnnxBuilder b(24);
  b.input("x", {2}).output("y");
  b.node("Relu", {"x"}, {"r"}, "relu");
  OnnxBuilder::set_int(b.node("Cast", {"r"}, {"y"}, "cast"), "to", onnx::TensorProto::FLOAT);
  const std::string msg = error_of<Unsupported>(b);
  EXPECT_NE(msg.find("'cast'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Cast-24"), std::string::npos) << msg;
  EXPECT_NE(msg.find("up to opset 23"), std::string::npos) << msg;
}

TEST(AModelNewerThanOpset23, IsRefusedByItsOpsetWhenNoOpChanged) {
  for (int64_t opset : {24, 99}) {
    OnnxBuilder b(opset);
    b.input("x", {2}).output("y");
    b.node("Relu", {"x"}, {"y"});
    const std::string msg = error_of<Unsupported>(b);
    EXPECT_NE(msg.find("opset " + std::to_string(opset)), std::string::npos) << msg;
    EXPECT_NE(msg.find("up to opset 23"), std::string::npos) << msg;
  }
}

TEST(TheOpsetAdapter, ListsOnlyNewerRevisionsAfter23) {
  EXPECT_EQ(newer_revision("Cast", 24), "Cast-24");
  EXPECT_EQ(newer_revision("Cast", 27), "Cast-25");
  EXPECT_EQ(newer_revision("Cast", 23), "");
  EXPECT_EQ(newer_revision("MatMul", 28), "");
  EXPECT_EQ(newer_revision("Range", 27), "Range-27");
  EXPECT_GE(newest_listed_opset(), 24);
}

TEST(TheOpsetAdapter, ServesOnnx112sSchemaForAnOpUnchangedSince17) {
  const OpsetSchema matmul = opset_schema("MatMul", 23, "");
  ASSERT_NE(matmul.schema, nullptr);
  EXPECT_EQ(matmul.schema, onnx::OpSchemaRegistry::Instance()->GetSchema("MatMul", 17, ""));
  const OpsetSchema mean = opset_schema("ReduceMean", 23, "");
  ASSERT_NE(mean.schema, nullptr);
  EXPECT_EQ(mean.schema->Name(), "ReduceMean");
  EXPECT_EQ(mean.schema->SinceVersion(), 18);
  EXPECT_EQ(opset_schema("ReduceMax", 23, "").schema->SinceVersion(), 20);
  EXPECT_EQ(opset_schema("Cast", 22, "").schema->SinceVersion(), 21);
  EXPECT_FALSE(opset_schema("DFT", 20, "").refusal.empty());
}

}  // namespace
}  // namespace apart
