// Fused attention before autodiff (codegen/attention_fusion.h): the zoo GPT's attentions become one node each, no
// seq × seq tensor is left in the training graph, and training computes what the unfused graph computes (its loss
// and gradients within a stated tolerance; finite differences in float64).
#include "codegen/attention_fusion.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "codegen/autodiff.h"
#include "importer/importer.h"
#include "models/zoo.h"
#include "runtime/executor.h"
#include "tests/codegen/finite_differences.h"

namespace apart {
namespace {

using namespace apart::testing;

models::ZooOptions small_gpt(int64_t seq, int64_t heads, int64_t hidden, int64_t layers = 2) {
  models::ZooOptions z = models::options_for("gpt-tiny");
  z.layers = layers, z.seq = seq, z.heads = heads, z.hidden = hidden, z.vocab = 64, z.batch = 2;
  return z;
}

TaskGraph imported(const onnx::ModelProto& m) { return import_model_bytes(m.SerializeAsString(), {}, "m", {}).graph; }

// Float values of a training graph whose last two dims are seq × seq.
int seq_by_seq_values(const onnx::ModelProto& training, int64_t seq) {
  const TaskGraph g = imported(training);
  int n = 0;
  for (const Value& v : g.values())
    if (v.shape_known && v.shape.size() >= 2 && v.shape.back() == seq && v.shape[v.shape.size() - 2] == seq &&
        (v.dtype == DType::kFloat32 || v.dtype == DType::kFloat64))
      ++n;
  return n;
}

TrainingGraph training_graph(const onnx::ModelProto& forward, bool fuse) {
  TrainingGraphOptions options;
  options.fuse_attention = fuse;
  return build_training_graph(forward, options);
}

std::map<std::string, Tensor> outputs_of(const TrainingGraph& tg, const std::map<std::string, Tensor>& inputs) {
  Executor exec(tg.model, {});
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : exec.run(inputs)) out[name] = t;
  return out;
}

// The fused graph's loss within 1e-5 relative of the unfused one's, each param gradient within 1e-4 of the largest
// entry of the unfused gradient (float32, normalised).
void expect_same_training(const onnx::ModelProto& forward, int64_t seq, int64_t vocab) {
  const TrainingGraph fused = training_graph(forward, true), plain = training_graph(forward, false);
  const auto inputs = gpt_inputs(2, seq, vocab);
  auto a = outputs_of(fused, inputs), b = outputs_of(plain, inputs);
  const double la = get(a.at(fused.loss_output), 0), lb = get(b.at(plain.loss_output), 0);
  EXPECT_NEAR(la, lb, 1e-5 * std::abs(lb));
  ASSERT_EQ(fused.gradients, plain.gradients);
  expect_same_gradients(plain.gradients, a, b, 1e-4);
}

TEST(AFusedAttention, ReplacesEachGptAttentionWithOneNodeSoThatNoSeqBySeqTensorIsLeft) {
  const onnx::ModelProto forward = models::build_zoo_model(small_gpt(16, 2, 48));  // head 24: no [16, 16] but scores
  onnx::ModelProto fused = forward;
  const AttentionFusion f = fuse_attention(fused, imported(forward));
  EXPECT_EQ(f.nodes.size(), 2u);
  int softmaxes = 0, attentions = 0;
  for (const auto& n : fused.graph().node()) {
    softmaxes += n.op_type() == "Softmax";
    if (n.op_type() != "Attention") continue;
    ++attentions;
    EXPECT_EQ(n.domain(), "ai.apart");  // the zoo writes opset 17
    EXPECT_EQ(n.input_size(), 3);       // the causal triangle became is_causal: no mask input
  }
  EXPECT_EQ(softmaxes, 0);
  EXPECT_EQ(attentions, 2);
  // Each Kᵀ's own Transpose became the one that gives K: as many Transposes as before, none left unread.
  auto transposes = [](const onnx::ModelProto& m) {
    return std::count_if(m.graph().node().begin(), m.graph().node().end(),
                         [](const onnx::NodeProto& n) { return n.op_type() == "Transpose"; });
  };
  EXPECT_EQ(transposes(fused), transposes(forward));
  EXPECT_GT(seq_by_seq_values(training_graph(forward, false).model, 16), 0);  // the oracle sees them unfused
  EXPECT_EQ(seq_by_seq_values(training_graph(forward, true).model, 16), 0);
}

TEST(AFusedAttention, TrainsGptToTheUnfusedGraphsLossAndGradientsOverSeveralTiles) {
  expect_same_training(models::build_zoo_model(small_gpt(80, 2, 32)), 80, 64);  // 2 key tiles, the second partial
}

TEST(AFusedAttention, TrainsOddSizesWithANonCausalMaskKeptAsAnInput) {
  onnx::ModelProto forward = models::build_zoo_model(small_gpt(7, 3, 15, 1));
  std::mt19937 rng(3);
  for (auto& n : *forward.mutable_graph()->mutable_node()) {  // the [7, 7] bool mask: random, the diagonal kept
    if (n.op_type() != "Constant" || n.attribute(0).t().data_type() != onnx::TensorProto::BOOL) continue;
    std::string raw(49, '\0');
    for (int i = 0; i < 49; ++i) raw[static_cast<size_t>(i)] = i % 8 != 0 && rng() % 3 == 0 ? 1 : 0;
    n.mutable_attribute(0)->mutable_t()->set_raw_data(raw);
  }
  onnx::ModelProto fused = forward;
  ASSERT_TRUE(fuse_attention(fused, imported(forward)).changed());
  bool masked = false;
  for (const auto& n : fused.graph().node()) masked = masked || (n.op_type() == "Attention" && n.input_size() == 4);
  EXPECT_TRUE(masked);
  expect_same_training(forward, 7, 64);
}

TEST(AFusedAttention, OfGptInFloat64MatchesFiniteDifferences) {
  const onnx::ModelProto forward = to_float64(models::build_zoo_model(small_gpt(8, 2, 16, 1)));
  const TrainingGraph tg = training_graph(forward, true);
  bool fused = false;
  for (const auto& n : tg.model.graph().node()) fused = fused || n.op_type() == "AttentionGrad";
  ASSERT_TRUE(fused);
  expect_gradients_match(tg, gpt_inputs(2, 8, 64), kDouble, 4);
}

TEST(AFusedAttention, LeavesAnAttentionWhoseWeightsAreReadElsewhereAsItIs) {
  onnx::ModelProto forward = models::build_zoo_model(small_gpt(8, 2, 16, 1));
  for (const auto& n : forward.graph().node())
    if (n.op_type() == "Softmax") {
      auto* o = forward.mutable_graph()->add_output();
      o->set_name(n.output(0));
      o->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    }
  onnx::ModelProto copy = forward;
  EXPECT_FALSE(fuse_attention(copy, imported(forward)).changed());
  EXPECT_EQ(copy.SerializeAsString(), forward.SerializeAsString());
}

}  // namespace
}  // namespace apart
