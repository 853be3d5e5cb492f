// Stage graphs: forward then backward on the executor computes bitwise what the fused training graph computes
// (the oracle), with and without recomputation, on gpt-tiny, a cut-out MLP stage and a BatchNorm net.
#include <gtest/gtest.h>
#include <onnx/checker.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "codegen/stage_graphs.h"
#include "graph/error.h"
#include "importer/importer.h"
#include "runtime/executor.h"
#include "tests/support/onnx_builder.h"
#include "tests/support/read_model.h"

namespace apart {
namespace {

using testing::OnnxBuilder;
using Tensors = std::map<std::string, Tensor>;

const std::filesystem::path kModels = std::filesystem::path(APART_SOURCE_DIR) / "models";

// How the runtime imports both graphs (and the fused one): static shapes are in the protos already.
ImportOptions run_import() {
  ImportOptions import;
  import.require_external_data = true;
  return import;
}

Tensors run(const onnx::ModelProto& model, const Tensors& inputs, const RandomKey& key) {
  Executor exec(model, kModels, {}, run_import());
  Tensors out;
  for (auto& [name, t] : exec.run(inputs, key)) out.emplace(name, std::move(t));
  return out;
}

// "" when the two tensors hold the same bytes.
std::string bitwise_difference(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape())
    return std::string(dtype_name(got.dtype())) + " [" + shape_string(got.shape()) + "] vs " +
           std::string(dtype_name(want.dtype())) + " [" + shape_string(want.shape()) + "]";
  if (std::memcmp(got.raw(), want.raw(), static_cast<size_t>(got.bytes())) != 0) return "different bytes";
  return "";
}

Tensor random_floats(std::vector<int64_t> shape, std::mt19937& rng) {
  Tensor t(DType::kFloat32, std::move(shape));
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : t.span<float>()) x = u(rng);
  return t;
}

// What one step computes, by the names the fused training graph gives its outputs.
struct StepResult {
  Tensors values;
  std::vector<std::string> stash;
};

// The stage graphs run as a pipeline runtime runs them: forward, keep the stash, backward with the gradients of
// the stage outputs. `output_gradients` by stage output name.
StepResult run_staged(const StageGraphs& sg, const Tensors& inputs, const Tensors& output_gradients, const RandomKey& key) {
  StepResult r;
  const Tensors fwd = run(sg.forward, inputs, key);
  Tensors bwd_inputs;
  for (const auto& s : sg.stash) bwd_inputs.emplace(s, fwd.at(s));
  for (const auto& [output, grad_input] : sg.output_gradient_inputs) bwd_inputs.emplace(grad_input, output_gradients.at(output));
  const Tensors bwd = run(sg.backward, bwd_inputs, key);
  if (!sg.loss_output.empty()) r.values.emplace(sg.loss_output, fwd.at(sg.loss_output));
  for (const auto& [output, grad_input] : sg.output_gradient_inputs) r.values.emplace(output, fwd.at(output));
  for (const auto& [stat, update] : sg.state_updates) r.values.emplace(update, fwd.at(update));
  for (const auto& [param, grad] : sg.gradients) r.values.emplace(grad, bwd.at(grad));
  for (const auto& [input, grad] : sg.input_gradients) r.values.emplace(grad, bwd.at(grad));
  r.stash = sg.stash;
  return r;
}

// The oracle: the fused training graph of the same options on the same inputs.
Tensors run_fused(const onnx::ModelProto& forward, const TrainingGraphOptions& options, const Tensors& inputs,
                  const Tensors& output_gradients, const RandomKey& key) {
  const TrainingGraph tg = build_training_graph(forward, options);
  Tensors all = inputs;
  for (const auto& [output, grad_input] : tg.output_gradient_inputs) all.emplace(grad_input, output_gradients.at(output));
  return run(tg.model, all, key);
}

