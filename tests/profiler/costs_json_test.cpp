// apart.costs/1: round trip, and the errors a wrong file gets.
#include "profiler/costs_json.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "graph/error.h"
#include "profiler/cost_model.h"
#include "tests/profiler/graph_builder.h"

namespace apart {
namespace {

TaskGraph& two_layer(testing::GraphBuilder& b) {
  auto x = b.input("x", {4, 8});
  auto w = b.param("w", {8, 8});
  auto h = b.value("h", {4, 8});
  auto y = b.value("y", {4, 8});
  b.task("MatMul", {x, w}, {h});
  b.task("Tanh", {h}, {y});
  return b.finish();
}

TEST(CostsJson, RoundTripsEveryField) {
  testing::GraphBuilder b;
  TaskGraph& g = two_layer(b);
  const CostTable t = estimate_costs(g, device_preset("v100-32gb"));
  const auto path = std::filesystem::temp_directory_path() / ("apart_costs_" + std::to_string(getpid()) + ".json");
  write_costs_json(path, g, t);
  const CostTable r = read_costs_json(path, g);
  std::filesystem::remove(path);
  EXPECT_EQ(r.device, "v100-32gb");
  EXPECT_EQ(r.microbatch_size, 4);
  ASSERT_EQ(r.tasks.size(), t.tasks.size());
  for (size_t i = 0; i < t.tasks.size(); ++i) {
    EXPECT_DOUBLE_EQ(r.tasks[i].forward_s, t.tasks[i].forward_s);
    EXPECT_DOUBLE_EQ(r.tasks[i].backward_s, t.tasks[i].backward_s);
    EXPECT_DOUBLE_EQ(r.tasks[i].flops, t.tasks[i].flops);
    EXPECT_EQ(r.tasks[i].saved_bytes, t.tasks[i].saved_bytes);
    EXPECT_EQ(r.tasks[i].param_bytes, t.tasks[i].param_bytes);
    EXPECT_EQ(r.tasks[i].output_bytes, t.tasks[i].output_bytes);
  }
  const auto j = costs_to_json(g, t);
  EXPECT_EQ(j["schema"], "apart.costs/1");
  EXPECT_EQ(j["tasks"][0]["name"], g.task(TaskId(0)).name);
  EXPECT_EQ(j["tasks"][0]["op"], "MatMul");
}

TEST(CostsJson, RejectsFilesOfAnotherModelOrSchema) {
  testing::GraphBuilder b;
  TaskGraph& g = two_layer(b);
  auto j = costs_to_json(g, estimate_costs(g, device_preset("a100-40gb")));
  auto wrong_schema = j;
  wrong_schema["schema"] = "apart.costs/9";
  EXPECT_THROW(costs_from_json(wrong_schema, g), InvalidArgument);
  auto missing = j;
  missing["tasks"].erase(1);
  EXPECT_THROW(costs_from_json(missing, g), InvalidArgument);
  auto stranger = j;
  stranger["tasks"][0]["name"] = "not_in_the_model";
  EXPECT_THROW(costs_from_json(stranger, g), InvalidArgument);
  auto negative = j;
  negative["tasks"][0]["forward_s"] = -1;
  EXPECT_THROW(costs_from_json(negative, g), InvalidArgument);
  EXPECT_THROW(read_costs_json("/nonexistent/costs.json", g), SystemError);
}

TEST(CostsJson, LeavesNoPartialFileWhenTheDirectoryIsMissing) {
  testing::GraphBuilder b;
  TaskGraph& g = two_layer(b);
  EXPECT_THROW(write_costs_json("/nonexistent_dir/costs.json", g, estimate_costs(g, device_preset("a100-40gb"))),
               SystemError);
}

}  // namespace
}  // namespace apart
