// stage_K.onnx with a symbolic batch: which dims scale with it, how they are written, and when they stay static.
#include "codegen/stage_shapes.h"

#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <filesystem>
#include <set>

#include "codegen/plan_writer.h"
#include "driver/compile.h"
#include "graph/error.h"
#include "importer/importer.h"
#include "tests/support/onnx_builder.h"
#include "tests/support/read_model.h"
#include "tests/support/run_apart.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using testing::OnnxBuilder;
using testing::Dim;
using testing::TempDir;
using testing::read_file;

const fs::path kGptTiny = fs::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx";

ImportedModel import_at(const std::string& bytes, const std::string& symbol, int64_t batch) {
  ImportOptions o;
  o.dims[symbol] = batch;
  return import_model_bytes(bytes, ".", "m", o);
}

ValueId id_of(const ImportedModel& m, const std::string& name) {
  auto id = m.graph.find_value(name);
  EXPECT_TRUE(id.has_value()) << name;
  return id.value_or(ValueId(0));
}

// y = Reshape(x, [-1, 5]) of x [N, 4, 5]: y's first dim is 4·N.
OnnxBuilder flatten_model() {
  OnnxBuilder b;
  b.input("x", {"N", 4, 5}).output("y");
  b.int_initializer("target", {-1, 5});
  b.node("Reshape", {"x", "target"}, {"y"});
  return b;
}

TEST(SymbolicBatchShapes, NameTheBatchByTheModelsOwnSymbolAndItsMultiplesAsProducts) {
  const std::string bytes = flatten_model().bytes();
  const ImportedModel at1 = import_at(bytes, "N", 1), at3 = import_at(bytes, "N", 3);
  const StageShapes shapes = symbolic_batch_shapes(at1.graph, 1, at3.graph, 3, "N");
  EXPECT_TRUE(shapes.symbolic());
  EXPECT_EQ(shapes.batch_symbol, "N");
  const ValueId x = id_of(at1, "x"), y = id_of(at1, "y");
  EXPECT_EQ(shapes.dim_param(x, 0), "N");
  EXPECT_EQ(shapes.dim_param(x, 1), "");
  EXPECT_EQ(shapes.dim_param(x, 2), "");
  EXPECT_EQ(shapes.dim_param(y, 0), "4*N");
  EXPECT_EQ(shapes.dim_param(y, 1), "");
  EXPECT_EQ(shapes.dim_param(id_of(at1, "target"), 0), "") << "an initializer does not scale with the batch";
  EXPECT_TRUE(shapes.notes.empty());
}

TEST(SymbolicBatchShapes, WorkFromAnyBoundBatchNotJustOne) {
  const std::string bytes = flatten_model().bytes();
  const ImportedModel at2 = import_at(bytes, "N", 2), at5 = import_at(bytes, "N", 5);
  const StageShapes shapes = symbolic_batch_shapes(at2.graph, 2, at5.graph, 5, "N");
  EXPECT_EQ(shapes.dim_param(id_of(at2, "x"), 0), "N");
  EXPECT_EQ(shapes.dim_param(id_of(at2, "y"), 0), "4*N");
}

TEST(SymbolicBatchShapes, GiveADimThatIsNotProportionalToTheBatchAFreshNameAndANote) {
  // y = Concat(x, c) along axis 0: N + 1 rows.
  OnnxBuilder b;
  b.input("x", {"N", 4}).output("y");
  b.weight("c", {1, 4});
  OnnxBuilder::set_int(b.node("Concat", {"x", "c"}, {"y"}), "axis", 0);
  const std::string bytes = b.bytes();
  const ImportedModel at1 = import_at(bytes, "N", 1), at3 = import_at(bytes, "N", 3);
  const StageShapes shapes = symbolic_batch_shapes(at1.graph, 1, at3.graph, 3, "N");
  EXPECT_EQ(shapes.dim_param(id_of(at1, "x"), 0), "N");
  EXPECT_EQ(shapes.dim_param(id_of(at1, "y"), 0), "unk__0");
  EXPECT_EQ(shapes.dim_param(id_of(at1, "y"), 1), "");
  ASSERT_EQ(shapes.notes.size(), 1u);
  EXPECT_NE(shapes.notes[0].find("value y dim 0 is 2 at N=1 and 4 at N=3"), std::string::npos) << shapes.notes[0];
}

TEST(SymbolicBatchShapes, RejectEqualBatchSizesAndAnEmptySymbol) {
  const ImportedModel at1 = import_at(flatten_model().bytes(), "N", 1);
  EXPECT_THROW(symbolic_batch_shapes(at1.graph, 1, at1.graph, 1, "N"), InvalidArgument);
  EXPECT_THROW(symbolic_batch_shapes(at1.graph, 1, at1.graph, 3, ""), InvalidArgument);
}

