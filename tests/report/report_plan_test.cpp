// Reading a plan directory for the report: layer grouping, optional files, and typed errors naming the field.
#include <gtest/gtest.h>

#include "graph/error.h"
#include "report/report_plan.h"
#include "tests/report/report_test_util.h"

namespace {

using apart::report::layer_of;
using apart::report::load_report_plan;
using nlohmann::json;
namespace fs = std::filesystem;

TEST(ALayerName, IsTheTaskNameUpToTheFirstIndexedScope) {
  EXPECT_EQ(layer_of("/h.3/attn/qkv/MatMul"), "h.3");
  EXPECT_EQ(layer_of("/blocks.0/mlp/0/Add"), "blocks.0");
  EXPECT_EQ(layer_of("/model/layers.12/self_attn/q_proj/MatMul"), "model/layers.12");
  EXPECT_EQ(layer_of("/encoder/block_2/Add"), "encoder/block_2");
}

TEST(ALayerName, FallsBackToTheFirstScopeOrTheTopLevel) {
  EXPECT_EQ(layer_of("/wte/Gather"), "wte");
  EXPECT_EQ(layer_of("/ln_f/ReduceMean_1"), "ln_f");
  EXPECT_EQ(layer_of("/Constant"), "(top level)");
  EXPECT_EQ(layer_of("MatMul_7"), "(top level)");
  EXPECT_EQ(layer_of(""), "(top level)");
  EXPECT_EQ(layer_of("//x//Add"), "x");
}

class AReportPlan : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = apart::testing::fresh_temp_dir("plan"); }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const json& plan) { apart::testing::write_json(dir_ / "plan.json", plan); }
  std::string error_of(const json& plan) {
    write(plan);
    try {
      load_report_plan(dir_);
    } catch (const apart::InvalidModel& e) {
      return e.what();
    }
    return "(no InvalidModel)";
  }
  fs::path dir_;
};

TEST_F(AReportPlan, ReadsStagesLayersAndPredictions) {
  write(apart::testing::three_stage_plan());
  const auto p = load_report_plan(dir_);
  ASSERT_EQ(p.stages.size(), 3u);
  EXPECT_EQ(p.device_memory_bytes, 80000000000);
  EXPECT_EQ(p.bottleneck_stage, 1);
  ASSERT_TRUE(p.compute_lower_bound_s.has_value());
  EXPECT_DOUBLE_EQ(*p.compute_lower_bound_s, 0.012);
  ASSERT_EQ(p.stages[0].layers.size(), 2u);
  EXPECT_EQ(p.stages[0].layers[0].layer, "wte");
  EXPECT_EQ(p.stages[0].layers[1].layer, "h.0");
  EXPECT_EQ(p.stages[0].layers[1].tasks, 2);
  EXPECT_EQ(p.stages[2].layers.back().layer, "lm_head");
  EXPECT_FALSE(p.baselines.has_value());
  EXPECT_FALSE(p.have_costs);
  EXPECT_EQ(p.sim.stages.size(), 3u);
}

// The dynamo exporter names nodes generically ("node_MatMul_3"); costs.json keeps the module path its metadata gave
// (Task::scope), and the layers are read from it.
TEST_F(AReportPlan, NamesTheLayersOfGenericallyNamedTasksByTheModulePathCostsJsonKeeps) {
  json plan = apart::testing::three_stage_plan();
  const std::vector<std::vector<std::string>> tasks = {{"node_Gather_0", "node_MatMul_1", "node_Add_2"},
                                                       {"node_MatMul_3", "node_Add_4", "node_MatMul_5"},
                                                       {"node_Add_6", "node_Add_7", "node_MatMul_8"}};
  const std::vector<std::string> scopes = {"/model/embed_tokens", "/model/layers.0/self_attn", "/model/layers.0/mlp",
                                           "/model/layers.1/self_attn", "/model/layers.1/mlp", "/model/layers.2/self_attn",
                                           "/model/layers.2/mlp", "/model/norm", "/lm_head"};
  json rows = json::array();
  for (size_t s = 0; s < 3; ++s) {
    plan["stages"][s]["tasks"] = tasks[s];
    for (size_t k = 0; k < 3; ++k)
      rows.push_back({{"name", tasks[s][k]}, {"op", "MatMul"}, {"constant", false}, {"forward_s", 0.001},
                      {"scope", scopes[3 * s + k]}});
  }
  write(plan);
  apart::testing::write_json(dir_ / "costs.json", {{"schema", "apart.costs/1"}, {"device", "a100-80gb"},
                                                   {"microbatch_size", 1}, {"source", "analytic"}, {"tasks", rows}});
  const auto p = load_report_plan(dir_);
  ASSERT_TRUE(p.have_costs);
  ASSERT_EQ(p.stages[0].layers.size(), 2u);
  EXPECT_EQ(p.stages[0].layers[0].layer, "model");  // embed_tokens: the first scope, as for /model/embed_tokens/Gather
  EXPECT_EQ(p.stages[0].layers[1].layer, "model/layers.0");
  EXPECT_EQ(first_layer(p.stages[1]), "model/layers.1");
  EXPECT_EQ(last_layer(p.stages[1]), "model/layers.2");
  EXPECT_EQ(p.stages[2].layers.back().layer, "lm_head");
}

