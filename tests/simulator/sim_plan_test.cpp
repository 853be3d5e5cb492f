// plan.json → SimPlan through plan/'s reader: what partition writes is read back; malformed plans get InvalidModel
// naming the field.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "graph/error.h"
#include "simulator/sim_plan.h"

namespace apart::sim {
namespace {

using json = nlohmann::json;

json valid_plan() {
  return json::parse(R"({
    "schema": "apart.plan/1",
    "cluster": {"devices": 4, "device": "a100-80gb", "devices_per_node": 2, "memory_bytes": 85899345920},
    "training": {"global_batch": 32, "microbatches": 4, "microbatch_size": 8, "schedule": "1f1b",
                 "optimizer": "adam", "precision": "fp32"},
    "stages": [
      {"id": 0, "replicas": 2, "devices": [0, 1], "tasks": ["a"], "forward_s": 0.001, "backward_s": 0.002,
       "recompute": false, "allreduce_s": 0.0005, "memory_bytes": 1000,
       "inputs": [{"value": "x", "from_stage": -1, "bytes": 64}],
       "outputs": [{"value": "h", "to_stages": [1], "bytes": 128}]},
      {"id": 1, "replicas": 2, "devices": [2, 3], "tasks": ["b"], "forward_s": 0.001, "backward_s": 0.003,
       "recompute": true, "allreduce_s": 0, "memory_bytes": 2000,
       "inputs": [{"value": "h", "from_stage": 0, "bytes": 128}],
       "outputs": [{"value": "y", "to_stages": [], "bytes": 4}]}],
    "predicted": {"iteration_s": 0.02, "bottleneck_stage": 1, "bubble_fraction": 0.2}
  })");
}

std::string error_of(const json& j) {
  try {
    plan_from_json(j, "p.json");
  } catch (const InvalidModel& e) {
    return e.what();
  }
  return "no error";
}

TEST(APlanReader, ReadsWhatPartitionWrites) {
  const SimPlan p = plan_from_json(valid_plan(), "p.json");
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.training.microbatches, 4);
  EXPECT_EQ(p.training.schedule, Schedule::k1F1B);
  EXPECT_EQ(p.stages[0].devices, (std::vector<int>{0, 1}));
  EXPECT_EQ(p.stages[1].inputs[0].from_stage, 0);
  EXPECT_DOUBLE_EQ(p.stages[1].inputs[0].bytes, 128);
  EXPECT_EQ(p.stages[0].outputs[0].to_stages, (std::vector<int>{1}));
  EXPECT_DOUBLE_EQ(*p.predicted_iteration_s, 0.02);
  // The a100-80gb preset's links; stages 0 and 1 sit on different nodes (2 devices per node).
  EXPECT_GT(p.cluster.intra_node.bandwidth, p.cluster.inter_node.bandwidth);
  EXPECT_FALSE(p.cluster.same_node(0, 2));
}

TEST(APlanReader, TakesTheRecomputedForwardOutOfBackward) {
  const SimPlan p = plan_from_json(valid_plan(), "p.json");
  EXPECT_DOUBLE_EQ(p.stages[0].backward_s, 0.002);
  EXPECT_NEAR(p.stages[1].backward_s, 0.002, 1e-15);  // 0.003 includes the recomputed 0.001 forward
  EXPECT_TRUE(p.stages[1].recompute);
}

TEST(APlanReader, ReadsEachStagesOptimizerStepAndZeroWherePlansBeforeItHaveNone) {
  json j = valid_plan();
  j["stages"][1]["optimizer_s"] = 0.004;
  const SimPlan p = plan_from_json(j, "p.json");
  EXPECT_EQ(p.stages[0].optimizer_s, 0);
  EXPECT_DOUBLE_EQ(p.stages[1].optimizer_s, 0.004);
  j["stages"][1]["optimizer_s"] = -1;
  EXPECT_NE(error_of(j).find("stages[1].optimizer_s"), std::string::npos) << error_of(j);
}

TEST(APlanReader, PrefersThePlansBandwidths) {
  json j = valid_plan();
  j["cluster"]["inter_node_bandwidth"] = 1e9;
  EXPECT_DOUBLE_EQ(plan_from_json(j).cluster.inter_node.bandwidth, 1e9);
}

