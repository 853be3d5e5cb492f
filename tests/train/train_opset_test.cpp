// Models written at opsets 18–23 (Reduce*'s axes as input, Split's num_outputs, Pad's axes input) train to the
// same losses, bitwise, as their opset-17 forms, with apart train and with a 2-stage apart run; their stage files keep
// the opset and the nodes as written (importer/opset_adapter.h).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "importer/model_proto.h"
#include "train/trainer.h"
#include "tests/support/onnx_builder.h"
#include "tests/support/run_apart.h"

namespace apart {
namespace {
namespace fs = std::filesystem;

using testing::OnnxBuilder;
using testing::TempDir;

// x [batch, 8] → Linear 8→16 → LayerNorm (decomposed: ReduceMean over the last axis, as torch exports it) → Split in
// two halves → a · Sigmoid(gate) → Pad one zero column → Linear 9→4 → mean squared error against `target`.
// At opset 17 ReduceMean takes its axes as an attribute and Split its sizes as an input; from 18 the axes are input 1,
// Split has num_outputs and Pad names the padded axis.
OnnxBuilder gated_mlp(int64_t opset) {
  OnnxBuilder b(opset);
  b.input("x", {"batch", 8}).input("target", {"batch", 4}).output("loss");
  b.weight("w1", {8, 16}).weight("b1", {16}).weight("gamma", {16}).weight("beta", {16}).weight("w2", {9, 4});
  b.int_initializer("last", {-1});
  const bool new_form = opset >= 18;
  const auto mean_last = [&](const std::string& in, const std::string& out) {
    auto& n = new_form ? b.node("ReduceMean", {in, "last"}, {out}) : b.node("ReduceMean", {in}, {out});
    if (!new_form) OnnxBuilder::set_ints(n, "axes", {-1});
  };
  b.node("MatMul", {"x", "w1"}, {"xw"});
  b.node("Add", {"xw", "b1"}, {"h"});
  mean_last("h", "mu");
  b.node("Sub", {"h", "mu"}, {"centred"});
  b.node("Mul", {"centred", "centred"}, {"sq"});
  mean_last("sq", "var");
  auto& eps = b.node("Constant", {}, {"eps"});
  auto* value = eps.add_attribute();
  value->set_name("value_float");
  value->set_type(onnx::AttributeProto::FLOAT);
  value->set_f(1e-5f);
  b.node("Add", {"var", "eps"}, {"var_eps"});
  b.node("Sqrt", {"var_eps"}, {"std"});
  b.node("Div", {"centred", "std"}, {"normed"});
  b.node("Mul", {"normed", "gamma"}, {"scaled"});
  b.node("Add", {"scaled", "beta"}, {"ln"});
  if (new_form) {
    auto& split = b.node("Split", {"ln"}, {"a", "gate"});
    OnnxBuilder::set_int(split, "axis", 1);
    OnnxBuilder::set_int(split, "num_outputs", 2);
  } else {
    b.int_initializer("halves", {8, 8});
    OnnxBuilder::set_int(b.node("Split", {"ln", "halves"}, {"a", "gate"}), "axis", 1);
  }
  b.node("Sigmoid", {"gate"}, {"sig"});
  b.node("Mul", {"a", "sig"}, {"gated"});
  if (new_form) {
    b.int_initializer("pads", {0, 1}).int_initializer("pad_axes", {1});
    b.node("Pad", {"gated", "pads", "", "pad_axes"}, {"padded"});
  } else {
    b.int_initializer("pads", {0, 0, 0, 1});
    b.node("Pad", {"gated", "pads"}, {"padded"});
  }
  b.node("MatMul", {"padded", "w2"}, {"out"});
  b.node("Sub", {"out", "target"}, {"err"});
  b.node("Mul", {"err", "err"}, {"err2"});
  OnnxBuilder::set_int(b.node("ReduceMean", {"err2"}, {"loss"}), "keepdims", 0);
  return b;
}

// x [batch, 8] → Linear 8→12 → ReduceMax + ReduceMin + ReduceProd(Sigmoid) over the features → squared error against
// `target` [batch, 1]: the gradient rules of the extreme and product reductions, their axes an attribute at 17 and
// input 1 from 18 (ReduceProd's gradient emits a ReduceProd in the model's form).
OnnxBuilder reductions_model(int64_t opset) {
  OnnxBuilder b(opset);
  b.input("x", {"batch", 8}).input("target", {"batch", 1}).output("loss");
  b.weight("w", {8, 12});
  b.int_initializer("features", {1});
  b.node("MatMul", {"x", "w"}, {"h"});
  b.node("Sigmoid", {"h"}, {"s"});
  const auto reduce = [&](const char* op, const std::string& in, const std::string& out) {
    auto& n = opset >= 18 ? b.node(op, {in, "features"}, {out}) : b.node(op, {in}, {out});
    if (opset < 18) OnnxBuilder::set_ints(n, "axes", {1});
  };
  reduce("ReduceMax", "h", "max");
  reduce("ReduceMin", "h", "min");
  reduce("ReduceProd", "s", "prod");
  b.node("Add", {"max", "min"}, {"extremes"});
  b.node("Add", {"extremes", "prod"}, {"out"});
  b.node("Sub", {"out", "target"}, {"err"});
  b.node("Mul", {"err", "err"}, {"err2"});
  OnnxBuilder::set_int(b.node("ReduceMean", {"err2"}, {"loss"}), "keepdims", 0);
  return b;
}

std::vector<double> losses_of(const fs::path& model) {
  TrainOptions o;
  o.model = model.string();
  o.batch = 4;
  o.steps = 6;
  o.optimizer.kind = Optimizer::kAdamW;
  o.optimizer.lr = 1e-2;
  o.init = ParamInit::kRandom;
  o.seed = 7;
  std::vector<double> losses;
  for (const StepRecord& s : train(o).steps) losses.push_back(s.loss);
  return losses;
}

TEST(AModelAtOpsets18To23, TrainsToTheLossesOfItsOpset17FormBitwise) {
  for (const auto& [name, make] : {std::pair{"gated_mlp", &gated_mlp}, std::pair{"reductions", &reductions_model}}) {
    TempDir dir;
    const fs::path at17 = dir.file("m17.onnx");
    make(17).save(at17);
    const std::vector<double> reference = losses_of(at17);
    ASSERT_EQ(reference.size(), 6u) << name;
    EXPECT_LT(reference.back(), reference.front()) << name;
    for (int64_t opset : {18, 20, 21, 23}) {
      const fs::path model = dir.file(std::to_string(opset) + ".onnx");
      make(opset).save(model);
      EXPECT_EQ(losses_of(model), reference) << name << " at opset " << opset;
    }
  }
}

// The loss of apart's step line "step=<step> loss=…" (NaN when absent).
double step_loss(const std::string& out, int step) {
  const std::string key = "step=" + std::to_string(step) + " loss=";
  const size_t at = out.find(key);
  EXPECT_NE(at, std::string::npos) << out;
  return at == std::string::npos ? std::nan("") : std::stod(out.substr(at + key.size()));
}

// Plans `model` over 2 stages (2 micro-batches) into `plan`; checks the stage files declare `opset`.
void plan_two_stages(const std::string& model, const std::string& plan, int64_t opset) {
  const auto planned = testing::run_apart("partition " + model + " --device cpu --devices 2 --stages 2 --batch 8 " +
                                          "--microbatches 2 --no-baselines -q -o " + plan);
  ASSERT_EQ(planned.code, 0) << planned.out;
  for (const char* stage : {"stage_0.onnx", "stage_1.onnx"}) {
    const onnx::ModelProto m = load_model_proto(fs::path(plan) / stage);
    for (const auto& o : m.opset_import()) {
      if (o.domain().empty()) {
        EXPECT_EQ(o.version(), opset) << stage;
      }
    }
  }
}

TEST(AModelAtOpset23, PlansIntoStageFilesAtItsOpsetThatRunAsItsOpset17FormsDo) {
  TempDir dir;
  const std::string model = dir.file("m23.onnx").string(), at17 = dir.file("m17.onnx").string();
  const std::string plan = dir.file("plan23").string(), plan17 = dir.file("plan17").string();
  gated_mlp(23).save(model);
  gated_mlp(17).save(at17);
  plan_two_stages(model, plan, 23);
  plan_two_stages(at17, plan17, 17);
  // The stage files hold the nodes as the model writes them at 23.
  int64_t reductions_with_axes_input = 0, splits_by_num_outputs = 0;
  for (const char* stage : {"stage_0.onnx", "stage_1.onnx"}) {
    const onnx::ModelProto m = load_model_proto(fs::path(plan) / stage);
    for (const auto& n : m.graph().node()) {
      reductions_with_axes_input += n.op_type() == "ReduceMean" && n.input_size() == 2;
      splits_by_num_outputs += n.op_type() == "Split" && n.input_size() == 1;
    }
  }
  EXPECT_EQ(reductions_with_axes_input, 2);
  EXPECT_EQ(splits_by_num_outputs, 1);
  const std::string flags = " --steps 3 --init random --seed 3";
  const auto run = testing::run_apart("run " + plan + " --in-process" + flags);
  const auto run17 = testing::run_apart("run " + plan17 + " --in-process" + flags);
  const auto train = testing::run_apart("train " + model + " --batch 8" + flags);
  ASSERT_EQ(run.code, 0) << run.out;
  ASSERT_EQ(run17.code, 0) << run17.out;
  ASSERT_EQ(train.code, 0) << train.out;
  for (int step : {1, 3}) {
    EXPECT_EQ(step_loss(run.out, step), step_loss(run17.out, step)) << "step " << step;
    // Two micro-batches average the loss in another order than the whole batch does.
    EXPECT_NEAR(step_loss(run.out, step), step_loss(train.out, step), 1e-5 * std::abs(step_loss(train.out, step)));
  }
}

}  // namespace
}  // namespace apart