TEST_F(AReportPlan, AcceptsThePlanJsonFileItself) {
  write(apart::testing::three_stage_plan());
  EXPECT_EQ(load_report_plan(dir_ / "plan.json").stages.size(), 3u);
}

TEST_F(AReportPlan, RejectsADirectoryWithoutPlanJsonAsAnInvalidArgument) {
  EXPECT_THROW(load_report_plan(dir_), apart::InvalidArgument);
  EXPECT_THROW(load_report_plan(dir_ / "missing"), apart::InvalidArgument);
}

TEST_F(AReportPlan, NamesTheMalformedField) {
  json plan = apart::testing::three_stage_plan();
  plan["stages"][0]["tasks"][1] = 7;
  EXPECT_NE(error_of(plan).find("stages[0].tasks[1] must be a string"), std::string::npos) << error_of(plan);

  plan = apart::testing::three_stage_plan();
  plan["stages"][2].erase("forward_s");
  EXPECT_NE(error_of(plan).find("stages[2].forward_s is missing"), std::string::npos);

  plan = apart::testing::three_stage_plan();
  plan["cluster"]["memory_bytes"] = "lots";
  EXPECT_NE(error_of(plan).find("cluster.memory_bytes"), std::string::npos);

  plan = apart::testing::three_stage_plan();
  plan["schema"] = "apart.plan/0";
  EXPECT_NE(error_of(plan).find("schema"), std::string::npos);

  plan = apart::testing::three_stage_plan();
  plan["stages"] = json::array();
  EXPECT_NE(error_of(plan).find("stages must hold at least one stage"), std::string::npos);
}

TEST_F(AReportPlan, RejectsTextThatIsNotJson) {
  std::ofstream(dir_ / "plan.json") << "{\"schema\": ";
  EXPECT_THROW(load_report_plan(dir_), apart::InvalidModel);
}

TEST_F(AReportPlan, ReadsBaselinesWhenRecorded) {
  write(apart::testing::three_stage_plan());
  apart::testing::write_json(dir_ / "baselines.json",
      {{"schema", "apart.baselines/1"},
       {"methods", {{{"method", "uniform"}, {"iteration_s", 0.03}, {"samples_per_s", 266.7}, {"feasible", true},
                     {"planning_s", 0.01}, {"peak_memory_bytes", 2e9}},
                    {{"method", "metis"}, {"feasible", false}, {"iteration_s", nullptr}}}}});
  const auto p = load_report_plan(dir_);
  ASSERT_TRUE(p.baselines.has_value());
  ASSERT_EQ(p.baselines->size(), 2u);
  EXPECT_EQ((*p.baselines)[0].method, "uniform");
  EXPECT_DOUBLE_EQ(*(*p.baselines)[0].iteration_s, 0.03);
  EXPECT_FALSE((*p.baselines)[1].feasible);
  EXPECT_FALSE((*p.baselines)[1].iteration_s.has_value());
}

TEST_F(AReportPlan, NamesTheMalformedBaselinesField) {
  write(apart::testing::three_stage_plan());
  apart::testing::write_json(dir_ / "baselines.json",
      {{"schema", "apart.baselines/1"}, {"methods", {{{"method", "uniform"}, {"iteration_s", -1}}}}});
  try {
    load_report_plan(dir_);
    FAIL() << "no error";
  } catch (const apart::InvalidModel& e) {
    EXPECT_NE(std::string(e.what()).find("baselines.json: methods[0].iteration_s"), std::string::npos) << e.what();
  }
}

TEST_F(AReportPlan, SumsLayerCostsFromCostsJson) {
  write(apart::testing::three_stage_plan());
  apart::testing::write_json(dir_ / "costs.json",
      {{"schema", "apart.costs/1"},
       {"microbatch_size", 1},
       {"tasks", {{{"name", "/h.0/attn/MatMul"}, {"forward_s", 0.25}, {"param_bytes", 100}},
                  {{"name", "/h.0/mlp/Add"}, {"forward_s", 0.5}, {"param_bytes", 20}}}}});
  const auto p = load_report_plan(dir_);
  EXPECT_TRUE(p.have_costs);
  EXPECT_DOUBLE_EQ(p.stages[0].layers[1].forward_s, 0.75);
  EXPECT_EQ(p.stages[0].layers[1].param_bytes, 120);
  EXPECT_DOUBLE_EQ(p.stages[0].layers[0].forward_s, 0.0);
}

}  // namespace