TEST(SymbolicBatchShapes, AreStaticByDefault) {
  const StageShapes shapes;
  EXPECT_FALSE(shapes.symbolic());
  EXPECT_EQ(shapes.dim_param(ValueId(0), 0), "");
}

// gpt-tiny (input_ids and labels [batch, 32]) planned at batch 1, as `apart partition` does, into K stages.
struct StagedGptTiny {
  ImportedModel model;
  PlanDocument plan;  // as plan.json holds it
  StageShapes shapes;
};

StagedGptTiny stage_gpt_tiny(int stages) {
  CompileOptions o;
  o.model = kGptTiny;
  o.cluster.device = "a100-80gb";
  o.cluster.devices = stages;
  o.partition.training.global_batch = 4;
  o.partition.stage.stages = stages;
  o.partition.stage.replicas = 1;
  o.baselines = false;
  CompileResult r = compile(o);
  StageShapes shapes = stage_shapes(o, r.model);
  return {std::move(r.model), std::move(r.document), std::move(shapes)};
}

class StageFilesOfGptTiny : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    staged_ = stage_gpt_tiny(GetParam());
    ASSERT_EQ(staged_.plan.stages.size(), static_cast<size_t>(GetParam()));
    write_stage_models(staged_.plan, staged_.model.graph, kGptTiny, dir_.path(), staged_.shapes);
  }
  fs::path stage_file(size_t k) const { return dir_ / ("stage_" + std::to_string(k) + ".onnx"); }

  StagedGptTiny staged_;
  TempDir dir_;
};

TEST_P(StageFilesOfGptTiny, DeclareTheBatchDimAsTheModelsSymbolAndEveryOtherDimStatic) {
  const TaskGraph& g = staged_.model.graph;
  int batch_dims = 0;
  for (size_t k = 0; k < staged_.plan.stages.size(); ++k) {
    const onnx::ModelProto stage = testing::read_proto(stage_file(k));
    auto check = [&](const onnx::ValueInfoProto& info) {
      SCOPED_TRACE("stage " + std::to_string(k) + " value " + info.name());
      const auto id = g.find_value(info.name());
      ASSERT_TRUE(id.has_value());
      const Value& value = g.value(*id);
      const auto& shape = info.type().tensor_type().shape();
      ASSERT_EQ(shape.dim_size(), static_cast<int>(value.shape.size()));
      for (int axis = 0; axis < shape.dim_size(); ++axis) {
        const auto& dim = shape.dim(axis);
        if (axis > 0) {
          ASSERT_TRUE(dim.has_dim_value()) << "dim " << axis << " is " << dim.dim_param();
          EXPECT_EQ(dim.dim_value(), value.shape[axis]);
          continue;
        }
        // Dim 0 is the batch, or the batch times the sequence after gpt-tiny's logits are flattened: at
        // batch 1 its multiplier is the TaskGraph's dim.
        ASSERT_TRUE(dim.has_dim_param()) << "dim 0 of " << info.name() << " is static";
        const std::string expected = value.shape[0] == 1 ? "batch" : std::to_string(value.shape[0]) + "*batch";
        EXPECT_EQ(dim.dim_param(), expected);
        batch_dims += dim.dim_param() == "batch";
      }
    };
    for (const auto& in : stage.graph().input()) check(in);
    for (const auto& out : stage.graph().output()) check(out);
  }
  EXPECT_GE(batch_dims, 2 * GetParam()) << "input_ids, labels and one [batch, …] activation per cut, sent and read";
}

TEST_P(StageFilesOfGptTiny, PassTheOnnxCheckerWithShapeInference) {
  for (size_t k = 0; k < staged_.plan.stages.size(); ++k) {
    SCOPED_TRACE("stage " + std::to_string(k));
    onnx::ModelProto stage = testing::read_proto(stage_file(k));
    EXPECT_NO_THROW(onnx::checker::check_model(stage));
    // Strict inference fails on a declared dim that contradicts the nodes (as tests/models does for the zoo).
    onnx::ShapeInferenceOptions strict{/*check_type=*/true, /*error_mode=*/1, /*enable_data_propagation=*/false};
    EXPECT_NO_THROW(onnx::shape_inference::InferShapes(stage, onnx::OpSchemaRegistry::Instance(), strict));
  }
}

TEST_P(StageFilesOfGptTiny, ChainFromModelInputsToModelOutputs) {
  const TaskGraph& g = staged_.model.graph;
  std::set<std::string> available;
  for (ValueId v : g.graph_inputs()) available.insert(g.value(v).name);
  for (size_t k = 0; k < staged_.plan.stages.size(); ++k) {
    const onnx::ModelProto stage = testing::read_proto(stage_file(k));
    for (const auto& in : stage.graph().input())
      EXPECT_TRUE(available.count(in.name())) << "stage " << k << " input " << in.name() << " comes from nowhere";
    for (const auto& out : stage.graph().output()) available.insert(out.name());
  }
  for (ValueId v : g.graph_outputs()) EXPECT_TRUE(available.count(g.value(v).name)) << g.value(v).name;
}

