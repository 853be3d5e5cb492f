// Every kind of bad input gets a typed error that names what is wrong, never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <random>

#include "graph/error.h"
#include "importer/importer.h"
#include "importer/model_proto.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {

using testing::OnnxBuilder;
using testing::TempDir;

// Imports and returns the error it raised; fails the test if it raised none.
template <class E>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error";
  return {};
}

std::string import_error(const OnnxBuilder& b, const ImportOptions& o = {}) {
  return error_of<InvalidModel>([&] { import_model_bytes(b.bytes(), ".", "fixture.onnx", o); });
}

OnnxBuilder relu_model() {
  OnnxBuilder b;
  b.input("x", {2, 3}).output("y");
  b.node("Relu", {"x"}, {"y"}, "relu");
  return b;
}

TEST(TheImporter, RejectsAnEmptyFile) {
  TempDir dir;
  std::ofstream(dir / "empty.onnx").close();
  auto msg = error_of<InvalidModel>([&] { import_model(dir / "empty.onnx"); });
  EXPECT_NE(msg.find("empty"), std::string::npos);
}

TEST(TheImporter, RejectsADirectory) {
  TempDir dir;
  auto msg = error_of<InvalidArgument>([&] { import_model(dir.path()); });
  EXPECT_NE(msg.find("directory"), std::string::npos);
}

TEST(TheImporter, RejectsAMissingFileAsASystemError) {
  EXPECT_THROW(import_model("/nonexistent/model.onnx"), SystemError);
}

// load_model_proto (stage files, train, profile) reads a file with the same checks as import_model.
TEST(TheModelProtoLoader, RejectsWhatTheImporterRejects) {
  TempDir dir;
  EXPECT_THROW(load_model_proto(dir / "missing.onnx"), SystemError);
  EXPECT_THROW(load_model_proto(dir.path()), InvalidArgument);
  std::ofstream(dir / "empty.onnx").close();
  EXPECT_THROW(load_model_proto(dir / "empty.onnx"), InvalidModel);
  std::ofstream(dir / "text.onnx") << "not a model";
  EXPECT_THROW(load_model_proto(dir / "text.onnx"), InvalidModel);
}

TEST(TheModelProtoLoader, ReadsAValidModel) {
  TempDir dir;
  relu_model().save(dir / "relu.onnx");
  const onnx::ModelProto model = load_model_proto(dir / "relu.onnx");
  ASSERT_EQ(model.graph().node_size(), 1);
  EXPECT_EQ(model.graph().node(0).op_type(), "Relu");
}

TEST(TheImporter, RejectsRandomBytes) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::string bytes(64 + trial * 37, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    try {
      import_model_bytes(bytes, ".", "random.onnx");
      ADD_FAILURE() << "random bytes imported";
    } catch (const Error& e) {
      EXPECT_TRUE(e.kind() == ErrorKind::kInvalidModel || e.kind() == ErrorKind::kUnsupported) << e.what();
    }
  }
}

TEST(TheImporter, RejectsEveryTruncationOfAValidModel) {
  const std::string bytes = relu_model().bytes();
  for (size_t len = 1; len < bytes.size(); ++len) {
    try {
      import_model_bytes(bytes.substr(0, len), ".", "truncated.onnx");
      // A prefix may still parse as a smaller valid message; that is fine as long as nothing crashes.
    } catch (const Error& e) {
      EXPECT_NE(e.kind(), ErrorKind::kInternal) << e.what();
    }
  }
}

