// The --method dispatch above the phases (partition/methods.h): every method's plan on small models is the one the
// search gave before partition_graph became a script of phases, and apart goes through partition_graph.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "graph/error.h"
#include "partition/methods.h"
#include "plan_fingerprint.h"
#include "random_models.h"

namespace apart {
namespace {

// What partition_graph (which then dispatched on the method itself) gave at commit 11318e9 for
// method_cases() × kAllMethods, one line each, by plan_fingerprint.
constexpr const char* kPlansBeforeThePhaseScript = R"(EXPECTED
)";

std::string fingerprint_of(const testing::MethodCase& c, Method method) {
  const auto model = testing::random_model(c.seed, c.tasks, c.chain);
  try {
    return testing::plan_fingerprint(
        partition_by_method(model.graph, model.costs, testing::method_case_options(c, method)));
  } catch (const Infeasible& e) {
    return std::string("infeasible: ") + e.what();
  }
}

TEST(TheMethodDispatch, GivesEveryMethodThePlanItGaveBeforeThePhaseScript) {
  std::istringstream expected(kPlansBeforeThePhaseScript);
  std::string line;
  for (const auto& c : testing::method_cases())
    for (Method method : kAllMethods) {
      ASSERT_TRUE(std::getline(expected, line));
      EXPECT_EQ(fingerprint_of(c, method), line) << "seed " << c.seed << ", --method " << method_name(method);
    }
}

TEST(TheMethodDispatch, RunsApartThroughPartitionGraph) {
  const testing::MethodCase c = testing::method_cases().front();
  const auto model = testing::random_model(c.seed, c.tasks, c.chain);
  const PartitionOptions o = testing::method_case_options(c, Method::kApart);
  EXPECT_EQ(testing::plan_fingerprint(partition_by_method(model.graph, model.costs, o)),
            testing::plan_fingerprint(partition_graph(model.graph, model.costs, o)));
}

TEST(PartitionGraph, RunsOnlyApartsOwnMethod) {
  const testing::MethodCase c = testing::method_cases().front();
  const auto model = testing::random_model(c.seed, c.tasks, c.chain);
  EXPECT_ANY_THROW(partition_graph(model.graph, model.costs, testing::method_case_options(c, Method::kUniform)));
}

}  // namespace
}  // namespace apart
