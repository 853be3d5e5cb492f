// Tensor-parallel region detection: hand-built graphs as exact oracles, near-misses that must stay replicated, the
// zoo's GPT/BERT/T5/ResNet and the real GPT-2 export.
#include "partition/tensor_parallel.h"

#include <gtest/gtest.h>
#include <google/protobuf/unknown_field_set.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "graph/error.h"
#include "importer/importer.h"
#include "models/zoo.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using testing::OnnxBuilder;

ImportedModel import(const OnnxBuilder& b, int64_t batch = 1) {
  ImportOptions o;
  o.batch = batch;
  return import_model_bytes(b.bytes(), ".", "hand-built.onnx", o);
}

ImportedModel import_zoo(const models::ZooOptions& options, int64_t batch = 1) {
  ImportOptions o;
  o.batch = batch;
  return import_model_bytes(models::build_zoo_model(options).SerializeAsString(), ".", options.name + ".onnx", o);
}

// A Constant node holding one float: scalars as exporters write them (an initializer would be a param).
void scalar(OnnxBuilder& b, const std::string& name, float value) {
  onnx::NodeProto& n = b.node("Constant", {}, {name});
  auto* a = n.add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
  a->mutable_t()->add_float_data(value);
}

std::vector<std::string> names(const TaskGraph& g, const std::vector<TaskId>& tasks) {
  std::vector<std::string> out;
  for (TaskId t : tasks) out.push_back(g.task(t).name);
  return out;
}

TpRole role_of(const TaskGraph& g, const TensorParallelRegions& r, const std::string& task) {
  return r.roles[g.find_task(task).value().value()];
}

// x [B, 4, 8] → MatMul W1 [8, F] → Add b1 → Relu → MatMul W2 [F, 8] → Add b2; `prefix` names the nodes.
std::string mlp_block(OnnxBuilder& b, const std::string& x, const std::string& prefix, int64_t ffn = 12) {
  b.weight(prefix + ".w1", {8, ffn}).weight(prefix + ".b1", {ffn}).weight(prefix + ".w2", {ffn, 8}).weight(prefix + ".b2", {8});
  b.node("MatMul", {x, prefix + ".w1"}, {prefix + ".h"}, "/" + prefix + "/fc1/MatMul");
  b.node("Add", {prefix + ".h", prefix + ".b1"}, {prefix + ".hb"}, "/" + prefix + "/fc1/Add");
  b.node("Relu", {prefix + ".hb"}, {prefix + ".a"}, "/" + prefix + "/act/Relu");
  b.node("MatMul", {prefix + ".a", prefix + ".w2"}, {prefix + ".o"}, "/" + prefix + "/fc2/MatMul");
  b.node("Add", {prefix + ".o", prefix + ".b2"}, {prefix + ".y"}, "/" + prefix + "/fc2/Add");
  return prefix + ".y";
}

// The dynamo exporter's generic node names ("node_MatMul_0"), the module path in pkg.torch.onnx.name_scopes (field 9 of
// NodeProto, newer than the ONNX 1.12 protos: written as that field's bytes): the region is named by the metadata.
TEST(ADynamoExportedMlp, IsARegionNamedByTheModulePathOfItsNodesMetadata) {
  OnnxBuilder b;
  b.input("x", {"batch", 4, 8}).output("mlp.y");
  mlp_block(b, "x", "mlp");
  const std::vector<std::string> modules = {"fc1", "fc1", "act", "fc2", "fc2"};
  for (int i = 0; i < b.graph().node_size(); ++i) {
    onnx::NodeProto& n = *b.graph().mutable_node(i);
    n.set_name("node_" + n.op_type() + "_" + std::to_string(i));
    onnx::StringStringEntryProto meta;
    meta.set_key("pkg.torch.onnx.name_scopes");
    meta.set_value("['', 'model', 'model.layers.3', 'model.layers.3.mlp', 'model.layers.3.mlp." +
                   modules[static_cast<size_t>(i)] + "', 'op_" + std::to_string(i) + "']");
    n.GetReflection()->MutableUnknownFields(&n)->AddLengthDelimited(9, meta.SerializeAsString());
  }
  const ImportedModel m = import(b, 2);
  const TensorParallelRegions r = find_tensor_parallel_regions(m.graph, 2);
  ASSERT_EQ(r.regions.size(), 1u);
  EXPECT_EQ(r.regions[0].name, "/model/layers.3/mlp");
}

