// Fused kernels on devices that fuse: which values stay out of memory, and what a fused chain costs (profiler/fusion.h).
#include "profiler/fusion.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "profiler/cost_model.h"
#include "profiler/device.h"
#include "tests/profiler/graph_builder.h"

namespace apart {
namespace {

using testing::GraphBuilder;
using testing::ints_attr;
using testing::int_attr;

constexpr int64_t kRows = 4096, kHidden = 1024;  // large enough to be memory-bound
constexpr double kAct = kRows * kHidden * 4.0;   // one fp32 activation
constexpr double kVec = kHidden * 4.0;           // gamma or beta
constexpr double kScalar = 4.0;                  // a [1] fp32 constant

Device gpu() { return device_preset("a100-80gb"); }
Device gpu_without_fusion() {
  Device d = gpu();
  d.fuses_elementwise = false;
  return d;
}

// in[R,H] → MatMul(W) → x → LayerNorm as torch exports it (nine ops) → y → MatMul(W2) → z.
struct DecomposedLayerNorm {
  GraphBuilder b;
  TaskId matmul, head;
  std::vector<TaskId> ln;  // the nine, in order
  ValueId x, y;
  DecomposedLayerNorm() {
    auto in = b.input("in", {kRows, kHidden});
    auto w = b.param("w", {kHidden, kHidden});
    auto w2 = b.param("w2", {kHidden, kHidden});
    auto gamma = b.param("gamma", {kHidden});
    auto beta = b.param("beta", {kHidden});
    auto two = b.value("two", {1}, ValueKind::kConstant);
    auto eps = b.value("eps", {1}, ValueKind::kConstant);
    x = b.value("x", {kRows, kHidden});
    auto mean = b.value("mean", {kRows, 1});
    auto d = b.value("d", {kRows, kHidden});
    auto sq = b.value("sq", {kRows, kHidden});
    auto var = b.value("var", {kRows, 1});
    auto ve = b.value("ve", {kRows, 1});
    auto sd = b.value("sd", {kRows, 1});
    auto nrm = b.value("nrm", {kRows, kHidden});
    auto scaled = b.value("scaled", {kRows, kHidden});
    y = b.value("y", {kRows, kHidden});
    auto z = b.value("z", {kRows, kHidden}, ValueKind::kOutput);
    const std::vector<Attribute> last_axis = {ints_attr("axes", {-1}), int_attr("keepdims", 1)};
    matmul = b.task("MatMul", {in, w}, {x});
    ln.push_back(b.task("ReduceMean", {x}, {mean}, last_axis));
    ln.push_back(b.task("Sub", {x, mean}, {d}));
    ln.push_back(b.task("Pow", {d, two}, {sq}));
    ln.push_back(b.task("ReduceMean", {sq}, {var}, last_axis));
    ln.push_back(b.task("Add", {var, eps}, {ve}));
    ln.push_back(b.task("Sqrt", {ve}, {sd}));
    ln.push_back(b.task("Div", {d, sd}, {nrm}));
    ln.push_back(b.task("Mul", {nrm, gamma}, {scaled}));
    ln.push_back(b.task("Add", {scaled, beta}, {y}));
    head = b.task("MatMul", {y, w2}, {z});
    b.finish();
  }
};

TEST(ADecomposedLayerNorm, IsOneGroupWhoseIntermediatesStayOutOfMemory) {
  DecomposedLayerNorm m;
  const FusionGroups f = find_fusion_groups(m.b.g);
  ASSERT_EQ(f.groups.size(), 1u);
  EXPECT_EQ(f.groups[0], m.ln);
  for (TaskId t : m.ln) EXPECT_EQ(f.group_of[t.value()], m.ln.front().value());
  EXPECT_EQ(f.group_of[m.matmul.value()], FusionGroups::kNone);
  EXPECT_FALSE(f.internal[m.x.value()]);  // produced by a GEMM
  EXPECT_FALSE(f.internal[m.y.value()]);  // read by a GEMM
  for (size_t i = 0; i + 1 < m.ln.size(); ++i) EXPECT_TRUE(f.internal[m.b.g.task(m.ln[i]).outputs[0].value()]);
}

TEST(ADecomposedLayerNorm, CostsWhatTheFusedFormulaSays) {
  // One kernel at the normalisation's fractions of peak (the least efficient class in it): x, gamma, beta and the two
  // constants read once, y written once; one launch. Backward: dy read, dx, dgamma and dbeta written, and x, which
  // the group saves in place of its internal values, read back; one launch.
  DecomposedLayerNorm m;
  const Device d = gpu();
  const CostTable t = estimate_costs(m.b.g, d);
  const std::vector<bool> grad = values_requiring_grad(m.b.g);
  double flops = 0, backward_flops = 0, forward_s = 0, backward_s = 0;
  int64_t saved = 0;
  for (TaskId id : m.ln) {
    const TaskCost& c = t.tasks[id.value()];
    flops += c.flops;
    backward_flops += c.backward_flops;
    forward_s += c.forward_s;
    backward_s += c.backward_s;
    saved += c.saved_bytes;
  }
  EXPECT_DOUBLE_EQ(flops, 7.0 * kRows * kHidden + 4.0 * kRows);  // the ops' own counts, unchanged by fusion
  const OpEfficiency norm = default_efficiency(OpClass::kNormalization, d);
  const double fused_bytes = kAct + 2 * kVec + 2 * kScalar + kAct;
  const double expected_forward = roofline_time(flops, fused_bytes, d.peak_fp32_flops, d.memory_bandwidth, norm,
                                                d.kernel_overhead_s);
  EXPECT_NEAR(forward_s, expected_forward, 1e-12 * expected_forward);
  EXPECT_GT(fused_bytes / (d.memory_bandwidth * norm.memory), flops / (d.peak_fp32_flops * norm.compute));

  const double backward_bytes = kAct + kAct + 2 * kVec + kAct;
  const double expected_backward = roofline_time(backward_flops, backward_bytes, d.peak_fp32_flops,
                                                 d.memory_bandwidth, norm, d.kernel_overhead_s);
  EXPECT_NEAR(backward_s, expected_backward, 1e-12 * expected_backward);
  EXPECT_EQ(saved, static_cast<int64_t>(kAct));  // x only: a fused LayerNorm keeps its input
  EXPECT_EQ(t.tasks[m.ln.front().value()].saved_bytes, static_cast<int64_t>(kAct));
}

TEST(ADecomposedLayerNorm, CostsEveryOpOnItsOwnWhereTheDeviceDoesNotFuse) {
  DecomposedLayerNorm m;
  const Device d = gpu_without_fusion();
  const CostTable fused = estimate_costs(m.b.g, gpu());
  const CostTable alone = estimate_costs(m.b.g, d);
  double fused_s = 0, alone_s = 0;
  for (TaskId id : m.ln) {
    fused_s += fused.tasks[id.value()].forward_s;
    alone_s += alone.tasks[id.value()].forward_s;
    // Each op alone reads its inputs and writes its outputs: what forward_work says.
    const OpWork w = forward_work(m.b.g, id);
    EXPECT_DOUBLE_EQ(alone.tasks[id.value()].bytes_accessed, w.bytes_read + w.bytes_written);
  }
  EXPECT_GE(alone_s, 9 * d.kernel_overhead_s);
  EXPECT_GT(alone_s, 3 * fused_s);  // nine passes over memory against two
  // The GEMMs around it cost the same either way.
  EXPECT_EQ(fused.tasks[m.matmul.value()].forward_s, alone.tasks[m.matmul.value()].forward_s);
  EXPECT_EQ(fused.tasks[m.head.value()].forward_s, alone.tasks[m.head.value()].forward_s);
}

// x → Relu → r → Tanh → y, and r also read by a GEMM, or by an Add that also reads y · W: a GEMM lies between Relu
// and that Add, so r has to be in memory when the Add runs.
struct ForkedChain {
  GraphBuilder b;
  TaskId relu, tanh;
  ValueId x, r, y;
  explicit ForkedChain(bool second_is_gemm) {
    auto in = b.input("in", {kRows, kHidden});
    auto w = b.param("w", {kHidden, kHidden});
    x = b.value("x", {kRows, kHidden});
    r = b.value("r", {kRows, kHidden});
    y = b.value("y", {kRows, kHidden}, second_is_gemm ? ValueKind::kOutput : ValueKind::kActivation);
    auto p = b.value("p", {kRows, kHidden}, ValueKind::kOutput);
    b.task("MatMul", {in, w}, {x});
    relu = b.task("Relu", {x}, {r});
    tanh = b.task("Tanh", {r}, {y});
    if (second_is_gemm) {
      b.task("MatMul", {r, w}, {p});
    } else {
      auto q = b.value("q", {kRows, kHidden});
      b.task("MatMul", {y, w}, {q});
      b.task("Add", {r, q}, {p});
    }
    b.finish();
  }
};

TEST(AChainWhoseIntermediateHasASecondConsumer, IsNotFusedAcrossIt) {
  for (bool second_is_gemm : {true, false}) {
    SCOPED_TRACE(second_is_gemm ? "second consumer: a GEMM" : "second consumer: an Add behind a GEMM");
    ForkedChain m(second_is_gemm);
    const FusionGroups f = find_fusion_groups(m.b.g);
    EXPECT_FALSE(f.internal[m.r.value()]);
    EXPECT_EQ(f.group_of[m.relu.value()], FusionGroups::kNone);
    EXPECT_EQ(f.group_of[m.tanh.value()], FusionGroups::kNone);
    // Relu writes r and Tanh reads it back, as on a device that does not fuse.
    const CostTable fused = estimate_costs(m.b.g, gpu());
    const CostTable alone = estimate_costs(m.b.g, gpu_without_fusion());
    for (TaskId t : {m.relu, m.tanh}) {
      EXPECT_EQ(fused.tasks[t.value()].forward_s, alone.tasks[t.value()].forward_s);
      EXPECT_EQ(fused.tasks[t.value()].backward_s, alone.tasks[t.value()].backward_s);
      EXPECT_EQ(fused.tasks[t.value()].saved_bytes, alone.tasks[t.value()].saved_bytes);
      EXPECT_DOUBLE_EQ(fused.tasks[t.value()].bytes_accessed, 2 * kAct);
    }
  }
}

TEST(AView, KeepsItsValueInMemoryWhenAGemmReadsItAndPassesTheFusionOnWhenAnElementwiseOpDoes) {
  // x → Relu → r → Reshape → v → (MatMul | Tanh → MatMul)
  for (bool through_tanh : {false, true}) {
    GraphBuilder b;
    auto in = b.input("in", {kRows, kHidden});
    auto w = b.param("w", {kHidden, kHidden});
    auto shape = b.value("shape", {2}, ValueKind::kConstant, DType::kInt64);
    auto x = b.value("x", {kRows, kHidden});
    auto r = b.value("r", {kRows, kHidden});
    auto v = b.value("v", {kRows, kHidden});
    auto out = b.value("out", {kRows, kHidden}, ValueKind::kOutput);
    b.task("MatMul", {in, w}, {x});
    auto relu = b.task("Relu", {x}, {r});
    auto view = b.task("Reshape", {r, shape}, {v});
    if (through_tanh) {
      auto tv = b.value("tv", {kRows, kHidden});
      auto tanh = b.task("Tanh", {v}, {tv});
      b.task("MatMul", {tv, w}, {out});
      auto& g = b.finish();
      const FusionGroups f = find_fusion_groups(g);
      EXPECT_TRUE(f.internal[r.value()]);
      EXPECT_TRUE(f.internal[v.value()]);
      ASSERT_EQ(f.groups.size(), 1u);
      EXPECT_EQ(f.groups[0], (std::vector<TaskId>{relu, view, tanh}));
      const CostTable t = estimate_costs(g, gpu());
      EXPECT_DOUBLE_EQ(t.tasks[relu.value()].bytes_accessed + t.tasks[tanh.value()].bytes_accessed, 2 * kAct);
    } else {
      b.task("MatMul", {v, w}, {out});
      auto& g = b.finish();
      const FusionGroups f = find_fusion_groups(g);
      EXPECT_FALSE(f.internal[r.value()]);  // the GEMM reads r's memory through the view
      EXPECT_FALSE(f.internal[v.value()]);
      EXPECT_TRUE(f.groups.empty());
    }
  }
}

TEST(FusionGroups, AreDeterministic) {
  // (EstimateCosts.IsDeterministic covers the fused costs: its Relu → Add chain fuses on the a100 preset.)
  DecomposedLayerNorm m;
  const FusionGroups a = find_fusion_groups(m.b.g), b = find_fusion_groups(m.b.g);
  EXPECT_EQ(a.groups, b.groups);
  EXPECT_EQ(a.group_of, b.group_of);
  EXPECT_EQ(a.internal, b.internal);
}

TEST(DevicePresets, FuseOnGpusAndNotOnTheCpu) {
  for (const auto& name : device_preset_names())
    if (name != "cpu") {
      EXPECT_TRUE(device_preset(name).fuses_elementwise) << name;
    }
  EXPECT_FALSE(device_preset("cpu").fuses_elementwise);  // as `apart run` on the CPU runs every op alone
}

}  // namespace
}  // namespace apart