// Every value the staged run produced equals the fused run's, byte for byte; returns the staged result.
StepResult expect_staged_equals_fused(const onnx::ModelProto& forward, const StageGraphOptions& options,
                                      const Tensors& inputs, const Tensors& output_gradients = {},
                                      const RandomKey& key = {7, 3, 1}) {
  const Tensors fused = run_fused(forward, options.training, inputs, output_gradients, key);
  const StageGraphs sg = build_stage_graphs(forward, options);
  StepResult staged = run_staged(sg, inputs, output_gradients, key);
  EXPECT_EQ(staged.values.size(), fused.size());
  for (const auto& [name, want] : fused) {
    auto it = staged.values.find(name);
    if (it == staged.values.end()) {
      ADD_FAILURE() << "the stage graphs do not compute " << name;
      continue;
    }
    EXPECT_EQ(bitwise_difference(it->second, want), "") << name << (options.recompute ? " (recompute)" : "");
  }
  return staged;
}

std::vector<std::string> input_names(const onnx::GraphProto& g) {
  std::vector<std::string> names;
  for (const auto& i : g.input()) names.push_back(i.name());
  return names;
}
std::vector<std::string> output_names(const onnx::GraphProto& g) {
  std::vector<std::string> names;
  for (const auto& o : g.output()) names.push_back(o.name());
  return names;
}
std::set<std::string> node_names(const onnx::GraphProto& g) {
  std::set<std::string> names;
  for (const auto& n : g.node()) names.insert(n.name());
  return names;
}

onnx::ModelProto mlp_stage();
StageGraphOptions mlp_options(bool recompute);

// --- gpt-tiny as the whole model (one stage holding the loss) ---

StageGraphOptions gpt_options(int64_t batch, bool recompute) {
  StageGraphOptions o;
  o.training.import.batch = batch;  // as apart train binds --batch
  o.training.import.batch_explicit = true;
  o.recompute = recompute;
  return o;
}

Tensors gpt_inputs(int64_t batch) {
  std::mt19937 rng(5);
  Tensor ids(DType::kInt64, {batch, 32}), labels(DType::kInt64, {batch, 32});
  std::uniform_int_distribution<int64_t> token(0, 511);
  for (int64_t i = 0; i < batch * 32; ++i) ids.data<int64_t>()[i] = token(rng), labels.data<int64_t>()[i] = token(rng);
  return {{"input_ids", ids}, {"labels", labels}};
}

TEST(StageGraphsOfGptTiny, ComputeTheFusedGraphsLossAndEveryGradientBitwise) {
  const auto forward = testing::read_proto(kModels / "gpt-tiny.onnx");
  const StepResult r = expect_staged_equals_fused(forward, gpt_options(2, false), gpt_inputs(2));
  EXPECT_FALSE(r.stash.empty());
  // The head's transposed embedding table depends on params alone: the backward transposes again rather than
  // keeping a table-sized copy per micro-batch.
  EXPECT_EQ(std::count(r.stash.begin(), r.stash.end(), "/head/Transpose_output_0"), 0);
  EXPECT_TRUE(node_names(build_stage_graphs(forward, gpt_options(2, false)).backward.graph()).count("/head/Transpose"));
}

// A first stage (its attention fused: fewer forward nodes than the stage file's) whose output's gradient comes in from
// the next stage: the cut finds the backward where the fused training graph's forward ends.
TEST(StageGraphsOfGptTiny, OfAFirstStageWithFusedAttentionTakeTheGradientOfItsOutput) {
  auto forward = testing::read_proto(kModels / "gpt-tiny.onnx");
  const std::string boundary = "/blocks.0/Add_1_output_0";
  StageGraphOptions o = gpt_options(2, false);
  const ImportedModel imported = import_model_bytes(forward.SerializeAsString(), {}, "gpt-tiny", o.training.import);
  const Value& v = imported.graph.value(*imported.graph.find_value(boundary));
  forward.mutable_graph()->clear_output();
  auto* out = forward.mutable_graph()->add_output();
  out->set_name(boundary);
  out->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : v.shape) out->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
  o.training.output_gradients = {boundary};
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  Tensor grad(DType::kFloat32, v.shape);
  for (int64_t i = 0; i < grad.elements(); ++i) grad.data<float>()[i] = u(rng);
  const StageGraphs sg = build_stage_graphs(forward, o);
  bool fused = false;
  for (const auto& n : sg.forward.graph().node()) fused = fused || n.op_type() == "Attention";
  EXPECT_TRUE(fused);
  expect_staged_equals_fused(forward, o, gpt_inputs(2), {{boundary, grad}});
}