TEST(AHandBuiltMlp, IsOneRegionColumnThenRowEndingAtTheSecondMatMul) {
  OnnxBuilder b;
  b.input("x", {"batch", 4, 8}).output("mlp.y");
  mlp_block(b, "x", "mlp");
  const ImportedModel m = import(b, 2);
  const TensorParallelRegions r = find_tensor_parallel_regions(m.graph, 2);
  ASSERT_EQ(r.regions.size(), 1u);
  const TpRegion& region = r.regions[0];
  EXPECT_EQ(region.kind, TpRegionKind::kMlp);
  EXPECT_EQ(region.name, "/mlp");
  EXPECT_EQ(names(m.graph, region.tasks),
            (std::vector<std::string>{"/mlp/fc1/MatMul", "/mlp/fc1/Add", "/mlp/act/Relu", "/mlp/fc2/MatMul"}));
  EXPECT_EQ(names(m.graph, region.column_tasks), std::vector<std::string>{"/mlp/fc1/MatMul"});
  EXPECT_EQ(names(m.graph, region.row_tasks), std::vector<std::string>{"/mlp/fc2/MatMul"});
  EXPECT_EQ(m.graph.value(region.end_value).name, "mlp.o");
  EXPECT_EQ(region.closing, TpClosing::kAllReduce);
  EXPECT_DOUBLE_EQ(region.end_bytes_per_sample, 4.0 * 8 * 4);  // [4, 8] fp32 per sample
  ASSERT_EQ(region.inputs.size(), 1u);
  EXPECT_EQ(m.graph.value(region.inputs[0]).name, "x");
  ASSERT_EQ(region.sliced_inputs.size(), 1u);  // b1 is sliced with W1's columns; b2 comes after the all-reduce
  EXPECT_EQ(m.graph.value(region.sliced_inputs[0]).name, "mlp.b1");
  EXPECT_EQ(region.split_units, 12);
  EXPECT_EQ(region.bounded_by, "12 ffn features");
  EXPECT_EQ(region.degrees, (std::vector<int>{1, 2, 4}));  // 8 does not divide 12
  EXPECT_EQ(role_of(m.graph, r, "/mlp/fc1/MatMul"), TpRole::kColumn);
  EXPECT_EQ(role_of(m.graph, r, "/mlp/fc1/Add"), TpRole::kFollowsSplit);
  EXPECT_EQ(role_of(m.graph, r, "/mlp/act/Relu"), TpRole::kFollowsSplit);
  EXPECT_EQ(role_of(m.graph, r, "/mlp/fc2/MatMul"), TpRole::kRow);
  EXPECT_EQ(role_of(m.graph, r, "/mlp/fc2/Add"), TpRole::kReplicated);
  EXPECT_EQ(r.summary(), "1 MLP");
}

TEST(AGemmMlp, SplitsTheFirstGemmWithItsBiasAndAddsTheSecondsBiasAfterTheAllReduce) {
  // torch's nn.Linear on 2-D inputs: Gemm(x, W [out, in], b, transB = 1).
  OnnxBuilder b;
  b.input("x", {"batch", 8}).output("y");
  b.weight("w1", {16, 8}).weight("b1", {16}).weight("w2", {8, 16}).weight("b2", {8});
  OnnxBuilder::set_int(b.node("Gemm", {"x", "w1", "b1"}, {"h"}, "/fc1/Gemm"), "transB", 1);
  b.node("Tanh", {"h"}, {"a"}, "/act/Tanh");
  OnnxBuilder::set_int(b.node("Gemm", {"a", "w2", "b2"}, {"y"}, "/fc2/Gemm"), "transB", 1);
  const ImportedModel m = import(b);
  const TensorParallelRegions r = find_tensor_parallel_regions(m.graph);
  ASSERT_EQ(r.regions.size(), 1u);
  const TpRegion& region = r.regions[0];
  EXPECT_EQ(region.kind, TpRegionKind::kMlp);
  EXPECT_EQ(names(m.graph, region.tasks), (std::vector<std::string>{"/fc1/Gemm", "/act/Tanh", "/fc2/Gemm"}));
  EXPECT_EQ(m.graph.value(region.end_value).name, "y");
  ASSERT_EQ(region.sliced_inputs.size(), 1u);
  EXPECT_EQ(m.graph.value(region.sliced_inputs[0]).name, "b1");
  EXPECT_EQ(region.bounded_by, "16 ffn features");
  EXPECT_EQ(region.degrees, (std::vector<int>{1, 2, 4, 8}));
}

TEST(TwoResidualMlps, RecordTheReplicatedTasksBetweenThemOnly) {
  OnnxBuilder b;
  b.input("x", {"batch", 4, 8}).output("y2");
  const std::string m1 = mlp_block(b, "x", "m1");
  b.node("Add", {"x", m1}, {"y1"}, "/res1/Add");
  const std::string m2 = mlp_block(b, "y1", "m2");
  b.node("Add", {"y1", m2}, {"y2"}, "/res2/Add");
  const ImportedModel m = import(b);
  const TensorParallelRegions r = find_tensor_parallel_regions(m.graph);
  ASSERT_EQ(r.regions.size(), 2u);
  EXPECT_EQ(r.regions[0].name, "/m1");
  EXPECT_EQ(r.regions[1].name, "/m2");
  // m1's bias and the residual add sit between the two all-reduces; m2's bias and add feed no region.
  EXPECT_EQ(names(m.graph, r.between_regions), (std::vector<std::string>{"/m1/fc2/Add", "/res1/Add"}));
}

