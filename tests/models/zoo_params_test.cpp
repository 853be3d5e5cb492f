// Parameter counts: each family's closed form against published sizes, and the generated graph against the closed form.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>

#include "graph/error.h"
#include "models/zoo.h"
#include "tests/models/zoo_test_util.h"

namespace apart::models {
namespace {

using testing::initializer_elements;

int64_t preset_params(const std::string& name) { return closed_form_params(options_for(name)); }

void expect_within(double actual, double expected, double rel) {
  EXPECT_LE(std::abs(actual - expected), rel * expected) << actual << " vs " << expected;
}

// Builds the preset's graph with shapes only (cheap even at 175B) and counts its initializers.
int64_t generated_params(const std::string& name) {
  ZooOptions o = options_for(name);
  o.weights = WeightsMode::kNone;
  return initializer_elements(build_zoo_model(o));
}

TEST(AGptGenerator, CountsGpt3_175bParamsAsClosedForm) {
  expect_within(static_cast<double>(preset_params("gpt3-175b")), 174.6e9, 0.005);
  EXPECT_EQ(generated_params("gpt3-175b"), preset_params("gpt3-175b"));
}

TEST(AGptGenerator, MatchesHuggingFaceGpt2SmallCountExactly) {
  EXPECT_EQ(preset_params("gpt2-small"), 124'439'808);  // GPT2LMHeadModel, tied head
  EXPECT_EQ(generated_params("gpt2-small"), 124'439'808);
}

TEST(ABertGenerator, CountsBertLargeNear335M) {
  expect_within(static_cast<double>(preset_params("bert-large")), 335e6, 0.01);
  EXPECT_EQ(generated_params("bert-large"), preset_params("bert-large"));
}

TEST(ABertGenerator, ScalesTheRannCConfigsToBillions) {
  expect_within(static_cast<double>(preset_params("bert-1.3b")), 1.3e9, 0.03);
  expect_within(static_cast<double>(preset_params("bert-4.9b")), 4.9e9, 0.02);
}

TEST(AT5Generator, MatchesHuggingFaceT5SmallAndBaseCounts) {
  EXPECT_EQ(preset_params("t5-small"), 60'506'624);
  EXPECT_EQ(preset_params("t5-base"), 222'903'552);
  expect_within(static_cast<double>(preset_params("t5-11b")), 11.3e9, 0.01);
}

TEST(AResnetGenerator, MatchesTorchvisionCountsExactly) {
  EXPECT_EQ(preset_params("resnet50"), 25'557'032);
  EXPECT_EQ(preset_params("resnet101"), 44'549'160);
  EXPECT_EQ(preset_params("resnet152"), 60'192'808);
  expect_within(static_cast<double>(preset_params("resnet50")), 25.6e6, 0.01);
}

TEST(AResnetGenerator, WidensResnet152ToAbout3_7B) {
  expect_within(static_cast<double>(preset_params("resnet152x8")), 3.7e9, 0.02);
}

TEST(AZooGenerator, EmitsExactlyTheClosedFormParamsForEveryPreset) {
  for (const auto& p : zoo_presets()) {
    SCOPED_TRACE(p.name);
    EXPECT_EQ(generated_params(p.name), closed_form_params(p.options));
  }
}

TEST(AZooGenerator, EmitsTheClosedFormForResizedFamilies) {
  ZooOptions o = options_for("t5");
  o.layers = 3;
  o.hidden = 96;
  o.heads = 4;
  o.head_dim = 40;  // inner width 160 != hidden, as in t5-3b
  o.ffn = 200;
  o.weights = WeightsMode::kNone;
  EXPECT_EQ(initializer_elements(build_zoo_model(o)), closed_form_params(o));
  o = options_for("bert");
  o.seq = 700;  // more positions than the 512-row default table
  o.weights = WeightsMode::kNone;
  EXPECT_EQ(initializer_elements(build_zoo_model(o)), closed_form_params(o));
  o = options_for("mlp");
  o.layers = 7;
  o.hidden = 33;
  EXPECT_EQ(initializer_elements(build_zoo_model(o)), 7 * (33 * 33 + 33));
}

TEST(AZooPresetTable, DefaultsToShapesOnlyAbove1BParams) {
  EXPECT_EQ(options_for("gpt3-175b").weights, WeightsMode::kNone);
  EXPECT_EQ(options_for("gpt2-xl").weights, WeightsMode::kNone);
  EXPECT_EQ(options_for("gpt2-small").weights, WeightsMode::kRandom);
  EXPECT_EQ(options_for("gpt-tiny").loss, Loss::kCrossEntropy);
  EXPECT_EQ(options_for("mlp-tiny").loss, Loss::kMse);
}

TEST(AZooPresetTable, RejectsAnUnknownNameListingTheKnownOnes) {
  try {
    options_for("gpt4");
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("gpt3-175b"), std::string::npos) << e.what();
  }
}

void expect_rejected(const ZooOptions& o, const std::string& flag) {
  try {
    o.validate();
    FAIL() << "accepted; expected an error naming " << flag;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
  }
}

TEST(AZooOptions, RejectsBadValuesNamingTheFlag) {
  ZooOptions o = options_for("gpt");
  o.heads = 3;  // does not divide 64
  expect_rejected(o, "--heads");
  o = options_for("gpt");
  o.layers = 0;
  expect_rejected(o, "--layers");
  o = options_for("gpt");
  o.seq = 100000;  // the causal mask would not fit one message
  expect_rejected(o, "--seq");
  o = options_for("resnet");
  o.layers = 34;
  expect_rejected(o, "--layers");
  o = options_for("resnet");
  o.dtype = FloatType::kBf16;
  expect_rejected(o, "--dtype");
  o = options_for("t5");
  o.layernorm = LayerNormStyle::kFused;
  expect_rejected(o, "--layernorm");
  o = options_for("bert");
  o.vocab = 1;
  expect_rejected(o, "--vocab");
}

}  // namespace
}  // namespace apart::models
