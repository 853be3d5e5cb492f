// apart train on float16/bfloat16 models (a torch model .half()-ed before export, a bf16 checkpoint converted to
// ONNX): they train in float32 exactly as the float32 model of their widened weights does, and --save-model writes
// the weights back in their stored dtype.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cstring>
#include <random>
#include <stdexcept>

#include "importer/model_proto.h"
#include "runtime/executor.h"
#include "runtime/half_precision.h"
#include "train/trainer.h"
#include "tests/support/onnx_builder.h"
#include "tests/support/printed_numbers.h"
#include "tests/support/run_apart.h"

namespace apart {
namespace {

using testing::OnnxBuilder;
using testing::TempDir;

constexpr int64_t kFeatures = 8, kHidden = 16, kOutputs = 2;
const char* const kWeights[] = {"w1", "b1", "w2", "b2"};

// A two-layer regression stored as `stored` (its inputs, weights and output y): x → MatMul+Add → Relu →
// Cast(to=stored) → MatMul+Add → y; loss = mean((Cast(y, FLOAT) − Cast(target, FLOAT))²), as a half export with its
// loss in float32 reads. Its weights are seeded normal values rounded to `values_of` (float16 or bfloat16), so the
// float32 model (stored float32) of the same `values_of` holds exactly the half model's weights, widened.
OnnxBuilder half_mlp(DType stored, DType values_of) {
  const int elem = static_cast<int>(stored);
  OnnxBuilder b(17);
  b.input("x", {"batch", kFeatures}, elem).input("target", {"batch", kOutputs}, elem);
  b.output({"loss", DType::kFloat32, {}}).output("y", elem);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 0.4f);
  auto weight = [&](const std::string& name, std::vector<int64_t> shape) {
    Tensor values(DType::kFloat32, shape);
    for (float& v : values.span<float>()) v = normal(rng);
    const Tensor rounded = widen_to_float32(narrow_from_float32(values, values_of));
    b.initializer(stored == DType::kFloat32 ? rounded : narrow_from_float32(rounded, stored), name);
  };
  weight("w1", {kFeatures, kHidden});
  weight("b1", {kHidden});
  weight("w2", {kHidden, kOutputs});
  weight("b2", {kOutputs});
  b.node("MatMul", {"x", "w1"}, {"xw1"});
  b.node("Add", {"xw1", "b1"}, {"h1"});
  b.node("Relu", {"h1"}, {"r1"});
  OnnxBuilder::set_int(b.node("Cast", {"r1"}, {"r1s"}), "to", elem);  // as autocast exports write it
  b.node("MatMul", {"r1s", "w2"}, {"xw2"});
  b.node("Add", {"xw2", "b2"}, {"y"});
  OnnxBuilder::set_int(b.node("Cast", {"y"}, {"yf"}), "to", onnx::TensorProto::FLOAT);
  OnnxBuilder::set_int(b.node("Cast", {"target"}, {"tf"}), "to", onnx::TensorProto::FLOAT);
  b.node("Sub", {"yf", "tf"}, {"d"});
  b.node("Mul", {"d", "d"}, {"d2"});
  OnnxBuilder::set_int(b.node("ReduceMean", {"d2"}, {"loss"}), "keepdims", 0);
  return b;
}

TrainOptions adam(const std::filesystem::path& model, const std::filesystem::path& save_model) {
  TrainOptions o;
  o.model = model.string();
  o.loss = "loss";
  o.batch = 8;
  o.steps = 25;
  o.optimizer.kind = Optimizer::kAdam;
  o.optimizer.lr = 2e-2;
  o.save_model = save_model.string();
  return o;
}

const onnx::TensorProto& initializer(const onnx::ModelProto& model, const std::string& name) {
  for (const auto& init : model.graph().initializer())
    if (init.name() == name) return init;
  throw std::runtime_error("no initializer " + name);
}

class AHalfPrecisionModel : public ::testing::TestWithParam<DType> {};

TEST_P(AHalfPrecisionModel, TrainsExactlyAsTheFloat32ModelOfItsWidenedWeights) {
  const DType half = GetParam();
  TempDir dir;
  half_mlp(half, half).save(dir.file("half.onnx"));
  half_mlp(DType::kFloat32, half).save(dir.file("wide.onnx"));

  TrainOptions o = adam(dir.file("half.onnx"), dir.file("half.trained.onnx"));
  std::vector<std::string> notes;
  o.on_note = [&](const std::string& note) { notes.push_back(note); };
  const TrainResult trained_half = train(o);
  const TrainResult trained_wide = train(adam(dir.file("wide.onnx"), dir.file("wide.trained.onnx")));

  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("widened 4 " + std::string(dtype_name(half)) + " tensors"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("compute is float32"), std::string::npos) << notes[0];
  EXPECT_EQ(trained_half.half_widening.tensors, 4);
  EXPECT_EQ(trained_half.half_widening.casts, 1);  // Cast(to=half); the casts to FLOAT stay as they are
  EXPECT_EQ(trained_half.half_widening.inputs.size(), 2u);
  EXPECT_FALSE(trained_wide.half_widening.changed());

  // The same losses, bitwise: once widened, the half model is the float32 one (the same graph, weights and data).
  ASSERT_EQ(trained_half.steps.size(), 25u);
  for (size_t k = 0; k < trained_half.steps.size(); ++k)
    EXPECT_EQ(trained_half.steps[k].loss, trained_wide.steps[k].loss) << "step " << k + 1;
  EXPECT_LT(trained_half.steps.back().loss, 0.5 * trained_half.steps.front().loss)
      << "first " << trained_half.steps.front().loss << ", last " << trained_half.steps.back().loss;

  // --save-model: the half model's weights come back in its dtype, the float32 masters rounded to nearest even;
  // its inputs and output keep their half types.
  const onnx::ModelProto saved_half = load_model_proto(dir.file("half.trained.onnx"));
  const onnx::ModelProto saved_wide = load_model_proto(dir.file("wide.trained.onnx"));
  for (const char* name : kWeights) {
    const onnx::TensorProto& h = initializer(saved_half, name);
    ASSERT_EQ(h.data_type(), static_cast<int32_t>(half)) << name;
    const Tensor want = narrow_from_float32(tensor_from_proto(initializer(saved_wide, name)), half);
    const Tensor got = tensor_from_proto(h);
    ASSERT_EQ(got.bytes(), want.bytes());
    EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), static_cast<size_t>(got.bytes()))) << name;
    EXPECT_NE(0, std::memcmp(got.raw(), tensor_from_proto(initializer(load_model_proto(dir.file("half.onnx")), name)).raw(),
                             static_cast<size_t>(got.bytes())))
        << name << " did not change";
  }
  for (const auto& io : {saved_half.graph().input(0), saved_half.graph().input(1), saved_half.graph().output(1)})
    EXPECT_EQ(io.type().tensor_type().elem_type(), static_cast<int32_t>(half)) << io.name();
}

