// apart train on models from other exporters: Constant-node weights (paddle2onnx/tf2onnx, opset 9 and 11) train
// and are written back; an embedding (Gather) trains at opset 14 with the gradient it has at opset 16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "codegen/autodiff.h"
#include "importer/constant_params.h"
#include "importer/model_proto.h"
#include "runtime/executor.h"
#include "train/trainer.h"
#include "tests/support/exporter_models.h"

namespace apart {
namespace {

using testing::TempDir;

// The float contents of the Constant node or initializer named `name`, as written in `model`.
std::vector<float> weight_values(const onnx::ModelProto& model, const std::string& name) {
  const onnx::TensorProto* t = nullptr;
  for (const auto& init : model.graph().initializer())
    if (init.name() == name) t = &init;
  for (const auto& n : model.graph().node())
    if (n.op_type() == "Constant" && n.output(0) == name) t = &n.attribute(0).t();
  if (!t) return {};
  std::vector<float> out(static_cast<size_t>(t->raw_data().size() / 4));
  if (t->raw_data().empty()) return std::vector<float>(t->float_data().begin(), t->float_data().end());
  std::memcpy(out.data(), t->raw_data().data(), t->raw_data().size());
  return out;
}

// Adam from the model's own weights.
TrainOptions adam(const std::filesystem::path& model, int64_t batch, int64_t steps, double lr) {
  TrainOptions o;
  o.model = model.string();
  o.batch = batch;
  o.steps = steps;
  o.optimizer.kind = Optimizer::kAdam;
  o.optimizer.lr = lr;
  o.init = ParamInit::kModel;
  return o;
}

class APaddleStyleModel : public ::testing::TestWithParam<int64_t> {};

TEST_P(APaddleStyleModel, TrainsItsConstantWeightsAndWritesThemBack) {
  TempDir dir;
  const auto path = dir.file("paddle.onnx");
  testing::OnnxBuilder b = testing::paddle_style_model(GetParam());
  b.save(path);
  TrainOptions o = adam(path, 4, 12, 2e-2);
  o.save_model = dir.file("trained.onnx").string();
  std::vector<std::string> notes;
  o.on_note = [&](const std::string& note) { notes.push_back(note); };
  const TrainResult r = train(o);
  EXPECT_EQ(r.params, testing::kPaddleParams);
  EXPECT_EQ(r.param_tensors, 5);
  EXPECT_EQ(r.constant_params.count, 5);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("5 Constant nodes"), std::string::npos);
  ASSERT_EQ(r.steps.size(), 12u);
  EXPECT_LT(r.steps.back().loss, 0.8 * r.steps.front().loss)
      << "first " << r.steps.front().loss << ", last " << r.steps.back().loss;

