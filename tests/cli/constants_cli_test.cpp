// --constants-as-params on|off on the commands that import a model, and the one note it gives (a paddle2onnx-style
// model: weights as Constant nodes, opset 11, batch dim p2o.DynamicDimension.0).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/support/exporter_models.h"
#include "tests/support/run_apart.h"

namespace apart {
namespace {

using testing::run_apart;
using testing::TempDir;

constexpr const char* kNote = "apart: note: 5 Constant nodes feed weight slots";

std::string paddle_model(const TempDir& dir) {
  const auto path = dir.file("paddle.onnx");
  testing::paddle_style_model(11).save(path);
  return path.string();
}

TEST(TheConstantsAsParamsFlag, OnByDefaultMakesInspectCountTheConstantWeightsWithOneNote) {
  TempDir dir;
  const std::string model = paddle_model(dir);
  const auto json = run_apart("inspect " + model + " --json", /*with_stderr=*/false);
  ASSERT_EQ(json.code, 0) << json.out;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["params"], testing::kPaddleParams);
  EXPECT_EQ(j["param_bytes"], testing::kPaddleParamBytes);
  EXPECT_EQ(j["constant_params"]["count"], 5);
  EXPECT_EQ(j["constant_params"]["bytes"], testing::kPaddleParamBytes);
  for (const std::string flag : {"", " --constants-as-params on"}) {
    const auto text = run_apart("inspect " + model + flag);
    ASSERT_EQ(text.code, 0) << text.out;
    const size_t note = text.out.find(kNote);
    EXPECT_NE(note, std::string::npos) << text.out;
    EXPECT_EQ(text.out.find(kNote, note + 1), std::string::npos) << "one note only:\n" << text.out;
    EXPECT_NE(text.out.find("944 bytes"), std::string::npos) << text.out;
  }
}

TEST(TheConstantsAsParamsFlag, OffImportsTheConstantsAsBeforeWithoutANote) {
  TempDir dir;
  const std::string model = paddle_model(dir);
  const auto json = run_apart("inspect " + model + " --json --constants-as-params off", /*with_stderr=*/false);
  ASSERT_EQ(json.code, 0) << json.out;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["params"], 0);
  EXPECT_EQ(j["param_bytes"], 0);
  const auto text = run_apart("inspect " + model + " --constants-as-params off");
  EXPECT_EQ(text.out.find("apart: note:"), std::string::npos) << text.out;
}

TEST(TheConstantsAsParamsFlag, RefusesAValueOtherThanOnOrOff) {
  TempDir dir;
  const auto r = run_apart("inspect " + paddle_model(dir) + " --constants-as-params yes");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--constants-as-params must be on or off"), std::string::npos) << r.out;
}

TEST(TheConstantsAsParamsFlag, LetsTrainTrainTheConstantWeights) {
  TempDir dir;
  const std::string model = paddle_model(dir);
  const auto on = run_apart("train " + model + " --steps 3 --batch 2 -q");
  ASSERT_EQ(on.code, 0) << on.out;
  EXPECT_NE(on.out.find(kNote), std::string::npos) << on.out;
  EXPECT_NE(on.out.find("trained 236 params (5 tensors)"), std::string::npos) << on.out;
  const auto off = run_apart("train " + model + " --steps 3 --batch 2 -q --constants-as-params off");
  EXPECT_NE(off.code, 0) << off.out;
  EXPECT_NE(off.out.find("no float initializers to train"), std::string::npos) << off.out;
}

TEST(TheConstantsAsParamsFlag, GoesIntoThePlanAndItsStageFiles) {
  TempDir dir;
  const std::string model = paddle_model(dir);
  for (const std::string value : {"on", "off"}) {
    const auto plan = dir.file("plan_" + value);
    const auto r = run_apart("partition " + model + " --devices 2 --device cpu --batch 8 -q -o " + plan.string() +
                             " --constants-as-params " + value);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(r.out.find(kNote) != std::string::npos, value == "on") << r.out;
    const auto j = nlohmann::json::parse(testing::read_file(plan / "plan.json"));
    EXPECT_EQ(j["model"]["params"], value == "on" ? testing::kPaddleParams : 0);
    EXPECT_EQ(j["model"]["constants_as_params"], value == "on");
    // The stage files hold the weights as initializers (on) or Constant nodes (off).
    int initializers = 0, constants = 0;
    for (int k = 0; std::filesystem::exists(plan / ("stage_" + std::to_string(k) + ".onnx")); ++k) {
      onnx::ModelProto stage;
      ASSERT_TRUE(stage.ParseFromString(testing::read_file(plan / ("stage_" + std::to_string(k) + ".onnx"))));
      initializers += stage.graph().initializer_size();
      for (const auto& n : stage.graph().node()) constants += n.op_type() == "Constant";
    }
    EXPECT_EQ(initializers, value == "on" ? 5 : 0);
    EXPECT_GE(constants, value == "on" ? 1 : 6);
  }
}

}  // namespace
}  // namespace apart