// Attention over x [B, S=4, H=8] with 2 heads of 4; q/k/v either from one fused [8, 24] weight and a Split or from
// three weights. Shapes are int64 initializers, as torch's constant folding leaves them.
void attention_tail(OnnxBuilder& b, const std::string& q, const std::string& k, const std::string& v) {
  b.int_initializer("heads_shape", {0, 0, 2, 4});
  b.int_initializer("merged_shape", {0, 0, 8});
  b.node("Reshape", {q, "heads_shape"}, {"qr"}, "/attn/Reshape");
  b.node("Reshape", {k, "heads_shape"}, {"kr"}, "/attn/Reshape_1");
  b.node("Reshape", {v, "heads_shape"}, {"vr"}, "/attn/Reshape_2");
  OnnxBuilder::set_ints(b.node("Transpose", {"qr"}, {"qt"}, "/attn/Transpose"), "perm", {0, 2, 1, 3});
  OnnxBuilder::set_ints(b.node("Transpose", {"kr"}, {"kt"}, "/attn/Transpose_1"), "perm", {0, 2, 3, 1});
  OnnxBuilder::set_ints(b.node("Transpose", {"vr"}, {"vt"}, "/attn/Transpose_2"), "perm", {0, 2, 1, 3});
  b.node("MatMul", {"qt", "kt"}, {"scores"}, "/attn/MatMul");
  scalar(b, "scale", 2.0f);
  b.node("Div", {"scores", "scale"}, {"scaled"}, "/attn/Div");
  b.node("Add", {"scaled", "mask"}, {"masked"}, "/attn/Add");  // mask: a graph input [B, 1, 1, S]
  OnnxBuilder::set_int(b.node("Softmax", {"masked"}, {"probs"}, "/attn/Softmax"), "axis", -1);
  b.node("MatMul", {"probs", "vt"}, {"ctx"}, "/attn/MatMul_1");
  OnnxBuilder::set_ints(b.node("Transpose", {"ctx"}, {"ctxt"}, "/attn/Transpose_3"), "perm", {0, 2, 1, 3});
  b.node("Reshape", {"ctxt", "merged_shape"}, {"merged"}, "/attn/Reshape_3");
  b.weight("wo", {8, 8}).weight("bo", {8});
  b.node("MatMul", {"merged", "wo"}, {"o"}, "/attn/out/MatMul");
  b.node("Add", {"o", "bo"}, {"y"}, "/attn/out/Add");
}

OnnxBuilder fused_qkv_attention() {
  OnnxBuilder b;
  b.input("x", {"batch", 4, 8}).input("mask", {"batch", 1, 1, 4}).output("y");
  b.weight("wqkv", {8, 24}).weight("bqkv", {24});
  b.node("MatMul", {"x", "wqkv"}, {"qkv0"}, "/attn/qkv/MatMul");
  b.node("Add", {"bqkv", "qkv0"}, {"qkv"}, "/attn/qkv/Add");
  b.int_initializer("sizes", {8, 8, 8});
  OnnxBuilder::set_int(b.node("Split", {"qkv", "sizes"}, {"q", "k", "v"}, "/attn/Split"), "axis", 2);
  attention_tail(b, "q", "k", "v");
  return b;
}

OnnxBuilder separate_qkv_attention() {
  OnnxBuilder b;
  b.input("x", {"batch", 4, 8}).input("mask", {"batch", 1, 1, 4}).output("y");
  for (const char* p : {"q", "k", "v"}) {
    const std::string s = p;
    b.weight("w" + s, {8, 8}).weight("b" + s, {8});
    b.node("MatMul", {"x", "w" + s}, {s + "0"}, "/attn/" + s + "/MatMul");
    b.node("Add", {s + "0", "b" + s}, {s}, "/attn/" + s + "/Add");
  }
  attention_tail(b, "q", "k", "v");
  return b;
}

void expect_attention(const ImportedModel& m, const TensorParallelRegions& r, size_t columns) {
  ASSERT_EQ(r.regions.size(), 1u) << r.summary();
  const TpRegion& a = r.regions[0];
  EXPECT_EQ(a.kind, TpRegionKind::kAttention);
  EXPECT_EQ(a.name, "/attn");
  EXPECT_EQ(a.column_tasks.size(), columns);
  EXPECT_EQ(names(m.graph, a.row_tasks), std::vector<std::string>{"/attn/out/MatMul"});
  EXPECT_EQ(m.graph.value(a.end_value).name, "o");
  EXPECT_EQ(a.heads, 2);
  EXPECT_EQ(a.split_units, 2);
  EXPECT_EQ(a.bounded_by, "2 heads");
  EXPECT_EQ(a.degrees, (std::vector<int>{1, 2}));
  ASSERT_EQ(a.inputs.size(), 1u);  // one backward all-reduce: q, k and v read the same x
  EXPECT_EQ(m.graph.value(a.inputs[0]).name, "x");
  for (const char* t : {"/attn/MatMul", "/attn/Div", "/attn/Add", "/attn/Softmax", "/attn/MatMul_1", "/attn/Reshape_3"})
    EXPECT_EQ(role_of(m.graph, r, t), TpRole::kFollowsSplit) << t;
  EXPECT_EQ(role_of(m.graph, r, "/attn/out/Add"), TpRole::kReplicated);
  // Every batch task but the output bias is in the region.
  EXPECT_EQ(a.tasks.size(), m.graph.num_batch_tasks() - 1);
}

