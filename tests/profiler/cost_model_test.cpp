// Backward rules, saved values, roofline, batch scaling and determinism of the analytic cost model.
#include "profiler/cost_model.h"

#include <gtest/gtest.h>

#include "tests/profiler/graph_builder.h"

namespace apart {
namespace {

using testing::GraphBuilder;
using testing::ints_attr;

Device test_device() {
  Device d = device_preset("a100-80gb");
  return d;
}

// x[8,64] → MatMul(W[64,32]) → Relu → Add(b) → y ; plus a constant Transpose of a param.
struct SmallMlp {
  GraphBuilder b;
  TaskId matmul, relu, add, constant_transpose;
  ValueId x, h, r, y;
  SmallMlp() {
    x = b.input("x", {8, 64});
    auto w = b.param("w", {64, 32});
    auto w2 = b.param("w2", {32, 32});
    auto w2t = b.value("w2t", {32, 32});
    auto bias = b.param("bias", {32});
    h = b.value("h", {8, 32});
    r = b.value("r", {8, 32});
    y = b.value("y", {8, 32});
    constant_transpose = b.task("Transpose", {w2}, {w2t});
    matmul = b.task("MatMul", {x, w}, {h});
    relu = b.task("Relu", {h}, {r});
    add = b.task("Add", {r, bias}, {y});
    b.finish();
  }
};

TEST(Roofline, TakesTheSlowerOfComputeAndMemoryPlusOverhead) {
  const OpEfficiency eff{0.5, 0.25};
  // 1e12 FLOP at 1e13·0.5 = 0.2 s; 1e9 B at 1e11·0.25 = 0.04 s.
  EXPECT_DOUBLE_EQ(roofline_time(1e12, 1e9, 1e13, 1e11, eff, 1e-6), 0.2 + 1e-6);
  EXPECT_DOUBLE_EQ(roofline_time(1e9, 1e11, 1e13, 1e11, eff, 0), 4.0);
  EXPECT_DOUBLE_EQ(roofline_time(0, 0, 1e13, 1e11, eff, 1e-6), 0.0);
}

TEST(BackwardWork, CountsInputAndWeightGradientsAsTwiceTheForwardMatMul) {
  GraphBuilder b;
  auto x = b.input("x", {8, 64});
  auto w = b.param("w", {64, 32});
  auto h = b.value("h", {8, 32});
  auto w2 = b.param("w2", {32, 16});
  auto y = b.value("y", {8, 16});
  auto first = b.task("MatMul", {x, w}, {h});
  auto second = b.task("MatMul", {h, w2}, {y});
  auto& g = b.finish();
  const auto grad = values_requiring_grad(g);
  // The first layer's input is data: only the weight gradient (1× forward), saving x.
  const BackwardWork b1 = backward_work(g, first, forward_work(g, first), grad);
  EXPECT_DOUBLE_EQ(b1.flops, forward_work(g, first).flops);
  ASSERT_EQ(b1.saved.size(), 1u);
  EXPECT_EQ(b1.saved[0], x);
  // The second layer needs dX and dW: 2× forward; it saves its activation input, not the param.
  const BackwardWork b2 = backward_work(g, second, forward_work(g, second), grad);
  EXPECT_DOUBLE_EQ(b2.flops, 2 * forward_work(g, second).flops);
  ASSERT_EQ(b2.saved.size(), 1u);
  EXPECT_EQ(b2.saved[0], h);
}

TEST(BackwardWork, SavesBothInputsOfAnActivationTimesActivationMatMul) {
  GraphBuilder b;
  auto x = b.input("x", {4, 8});
  auto w = b.param("w", {8, 8});
  auto q = b.value("q", {4, 8});
  auto kt = b.value("kt", {8, 4});
  auto s = b.value("s", {4, 4});
  b.task("MatMul", {x, w}, {q});
  b.task("Transpose", {q}, {kt});
  auto qk = b.task("MatMul", {q, kt}, {s});
  auto& g = b.finish();
  const BackwardWork bw = backward_work(g, qk, forward_work(g, qk), values_requiring_grad(g));
  EXPECT_EQ(bw.saved.size(), 2u);
  EXPECT_DOUBLE_EQ(bw.flops, 2 * forward_work(g, qk).flops);
}

TEST(BackwardWork, SavesReluOutputAndNothingForAdd) {
  SmallMlp m;
  const auto grad = values_requiring_grad(m.b.g);
  const BackwardWork relu = backward_work(m.b.g, m.relu, forward_work(m.b.g, m.relu), grad);
  ASSERT_EQ(relu.saved.size(), 1u);
  EXPECT_EQ(relu.saved[0], m.r);
  const BackwardWork add = backward_work(m.b.g, m.add, forward_work(m.b.g, m.add), grad);
  EXPECT_TRUE(add.saved.empty());
  EXPECT_DOUBLE_EQ(add.flops, 8 * 32);  // the bias gradient sums dY over the batch
}

TEST(BackwardWork, ConvolutionOnImagesComputesOnlyTheWeightGradient) {
  GraphBuilder b;
  auto x = b.input("x", {2, 3, 8, 8});
  auto w = b.param("w", {4, 3, 3, 3});
  auto y = b.value("y", {2, 4, 8, 8});
  auto c = b.task("Conv", {x, w}, {y}, {ints_attr("pads", {1, 1, 1, 1})});
  auto w2 = b.param("w2", {4, 2, 3, 3});
  auto z = b.value("z", {2, 4, 8, 8});
  auto grouped = b.task("Conv", {y, w2}, {z}, {testing::int_attr("group", 2), ints_attr("pads", {1, 1, 1, 1})});
  auto& g = b.finish();
  const auto grad = values_requiring_grad(g);
  EXPECT_DOUBLE_EQ(backward_work(g, c, forward_work(g, c), grad).flops, forward_work(g, c).flops);
  EXPECT_DOUBLE_EQ(backward_work(g, grouped, forward_work(g, grouped), grad).flops, 2 * forward_work(g, grouped).flops);
}

TEST(EstimateCosts, GivesConstantTasksNoPerStepCostButKeepsTheirParams) {
  SmallMlp m;
  const CostTable t = estimate_costs(m.b.g, test_device());
  const TaskCost& c = t.tasks[m.constant_transpose.value()];
  EXPECT_EQ(c.forward_s, 0);
  EXPECT_EQ(c.backward_s, 0);
  EXPECT_EQ(c.saved_bytes, 0);
  EXPECT_EQ(c.flops, 0);
  EXPECT_EQ(c.param_bytes, 32 * 32 * 4);
}

TEST(EstimateCosts, CountsEachSavedValueOnce) {
  SmallMlp m;
  const CostTable t = estimate_costs(m.b.g, test_device());
  EXPECT_EQ(t.tasks[m.matmul.value()].saved_bytes, 8 * 64 * 4);  // x, for dW
  EXPECT_EQ(t.tasks[m.relu.value()].saved_bytes, 8 * 32 * 4);    // its output
  EXPECT_EQ(t.tasks[m.add.value()].saved_bytes, 0);
  for (const TaskCost& c : t.tasks) {
    EXPECT_GE(c.forward_s, 0);
    EXPECT_GE(c.backward_s, 0);
  }
}

TEST(EstimateCosts, ScalesBatchWorkLinearlyWithTheMicroBatch) {
  SmallMlp m;
  CostOptions bound;
  bound.reference_batch = 8;  // the graph is bound at batch 8
  CostOptions o = bound;
  o.microbatch_size = 32;
  const CostTable ref = estimate_costs(m.b.g, test_device(), bound);
  const CostTable big = estimate_costs(m.b.g, test_device(), o);
  EXPECT_EQ(ref.microbatch_size, 8);
  EXPECT_EQ(big.microbatch_size, 32);
  const auto i = m.matmul.value();
  EXPECT_DOUBLE_EQ(big.tasks[i].flops, 4 * ref.tasks[i].flops);
  EXPECT_EQ(big.tasks[i].saved_bytes, 4 * ref.tasks[i].saved_bytes);
  EXPECT_EQ(big.tasks[i].param_bytes, ref.tasks[i].param_bytes);
  // Bytes: activations scale, the weight does not.
  EXPECT_DOUBLE_EQ(big.tasks[i].bytes_accessed, 64 * 32 * 4 + 4 * (8 * 64 * 4 + 8 * 32 * 4));
}

TEST(EstimateCosts, HalvesActivationBytesUnderMixedPrecisionAndUsesTensorPeak) {
  SmallMlp m;
  CostOptions o;
  o.precision = Precision::kMixed;
  const CostTable fp32 = estimate_costs(m.b.g, test_device());
  const CostTable mixed = estimate_costs(m.b.g, test_device(), o);
  EXPECT_EQ(mixed.tasks[m.relu.value()].saved_bytes * 2, fp32.tasks[m.relu.value()].saved_bytes);
  EXPECT_EQ(mixed.precision, "mixed");
}

TEST(EstimateCosts, RunsLargeGemmsNearPeakAndSmallKernelsAtTheOverhead) {
  GraphBuilder b;
  auto x = b.input("x", {8192, 8192});
  auto w = b.param("w", {8192, 8192});
  auto y = b.value("y", {8192, 8192});
  auto big = b.task("MatMul", {x, w}, {y});
  auto s = b.value("s", {8192, 8192});
  b.task("Relu", {y}, {s});
  auto& g = b.finish();
  const Device d = test_device();
  CostOptions o;
  o.precision = Precision::kMixed;
  const CostTable t = estimate_costs(g, d, o);
  const double achieved = t.tasks[big.value()].flops / t.tasks[big.value()].forward_s;
  EXPECT_GT(achieved, 0.6 * d.peak_fp16_flops);
  EXPECT_LE(achieved, d.peak_fp16_flops);
  SmallMlp m;  // tiny kernels: the launch overhead dominates
  const CostTable small = estimate_costs(m.b.g, d);
  EXPECT_LT(small.tasks[m.relu.value()].forward_s, 2 * d.kernel_overhead_s);
  EXPECT_GE(small.tasks[m.relu.value()].forward_s, d.kernel_overhead_s);
}

TEST(EstimateCosts, WarnsAboutOpaqueOpsAndStillCostsThem) {
  GraphBuilder b;
  auto x = b.input("x", {4, 4});
  auto y = b.value("y", {4, 4});
  b.task("FancyCustomOp", {x}, {y});
  auto& g = b.finish();
  const CostTable t = estimate_costs(g, test_device());
  ASSERT_EQ(t.warnings.size(), 1u);
  EXPECT_NE(t.warnings[0].find("FancyCustomOp"), std::string::npos);
  EXPECT_FALSE(t.tasks[0].known);
  EXPECT_GT(t.tasks[0].forward_s, 0);
}

TEST(EstimateCosts, IsDeterministic) {
  SmallMlp m;
  const CostTable a = estimate_costs(m.b.g, test_device());
  const CostTable b = estimate_costs(m.b.g, test_device());
  ASSERT_EQ(a.tasks.size(), b.tasks.size());
  for (size_t i = 0; i < a.tasks.size(); ++i) {
    EXPECT_EQ(a.tasks[i].forward_s, b.tasks[i].forward_s);
    EXPECT_EQ(a.tasks[i].backward_s, b.tasks[i].backward_s);
    EXPECT_EQ(a.tasks[i].saved_bytes, b.tasks[i].saved_bytes);
    EXPECT_EQ(a.tasks[i].flops, b.tasks[i].flops);
  }
}

TEST(RescaleCosts, ScalesBatchTasksAndLeavesConstantTasks) {
  SmallMlp m;
  CostOptions bound;
  bound.reference_batch = 8;  // the batch SmallMlp is built at
  const CostTable t = estimate_costs(m.b.g, test_device(), bound);
  const CostTable r = rescale_costs(t, m.b.g, 16);
  EXPECT_EQ(r.microbatch_size, 16);
  EXPECT_DOUBLE_EQ(r.tasks[m.matmul.value()].forward_s, 2 * t.tasks[m.matmul.value()].forward_s);
  EXPECT_EQ(r.tasks[m.constant_transpose.value()].param_bytes, t.tasks[m.constant_transpose.value()].param_bytes);
}

}  // namespace
}  // namespace apart