TEST(StageGraphsOfGptTiny, WithRecomputeComputeTheSameBitsFromTheInputsAlone) {
  const auto forward = testing::read_proto(kModels / "gpt-tiny.onnx");
  const StepResult r = expect_staged_equals_fused(forward, gpt_options(2, true), gpt_inputs(2));
  EXPECT_EQ(r.stash, (std::vector<std::string>{"input_ids", "labels"}));
}

TEST(StageGraphsOfGptTiny, AreValidOnnxModels) {
  const auto forward = testing::read_proto(kModels / "gpt-tiny.onnx");
  for (bool recompute : {false, true}) {
    const StageGraphs sg = build_stage_graphs(forward, gpt_options(2, recompute));
    EXPECT_NO_THROW(onnx::checker::check_model(sg.forward)) << recompute;
    EXPECT_NO_THROW(onnx::checker::check_model(sg.backward)) << recompute;
  }
  const StageGraphs stage = build_stage_graphs(mlp_stage(), mlp_options(true));
  EXPECT_NO_THROW(onnx::checker::check_model(stage.forward));
  EXPECT_NO_THROW(onnx::checker::check_model(stage.backward));
}

TEST(StageGraphsOfGptTiny, AreByteIdenticalAcrossBuilds) {
  const auto forward = testing::read_proto(kModels / "gpt-tiny.onnx");
  for (bool recompute : {false, true}) {
    const StageGraphs a = build_stage_graphs(forward, gpt_options(1, recompute));
    const StageGraphs b = build_stage_graphs(forward, gpt_options(1, recompute));
    EXPECT_EQ(a.forward.SerializeAsString(), b.forward.SerializeAsString()) << recompute;
    EXPECT_EQ(a.backward.SerializeAsString(), b.backward.SerializeAsString()) << recompute;
    EXPECT_EQ(a.stash, b.stash);
  }
}

// --- A stage cut out of a model: an input boundary value in, an output boundary value out, no loss ---

constexpr int64_t kRows = 4, kWidth = 6, kHidden = 10;

// h → MatMul·W1 + b1 → Relu → Dropout(0.25, training) → MatMul·W2 → y. The Dropout's ratio and mode are
// Constant nodes: its gradient reads the ratio, which the backward computes itself instead of stashing.
onnx::ModelProto mlp_stage() {
  std::mt19937 rng(11);
  OnnxBuilder b;
  b.input({"h", DType::kFloat32, {kRows, kWidth}}).output({"y", DType::kFloat32, {kRows, kWidth}});
  b.initializer(random_floats({kWidth, kHidden}, rng), "W1").initializer(random_floats({kHidden}, rng), "b1");
  b.initializer(random_floats({kHidden, kWidth}, rng), "W2");
  b.node("MatMul", {"h", "W1"}, {"a"}, "fc1");
  b.node("Add", {"a", "b1"}, {"z"}, "fc1_bias");
  b.node("Relu", {"z"}, {"r"}, "relu");
  auto& ratio = b.node("Constant", {}, {"ratio"}, "ratio");
  auto* ra = ratio.add_attribute();
  ra->set_name("value");
  ra->set_type(onnx::AttributeProto::TENSOR);
  ra->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
  ra->mutable_t()->add_float_data(0.25f);
  auto& mode = b.node("Constant", {}, {"training"}, "training");
  auto* ma = mode.add_attribute();
  ma->set_name("value");
  ma->set_type(onnx::AttributeProto::TENSOR);
  ma->mutable_t()->set_data_type(onnx::TensorProto::BOOL);
  ma->mutable_t()->add_int32_data(1);
  b.node("Dropout", {"r", "ratio", "training"}, {"d"}, "drop");
  b.node("MatMul", {"d", "W2"}, {"y"}, "fc2");
  return b.model();
}

StageGraphOptions mlp_options(bool recompute) {
  StageGraphOptions o;
  o.training.output_gradients = {"y"};
  o.training.input_gradients = {"h"};
  o.recompute = recompute;
  return o;
}

Tensors mlp_inputs() {
  std::mt19937 rng(13);
  return {{"h", random_floats({kRows, kWidth}, rng)}};
}
Tensors mlp_output_gradients() {
  std::mt19937 rng(17);
  return {{"y", random_floats({kRows, kWidth}, rng)}};
}

TEST(StageGraphsOfAMiddleStage, ComputeTheFusedGraphsOutputsAndGradientsBitwise) {
  expect_staged_equals_fused(mlp_stage(), mlp_options(false), mlp_inputs(), mlp_output_gradients());
}