TEST(AFusedQkvAttention, IsOneRegionSplitByHeadsThroughTheSplit) {
  const ImportedModel m = import(fused_qkv_attention());
  const TensorParallelRegions r = find_tensor_parallel_regions(m.graph);
  expect_attention(m, r, 1);
  EXPECT_EQ(role_of(m.graph, r, "/attn/Split"), TpRole::kFollowsSplit);
  EXPECT_EQ(r.summary(), "1 attention");
}

TEST(ASeparateQkvAttention, JoinsItsThreeColumnLinearsIntoOneRegion) {
  const ImportedModel m = import(separate_qkv_attention());
  const TensorParallelRegions r = find_tensor_parallel_regions(m.graph);
  expect_attention(m, r, 3);
  for (const char* t : {"/attn/q/MatMul", "/attn/k/MatMul", "/attn/v/MatMul"})
    EXPECT_EQ(role_of(m.graph, r, t), TpRole::kColumn) << t;
}

// A fused QKV read through three Slices along the split axis: the shard pass cuts Split sizes but not Slice ranges, so
// the detection leaves it replicated (it found it before, and apart run then refused the plan --tp chose).
TEST(AFusedQkvAttention, ReadThroughThreeSlicesStaysReplicatedAsTheShardPassCannotCutIt) {
  OnnxBuilder b;
  b.input("x", {"batch", 4, 8}).input("mask", {"batch", 1, 1, 4}).output("y");
  b.weight("wqkv", {8, 24});
  b.node("MatMul", {"x", "wqkv"}, {"qkv"}, "/attn/qkv/MatMul");
  b.int_initializer("axis2", {2});
  const char* parts[] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    b.int_initializer(std::string("start_") + parts[i], {8 * i});
    b.int_initializer(std::string("end_") + parts[i], {8 * i + 8});
    b.node("Slice", {"qkv", std::string("start_") + parts[i], std::string("end_") + parts[i], "axis2"}, {parts[i]},
           std::string("/attn/Slice_") + parts[i]);
  }
  attention_tail(b, "q", "k", "v");
  const ImportedModel m = import(b);
  const TensorParallelRegions r = find_tensor_parallel_regions(m.graph);
  EXPECT_EQ(r.count(TpRegionKind::kAttention), 0u) << r.summary();
  EXPECT_EQ(role_of(m.graph, r, "/attn/qkv/MatMul"), TpRole::kReplicated);
}

// ---- Near-misses: each breaks one rule and must leave every task replicated ----

void expect_no_region(const ImportedModel& m) {
  const TensorParallelRegions r = find_tensor_parallel_regions(m.graph);
  EXPECT_TRUE(r.regions.empty()) << r.summary();
  for (TpRole role : r.roles) EXPECT_EQ(role, TpRole::kReplicated);
  EXPECT_EQ(r.summary(), "none");
}

TEST(AnMlpWithAReduceMeanOverTheSplitAxis, StaysReplicated) {
  OnnxBuilder b;
  b.input("x", {"batch", 4, 8}).output("y");
  b.weight("w1", {8, 16}).weight("w2", {16, 8});
  b.node("MatMul", {"x", "w1"}, {"h"});
  OnnxBuilder::set_ints(b.node("ReduceMean", {"h"}, {"mean"}), "axes", {-1});  // over the ffn features: a norm
  b.node("Sub", {"h", "mean"}, {"c"});
  b.node("MatMul", {"c", "w2"}, {"y"});
  expect_no_region(import(b));
}

TEST(AnMlpWithAReduceMeanOverAnotherAxis, StillSplits) {
  OnnxBuilder b;
  b.input("x", {"batch", 4, 8}).output("y");
  b.weight("w1", {8, 16}).weight("w2", {16, 8});
  b.node("MatMul", {"x", "w1"}, {"h"});
  OnnxBuilder::set_ints(b.node("ReduceMean", {"h"}, {"mean"}), "axes", {1});  // over the sequence
  b.node("Sub", {"h", "mean"}, {"c"});
  b.node("MatMul", {"c", "w2"}, {"y"});
  const TensorParallelRegions r = find_tensor_parallel_regions(import(b).graph);
  ASSERT_EQ(r.regions.size(), 1u);
  EXPECT_EQ(r.regions[0].kind, TpRegionKind::kMlp);
}

TEST(AnMlpWhoseReshapeMixesTheSplitAxis, StaysReplicated) {
  OnnxBuilder b;
  b.input("x", {"batch", 4, 8}).output("y");
  b.weight("w1", {8, 16}).weight("w2", {8, 8});
  b.node("MatMul", {"x", "w1"}, {"h"});
  b.int_initializer("shape", {0, 8, 8});  // [B, 4, 16] → [B, 8, 8]: the features spill into the sequence
  b.node("Reshape", {"h", "shape"}, {"r"});
  b.node("MatMul", {"r", "w2"}, {"y"});
  expect_no_region(import(b));
}

