// The kernel program of a training graph (codegen/kernel_program.h): the cost model prices the list it launches —
// the same launches, the same fusion groups, the same bytes — views launch nothing, and a GPT's largest tensor is
// smaller than one seq × seq tensor per head.
#include "codegen/kernel_program.h"

#include <gtest/gtest.h>

#include <cmath>

#include "codegen/autodiff.h"
#include "importer/importer.h"
#include "models/zoo.h"
#include "profiler/attention_pattern.h"
#include "profiler/cost_model.h"
#include "profiler/device.h"
#include "profiler/fusion.h"

namespace apart {
namespace {

constexpr int64_t kBatch = 2, kSeq = 128, kHeads = 4;

// The zoo GPT's training graph as the executor imports it (shapes bound, Constant nodes kept).
models::ZooOptions small_gpt() {
  models::ZooOptions z = models::options_for("gpt-tiny");
  z.layers = 2, z.seq = kSeq, z.heads = kHeads, z.hidden = 32, z.vocab = 64, z.batch = kBatch;
  return z;
}

const TaskGraph& gpt_training_graph() {
  static const ImportedModel step = [] {
    const TrainingGraph tg = build_training_graph(models::build_zoo_model(small_gpt()));
    ImportOptions as_given;
    as_given.constants_as_params = false;
    return import_model_bytes(tg.model.SerializeAsString(), {}, "gpt", as_given);
  }();
  return step.graph;
}

TEST(AKernelProgram, LaunchesWhatTheCostModelPricesWithAndWithoutFusion) {
  const TaskGraph& g = gpt_training_graph();
  for (const char* name : {"cpu", "h100-80gb"}) {
    const Device device = device_preset(name);
    const KernelProgram p = lower_to_kernels(g, {device.fuses_elementwise});
    const StepPrice priced = price_training_step(g, device, Precision::kFp32);
    EXPECT_EQ(p.totals.launches, priced.launches) << name;
    EXPECT_NEAR(p.totals.bytes, priced.bytes, 1e-9 * priced.bytes) << name;
    EXPECT_NEAR(p.totals.flops, priced.flops, 1e-9 * priced.flops) << name;
    const StepPrice mixed = price_training_step(g, device, Precision::kMixed);
    EXPECT_NEAR(mixed.bytes, 0.5 * priced.bytes, 1e-9 * priced.bytes) << name;
  }
}

TEST(AKernelProgram, FusesExactlyTheGroupsTheCostModelPrices) {
  const TaskGraph& g = gpt_training_graph();
  const FusionGroups groups = find_fusion_groups(g);
  const KernelProgram p = lower_to_kernels(g, {true});
  std::vector<std::vector<TaskId>> fused;
  for (const ProgramKernel& k : p.kernels)
    if (k.tasks.size() > 1) fused.push_back(k.tasks);
  std::vector<std::vector<TaskId>> priced;
  const std::vector<bool> run = tasks_run_each_step(g);
  for (const auto& members : groups.groups)
    if (run[members.front().value()]) priced.push_back(members);
  ASSERT_FALSE(priced.empty());
  EXPECT_EQ(fused, priced);
  EXPECT_LT(p.totals.launches, lower_to_kernels(g, {false}).totals.launches);
}

TEST(AKernelProgram, TotalsAreTheSumsOfItsKernelsAndViewsLaunchNothing) {
  const TaskGraph& g = gpt_training_graph();
  const KernelProgram p = lower_to_kernels(g, {});
  int64_t launches = 0, views = 0;
  double bytes = 0, flops = 0;
  for (const ProgramKernel& k : p.kernels) {
    launches += k.launch ? 1 : 0;
    bytes += k.bytes_read + k.bytes_written;
    flops += k.flops;
    if (k.launch) continue;
    EXPECT_EQ(k.bytes_read + k.bytes_written, 0) << k.name;
    const Task& t = g.task(k.tasks.front());
    if (t.op_type == "Reshape") {
      ++views;
      EXPECT_TRUE(p.alias[k.tasks.front().value()]);
    }
  }
  EXPECT_GT(views, 0);
  EXPECT_EQ(p.totals.launches, launches);
  EXPECT_DOUBLE_EQ(p.totals.bytes, bytes);
  EXPECT_DOUBLE_EQ(p.totals.flops, flops);
  EXPECT_DOUBLE_EQ(p.totals.fp32_activation_fraction, 1.0);  // the runtime stores float32
}

TEST(AKernelProgram, OfAGptHoldsNoTensorAsLargeAsOneSeqBySeqScorePerHead) {
  const KernelProgram p = lower_to_kernels(gpt_training_graph(), {});
  EXPECT_GT(p.totals.largest_tensor_bytes, 0);
  EXPECT_LT(p.totals.largest_tensor_bytes, kSeq * kSeq * 4 * kHeads * kBatch);
  int attention = 0;
  for (const ProgramKernel& k : p.kernels)
    attention += k.name == "ai.apart.Attention" || k.name == "ai.apart.AttentionGrad";
  EXPECT_EQ(attention, 4);  // two layers, forward and backward
}

// The same GPT's forward graph as the planner imports it (the compile path's import options).
const TaskGraph& gpt_forward_graph() {
  static const ImportedModel forward =
      import_model_bytes(models::build_zoo_model(small_gpt()).SerializeAsString(), {}, "gpt", {});
  return forward.graph;
}

CostTable planned_costs(const Device& device) {
  CostOptions o;
  o.reference_batch = kBatch;
  return estimate_costs(gpt_forward_graph(), device, o);
}

// The planner prices each attention of the forward graph (profiler/attention_pattern.h) as exactly the
// ai.apart.Attention and ai.apart.AttentionGrad kernels the program lists: launches, bytes and FLOPs.
TEST(AKernelProgram, ListsForEachAttentionTheKernelsThePlannerPrices) {
  const std::vector<AttentionMatch> attention = find_attention(gpt_forward_graph());
  ASSERT_EQ(attention.size(), 2u);  // two layers
  for (const char* name : {"cpu", "h100-80gb"}) {
    const Device device = device_preset(name);
    const CostTable table = planned_costs(device);
    StepPrice planned;
    for (const AttentionMatch& m : attention)
      for (TaskId t : m.tasks) {
        const TaskCost& c = table.tasks[t.value()];
        planned.launches += c.launches;
        planned.bytes += c.bytes_accessed + c.backward_bytes;
        planned.flops += c.flops + c.backward_flops;
      }
    StepPrice listed;
    for (const ProgramKernel& k : lower_to_kernels(gpt_training_graph(), {device.fuses_elementwise}).kernels)
      if (k.name == "ai.apart.Attention" || k.name == "ai.apart.AttentionGrad") {
        listed.launches += k.launch ? 1 : 0;
        listed.bytes += k.bytes_read + k.bytes_written;
        listed.flops += k.flops;
      }
    EXPECT_EQ(planned.launches, listed.launches) << name;
    EXPECT_NEAR(planned.bytes, listed.bytes, 1e-9 * listed.bytes) << name;
    EXPECT_NEAR(planned.flops, listed.flops, 1e-9 * listed.flops) << name;
  }
}

// The planner's whole step (estimate_costs of the forward graph, price_planned_step) against the program of its
// training graph. FLOPs agree within 3 %; launches and bytes within 35 %: the planner prices a backward per forward
// op by its rule (one pass for a Mul, a Div, a ReduceMean's gradient), while autodiff writes the gradients of the
// zoo's primitive LayerNorm, GELU and loss as several ops each. Measured: cpu 190 launches and 21.2 MB planned
// against 279 and 27.0 MB listed; h100-80gb (fused groups) 62 and 8.6 MB against 90 and 12.5 MB; FLOPs 70.3 M
// against 71.7 M. (Before attention was priced fused, the planner priced seq × seq scores it never runs.)
TEST(AKernelProgram, AndThePlannersWholeStepAgreeWithinAStatedToleranceOnAGpt) {
  for (const char* name : {"cpu", "h100-80gb"}) {
    const Device device = device_preset(name);
    const StepPrice planned = price_planned_step(gpt_forward_graph(), planned_costs(device));
    const KernelProgramTotals listed = lower_to_kernels(gpt_training_graph(), {device.fuses_elementwise}).totals;
    EXPECT_NEAR(static_cast<double>(planned.launches), static_cast<double>(listed.launches),
                0.35 * static_cast<double>(listed.launches))
        << name;
    EXPECT_NEAR(planned.bytes, listed.bytes, 0.35 * listed.bytes) << name;
    EXPECT_NEAR(planned.flops, listed.flops, 0.03 * listed.flops) << name;
  }
}

}  // namespace
}  // namespace apart