TEST(StageGraphsOfAMiddleStage, WithRecomputeComputeTheSameBitsAndStashOnlyTheStageInput) {
  const StepResult r = expect_staged_equals_fused(mlp_stage(), mlp_options(true), mlp_inputs(), mlp_output_gradients());
  EXPECT_EQ(r.stash, std::vector<std::string>{"h"});
}

TEST(StageGraphsOfAMiddleStage, DrawTheFusedGraphsDropoutMaskUnderEveryKey) {
  for (const RandomKey key : {RandomKey{0, 0, 0}, RandomKey{1, 2, 3}, RandomKey{9, 1, 7}})
    for (bool recompute : {false, true})
      expect_staged_equals_fused(mlp_stage(), mlp_options(recompute), mlp_inputs(), mlp_output_gradients(), key);
}

// Two stage inputs meet in an Add (a ResNet's residual cut at a block's end): both input gradients are one value,
// which the backward must output twice — the first output renames its producer, the second copies it from there.
TEST(StageGraphsOfAMiddleStage, OutputTheSameGradientForTwoInputsThatMeetInAnAdd) {
  std::mt19937 rng(23);
  OnnxBuilder b;
  b.input({"p", DType::kFloat32, {kRows, kWidth}}).input({"q", DType::kFloat32, {kRows, kWidth}});
  b.output({"y", DType::kFloat32, {kRows, kWidth}});
  b.initializer(random_floats({kWidth, kWidth}, rng), "W");
  b.node("Add", {"p", "q"}, {"s"}, "residual");
  b.node("Relu", {"s"}, {"r"}, "relu");
  b.node("MatMul", {"r", "W"}, {"y"}, "fc");
  StageGraphOptions o;
  o.training.output_gradients = {"y"};
  o.training.input_gradients = {"p", "q"};
  std::mt19937 data(29);
  const Tensors inputs{{"p", random_floats({kRows, kWidth}, data)}, {"q", random_floats({kRows, kWidth}, data)}};
  const StepResult r = expect_staged_equals_fused(b.model(), o, inputs, mlp_output_gradients());
  const StageGraphs sg = build_stage_graphs(b.model(), o);
  ASSERT_EQ(sg.input_gradients.size(), 2u);
  const Tensor& gp = r.values.at(sg.input_gradients[0].second);
  const Tensor& gq = r.values.at(sg.input_gradients[1].second);
  ASSERT_EQ(gp.elements(), gq.elements());
  EXPECT_EQ(std::memcmp(gp.raw(), gq.raw(), static_cast<size_t>(gp.bytes())), 0);
}

// --- ZB-H1's split of the backward into its input-gradient (B) and weight-gradient (W) passes ---

// B then W, as apart run runs them under ZB-H1, against the whole backward: every gradient bitwise, each backward
// node in exactly one pass, no input gradient from W.
void expect_split_equals_backward(const onnx::ModelProto& forward, StageGraphOptions options, const Tensors& inputs,
                                  const Tensors& output_gradients, bool expect_input_pass) {
  options.split_weight_pass = true;
  const StageGraphs sg = build_stage_graphs(forward, options);
  const RandomKey key{7, 3, 1};
  const Tensors fwd = run(sg.forward, inputs, key);
  Tensors bwd_inputs;
  for (const auto& st : sg.stash) bwd_inputs.emplace(st, fwd.at(st));
  for (const auto& [output, grad_input] : sg.output_gradient_inputs) bwd_inputs.emplace(grad_input, output_gradients.at(output));
  const Tensors whole = run(sg.backward, bwd_inputs, key);
  auto reads = [&](const onnx::GraphProto& g, const Tensors& from) {
    Tensors in;
    for (const auto& i : g.input())
      if (from.count(i.name())) in.emplace(i.name(), from.at(i.name()));
    return in;
  };
  Tensors b;
  if (sg.input_pass.graph().output_size() > 0) b = run(sg.input_pass, reads(sg.input_pass.graph(), bwd_inputs), key);
  EXPECT_EQ(sg.input_pass.graph().output_size() > 0, expect_input_pass);
  Tensors w_inputs = reads(sg.weight_pass.graph(), bwd_inputs);
  for (const auto& c : sg.carried) w_inputs.emplace(c, b.at(c));
  const Tensors w = run(sg.weight_pass, w_inputs, key);
  for (const auto& [input, grad] : sg.input_gradients) {
    ASSERT_TRUE(b.count(grad)) << "B does not compute the input gradient " << grad;
    EXPECT_FALSE(w.count(grad)) << grad;
    EXPECT_EQ(bitwise_difference(b.at(grad), whole.at(grad)), "") << grad;
  }
  int from_w = 0;
  for (const auto& [param, grad] : sg.gradients) {
    const bool in_b = b.count(grad) > 0, in_w = w.count(grad) > 0;
    EXPECT_NE(in_b, in_w) << grad << " comes from " << (in_b ? "both passes" : "neither pass");
    from_w += in_w;
    EXPECT_EQ(bitwise_difference(in_b ? b.at(grad) : w.at(grad), whole.at(grad)), "") << grad;
  }
  EXPECT_GT(from_w, 0) << "W computes no weight gradient";
  std::set<std::string> both = node_names(sg.input_pass.graph());
  for (const auto& name : node_names(sg.weight_pass.graph()))
    EXPECT_TRUE(both.insert(name).second || name.empty()) << name << " runs in both passes";
  std::set<std::string> backward = node_names(sg.backward.graph());
  EXPECT_EQ(both, backward);
}

