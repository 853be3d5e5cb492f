// The stage graph: nodes and edges from a plan, DOT with quoted names, apart.stagegraph/1 JSON.
#include <gtest/gtest.h>

#include "report/stage_graph.h"
#include "tests/report/report_test_util.h"

namespace {

using namespace apart::report;
namespace fs = std::filesystem;

class AStageGraph : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = apart::testing::fresh_temp_dir("graph");
    apart::testing::write_json(dir_ / "plan.json", apart::testing::three_stage_plan());
    graph_ = stage_graph(load_report_plan(dir_));
  }
  void TearDown() override { fs::remove_all(dir_); }
  const StageEdge* edge(const std::string& from, const std::string& to) const {
    for (const StageEdge& e : graph_.edges)
      if (e.from == from && e.to == to) return &e;
    return nullptr;
  }
  fs::path dir_;
  StageGraph graph_;
};

TEST_F(AStageGraph, HasOneNodePerStagePlusModelInputsAndOutputs) {
  ASSERT_EQ(graph_.nodes.size(), 5u);
  EXPECT_EQ(graph_.nodes.front().id, "inputs");
  EXPECT_EQ(graph_.nodes.back().id, "outputs");
  const StageNode& s0 = graph_.nodes[1];
  EXPECT_EQ(s0.id, "stage 0");
  EXPECT_EQ(s0.tasks, 3);
  EXPECT_EQ(s0.replicas, 2);
  EXPECT_EQ(s0.param_bytes, 1000);
  EXPECT_EQ(s0.first_layer, "wte");
  EXPECT_EQ(s0.last_layer, "h.0");
}

TEST_F(AStageGraph, HasOneEdgePerStagePairWithTheBytesOfItsValues) {
  ASSERT_NE(edge("stage 0", "stage 1"), nullptr);
  EXPECT_DOUBLE_EQ(edge("stage 0", "stage 1")->bytes, 1000);
  ASSERT_NE(edge("stage 0", "stage 2"), nullptr);  // the skip connection
  ASSERT_NE(edge("stage 1", "stage 2"), nullptr);
  EXPECT_DOUBLE_EQ(edge("stage 1", "stage 2")->bytes, 2000);
  ASSERT_NE(edge("inputs", "stage 2"), nullptr);
  EXPECT_EQ(edge("inputs", "stage 2")->values, std::vector<std::string>{"labels"});
  ASSERT_NE(edge("stage 2", "outputs"), nullptr);
  EXPECT_EQ(graph_.edges.size(), 6u);
}

TEST_F(AStageGraph, WritesDotWithQuotedNames) {
  const std::string dot = stage_graph_dot(graph_);
  EXPECT_EQ(dot.rfind("// apart viz", 0), 0u);
  EXPECT_NE(dot.find("digraph \"apart_stages\" {"), std::string::npos);
  EXPECT_NE(dot.find("\"stage 0\" -> \"stage 1\""), std::string::npos) << dot;
  EXPECT_NE(dot.find("\"stage 0\" -> \"stage 2\""), std::string::npos);
  EXPECT_NE(dot.find("\"inputs\" -> \"stage 0\""), std::string::npos);
  EXPECT_NE(dot.find("x0\\n1000 B"), std::string::npos) << dot;
}

TEST_F(AStageGraph, EscapesQuotesInValueNames) {
  graph_.edges[0].values = {"a\"b\\c"};
  EXPECT_NE(stage_graph_dot(graph_).find("a\\\"b\\\\c"), std::string::npos);
}

TEST_F(AStageGraph, WritesStageGraphJson) {
  const auto j = stage_graph_json(graph_);
  EXPECT_EQ(j["schema"], "apart.stagegraph/1");
  ASSERT_EQ(j["nodes"].size(), 5u);
  EXPECT_EQ(j["nodes"][1]["kind"], "stage");
  EXPECT_DOUBLE_EQ(j["nodes"][1]["time_s"].get<double>(), 0.003);
  EXPECT_EQ(j["edges"].size(), 6u);
  EXPECT_EQ(j["edges"][0]["from"], "inputs");
}

TEST(AFormatter, IsGraphUnits) {  // graph/units.h; its own tests in tests/graph/units_test.cpp
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1.5 * 1024 * 1024 * 1024), "1.50 GiB");
  EXPECT_EQ(format_count(167680), "167.68K");
  EXPECT_EQ(format_seconds(0.0012124), "1.212 ms");
  EXPECT_EQ(format_seconds(2.5), "2.500 s");
}

}  // namespace
