// apart.costs/1: round trip, and the errors a wrong file gets.
#include "plan/costs_json.h"

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
  CostOptions bound;
  bound.reference_batch = 4;  // the batch two_layer is built at
  const CostTable t = estimate_costs(g, device_preset("v100-32gb"), bound);
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

std::string error_of(const nlohmann::json& j, const TaskGraph& g) {
  try {
    costs_from_json(j, g, "c.json");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

// Issue 11: forward_s = 1e308 reached partition as a finite cost; saved_bytes = 1e300 went through an undefined
// double → int64 conversion to a negative stage memory that "fit"; a wrong type gave nlohmann's message.
TEST(CostsJson, RefusesFiguresPastTheDocumentedLimitsNamingTaskFieldAndRange) {
  testing::GraphBuilder b;
  TaskGraph& g = two_layer(b);
  const auto j = costs_to_json(g, estimate_costs(g, device_preset("a100-40gb")));
  const std::string task = j["tasks"][0]["name"];
  auto huge_time = j;
  huge_time["tasks"][0]["forward_s"] = 1e308;
  EXPECT_NE(error_of(huge_time, g).find("c.json: tasks[0] ('" + task + "').forward_s must be a finite number in [0, 32000000] (got 1e+308)"),
            std::string::npos) << error_of(huge_time, g);
  auto huge_bytes = j;
  huge_bytes["tasks"][0]["saved_bytes"] = 1e300;
  EXPECT_NE(error_of(huge_bytes, g).find("saved_bytes must be a finite number in [0, 1152921504606846976]"), std::string::npos)
      << error_of(huge_bytes, g);
  auto summed = j;  // each under 2^60, together past it: stage sums would overflow
  summed["tasks"][0]["saved_bytes"] = 1e18;
  summed["tasks"][1]["saved_bytes"] = 1e18;
  EXPECT_NE(error_of(summed, g).find("past 2^60 bytes"), std::string::npos) << error_of(summed, g);
  auto wrong_type = j;
  wrong_type["device"] = 5;
  EXPECT_NE(error_of(wrong_type, g).find("c.json: device must be a string (got a number)"), std::string::npos)
      << error_of(wrong_type, g);
  auto fraction = j;
  fraction["microbatch_size"] = 7.5;
  EXPECT_NE(error_of(fraction, g).find("microbatch_size must be an integer in [1, 16777216] (got 7.5)"), std::string::npos)
      << error_of(fraction, g);
}

TEST(CostsJson, LeavesNoPartialFileWhenTheDirectoryIsMissing) {
  testing::GraphBuilder b;
  TaskGraph& g = two_layer(b);
  EXPECT_THROW(write_costs_json("/nonexistent_dir/costs.json", g, estimate_costs(g, device_preset("a100-40gb"))),
               SystemError);
}

}  // namespace
}  // namespace apart