TEST(ZeroBubbleStageGraphs, OfAMiddleStageComputeTheBackwardsGradientsBitwiseInTwoPasses) {
  expect_split_equals_backward(mlp_stage(), mlp_options(false), mlp_inputs(), mlp_output_gradients(), true);
  expect_split_equals_backward(mlp_stage(), mlp_options(true), mlp_inputs(), mlp_output_gradients(), true);
}

TEST(ZeroBubbleStageGraphs, OfAStageWithoutInputGradientsLeaveTheWholeBackwardToW) {
  const auto forward = testing::read_proto(kModels / "gpt-tiny.onnx");
  expect_split_equals_backward(forward, gpt_options(2, false), gpt_inputs(2), {}, false);
}

TEST(StageGraphsOfAMiddleStage, ListInputsAndOutputsInTheDeclaredOrder) {
  const StageGraphs sg = build_stage_graphs(mlp_stage(), mlp_options(false));
  EXPECT_EQ(sg.loss_output, "");
  ASSERT_EQ(sg.output_gradient_inputs.size(), 1u);
  ASSERT_EQ(sg.input_gradients.size(), 1u);
  ASSERT_EQ(sg.gradients.size(), 3u);
  // The forward: its inputs; the stage output, then the stash.
  EXPECT_EQ(input_names(sg.forward.graph()), std::vector<std::string>{"h"});
  std::vector<std::string> forward_outputs{"y"};
  forward_outputs.insert(forward_outputs.end(), sg.stash.begin(), sg.stash.end());
  EXPECT_EQ(output_names(sg.forward.graph()), forward_outputs);
  // The backward: the stash, then the output gradient; param gradients, then the input gradient.
  std::vector<std::string> backward_inputs = sg.stash;
  backward_inputs.push_back(sg.output_gradient_inputs[0].second);
  EXPECT_EQ(input_names(sg.backward.graph()), backward_inputs);
  std::vector<std::string> backward_outputs;
  for (const auto& [param, grad] : sg.gradients) backward_outputs.push_back(grad);
  backward_outputs.push_back(sg.input_gradients[0].second);
  EXPECT_EQ(output_names(sg.backward.graph()), backward_outputs);
  // Both carry the params.
  EXPECT_EQ(sg.forward.graph().initializer_size(), 3);
  EXPECT_EQ(sg.backward.graph().initializer_size(), 3);
}

TEST(StageGraphsOfAMiddleStage, RunNoForwardComputationInTheBackwardUnlessRecomputing) {
  const std::set<std::string> batch_nodes{"fc1", "fc1_bias", "relu", "drop", "fc2"};
  const StageGraphs saved = build_stage_graphs(mlp_stage(), mlp_options(false));
  for (const auto& n : node_names(saved.backward.graph())) EXPECT_FALSE(batch_nodes.count(n)) << n;
  // Its stash: the stage input (for W1's gradient), relu's output (its own gradient and W2's via the mask), the
  // mask; not the ratio, which the backward computes again from its Constant node.
  EXPECT_EQ(std::count(saved.stash.begin(), saved.stash.end(), "ratio"), 0);
  EXPECT_TRUE(node_names(saved.backward.graph()).count("ratio"));
  // With recompute it runs them again, except fc2: no gradient reads the stage output itself.
  const StageGraphs recomputed = build_stage_graphs(mlp_stage(), mlp_options(true));
  const std::set<std::string> names = node_names(recomputed.backward.graph());
  for (const auto& n : batch_nodes) EXPECT_EQ(names.count(n), n == "fc2" ? 0u : 1u) << n;
}