TEST(AnMlpWhoseSecondLinearsWeightIsNoParam, StaysReplicated) {
  OnnxBuilder b;
  b.input("x", {"batch", 4, 8}).input("w2", {"batch", 16, 8}).output("y");
  b.weight("w1", {8, 16});
  b.node("MatMul", {"x", "w1"}, {"h"});
  b.node("Relu", {"h"}, {"a"});
  b.node("MatMul", {"a", "w2"}, {"y"});
  expect_no_region(import(b));
}

TEST(ASplitValueLeavingTheModel, StaysReplicated) {
  OnnxBuilder b;
  b.input("x", {"batch", 4, 8}).output("y").output("a");
  b.weight("w1", {8, 16}).weight("w2", {16, 8});
  b.node("MatMul", {"x", "w1"}, {"h"});
  b.node("Relu", {"h"}, {"a"});  // read by the row linear and by the model's caller
  b.node("MatMul", {"a", "w2"}, {"y"});
  expect_no_region(import(b));
}

TEST(ASplitOfAReshapedValue, StaysReplicated) {
  // Splitting q/k/v after the heads reshape would give the pieces to the ranks unevenly.
  OnnxBuilder b;
  b.input("x", {"batch", 4, 8}).output("y");
  b.weight("w1", {8, 24}).weight("w2", {8, 8});
  b.node("MatMul", {"x", "w1"}, {"h"});
  b.int_initializer("shape", {0, 0, 3, 8});
  b.node("Reshape", {"h", "shape"}, {"r"});
  b.int_initializer("sizes", {1, 1, 1});
  OnnxBuilder::set_int(b.node("Split", {"r", "sizes"}, {"p0", "p1", "p2"}), "axis", 2);
  b.int_initializer("back", {0, 0, 8});
  b.node("Reshape", {"p0", "back"}, {"q"});
  b.node("MatMul", {"q", "w2"}, {"y"});
  expect_no_region(import(b));
}

TEST(AnAttentionWhoseSoftmaxRunsOverTheHeads, StaysReplicated) {
  OnnxBuilder b = fused_qkv_attention();
  for (auto& n : *b.graph().mutable_node())
    if (n.op_type() == "Softmax") n.mutable_attribute(0)->set_i(1);  // axis 1: the heads
  expect_no_region(import(b));
}

// ---- Embedding and LM head ----

TEST(ATiedEmbeddingAndLmHead, AreVocabularySplitAndShareTheirWeight) {
  OnnxBuilder b;
  b.input("ids", {"batch", 4}, onnx::TensorProto::INT64).output("logits");
  b.weight("table", {16, 8});
  b.node("Gather", {"table", "ids"}, {"e"}, "/embed/Gather");
  b.node("Relu", {"e"}, {"h"}, "/act/Relu");
  OnnxBuilder::set_ints(b.node("Transpose", {"table"}, {"table_t"}, "/head/Transpose"), "perm", {1, 0});
  b.node("MatMul", {"h", "table_t"}, {"logits"}, "/head/MatMul");
  const ImportedModel m = import(b);
  const TensorParallelRegions r = find_tensor_parallel_regions(m.graph);
  ASSERT_EQ(r.regions.size(), 2u);
  const TpRegion& e = r.regions[0];
  const TpRegion& h = r.regions[1];
  EXPECT_EQ(e.kind, TpRegionKind::kEmbedding);
  EXPECT_EQ(e.name, "/embed");
  EXPECT_EQ(m.graph.value(e.end_value).name, "e");
  EXPECT_DOUBLE_EQ(e.end_bytes_per_sample, 4.0 * 8 * 4);
  EXPECT_EQ(e.bounded_by, "16 vocabulary rows");
  EXPECT_EQ(e.degrees, (std::vector<int>{1, 2, 4, 8}));
  EXPECT_TRUE(e.inputs.empty());
  EXPECT_EQ(h.kind, TpRegionKind::kLmHead);
  EXPECT_EQ(h.name, "/head");
  EXPECT_EQ(h.closing, TpClosing::kAllGather);
  EXPECT_EQ(m.graph.value(h.end_value).name, "logits");
  EXPECT_EQ(h.bounded_by, "16 vocabulary columns");
  EXPECT_EQ(e.shares_weight_with, std::vector<size_t>{1});
  EXPECT_EQ(h.shares_weight_with, std::vector<size_t>{0});
  EXPECT_EQ(role_of(m.graph, r, "/embed/Gather"), TpRole::kVocab);
  EXPECT_EQ(role_of(m.graph, r, "/act/Relu"), TpRole::kReplicated);
  EXPECT_EQ(role_of(m.graph, r, "/head/MatMul"), TpRole::kColumn);
  EXPECT_EQ(r.summary(), "embedding, LM head (tied)");
}

TEST(AClassifierHeadWithoutAnEmbedding, IsNoLmHead) {
  // A linear to 10 classes leaving the model could be column-split and all-gathered, but nothing says it is a
  // vocabulary: kept replicated (an LM head's width is an embedding's vocabulary, or its weight is the table).
  OnnxBuilder b;
  b.input("x", {"batch", 8}).output("y");
  b.weight("w", {8, 10});
  b.node("MatMul", {"x", "w"}, {"y"});
  expect_no_region(import(b));
}