TEST_P(StageFilesOfGptTiny, AreByteIdenticalWhenWrittenTwice) {
  TempDir again;
  write_stage_models(staged_.plan, staged_.model.graph, kGptTiny, again.path(), staged_.shapes);
  for (size_t k = 0; k < staged_.plan.stages.size(); ++k)
    EXPECT_EQ(read_file(stage_file(k)), read_file(again / ("stage_" + std::to_string(k) + ".onnx"))) << "stage " << k;
}

INSTANTIATE_TEST_SUITE_P(GptTiny, StageFilesOfGptTiny, ::testing::Values(2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "Stages"; });

// From the command line: the symbol partition binds itself stays symbolic; pinned or absent ones stay static.

// x [<batch>, 16] through three MatMul+Relu layers.
OnnxBuilder mlp(Dim batch) {
  OnnxBuilder b;
  b.input("x", {batch, 16}).output("y");
  std::string h = "x";
  for (int i = 0; i < 3; ++i) {
    const std::string w = "w" + std::to_string(i), m = "m" + std::to_string(i);
    const std::string r = i == 2 ? "y" : "h" + std::to_string(i);
    b.weight(w, {16, 16});
    b.node("MatMul", {h, w}, {m}, "matmul" + std::to_string(i));
    b.node("Relu", {m}, {r}, "relu" + std::to_string(i));
    h = r;
  }
  return b;
}

// The dims of every boundary value of every stage file in `plan`: dim_param, or the dim_value as text.
// Every dim (or, with leading_only, every value's first dim) of the stage files' inputs and outputs.
std::set<std::string> boundary_dims(const fs::path& plan, bool leading_only = false) {
  std::set<std::string> dims;
  for (size_t k = 0; fs::exists(plan / ("stage_" + std::to_string(k) + ".onnx")); ++k) {
    const onnx::ModelProto stage = testing::read_proto(plan / ("stage_" + std::to_string(k) + ".onnx"));
    std::vector<onnx::ValueInfoProto> infos(stage.graph().input().begin(), stage.graph().input().end());
    infos.insert(infos.end(), stage.graph().output().begin(), stage.graph().output().end());
    for (const auto& info : infos)
      for (const auto& d : info.type().tensor_type().shape().dim()) {
        dims.insert(d.has_dim_param() ? d.dim_param() : std::to_string(d.dim_value()));
        if (leading_only) break;
      }
  }
  return dims;
}

std::string partition(const fs::path& model, const fs::path& out, const std::string& flags = "") {
  const auto r = testing::run_apart("partition " + model.string() + " --devices 2 --stages 2 --replicas 1 --batch 8 "
                                    "--no-baselines " + flags + " -o " + out.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(out / "stage_1.onnx")) << r.out;
  return r.out;
}

TEST(ApartPartitionStageFiles, KeepTheModelsOwnBatchSymbol) {
  TempDir dir;
  mlp("N").save(dir / "mlp.onnx");
  partition(dir / "mlp.onnx", dir / "plan");
  EXPECT_EQ(boundary_dims(dir / "plan"), (std::set<std::string>{"N", "16"}));
}

TEST(ApartPartitionStageFiles, KeepGptTinysBatchSymbolic) {
  TempDir dir;
  partition(kGptTiny, dir / "plan");
  // Only the leading (batch) dims: a cut may carry a value with a literal 1 elsewhere (a LayerNorm's [batch, seq, 1]
  // mean, where a cut inside the fused kernel falls).
  EXPECT_EQ(boundary_dims(dir / "plan", /*leading_only=*/true), (std::set<std::string>{"batch"}))
      << "a batch dim written as a number";
}

TEST(ApartPartitionStageFiles, StayStaticForAModelWithoutASymbolicBatch) {
  TempDir dir;
  mlp(4).save(dir / "mlp.onnx");
  partition(dir / "mlp.onnx", dir / "plan");
  EXPECT_EQ(boundary_dims(dir / "plan"), (std::set<std::string>{"4", "16"}));
}

TEST(ApartPartitionStageFiles, StayStaticWhenTheUserPinsTheBatch) {
  TempDir dir;
  mlp("batch").save(dir / "mlp.onnx");
  partition(dir / "mlp.onnx", dir / "plan", "--dim batch=2");
  EXPECT_EQ(boundary_dims(dir / "plan"), (std::set<std::string>{"2", "16"}));
}

}  // namespace
}  // namespace apart