TEST_P(AHalfPrecisionModel, RunsForwardOnTheExecutorFromHalfInputs) {
  const DType half = GetParam();
  TempDir dir;
  half_mlp(half, half).save(dir.file("half.onnx"));
  half_mlp(DType::kFloat32, half).save(dir.file("wide.onnx"));
  ImportOptions import;
  import.dims["batch"] = 3;
  const ImportedModel half_model = import_model(dir.file("half.onnx"), import);
  const ImportedModel wide_model = import_model(dir.file("wide.onnx"), import);
  Executor on_half(half_model), on_wide(wide_model);
  EXPECT_EQ(on_half.half_widening().tensors, 4);
  EXPECT_EQ(on_half.model().graph.value(*on_half.model().graph.find_value("y")).dtype, DType::kFloat32);

  Tensor x(DType::kFloat32, {3, kFeatures}), target(DType::kFloat32, {3, kOutputs});
  for (int64_t i = 0; i < x.elements(); ++i) x.data<float>()[i] = 0.25f * static_cast<float>(i % 9) - 1.f;
  for (int64_t i = 0; i < target.elements(); ++i) target.data<float>()[i] = 0.5f * static_cast<float>(i);
  // Half inputs are widened at feed (exact: these values are half values), so both executors see the same numbers.
  const NamedTensors from_half = on_half.run({{"x", narrow_from_float32(x, half)}, {"target", narrow_from_float32(target, half)}});
  const NamedTensors from_wide = on_wide.run({{"x", x}, {"target", target}});
  ASSERT_EQ(from_half.size(), 2u);
  for (size_t i = 0; i < from_half.size(); ++i) {
    ASSERT_EQ(from_half[i].second.dtype(), DType::kFloat32);
    ASSERT_EQ(from_half[i].second.bytes(), from_wide[i].second.bytes());
    EXPECT_EQ(0, std::memcmp(from_half[i].second.raw(), from_wide[i].second.raw(), static_cast<size_t>(from_half[i].second.bytes())))
        << from_half[i].first;
  }
  EXPECT_THROW(on_half.run({{"x", Tensor(DType::kFloat64, {3, kFeatures})}, {"target", target}}), InvalidArgument);
}