TEST(ATwoClassHeadBesideATwoRowEmbedding, IsNoLmHead) {
  // BERT's token-type table has 2 rows and its next-sentence head 2 outputs: only the largest vocabulary (or a
  // tied table) makes a linear an LM head.
  OnnxBuilder b;
  b.input("ids", {"batch", 4}, onnx::TensorProto::INT64).input("types", {"batch", 4}, onnx::TensorProto::INT64);
  b.output("logits").output("nsp");
  b.weight("words", {16, 8}).weight("token_types", {2, 8}).weight("w_lm", {8, 16}).weight("w_nsp", {8, 2});
  b.node("Gather", {"words", "ids"}, {"e"}, "/words/Gather");
  b.node("Gather", {"token_types", "types"}, {"t"}, "/types/Gather");
  b.node("Add", {"e", "t"}, {"h"}, "/Add");
  b.node("MatMul", {"h", "w_lm"}, {"logits"}, "/lm/MatMul");
  b.node("MatMul", {"h", "w_nsp"}, {"nsp"}, "/nsp/MatMul");
  const ImportedModel m = import(b);
  const TensorParallelRegions r = find_tensor_parallel_regions(m.graph);
  EXPECT_EQ(r.summary(), "2 embeddings, LM head");
  EXPECT_EQ(role_of(m.graph, r, "/lm/MatMul"), TpRole::kColumn);
  EXPECT_EQ(role_of(m.graph, r, "/nsp/MatMul"), TpRole::kReplicated);
}

// ---- The zoo: one attention and one MLP per layer, embeddings and the LM head ----

models::ZooOptions zoo(models::Family family, int64_t layers) {
  models::ZooOptions o;
  o.family = family;
  o.name = std::string(models::family_name(family));
  o.layers = layers;
  o.hidden = 64;
  o.heads = 4;
  o.seq = 16;
  o.vocab = 96;
  o.weights = models::WeightsMode::kNone;
  return o;
}

// The op types of an attention region's core (what selective recomputation re-runs), in order.
std::vector<std::string> core_ops(const TaskGraph& g, const TpRegion& region) {
  std::vector<std::string> ops;
  for (TaskId t : region.core_tasks) ops.push_back(g.task(t).op_type);
  return ops;
}

TEST(TheZoosGpt, HasOneAttentionAndOneMlpPerLayerAndATiedHead) {
  const ImportedModel m = import_zoo(zoo(models::Family::kGpt, 3), 2);
  const TensorParallelRegions r = find_tensor_parallel_regions(m.graph, 2);
  EXPECT_EQ(r.count(TpRegionKind::kAttention), 3u);
  EXPECT_EQ(r.count(TpRegionKind::kMlp), 3u);
  EXPECT_EQ(r.count(TpRegionKind::kEmbedding), 1u);
  EXPECT_EQ(r.count(TpRegionKind::kLmHead), 1u);
  EXPECT_EQ(r.summary(), "3 attention, 3 MLP, embedding, LM head (tied)");
  ASSERT_EQ(r.regions.size(), 8u);
  EXPECT_EQ(r.regions[0].name, "/wte");
  EXPECT_EQ(r.regions[1].name, "/blocks.0/attn");
  EXPECT_EQ(r.regions[2].name, "/blocks.0/mlp");
  EXPECT_EQ(r.regions[7].name, "/head");
  const TpRegion& attn = r.regions[1];
  EXPECT_EQ(attn.heads, 4);
  EXPECT_EQ(attn.degrees, (std::vector<int>{1, 2, 4}));
  EXPECT_DOUBLE_EQ(attn.end_bytes_per_sample, 16.0 * 64 * 4);  // [S, h] fp32
  EXPECT_EQ(r.regions[2].split_units, 256);                     // ffn 4h
  // The LM head ends in cross-entropy over the split vocabulary: three floats per token.
  EXPECT_EQ(r.regions[7].closing, TpClosing::kVocabParallelLoss);
  EXPECT_DOUBLE_EQ(r.regions[7].end_bytes_per_sample, 3.0 * 4 * 16);
  EXPECT_TRUE(r.regions[7].tied());
  // Its core runs from the score MatMul to the context MatMul, through the softmax; the MLP has none.
  const std::vector<std::string> core = core_ops(m.graph, attn);
  ASSERT_GE(core.size(), 3u);
  EXPECT_EQ(core.front(), "MatMul");
  EXPECT_EQ(core.back(), "MatMul");
  EXPECT_NE(std::find(core.begin(), core.end(), "Softmax"), core.end());
  for (TaskId t : attn.core_tasks) EXPECT_EQ(r.region_of[t.value()], 1) << "a core task belongs to its region";
  EXPECT_TRUE(r.regions[2].core_tasks.empty());
  // Every block's two layer norms and two residual adds sit between regions; the final norm too.
  EXPECT_FALSE(r.between_regions.empty());
  for (TaskId t : r.between_regions) EXPECT_EQ(r.region_of[t.value()], -1);
}