// A backward that reads integers computed from a stage input's static shape gets them as a Constant, not stashed:
// y = h · ReduceSum(Gather(P, Shape(h)), 0), whose Gather gradient reads the indices Shape(h) = [4, 6].
TEST(StageGraphsOfAMiddleStage, FoldShapeArithmeticOnTheirInputsIntoTheBackward) {
  std::mt19937 rng(29);
  OnnxBuilder b;
  b.input({"h", DType::kFloat32, {kRows, kWidth}}).output({"y", DType::kFloat32, {kRows, kWidth}});
  b.initializer(random_floats({8, kWidth}, rng), "P").int_initializer("axis0", {0});
  b.node("Shape", {"h"}, {"dims"}, "dims");
  b.node("Gather", {"P", "dims"}, {"rows"}, "rows");
  b.node("ReduceSum", {"rows", "axis0"}, {"scale"}, "scale");
  b.node("Mul", {"h", "scale"}, {"y"}, "mul");
  for (bool recompute : {false, true}) {
    const StepResult r = expect_staged_equals_fused(b.model(), mlp_options(recompute), mlp_inputs(), mlp_output_gradients());
    EXPECT_EQ(std::count(r.stash.begin(), r.stash.end(), "dims"), 0) << recompute;
  }
  const StageGraphs sg = build_stage_graphs(b.model(), mlp_options(false));
  EXPECT_TRUE(node_names(sg.backward.graph()).count("stage/folded/dims"));
  EXPECT_FALSE(node_names(sg.backward.graph()).count("dims"));
}

// An integer boundary value a later stage reads has no gradient; the forward still outputs it, last.
TEST(StageGraphsOfAMiddleStage, OutputTheBoundaryValuesThatHaveNoGradient) {
  onnx::ModelProto model = mlp_stage();
  OnnxBuilder b;
  b.node("Shape", {"h"}, {"dims"}, "dims");
  b.output({"dims", DType::kInt64, {2}});
  *model.mutable_graph()->add_node() = b.graph().node(0);
  *model.mutable_graph()->add_output() = b.graph().output(0);
  const StageGraphs sg = build_stage_graphs(model, mlp_options(false));
  EXPECT_EQ(sg.outputs_without_gradient, std::vector<std::string>{"dims"});
  EXPECT_EQ(output_names(sg.forward.graph()).back(), "dims");
  const Tensors out = run(sg.forward, mlp_inputs(), {});
  ASSERT_TRUE(out.count("dims"));
  EXPECT_EQ(out.at("dims").data<int64_t>()[0], kRows);
  EXPECT_EQ(out.at("dims").data<int64_t>()[1], kWidth);
}

// --- BatchNormalization in training mode: the running statistics come out of the forward ---

onnx::ModelProto conv_bn_net() {
  std::mt19937 rng(19);
  OnnxBuilder b;
  b.input({"x", DType::kFloat32, {2, 3, 5, 5}}).input({"labels", DType::kInt64, {2}});
  b.output({"loss", DType::kFloat32, {}});
  b.initializer(random_floats({4, 3, 3, 3}, rng), "conv.W");
  Tensor ones(DType::kFloat32, {4}), zeros(DType::kFloat32, {4});
  for (auto& v : ones.span<float>()) v = 1;
  for (auto& v : zeros.span<float>()) v = 0;
  b.initializer(random_floats({4}, rng), "bn.scale").initializer(random_floats({4}, rng), "bn.bias");
  b.initializer(zeros, "bn.mean").initializer(ones, "bn.var");
  b.initializer(random_floats({4, 3}, rng), "fc.W");
  auto& conv = b.node("Conv", {"x", "conv.W"}, {"c"}, "conv");
  OnnxBuilder::set_ints(conv, "pads", {1, 1, 1, 1});
  b.node("BatchNormalization", {"c", "bn.scale", "bn.bias", "bn.mean", "bn.var"}, {"n"}, "bn");
  b.node("Relu", {"n"}, {"r"}, "relu");
  b.node("GlobalAveragePool", {"r"}, {"p"}, "pool");
  b.node("Flatten", {"p"}, {"f"}, "flatten");
  b.node("MatMul", {"f", "fc.W"}, {"logits"}, "fc");
  b.node("SoftmaxCrossEntropyLoss", {"logits", "labels"}, {"loss"}, "loss");
  return b.model();
}

