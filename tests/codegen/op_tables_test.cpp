// The three op tables cannot drift: every op the CPU runtime runs is costed by the profiler and is either
// differentiated by autodiff or listed as forward-only.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "codegen/autodiff.h"
#include "profiler/op_work.h"
#include "runtime/executor.h"

namespace apart {
namespace {

std::string join(const std::vector<std::string>& ops) {
  std::string s;
  for (const auto& op : ops) s += (s.empty() ? "" : ", ") + op;
  return s;
}

TEST(EveryOpWithACpuKernel, HasACostRule) {
  std::vector<std::string> missing;
  for (const std::string& op : runtime_supported_ops())
    if (!has_cost_rule(op)) missing.push_back(op);
  EXPECT_TRUE(missing.empty()) << "ops with a kernel but no cost rule (profiler/op_work.cpp): " << join(missing);
}

TEST(EveryOpWithACpuKernel, HasAGradientRuleOrIsListedAsForwardOnly) {
  const auto& forward_only = forward_only_ops();
  std::vector<std::string> missing;
  for (const std::string& op : runtime_supported_ops())
    if (!has_gradient_rule(op) && std::find(forward_only.begin(), forward_only.end(), op) == forward_only.end())
      missing.push_back(op);
  EXPECT_TRUE(missing.empty()) << "ops with a kernel but neither a gradient rule (codegen/gradients/) nor a place "
                                  "in forward_only_ops(): "
                               << join(missing);
}

TEST(TheForwardOnlyList, NamesOnlyOpsTheRuntimeRunsAndNoOpWithAGradientRule) {
  const std::vector<std::string> kernels = runtime_supported_ops();
  for (const std::string& op : forward_only_ops()) {
    EXPECT_NE(std::find(kernels.begin(), kernels.end(), op), kernels.end()) << op << " has no CPU kernel";
    EXPECT_FALSE(has_gradient_rule(op)) << op << " is listed as forward-only but has a gradient rule";
  }
}

}  // namespace
}  // namespace apart
