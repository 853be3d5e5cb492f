// The kernel program of a training graph (codegen/kernel_program.h): the cost model prices the list it launches —
// the same launches, the same fusion groups, the same bytes — views launch nothing, and a GPT's largest tensor is
// smaller than one seq × seq tensor per head.
#include "codegen/kernel_program.h"

#include <gtest/gtest.h>

#include <cmath>

#include "codegen/autodiff.h"
#include "importer/importer.h"
#include "models/zoo.h"
#include "profiler/cost_model.h"
#include "profiler/device.h"
#include "profiler/fusion.h"

namespace apart {
namespace {

constexpr int64_t kBatch = 2, kSeq = 128, kHeads = 4;

// The zoo GPT's training graph as the executor imports it (shapes bound, Constant nodes kept).
const TaskGraph& gpt_training_graph() {
  static const ImportedModel step = [] {
    models::ZooOptions z = models::options_for("gpt-tiny");
    z.layers = 2, z.seq = kSeq, z.heads = kHeads, z.hidden = 32, z.vocab = 64, z.batch = kBatch;
    const TrainingGraph tg = build_training_graph(models::build_zoo_model(z));
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

}  // namespace
}  // namespace apart