TEST(APlanReader, NamesTheFieldOfAMalformedPlan) {
  struct Case {
    std::function<void(json&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["schema"] = "apart.plan/2"; }, "schema"},
      {[](json& j) { j.erase("stages"); }, "stages is missing"},
      {[](json& j) { j["stages"] = json::array(); }, "stages must hold at least one stage"},
      {[](json& j) { j["stages"][1].erase("forward_s"); }, "stages[1].forward_s"},
      {[](json& j) { j["stages"][0]["backward_s"] = -1; }, "stages[0].backward_s"},
      {[](json& j) { j["stages"][0]["forward_s"] = "fast"; }, "stages[0].forward_s"},
      {[](json& j) { j["stages"][1]["backward_s"] = 0.0005; }, "stages[1].backward_s"},  // < forward with recompute
      {[](json& j) { j["stages"][0]["devices"] = json::array({0}); }, "stages[0].devices"},
      {[](json& j) { j["stages"][1]["devices"][1] = 9; }, "stages[1].devices[1]"},
      {[](json& j) { j["stages"][1]["devices"][0] = 0; }, "also used by stage 0"},
      {[](json& j) { j["stages"][1]["id"] = 5; }, "stages[1].id"},
      {[](json& j) { j["stages"][0]["replicas"] = 0; }, "stages[0].replicas"},
      {[](json& j) { j["stages"][1]["inputs"][0]["from_stage"] = 1; }, "stages[1].inputs[0].from_stage"},
      {[](json& j) { j["stages"][0]["outputs"][0]["to_stages"] = json::array({0}); }, "stages[0].outputs[0].to_stages[0]"},
      {[](json& j) { j["stages"][0]["outputs"][0]["to_stages"] = json::array({7}); }, "stages[0].outputs[0].to_stages[0]"},
      {[](json& j) { j["training"]["microbatches"] = 0; }, "training.microbatches"},
      {[](json& j) { j["training"]["microbatches"] = 2.5; }, "training.microbatches"},
      {[](json& j) { j["training"]["schedule"] = "zb"; }, "training.schedule"},
      {[](json& j) { j["cluster"]["devices"] = "four"; }, "cluster.devices"},
      {[](json& j) { j.erase("cluster"); }, "cluster is missing"},
      {[](json& j) { j["stages"][0]["recompute"] = "yes"; }, "stages[0].recompute"},
  };
  for (const Case& c : cases) {
    json j = valid_plan();
    c.edit(j);
    const std::string message = error_of(j);
    EXPECT_NE(message.find(c.field), std::string::npos) << "expected '" << c.field << "' in: " << message;
    EXPECT_NE(message.find("p.json"), std::string::npos) << message;
  }
  EXPECT_NE(error_of(json::array()).find("JSON object"), std::string::npos);
}

TEST(APlanReader, ReportsUnreadableAndNonJsonFiles) {
  const auto dir = std::filesystem::temp_directory_path() / ("apart_sim_plan_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  // plan/'s reader: a path that is neither a plan directory nor a file is a bad argument (it names what to run).
  EXPECT_THROW(load_plan(dir / "missing.json"), InvalidArgument);
  EXPECT_THROW(load_plan(dir), InvalidArgument);  // a directory without plan.json
  std::ofstream(dir / "plan.json") << "{ not json";
  EXPECT_THROW(load_plan(dir), InvalidModel);
  std::ofstream(dir / "plan.json", std::ios::trunc) << valid_plan().dump();
  EXPECT_EQ(load_plan(dir).stages.size(), 2u);
  EXPECT_EQ(load_plan(dir / "plan.json").stages.size(), 2u);
  std::filesystem::remove_all(dir);
}

// Issue 11: finite but absurd figures ran the report out of memory and printed inf/-nan from simulate, exit 0.
TEST(APlanReader, RefusesFiguresPastTheDocumentedLimitsNamingTheFieldAndTheRange) {
  struct Case {
    std::function<void(json&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["stages"][0]["forward_s"] = 1e308; }, "stages[0].forward_s must be a finite number in [0, 32000000]"},
      {[](json& j) { j["stages"][1]["allreduce_s"] = 1e9; }, "stages[1].allreduce_s must be a finite number in [0, 32000000]"},
      {[](json& j) { j["stages"][0]["inputs"][0]["bytes"] = 1e300; }, "stages[0].inputs[0].bytes"},
      {[](json& j) { j["stages"][0]["memory_bytes"] = 1e300; }, "stages[0].memory_bytes must be an integer in [0, 1152921504606846976]"},
      {[](json& j) { j["training"]["microbatches"] = 1e9; }, "training.microbatches must be an integer in [1, 16777216]"},
      {[](json& j) { j["training"]["microbatches"] = 64; }, "more than training.global_batch 32"},
      {[](json& j) { j["training"]["virtual_stages"] = 1000000; }, "training.virtual_stages must be an integer in [1, 64]"},
      // 2^62 was "must be at least 1"; now the message gives the range and the value.
      {[](json& j) { j["cluster"]["devices"] = int64_t{1} << 62; },
       "cluster.devices must be an integer in [1, 1048576] (got 4611686018427387904)"},
      {[](json& j) { j["cluster"]["devices"] = 7.5; }, "cluster.devices must be an integer in [1, 1048576] (got 7.5)"},
      {[](json& j) { j["cluster"]["inter_node_bandwidth"] = 0; }, "cluster.inter_node_bandwidth must be a finite number in (0,"},
      {[](json& j) { j["stages"][0]["forward_s"] = "fast"; }, "stages[0].forward_s must be a finite number in [0, 32000000] (got a string)"},
      {[](json& j) { j["training"]["schedule"] = 3; }, "training.schedule must be a string (got a number)"},
  };
  for (const Case& c : cases) {
    json j = valid_plan();
    c.edit(j);
    const std::string message = error_of(j);
    EXPECT_NE(message.find(c.message), std::string::npos) << "expected '" << c.message << "' in: " << message;
  }
}

TEST(APlanReader, FallsBackToDocumentedLinksForAnUnknownDevice) {
  json j = valid_plan();
  j["cluster"]["device"] = "tpu-v9";
  const SimPlan p = plan_from_json(j);
  EXPECT_DOUBLE_EQ(p.cluster.intra_node.bandwidth, 300e9);
  EXPECT_DOUBLE_EQ(p.cluster.inter_node.bandwidth, 25e9);
  EXPECT_NE(p.links_source.find("unknown device"), std::string::npos);
}

}  // namespace
}  // namespace apart::sim