TEST_P(AHalfPrecisionModel, TrainsFromRandomFloat32WeightsAndSavesThemInItsDtype) {
  const DType half = GetParam();
  TempDir dir;
  half_mlp(half, half).save(dir.file("half.onnx"));
  TrainOptions o = adam(dir.file("half.onnx"), dir.file("trained.onnx"));
  o.init = ParamInit::kRandom;
  o.steps = 3;
  std::vector<std::string> notes;
  o.on_note = [&](const std::string& note) { notes.push_back(note); };
  const TrainResult r = train(o);
  EXPECT_EQ(r.half_widening.tensors, 0);  // --init random drew float32 masters already
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].rfind("widened 1 cast to half, 2 inputs and 1 output to float32: compute is float32", 0), 0u) << notes[0];
  for (const char* name : kWeights)
    EXPECT_EQ(initializer(load_model_proto(dir.file("trained.onnx")), name).data_type(), static_cast<int32_t>(half)) << name;
}

INSTANTIATE_TEST_SUITE_P(Stored, AHalfPrecisionModel, ::testing::Values(DType::kFloat16, DType::kBFloat16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(ApartTrain, SaysOnStderrHowManyTensorsItWidenedAndThatComputeIsFloat32) {
  TempDir dir;
  half_mlp(DType::kFloat16, DType::kFloat16).save(dir.file("half.onnx"));
  const auto r = testing::run_apart("train " + dir.file("half.onnx").string() + " --steps 2 --batch 4 --loss loss -q");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("apart: note: widened 4 float16 tensors"), std::string::npos) << r.out;
}

// apart run widens each stage file as apart train widens the model: a two-stage plan of a float16/bfloat16 gpt-tiny
// prints apart train's losses on the whole batch.
TEST(ApartRun, TrainsAHalfPrecisionPlanWithApartTrainsLosses) {
  for (const char* dtype : {"fp16", "bf16"}) {
    TempDir dir;
    const std::string model = dir.file("half.onnx").string(), plan = dir.file("plan").string();
    ASSERT_EQ(testing::run_apart(std::string("zoo gpt-tiny --dtype ") + dtype + " -q -o " + model).code, 0);
    const auto planned = testing::run_apart("partition " + model + " --device cpu --devices 2 --stages 2 --batch 8 " +
                                            "--microbatches 4 --no-baselines -q -o " + plan);
    ASSERT_EQ(planned.code, 0) << planned.out;
    const auto run = testing::run_apart("run " + plan + " --in-process --steps 3 --init random --seed 3");
    const auto train = testing::run_apart("train " + model + " --steps 3 --batch 8 --init random --seed 3");
    ASSERT_EQ(run.code, 0) << run.out;
    ASSERT_EQ(train.code, 0) << train.out;
    // Micro-batches of 2 against the whole batch of 8: other GEMM shapes, so sums in another order (the stated
    // tolerance of printed losses, not their digits).
    for (const char* step : {"step=1 loss=", "step=3 loss="}) {
      const auto from_run = testing::number_after(run.out, step), from_train = testing::number_after(train.out, step);
      ASSERT_TRUE(from_run.has_value()) << run.out;
      ASSERT_TRUE(from_train.has_value()) << train.out;
      EXPECT_NEAR(*from_run, *from_train, testing::printed_loss_tolerance(*from_train)) << dtype << " " << step;
    }
  }
}

// apart profile --init random draws float32 masters for a half model's initializers as apart train does (one
// randomize_params), so a graph-only float16 export (weights declared, not shipped) profiles.
TEST(ApartProfile, MeasuresAGraphOnlyHalfPrecisionModelWithRandomWeights) {
  TempDir dir;
  const std::string model = dir.file("half.onnx").string();
  ASSERT_EQ(testing::run_apart("zoo gpt-tiny --dtype fp16 --weights none -q -o " + model).code, 0);
  const auto r = testing::run_apart("profile " + model + " --init random --batch 2 --warmup 1 --repeats 1 -q -o " +
                                    dir.file("costs.json").string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir.file("costs.json")));
}

}  // namespace
}  // namespace apart