TEST(TheZoosBert, HasOneAttentionAndOneMlpPerLayerAndKeepsTheTransformReplicated) {
  const ImportedModel m = import_zoo(zoo(models::Family::kBert, 2));
  const TensorParallelRegions r = find_tensor_parallel_regions(m.graph);
  EXPECT_EQ(r.summary(), "2 attention, 2 MLP, embedding, LM head (tied)");
  // The masked-LM transform's dense feeds a LayerNorm over its features: not splittable, so it stays replicated.
  const auto dense = m.graph.find_task("/cls/predictions/transform/dense/MatMul");
  ASSERT_TRUE(dense.has_value());
  EXPECT_EQ(r.roles[dense->value()], TpRole::kReplicated);
  for (const TpRegion& region : r.regions)
    if (region.kind == TpRegionKind::kAttention) {
      EXPECT_EQ(region.column_tasks.size(), 3u) << region.name;
    }
}

TEST(TheZoosT5, HasSelfAndCrossAttentionInTheDecoder) {
  const ImportedModel m = import_zoo(zoo(models::Family::kT5, 2));
  const TensorParallelRegions r = find_tensor_parallel_regions(m.graph);
  // Encoder: 2 × (self-attention, MLP); decoder: 2 × (self-attention, cross-attention, MLP).
  EXPECT_EQ(r.summary(), "6 attention, 4 MLP, 2 embeddings, LM head (tied)");
  size_t cross = 0;
  for (const TpRegion& region : r.regions) {
    if (region.name.find("EncDecAttention") == std::string::npos) continue;
    ++cross;
    EXPECT_EQ(region.kind, TpRegionKind::kAttention);
    EXPECT_EQ(region.inputs.size(), 2u) << region.name;  // the decoder's state and the encoder's output
  }
  EXPECT_EQ(cross, 2u);
  // The shared relative position bias is read sliced by heads.
  const TpRegion* self0 = nullptr;
  for (const TpRegion& region : r.regions)
    if (region.name == "/encoder/block.0/layer.0/SelfAttention") self0 = &region;
  ASSERT_NE(self0, nullptr);
  EXPECT_FALSE(self0->sliced_inputs.empty());
}

// apart zoo's Llama at `layers` layers with `kv_heads` kv heads, imported, and its regions.
struct LlamaRegions {
  ImportedModel m;
  TensorParallelRegions r;
};
LlamaRegions llama_regions(int64_t layers, int64_t kv_heads) {
  models::ZooOptions o = zoo(models::Family::kLlama, layers);
  o.kv_heads = kv_heads;
  LlamaRegions out{import_zoo(o), {}};
  out.r = find_tensor_parallel_regions(out.m.graph);
  return out;
}

// Llama (RMSNorm, rotary embeddings through rotate_half's Slice/Neg/Concat, grouped-query attention through
// repeat_kv's Unsqueeze/Expand/Reshape, SwiGLU, untied head): every attention is found, its degrees bounded by the
// kv heads as well as the query heads (gcd of every split width: 4 heads and 2 kv heads allow 1 and 2), and the
// SwiGLU's gate and up projections are the column linears of one MLP region with down its row.
TEST(TheZoosLlama, HasOneAttentionWithRotaryAndGroupedKvHeadsAndOneSwigluMlpPerLayer) {
  const LlamaRegions found = llama_regions(2, 2);
  const ImportedModel& m = found.m;
  const TensorParallelRegions& r = found.r;
  EXPECT_EQ(r.summary(), "2 attention, 2 MLP, embedding, LM head");
  ASSERT_EQ(r.regions.size(), 6u);
  const TpRegion& attn = r.regions[1];
  EXPECT_EQ(attn.kind, TpRegionKind::kAttention);
  EXPECT_EQ(attn.name, "/model/layers.0/self_attn");
  EXPECT_EQ(attn.heads, 4);
  EXPECT_EQ(attn.split_units, 2);  // the kv heads
  EXPECT_EQ(attn.degrees, (std::vector<int>{1, 2}));
  EXPECT_EQ(names(m.graph, attn.column_tasks), (std::vector<std::string>{"/model/layers.0/self_attn/q_proj/MatMul",
                                                                         "/model/layers.0/self_attn/k_proj/MatMul",
                                                                         "/model/layers.0/self_attn/v_proj/MatMul"}));
  EXPECT_EQ(names(m.graph, attn.row_tasks), (std::vector<std::string>{"/model/layers.0/self_attn/o_proj/MatMul"}));
  EXPECT_EQ(role_of(m.graph, r, "/model/layers.0/self_attn/Concat"), TpRole::kFollowsSplit);
  EXPECT_EQ(role_of(m.graph, r, "/model/layers.0/self_attn/Expand"), TpRole::kFollowsSplit);
  const TpRegion& mlp = r.regions[2];
  EXPECT_EQ(mlp.kind, TpRegionKind::kMlp);
  EXPECT_EQ(names(m.graph, mlp.column_tasks),
            (std::vector<std::string>{"/model/layers.0/mlp/gate_proj/MatMul", "/model/layers.0/mlp/up_proj/MatMul"}));
  EXPECT_EQ(names(m.graph, mlp.row_tasks), (std::vector<std::string>{"/model/layers.0/mlp/down_proj/MatMul"}));
  EXPECT_FALSE(r.regions.back().tied());
  EXPECT_EQ(r.sequence, 16);
  // The RMS norms sit between regions: what sequence parallelism cuts.
  bool norm = false;
  for (TaskId t : r.between_regions)
    norm = norm || m.graph.task(t).name == "/model/layers.0/post_attention_layernorm/ReduceMean";
  EXPECT_TRUE(norm);
}