TEST(StageGraphsOfABatchNormNet, GiveTheFusedGraphsRunningStatisticsAndGradientsBitwise) {
  std::mt19937 rng(23);
  Tensor labels(DType::kInt64, {2});
  labels.data<int64_t>()[0] = 1, labels.data<int64_t>()[1] = 2;
  const Tensors inputs{{"x", random_floats({2, 3, 5, 5}, rng)}, {"labels", labels}};
  StageGraphOptions options;
  options.training.params = {"conv.W", "bn.scale", "bn.bias", "fc.W"};
  for (bool recompute : {false, true}) {
    options.recompute = recompute;
    expect_staged_equals_fused(conv_bn_net(), options, inputs);
    const StageGraphs sg = build_stage_graphs(conv_bn_net(), options);
    ASSERT_EQ(sg.state_updates.size(), 2u);
    EXPECT_EQ(sg.state_updates[0].first, "bn.mean");
    const auto outputs = output_names(sg.forward.graph());
    EXPECT_EQ(outputs.back(), sg.state_updates[1].second);
    for (const auto& o : output_names(sg.backward.graph()))
      EXPECT_NE(o, sg.state_updates[0].second) << "running statistics are the forward's outputs";
  }
}

// --- A decoder stage: ConvTranspose, HardSwish, Resize, Pad and a strided Slice (ai.apart gradients that read the
// forward's roi/scales and constants) ---

onnx::ModelProto decoder_stage() {
  std::mt19937 rng(29);
  OnnxBuilder b(14);
  b.input({"h", DType::kFloat32, {2, 2, 3, 3}}).output({"y", DType::kFloat32, {2, 3, 5, 7}});
  b.initializer(random_floats({2, 3, 3, 3}, rng), "up.W").initializer(random_floats({3}, rng), "up.b");
  OnnxBuilder::set_ints(b.node("ConvTranspose", {"h", "up.W", "up.b"}, {"u"}, "up"), "strides", {2, 2});  // 7 × 7
  b.node("HardSwish", {"u"}, {"a"}, "act");
  Tensor scales(DType::kFloat32, {4});
  for (int i = 0; i < 4; ++i) scales.data<float>()[i] = i < 2 ? 1.0f : 1.5f;
  b.initializer(scales, "scales");
  auto* mode = b.node("Resize", {"a", "", "scales"}, {"r"}, "resize").add_attribute();  // 10 × 10
  mode->set_name("mode"), mode->set_type(onnx::AttributeProto::STRING), mode->set_s("linear");
  b.int_initializer("pads", {0, 0, 1, 2, 0, 0, -1, 2});  // 10 × 14
  auto* pad_mode = b.node("Pad", {"r", "pads"}, {"p"}, "pad").add_attribute();
  pad_mode->set_name("mode"), pad_mode->set_type(onnx::AttributeProto::STRING), pad_mode->set_s("reflect");
  b.int_initializer("starts", {9, 0}).int_initializer("ends", {0, 100}).int_initializer("axes", {2, 3});
  b.int_initializer("steps", {-2, 2});  // rows 9, 7, 5, 3, 1; columns 0, 2, …, 12
  b.node("Slice", {"p", "starts", "ends", "axes", "steps"}, {"y"}, "slice");
  return b.model();
}

TEST(StageGraphsOfADecoderStage, ComputeTheFusedGraphsOutputsAndGradientsBitwise) {
  std::mt19937 rng(31);
  const Tensors inputs{{"h", random_floats({2, 2, 3, 3}, rng)}};
  const Tensors output_gradients{{"y", random_floats({2, 3, 5, 7}, rng)}};
  StageGraphOptions options;
  options.training.output_gradients = {"y"};
  options.training.input_gradients = {"h"};
  for (bool recompute : {false, true}) {
    options.recompute = recompute;
    expect_staged_equals_fused(decoder_stage(), options, inputs, output_gradients);
    EXPECT_EQ(build_stage_graphs(decoder_stage(), options).gradients.size(), 2u) << "up.W and up.b, not the scales";
  }
}