// Real models cut at every 1 KiB: gpt-tiny (with its weights inline) and the shared torch exports (graph-only).
// Each prefix is refused with a typed error — or, where the cut falls between whole fields, imports as the smaller
// model it is — and never crashes; most must be refused.
TEST(TheImporter, RefusesARealModelTruncatedAtEveryKibibyte) {
  std::vector<std::filesystem::path> models = {std::filesystem::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx"};
  for (const char* name : {"resnet50.onnx", "gpt2_small.onnx"})
    if (std::filesystem::exists(std::filesystem::path(APART_SHARED_MODELS_DIR) / name))
      models.push_back(std::filesystem::path(APART_SHARED_MODELS_DIR) / name);
  for (const auto& model : models) {
    std::ifstream in(model, std::ios::binary);
    const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    ASSERT_GT(bytes.size(), 4096u) << model;
    int refused = 0, cuts = 0;
    for (size_t len = 1024; len < bytes.size(); len += 1024, ++cuts) {
      ImportOptions o;
      o.batch = 1;
      try {
        import_model_bytes(bytes.substr(0, len), model.parent_path(), "truncated.onnx", o);
      } catch (const Error& e) {
        EXPECT_NE(e.kind(), ErrorKind::kInternal) << model << " cut at " << len << ": " << e.what();
        ++refused;
      }
    }
    EXPECT_GE(refused * 10, cuts * 9) << model << ": only " << refused << " of " << cuts << " cuts were refused";
  }
}

// ONNX 1.12's Conv inference takes the kernel from W's dims when kernel_shape is absent and then indexes
// X-rank-sized vectors with it: a W of higher rank read out of bounds (found by fuzz/import.cpp on QLinearConv).
TEST(TheImporter, NamesAConvolutionWhoseWeightRankDiffersFromItsInputsInsteadOfCrashingInOnnx) {
  for (const std::vector<int64_t>& w : {std::vector<int64_t>{4, 3, 3, 3, 3}, std::vector<int64_t>{4, 3}}) {
    OnnxBuilder b;
    b.input("x", {1, 3, 8, 8}).output("y");
    b.weight("w", w);
    b.node("Conv", {"x", "w"}, {"y"}, "conv");
    const std::string message = import_error(b);
    EXPECT_NE(message.find("node 'conv' (Conv): its weight 'w' has rank " + std::to_string(w.size())), std::string::npos)
        << message;
  }
  OnnxBuilder pool;
  pool.input("x", {1, 3, 8, 8}).output("y");
  OnnxBuilder::set_ints(pool.node("MaxPool", {"x"}, {"y"}, "pool"), "kernel_shape", {2, 2});
  OnnxBuilder::set_ints(*pool.graph().mutable_node(0), "pads", {1, 1});
  EXPECT_NE(import_error(pool).find("attribute pads has 2 values, not the 4"), std::string::npos) << import_error(pool);
}

// ONNX 1.12's Shape-15 inference dereferences its input's type unchecked: a custom-domain op's output (no schema, so
// no inferred type) feeding Shape crashed the importer (found by fuzz/import.cpp on an untyped graph input).
TEST(TheImporter, PlansAShapeOfACustomOpsOutputWithoutCrashingInOnnx) {
  OnnxBuilder b(15);
  auto* domain = b.model().add_opset_import();
  domain->set_domain("com.example");
  domain->set_version(1);
  b.input("x", {2, 3}).output("y", onnx::TensorProto::INT64);
  b.node("Custom", {"x"}, {"t"}, "custom").set_domain("com.example");
  b.node("Shape", {"t"}, {"y"}, "shape");
  const ImportedModel m = import_model_bytes(b.bytes(), ".", "custom_shape.onnx");
  EXPECT_EQ(m.graph.num_tasks(), 2u);
}

// ONNX 1.12's Gemm inference reads B's dim 1 whatever B's rank (found by fuzz/import.cpp on a Gemm-6).
TEST(TheImporter, NamesAGemmWhoseOperandIsNotAMatrixInsteadOfCrashingInOnnx) {
  OnnxBuilder b(6, 3);
  b.input("a", {2, 3}).input("b", {4}).input("c", {4}).output("y");
  b.node("Gemm", {"a", "b", "c"}, {"y"}, "gemm");
  EXPECT_NE(import_error(b).find("node 'gemm' (Gemm): input 'b' has rank 1"), std::string::npos) << import_error(b);
}

TEST(TheImporter, RefusesAGraphInputWithoutAType) {
  OnnxBuilder b(15);
  b.graph().add_input()->set_name("x");
  b.output("y", onnx::TensorProto::INT64);
  b.node("Shape", {"x"}, {"y"}, "shape");
  EXPECT_NE(import_error(b).find("graph input 'x' declares no type"), std::string::npos) << import_error(b);
}

TEST(TheImporter, RejectsAGraphWithACycle) {
  OnnxBuilder b;
  b.input("x", {2}).output("b");
  b.node("Add", {"x", "b"}, {"a"}, "first");
  b.node("Relu", {"a"}, {"b"}, "second");
  EXPECT_NE(import_error(b).find("cycle"), std::string::npos);
}

TEST(TheImporter, RejectsANodeInputThatNothingProduces) {
  OnnxBuilder b;
  b.input("x", {2}).output("y");
  b.node("Add", {"x", "ghost"}, {"y"}, "adder");
  auto msg = import_error(b);
  EXPECT_NE(msg.find("ghost"), std::string::npos);
  EXPECT_NE(msg.find("adder"), std::string::npos);
}

TEST(TheImporter, RejectsTwoNodesWritingOneValue) {
  OnnxBuilder b;
  b.input("x", {2}).output("y");
  b.node("Relu", {"x"}, {"y"}, "one");
  b.node("Neg", {"x"}, {"y"}, "two");
  auto msg = import_error(b);
  EXPECT_NE(msg.find("two nodes"), std::string::npos);
}

TEST(TheImporter, RejectsANodeOverwritingAnInitializer) {
  OnnxBuilder b;
  b.input("x", {2}).output("w");
  b.weight("w", {2});
  b.node("Relu", {"x"}, {"w"}, "clobber");
  EXPECT_NE(import_error(b).find("initializer"), std::string::npos);
}

TEST(TheImporter, RejectsAnInitializerShadowingAnInputWithAnotherShape) {
  OnnxBuilder b;
  b.input("w", {4}).output("y");
  b.weight("w", {2});
  b.node("Relu", {"w"}, {"y"});
  auto msg = import_error(b);
  EXPECT_NE(msg.find("shadows"), std::string::npos);
}

TEST(TheImporter, AcceptsAnInitializerListedAsAnInputAsIrVersion3Requires) {
  OnnxBuilder b(9, 3);
  b.input("x", {2}).input("w", {2}).output("y");
  b.weight("w", {2});
  b.node("Add", {"x", "w"}, {"y"});
  auto m = import_model_bytes(b.bytes(), ".", "ir3.onnx");
  EXPECT_EQ(m.graph.value(*m.graph.find_value("w")).kind, ValueKind::kParam);
  EXPECT_EQ(m.graph.graph_inputs().size(), 1u);
}

TEST(TheImporter, NamesAnUnboundDynamicDimTheValueAndTheFlag) {
  OnnxBuilder b;
  b.input("tokens", {"batch", 16}).output("y");
  b.node("Relu", {"tokens"}, {"y"});
  auto msg = error_of<InvalidArgument>([&] { import_model_bytes(b.bytes(), ".", "m.onnx"); });
  EXPECT_NE(msg.find("'batch'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'tokens'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--dim batch="), std::string::npos) << msg;
  EXPECT_NE(msg.find("--shape tokens:"), std::string::npos) << msg;
}

TEST(TheImporter, RejectsElementCountOverflowInAnInitializer) {
  OnnxBuilder b;
  b.input("x", {2}).output("y");
  auto* t = b.graph().add_initializer();
  t->set_name("huge");
  t->set_data_type(onnx::TensorProto::FLOAT);
  t->add_dims(int64_t{1} << 40);
  t->add_dims(int64_t{1} << 40);
  b.node("Relu", {"x"}, {"y"});
  auto msg = import_error(b);
  EXPECT_NE(msg.find("huge"), std::string::npos);
  EXPECT_NE(msg.find("overflows"), std::string::npos);
}

TEST(TheImporter, RejectsElementCountOverflowInABoundInputShape) {
  OnnxBuilder b;
  b.input("x", {"a", "b"}).output("y");
  b.node("Relu", {"x"}, {"y"});
  ImportOptions o;
  o.dims = {{"a", int64_t{1} << 40}, {"b", int64_t{1} << 40}};
  EXPECT_NE(import_error(b, o).find("overflows"), std::string::npos);
}

TEST(TheImporter, RejectsRawDataWhoseLengthDoesNotMatchTheShape) {
  OnnxBuilder b;
  b.input("x", {2}).output("y");
  b.weight("w", {2});
  b.graph().mutable_initializer(0)->mutable_raw_data()->resize(7);
  b.node("Add", {"x", "w"}, {"y"});
  auto msg = import_error(b);
  EXPECT_NE(msg.find("'w'"), std::string::npos);
  EXPECT_NE(msg.find("raw_data"), std::string::npos);
}

TEST(TheImporter, RejectsAnAbsoluteExternalDataLocation) {
  OnnxBuilder b;
  b.input("x", {2}).output("y");
  b.external_weight("w", {2}, "/etc/passwd");
  b.node("Add", {"x", "w"}, {"y"});
  EXPECT_NE(import_error(b).find("absolute"), std::string::npos);
}

TEST(TheImporter, RejectsAnExternalDataLocationWithDotDot) {
  OnnxBuilder b;
  b.input("x", {2}).output("y");
  b.external_weight("w", {2}, "weights/../../secret.bin");
  b.node("Add", {"x", "w"}, {"y"});
  EXPECT_NE(import_error(b).find(".."), std::string::npos);
}

TEST(TheImporter, RejectsAnExternalDataLocationThatEscapesThroughASymlink) {
  TempDir dir, outside;
  std::filesystem::create_directory_symlink(outside.path(), dir / "link");
  { std::ofstream(outside / "w.bin") << std::string(8, '\0'); }
  OnnxBuilder b;
  b.input("x", {2}).output("y");
  b.external_weight("w", {2}, "link/w.bin");
  b.node("Add", {"x", "w"}, {"y"});
  b.save(dir / "m.onnx");
  auto msg = error_of<InvalidModel>([&] { import_model(dir / "m.onnx"); });
  EXPECT_NE(msg.find("outside"), std::string::npos) << msg;
}

// apart's plans hard-link the model's weights into PLAN/weights/, so a planned model's file has two links and a
// stage file's weights are such a link: both must import.
TEST(TheImporter, AcceptsAnExternalDataFileWithASecondHardLinkAsApartsPlansMakeThem) {
  TempDir dir, plan;
  { std::ofstream(dir / "w.bin") << std::string(8, '\0'); }
  std::filesystem::create_directories(plan / "weights");
  std::filesystem::create_hard_link(dir / "w.bin", plan / "weights" / "w.bin");
  for (const auto& [folder, location] : {std::pair{dir.path(), "w.bin"}, std::pair{plan.path(), "weights/w.bin"}}) {
    OnnxBuilder b;
    b.input("x", {2}).output("y");
    b.external_weight("w", {2}, location);
    b.node("Add", {"x", "w"}, {"y"});
    b.save(folder / "m.onnx");
    EXPECT_NO_THROW(import_model(folder / "m.onnx")) << location;
  }
}

TEST(TheImporter, RejectsAnUnknownOrRepeatedExternalDataKeyAndAcceptsAChecksum) {
  auto with_key = [](const std::string& key, const std::string& value) {
    OnnxBuilder b;
    b.input("x", {2}).output("y");
    b.external_weight("w", {2}, "w.bin");
    auto* kv = b.graph().mutable_initializer(0)->add_external_data();
    kv->set_key(key);
    kv->set_value(value);
    b.node("Add", {"x", "w"}, {"y"});
    return b;
  };
  OnnxBuilder unknown = with_key("basepath", "/etc");
  std::string msg = import_error(unknown);
  EXPECT_NE(msg.find("unknown external_data key 'basepath'"), std::string::npos) << msg;
  OnnxBuilder repeated = with_key("location", "other.bin");
  msg = import_error(repeated);
  EXPECT_NE(msg.find("'location' twice"), std::string::npos) << msg;
  // checksum is ONNX's own key: the model imports (its weights file is absent, so it is shapes only).
  TempDir dir;
  OnnxBuilder checksum = with_key("checksum", "da39a3ee5e6b4b0d3255bfef95601890afd80709");
  checksum.save(dir / "m.onnx");
  EXPECT_NO_THROW(import_model(dir / "m.onnx"));
}

TEST(TheImporter, RejectsAnOpsetNewerThanItAdapts) {
  OnnxBuilder b(24);  // 18–23 import (tests/importer/opset_adapter_test.cpp)
  b.input("x", {2}).output("y");
  b.node("Relu", {"x"}, {"y"});
  EXPECT_THROW(import_model_bytes(b.bytes(), ".", "m.onnx"), Unsupported);
}

TEST(TheImporter, RejectsFlagsNamingUnknownInputsOrDims) {
  OnnxBuilder b;
  b.input("x", {"batch", 2}).output("y");
  b.node("Relu", {"x"}, {"y"});
  ImportOptions shape;
  shape.input_shapes = {{"nope", {1, 2}}};
  shape.dims = {{"batch", 1}};
  EXPECT_NE(error_of<InvalidArgument>([&] { import_model_bytes(b.bytes(), ".", "m", shape); }).find("nope"), std::string::npos);
  ImportOptions dim;
  dim.dims = {{"batch", 1}, {"bach", 2}};
  EXPECT_NE(error_of<InvalidArgument>([&] { import_model_bytes(b.bytes(), ".", "m", dim); }).find("bach"), std::string::npos);
}

TEST(TheImporter, RejectsAShapeFlagThatContradictsAFixedDim) {
  OnnxBuilder b;
  b.input("x", {"batch", 2}).output("y");
  b.node("Relu", {"x"}, {"y"});
  ImportOptions o;
  o.input_shapes = {{"x", {4, 3}}};
  EXPECT_THROW(import_model_bytes(b.bytes(), ".", "m", o), InvalidArgument);
}

TEST(ShapeAndDimFlags, RejectMalformedText) {
  EXPECT_THROW(parse_shape_flag("noshape"), InvalidArgument);
  EXPECT_THROW(parse_shape_flag("x:8xx2"), InvalidArgument);
  EXPECT_THROW(parse_shape_flag("x:8x-1"), InvalidArgument);
  EXPECT_THROW(parse_dim_flag("batch"), InvalidArgument);
  EXPECT_THROW(parse_dim_flag("batch=eight"), InvalidArgument);
  EXPECT_THROW(parse_dim_flag("=8"), InvalidArgument);
  // Issue 11: a dim bound to 0 empties every tensor that carries it; past 2^40 no shape is meaningful.
  EXPECT_THROW(parse_dim_flag("batch=0"), InvalidArgument);
  EXPECT_THROW(parse_dim_flag("batch=4611686018427387904"), InvalidArgument);
  EXPECT_THROW(parse_shape_flag("x:8x4611686018427387904"), InvalidArgument);
  auto [name, dims] = parse_shape_flag("encoder:input:8x3x224x224");
  EXPECT_EQ(name, "encoder:input");
  EXPECT_EQ(dims, (std::vector<int64_t>{8, 3, 224, 224}));
  EXPECT_EQ(parse_dim_flag("batch=8"), (std::pair<std::string, int64_t>{"batch", 8}));
}

// ---------------- Messages a person can act on (issue 11) ----------------


TEST(TheImporter, RefusesANodeNameThatIsNotUtf8NamingTheNode) {
  OnnxBuilder b;
  b.input("x", {2, 3}).output("y");
  b.node("Relu", {"x"}, {"y"}, "relu\xff\xfe");
  const std::string msg = import_error(b);
  EXPECT_NE(msg.find("node 0 (Relu)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'relu\\xff\\xfe'"), std::string::npos) << msg;  // escaped, never raw
  EXPECT_NE(msg.find("UTF-8"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\xff'), std::string::npos);
}

TEST(TheImporter, RefusesAValueNameThatIsNotUtf8NamingWhereItIs) {
  OnnxBuilder b;
  b.input("x", {2, 3}).output("y\xc0");
  b.node("Relu", {"x"}, {"y\xc0"}, "relu");
  const std::string msg = import_error(b);
  EXPECT_NE(msg.find("graph output 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'y\\xc0'"), std::string::npos) << msg;

  OnnxBuilder in_body;  // a value inside an If body: stage files and JSON would carry it too
  in_body.input("c", {}, onnx::TensorProto::BOOL).output("y");
  auto& node = in_body.node("If", {"c"}, {"y"}, "if");
  for (const char* branch : {"then_branch", "else_branch"}) {
    auto* a = node.add_attribute();
    a->set_name(branch);
    a->set_type(onnx::AttributeProto::GRAPH);
    auto* g = a->mutable_g();
    g->set_name(branch);
    auto* k = g->add_node();
    k->set_op_type("Constant");
    k->add_output("k\xff");
    auto* v = k->add_attribute();
    v->set_name("value");
    v->set_type(onnx::AttributeProto::TENSOR);
    v->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
    v->mutable_t()->add_float_data(1);
    g->add_output()->set_name("k\xff");
  }
  const std::string body_msg = import_error(in_body);
  EXPECT_NE(body_msg.find("in the body of node 0 (If)"), std::string::npos) << body_msg;
}

// An If whose then_branch holds an If, `depth` deep: valid ONNX, 3 protobuf levels per If.
OnnxBuilder nested_if_model(int depth) {
  auto body = [](onnx::GraphProto& g, const std::string& out, int levels, auto& self) -> void {
    g.set_name("body" + std::to_string(levels));
    auto* n = g.add_node();
    n->add_output(out);
    if (levels == 0) {
      n->set_op_type("Constant");
      auto* v = n->add_attribute();
      v->set_name("value");
      v->set_type(onnx::AttributeProto::TENSOR);
      v->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
      v->mutable_t()->add_float_data(1);
    } else {
      n->set_op_type("If");
      n->add_input("c");
      for (const char* branch : {"then_branch", "else_branch"}) {  // only then_branch nests: linear size
        auto* a = n->add_attribute();
        a->set_name(branch);
        a->set_type(onnx::AttributeProto::GRAPH);
        self(*a->mutable_g(), out + "_", branch[0] == 't' ? levels - 1 : 0, self);
      }
    }
    auto* o = g.add_output();
    o->set_name(out);
    o->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    o->mutable_type()->mutable_tensor_type()->mutable_shape();
  };
  OnnxBuilder b;
  b.input("c", {}, onnx::TensorProto::BOOL);
  body(b.graph(), "y", depth, body);
  b.graph().set_name("test");
  return b;
}

TEST(TheImporter, SaysAModelNestedDeeperThanProtobufsLimitIsTooDeepNotTruncated) {
  EXPECT_NO_THROW(import_model_bytes(nested_if_model(4).bytes(), ".", "shallow.onnx"));  // the same model, shallower
  const std::string msg =
      error_of<Unsupported>([&] { import_model_bytes(nested_if_model(25).bytes(), ".", "deep.onnx"); });
  EXPECT_NE(msg.find("nests messages deeper than the 64 levels"), std::string::npos) << msg;
  EXPECT_NE(msg.find("recursion limit"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("truncated"), std::string::npos) << msg;
  // Bytes that are not a model still get "truncated or not an .onnx file".
  std::string cut = nested_if_model(4).bytes();
  cut.resize(cut.size() / 2);
  EXPECT_NE(error_of<InvalidModel>([&] { import_model_bytes(cut, ".", "cut.onnx"); }).find("truncated"), std::string::npos);
}

TEST(TheImporter, BlamesADimFlagNamingNoDimOfTheModelAndListsTheDimsItHas) {
  OnnxBuilder b;
  b.input("x", {"batch", "feat"}).output("y");
  b.node("Relu", {"x"}, {"y"});
  ImportOptions o;
  o.dims = {{"nosuch", 3}};
  const std::string msg = error_of<InvalidArgument>([&] { import_model_bytes(b.bytes(), ".", "m.onnx", o); });
  EXPECT_NE(msg.find("--dim nosuch=3: the model has no dim 'nosuch'; its dims are: batch, feat"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("not bound"), std::string::npos) << msg;
}

// Every "<...>" placeholder of a suggested flag replaced by 2.
std::string fill_in(std::string flag) {
  for (size_t at; (at = flag.find('<')) != std::string::npos;) flag.replace(at, flag.find('>', at) - at + 1, "2");
  return flag;
}

// The flags a message suggests: each "--dim …" and "--shape …" word, placeholders filled in.
ImportOptions suggested_options(const std::string& msg, const std::string& which) {
  ImportOptions o;
  for (size_t at = 0; (at = msg.find(which, at)) != std::string::npos; at += which.size()) {
    size_t end = msg.find_first_of(" ,;", at + which.size());
    const std::string arg = fill_in(msg.substr(at + which.size(), end == std::string::npos ? std::string::npos : end - at - which.size()));
    if (which == "--dim ") o.dims.insert(parse_dim_flag(arg));
    else o.input_shapes.push_back(parse_shape_flag(arg));
  }
  return o;
}

TEST(TheImporter, SuggestsForAnUnboundDimFlagsThatImportOnceTheirNumbersAreFilledIn) {
  OnnxBuilder b;
  b.input("x", {"batch", "feat"}).output("y");
  b.node("Relu", {"x"}, {"y"});
  const std::string msg = error_of<InvalidArgument>([&] { import_model_bytes(b.bytes(), ".", "m.onnx", {}); });
  EXPECT_NE(msg.find("--dim batch=<size> --dim feat=<size>"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--shape x:<batch>x<feat>"), std::string::npos) << msg;
  for (const char* which : {"--dim ", "--shape "}) {
    const ImportOptions o = suggested_options(msg, which);
    const ImportedModel m = import_model_bytes(b.bytes(), ".", "m.onnx", o);
    EXPECT_EQ(m.graph.value(*m.graph.find_value("x")).shape, (std::vector<int64_t>{2, 2})) << which;
  }

  // With batch bound, the suggestion keeps it and asks only for feat.
  ImportOptions half;
  half.dims = {{"batch", 4}};
  const std::string rest = error_of<InvalidArgument>([&] { import_model_bytes(b.bytes(), ".", "m.onnx", half); });
  EXPECT_NE(rest.find("pass --dim feat=<size>, or the input's whole shape, --shape x:4x<feat>"), std::string::npos) << rest;

  // An anonymous dynamic dim can only be given by --shape: the suggestion is one that imports.
  OnnxBuilder anon;
  anon.input("x", {"batch", "feat"}).output("y");
  anon.graph().mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->clear_dim_param();
  anon.node("Relu", {"x"}, {"y"});
  const std::string anon_msg = error_of<InvalidArgument>([&] { import_model_bytes(anon.bytes(), ".", "m.onnx", half); });
  EXPECT_NE(anon_msg.find("--shape x:4x<axis1>"), std::string::npos) << anon_msg;
  EXPECT_NO_THROW(import_model_bytes(anon.bytes(), ".", "m.onnx", suggested_options(anon_msg, "--shape ")));
}


// fuzz/import.cpp's first finding (tests/regress/import/): a Scan whose num_scan_inputs was renamed made ONNX 1.12's
// Scan inference dereference null inside libonnx. Nodes are now checked against their schema before inference.
TEST(TheImporter, RejectsANodeMissingARequiredAttributeBeforeOnnxInferenceReadsIt) {
  const std::string msg = error_of<InvalidModel>(
      [] { import_model(std::filesystem::path(APART_SOURCE_DIR) / "tests/regress/import/scan_missing_num_scan_inputs.onnx"); });
  EXPECT_NE(msg.find("(Scan) does not match ONNX's Scan-9 schema"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Unrecognized attribute: num_scan_onputs"), std::string::npos) << msg;
}

TEST(TheImporter, RejectsANodeOfASubgraphThatBreaksItsSchema) {
  OnnxBuilder b;
  b.input("cond", {}, onnx::TensorProto::BOOL).input("x", {2}).output("y");
  auto& if_node = b.node("If", {"cond"}, {"y"}, "branch");
  for (const char* branch : {"then_branch", "else_branch"}) {
    auto* a = if_node.add_attribute();
    a->set_name(branch);
    a->set_type(onnx::AttributeProto::GRAPH);
    auto* g = a->mutable_g();
    g->set_name(branch);
    auto* n = g->add_node();
    n->set_op_type("Transpose");
    n->set_name("inner");
    n->add_input("x");
    n->add_output("t");
    auto* perm = n->add_attribute();  // perm given as a float: a type the schema does not allow
    perm->set_name("perm");
    perm->set_type(onnx::AttributeProto::FLOAT);
    perm->set_f(1);
    g->add_output()->set_name("t");
  }
  const std::string msg = import_error(b);
  EXPECT_NE(msg.find("'branch/inner' (Transpose) does not match ONNX's Transpose"), std::string::npos) << msg;
}

}  // namespace
}  // namespace apart