  // Every weight changed, and is an initializer of the written model; Reshape's shape is still a Constant node.
  const onnx::ModelProto trained = load_model_proto(dir.file("trained.onnx"));
  for (const char* name : testing::kPaddleWeights) {
    const std::vector<float> before = weight_values(b.model(), name), after = weight_values(trained, name);
    ASSERT_EQ(before.size(), after.size()) << name;
    EXPECT_NE(before, after) << name;
    bool initializer = false;
    for (const auto& init : trained.graph().initializer()) initializer |= init.name() == name;
    EXPECT_TRUE(initializer) << name;
  }
  int constants = 0;
  for (const auto& n : trained.graph().node()) constants += n.op_type() == "Constant";
  EXPECT_EQ(constants, 1);
}

TEST_P(APaddleStyleModel, HasNothingToTrainWithConstantsAsParamsOff) {
  TempDir dir;
  const auto path = dir.file("paddle.onnx");
  testing::paddle_style_model(GetParam()).save(path);
  TrainOptions o;
  o.model = path.string();
  o.steps = 1;
  o.import.constants_as_params = false;
  EXPECT_THROW(train(o), InvalidArgument);  // "has no float initializers to train", as before
}

INSTANTIATE_TEST_SUITE_P(AtOpsets, APaddleStyleModel, ::testing::Values(9, 11),
                         [](const auto& info) { return "Opset" + std::to_string(info.param); });

TEST(ATfStyleModel, TrainsItsInitializerAndConstantWeightsInNhwcBehindTransposes) {
  TempDir dir;
  const auto path = dir.file("tf.onnx");
  testing::OnnxBuilder b = testing::tf_style_model();
  b.save(path);
  TrainOptions o = adam(path, 4, 12, 2e-2);
  o.save_model = dir.file("trained.onnx").string();
  const TrainResult r = train(o);
  EXPECT_EQ(r.params, testing::kTfParams);
  EXPECT_EQ(r.param_tensors, 4);
  EXPECT_EQ(r.constant_params.count, 3);  // the conv bias and both dense weights; the Clip bounds stay constant
  ASSERT_EQ(r.steps.size(), 12u);
  EXPECT_LT(r.steps.back().loss, 0.8 * r.steps.front().loss)
      << "first " << r.steps.front().loss << ", last " << r.steps.back().loss;
  const onnx::ModelProto trained = load_model_proto(dir.file("trained.onnx"));
  for (const char* name : {testing::kTfConvW, testing::kTfConvB, testing::kTfDenseW, testing::kTfDenseB})
    EXPECT_NE(weight_values(b.model(), name), weight_values(trained, name)) << name;
}

// The training graph of the embedding model at `opset`, run once on fixed ids: the loss and every gradient.
NamedTensors embedding_step(int64_t opset, bool* uses_apart_scatter) {
  onnx::ModelProto forward = testing::embedding_model(opset).model();
  constants_to_initializers(forward);
  TrainingGraphOptions options;
  options.import.dims["batch"] = 2;
  const TrainingGraph tg = build_training_graph(forward, options);
  *uses_apart_scatter = false;
  for (const auto& n : tg.model.graph().node())
    *uses_apart_scatter |= n.op_type() == "ScatterND" && n.domain() == "ai.apart";
  Executor executor(tg.model, {});
  Tensor ids(DType::kInt64, {2, 4});
  const int64_t values[] = {3, 1, 3, 9, 0, 3, 7, 1};  // repeated ids: their gradients add up
  for (int i = 0; i < 8; ++i) ids.data<int64_t>()[i] = values[i];
  return executor.run({{"ids", ids}});
}

TEST(AnEmbeddingAtOpset14, HasTheGradientItHasAtOpset16) {
  bool apart14 = false, apart16 = false;
  const NamedTensors at14 = embedding_step(14, &apart14), at16 = embedding_step(16, &apart16);
  EXPECT_TRUE(apart14);  // ScatterND's reduction is opset 16: ai.apart.ScatterND below
  EXPECT_FALSE(apart16);
  ASSERT_EQ(at14.size(), at16.size());
  ASSERT_EQ(at14.size(), 3u);  // loss, emb_grad, w_grad
  for (size_t i = 0; i < at14.size(); ++i) {
    EXPECT_EQ(at14[i].first, at16[i].first);
    const Tensor& a = at14[i].second;
    const Tensor& b = at16[i].second;
    ASSERT_EQ(a.shape(), b.shape()) << at14[i].first;
    double norm = 0;
    for (int64_t k = 0; k < a.elements(); ++k) {
      EXPECT_NEAR(a.data<float>()[k], b.data<float>()[k], 1e-6) << at14[i].first << "[" << k << "]";
      norm += std::abs(a.data<float>()[k]);
    }
    EXPECT_GT(norm, 0) << at14[i].first;
  }
}

TEST(AnEmbeddingAtOpset14, TrainsAsItDoesAtOpset16) {
  TempDir dir;
  std::vector<std::vector<double>> losses;
  for (int64_t opset : {14, 16}) {
    const auto path = dir.file("emb" + std::to_string(opset) + ".onnx");
    testing::embedding_model(opset).save(path);
    const TrainResult r = train(adam(path, 4, 6, 5e-2));
    losses.emplace_back();
    for (const StepRecord& s : r.steps) losses.back().push_back(s.loss);
  }
  ASSERT_EQ(losses[0].size(), 6u);
  EXPECT_LT(losses[0].back(), losses[0].front());
  for (size_t i = 0; i < losses[0].size(); ++i) EXPECT_NEAR(losses[0][i], losses[1][i], 1e-6 * std::abs(losses[1][i]) + 1e-9);
}

}  // namespace
}  // namespace apart