// --- Values a stage reads only for their shape (fold_shape_only_inputs) ---

// h [batch, 6] → MatMul·W → Reshape to Shape(early): `early` [batch, 2, 3], another stage's value, is read only by the
// Shape, as a torch export's attention reads its input's shape in a later stage than the input's.
onnx::ModelProto stage_reading_a_shape() {
  std::mt19937 rng(31);
  OnnxBuilder b;
  b.input("h", {"batch", kWidth}).input("early", {"batch", 2, 3});
  b.output("y");
  b.initializer(random_floats({kWidth, kWidth}, rng), "W");
  b.node("MatMul", {"h", "W"}, {"a"}, "fc");
  b.node("Shape", {"early"}, {"early_dims"}, "early_dims");
  b.node("Reshape", {"a", "early_dims"}, {"y"}, "reshape");
  return b.model();
}

ImportOptions at_batch(int64_t batch) {
  ImportOptions import;
  import.batch = batch;
  import.batch_explicit = true;
  return import;
}

TEST(AStageInputReadOnlyForItsShape, IsFoldedAtTheStagesBatchAndNoLongerAnInput) {
  onnx::ModelProto stage = stage_reading_a_shape();
  EXPECT_EQ(fold_shape_only_inputs(stage, {"h"}, at_batch(3)), std::vector<std::string>{"early"});
  std::vector<std::string> inputs;
  for (const auto& in : stage.graph().input()) inputs.push_back(in.name());
  EXPECT_EQ(inputs, std::vector<std::string>{"h"});
  EXPECT_EQ(stage.graph().node(1).op_type(), "Constant");
  EXPECT_EQ(stage.graph().node(1).name(), "early_dims");
  std::mt19937 rng(37);
  Executor exec(stage, {}, {}, at_batch(3));
  const NamedTensors out = exec.run({{"h", random_floats({3, kWidth}, rng)}});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].second.shape(), (std::vector<int64_t>{3, 2, 3}));  // the batch the stage runs, not the file's
  // Every input sent: nothing to fold, the stage unchanged.
  onnx::ModelProto whole = stage_reading_a_shape();
  EXPECT_TRUE(fold_shape_only_inputs(whole, {"h", "early"}, at_batch(3)).empty());
  EXPECT_EQ(whole.SerializeAsString(), stage_reading_a_shape().SerializeAsString());
}

TEST(AStageInputReadForItsData, IsRefusedNamingTheValueAndItsReader) {
  onnx::ModelProto stage = stage_reading_a_shape();
  OnnxBuilder extra;
  extra.node("Identity", {"early"}, {"early_copy"}, "copy");  // reads the data: cannot be folded
  *stage.mutable_graph()->add_node() = extra.graph().node(0);
  stage.mutable_graph()->add_output()->set_name("early_copy");
  try {
    fold_shape_only_inputs(stage, {"h"}, at_batch(3));
    ADD_FAILURE() << "no error";
  } catch (const InvalidModel& e) {
    EXPECT_NE(std::string(e.what()).find("'copy' (Identity) reads 'early'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("re-run apart partition"), std::string::npos) << e.what();
  }
}

// --- Bad input ---

TEST(StageGraphs, RefuseANodeWithoutAGradientRuleNamingIt) {
  OnnxBuilder b;
  b.input({"x", DType::kFloat32, {2}}).output({"y", DType::kFloat32, {2}});
  b.weight("w", {2});
  b.node("Mul", {"x", "w"}, {"p"}, "scale");
  b.node("Sin", {"p"}, {"y"}, "the_sine");
  StageGraphOptions options;
  options.training.output_gradients = {"y"};
  for (bool recompute : {false, true}) {
    options.recompute = recompute;
    try {
      build_stage_graphs(b.model(), options);
      ADD_FAILURE() << "no error";
    } catch (const Unsupported& e) {
      EXPECT_NE(std::string(e.what()).find("the_sine"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("Sin has no gradient rule"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace apart