// One kv head (multi-query attention): its k and v projections are one head wide, which a degree cannot cut by
// heads (the reshape puts the split inside the head, which rotate_half then slices), so the attention stays whole
// (replicated on every TP rank: no split region is ever wrong) while the MLP, embedding and head still split.
TEST(TheZoosLlamaWithOneKvHead, KeepsItsAttentionWhole) {
  const LlamaRegions found = llama_regions(1, 1);
  EXPECT_EQ(found.r.summary(), "1 MLP, embedding, LM head");
  EXPECT_EQ(role_of(found.m.graph, found.r, "/model/layers.0/self_attn/q_proj/MatMul"), TpRole::kReplicated);
}

TEST(TheZoosResnet, HasNoRegion) {
  // Convolutions are not matched (a channel split of conv pairs is possible, but not Megatron's pattern), and the
  // classifier's linear to 1000 classes is no vocabulary: nothing is split.
  models::ZooOptions o;
  o.family = models::Family::kResnet;
  o.name = "resnet";
  o.layers = 50;
  o.image = 32;
  o.weights = models::WeightsMode::kNone;
  const ImportedModel m = import_zoo(o);
  expect_no_region(m);
}

TEST(TheRealGpt2Export, Has12AttentionAnd12MlpRegions) {
  const fs::path p = fs::path(APART_SHARED_MODELS_DIR) / "gpt2_small.onnx";
  if (!fs::exists(p)) GTEST_SKIP() << "no " << p;
  ImportOptions o;
  o.batch = 1;
  const ImportedModel m = import_model(p, o);
  const TensorParallelRegions r = find_tensor_parallel_regions(m.graph);
  EXPECT_EQ(r.count(TpRegionKind::kAttention), 12u);
  EXPECT_EQ(r.count(TpRegionKind::kMlp), 12u);
  EXPECT_EQ(r.summary(), "12 attention, 12 MLP, embedding, LM head");
  for (const TpRegion& region : r.regions) {
    if (region.kind == TpRegionKind::kAttention) {
      EXPECT_EQ(region.heads, 12) << region.name;
      EXPECT_EQ(region.degrees, (std::vector<int>{1, 2, 4})) << region.name;
      EXPECT_DOUBLE_EQ(region.end_bytes_per_sample, 1024.0 * 768 * 4) << region.name;
      const std::vector<std::string> core = core_ops(m.graph, region);
      ASSERT_GE(core.size(), 3u) << region.name;
      EXPECT_EQ(core.front(), "MatMul") << region.name;
      EXPECT_EQ(core.back(), "MatMul") << region.name;
      EXPECT_NE(std::find(core.begin(), core.end(), "Softmax"), core.end()) << region.name;
    } else {
      EXPECT_TRUE(region.core_tasks.empty()) << region.name;
    }
    if (region.kind == TpRegionKind::kMlp) {
      EXPECT_EQ(region.degrees, (std::vector<int>{1, 2, 4, 8})) << region.name;
    }
    // The untied head's 50257 columns are odd: padded to a multiple of the degree, as Megatron pads the vocabulary.
    if (region.kind == TpRegionKind::kLmHead) {
      EXPECT_EQ(region.degrees, (std::vector<int>{1, 2, 4, 8}));
      EXPECT_NE(region.bounded_by.find("padded to a multiple of the degree"), std::string::npos) << region.bounded_by;
      EXPECT_FALSE(region.tied());
    }
  }
  EXPECT_EQ(r.regions[1].name, "/blocks.0/attn");
  EXPECT_EQ(r.regions[2].name, "/blocks.0/mlp");
}

TEST(TheDetection, IsDeterministic) {
  const ImportedModel m = import_zoo(zoo(models::Family::kT5, 2));
  const TensorParallelRegions a = find_tensor_parallel_regions(m.graph);
  const TensorParallelRegions b = find_tensor_parallel_regions(m.graph);
  ASSERT_EQ(a.regions.size(), b.regions.size());
  for (size_t i = 0; i < a.regions.size(); ++i) {
    EXPECT_EQ(a.regions[i].name, b.regions[i].name);
    EXPECT_EQ(a.regions[i].tasks, b.regions[i].tasks);
    EXPECT_EQ(a.regions[i].end_value, b.regions[i].end_value);
    EXPECT_EQ(a.regions[i].degrees, b.regions[i].degrees);
  }
  EXPECT_EQ(a.roles, b.roles);
  EXPECT_EQ(a.between_regions, b.between_regions);
}

TEST(TheDetection, RefusesAGraphBatchBelowOne) {
  const ImportedModel m = import(fused_qkv_attention());
  EXPECT_THROW(find_tensor_parallel_regions(m.graph, 0), InvalidArgument);
}

}  // namespace
}  // namespace apart
