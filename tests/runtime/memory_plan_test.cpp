// The memory planner: reuse on a chain, no overlap between values live together, executor use.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "importer/importer.h"
#include "runtime/executor.h"
#include "runtime/memory_plan.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {

// x → Relu → Relu → … (n tasks), every activation 4 KiB.
TaskGraph relu_chain(int n) {
  TaskGraph g;
  auto value = [&](const std::string& name, ValueKind kind) {
    Value v;
    v.name = name;
    v.dtype = DType::kFloat32;
    v.shape = {1024};
    v.shape_known = true;
    v.elements = 1024;
    v.bytes = 4096;
    v.kind = kind;
    return g.add_value(v);
  };
  ValueId prev = value("x", ValueKind::kInput);
  g.mark_graph_input(prev);
  for (int i = 0; i < n; ++i) {
    ValueId out = value("a" + std::to_string(i), i + 1 == n ? ValueKind::kOutput : ValueKind::kActivation);
    Task t;
    t.name = "relu" + std::to_string(i);
    t.op_type = "Relu";
    t.inputs = {prev};
    t.outputs = {out};
    g.add_task(t);
    prev = out;
  }
  g.mark_graph_output(prev);
  g.finalize();
  return g;
}

TEST(TheMemoryPlanner, ReusesBuffersAlongAChain) {
  TaskGraph g = relu_chain(10);
  MemoryPlan plan = plan_memory(g);
  EXPECT_EQ(plan.total_bytes, 10 * 4096);
  EXPECT_LT(plan.peak_bytes, plan.total_bytes);
  EXPECT_EQ(plan.peak_bytes, 2 * 4096);  // producer and consumer of each step, nothing else
  EXPECT_EQ(plan.lower_bound_bytes, 2 * 4096);
  EXPECT_NO_THROW(check_memory_plan(plan));
}

TEST(TheMemoryPlanner, NeverOverlapsValuesLiveTogether) {
  TaskGraph g = relu_chain(6);
  MemoryPlan plan = plan_memory(g);
  for (const auto& a : plan.buffers)
    for (const auto& b : plan.buffers) {
      if (a.value == b.value) continue;
      const bool together = a.first_step <= b.last_step && b.first_step <= a.last_step;
      const bool overlap = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
      EXPECT_FALSE(together && overlap);
    }
  // A corrupted plan is caught.
  plan.buffers[1].offset = plan.buffers[0].offset;
  plan.buffers[1].first_step = plan.buffers[0].first_step;
  plan.buffers[1].last_step = plan.buffers[0].last_step;
  EXPECT_THROW(check_memory_plan(plan), Error);
}

TEST(TheMemoryPlanner, PlansGptTinyBelowTheSumOfItsActivationsAndIsDeterministic) {
  ImportOptions options;
  options.dims["batch"] = 2;
  ImportedModel m = import_model(std::filesystem::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx", options);
  MemoryPlan a = plan_memory(m.graph), b = plan_memory(m.graph);
  EXPECT_NO_THROW(check_memory_plan(a));
  EXPECT_LT(a.peak_bytes, a.total_bytes / 2);
  EXPECT_GE(a.peak_bytes, a.lower_bound_bytes);
  EXPECT_EQ(a.peak_bytes, b.peak_bytes);
  EXPECT_EQ(a.offset_of, b.offset_of);
  std::printf("[ plan     ] gpt-tiny batch 2: arena %lld bytes, live lower bound %lld, no reuse %lld\n",
              static_cast<long long>(a.peak_bytes), static_cast<long long>(a.lower_bound_bytes),
              static_cast<long long>(a.total_bytes));
}

TEST(TheExecutor, RunsAChainInsideTheArenaAndReportsThePlanBeforeTheFirstStep) {
  testing::OnnxBuilder b;
  b.input({"x", DType::kFloat32, {256}}).output({"y", DType::kFloat32, {256}});
  std::string prev = "x";
  for (int i = 0; i < 8; ++i) {
    const std::string out = i == 7 ? "y" : "h" + std::to_string(i);
    b.node(i % 2 ? "Neg" : "Abs", {prev}, {out});  // ends in Neg: y = -|x|
    prev = out;
  }
  ImportedModel m = import_model(b.write("chain.onnx"));
  Executor exec(m);
  // The graph output y outlives the run: it is allocated apart, so the arena holds h0..h6.
  EXPECT_EQ(exec.memory_plan().total_bytes, 7 * 1024);
  EXPECT_EQ(exec.memory_plan().peak_bytes, 2 * 1024);
  Tensor x(DType::kFloat32, {256});
  for (int i = 0; i < 256; ++i) x.data<float>()[i] = static_cast<float>(i - 128);
  Tensor y = exec.run({{"x", x}}).at(0).second;
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y.data<float>()[i], -std::fabs(static_cast<float>(i - 128)));
  // Handed over without a copy, yet a later run does not overwrite it (a stage's stash waits for its backward).
  Tensor x2(DType::kFloat32, {256});
  for (int i = 0; i < 256; ++i) x2.data<float>()[i] = 7;
  const Tensor y2 = exec.run({{"x", x2}}).at(0).second;
  EXPECT_NE(y2.raw(), y.raw());
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(y2.data<float>()[i], -7.0f);
    EXPECT_EQ(y.data<float>()[i], -std::fabs(static_cast<float>(i - 128)));
  }
}

TEST(TheMemoryPlanner, HoldsTheBufferAViewAliasesUntilTheViewsLastReader) {
  TaskGraph g = relu_chain(6);
  MemoryPlanOptions options;
  options.alias_task.assign(6, false);
  options.alias_task[1] = true;  // a1 is a view of a0: read by relu2
  const MemoryPlan plan = plan_memory(g, options);
  EXPECT_FALSE(plan.planned(*g.find_value("a1")));
  for (const auto& b : plan.buffers)
    if (b.value == *g.find_value("a0")) EXPECT_EQ(b.last_step, 2);
  EXPECT_NO_THROW(check_memory_plan(plan));
}

TEST(TheExecutor, RunsAReshapeAsAViewOfItsInputThatStaysIntactUntilItsLastReader) {
  // y = |x| viewed as [16, 16], plus −exp(|x|) computed after it: without holding |x|'s bytes for the view, Exp and
  // Neg would reuse them.
  testing::OnnxBuilder b;
  b.input({"x", DType::kFloat32, {256}}).output({"y", DType::kFloat32, {16, 16}});
  b.int_initializer("shape", {16, 16});
  b.node("Abs", {"x"}, {"h0"});
  b.node("Reshape", {"h0", "shape"}, {"h1"});
  b.node("Exp", {"h1"}, {"h2"});
  b.node("Neg", {"h2"}, {"h3"});
  b.node("Add", {"h1", "h3"}, {"y"});
  ImportedModel m = import_model(b.write("view.onnx"));
  Executor exec(m);
  EXPECT_FALSE(exec.memory_plan().planned(*m.graph.find_value("h1")));  // no buffer, no copy
  Tensor x(DType::kFloat32, {256});
  for (int i = 0; i < 256; ++i) x.data<float>()[i] = static_cast<float>(i - 128) / 64;
  for (int run = 0; run < 2; ++run) {
    const Tensor y = exec.run({{"x", x}}).at(0).second;
    for (int i = 0; i < 256; ++i) {
      const float a = std::fabs(x.data<float>()[i]);
      EXPECT_FLOAT_EQ(y.data<float>()[i], a - std::exp(a)) << i;
    }
  }
}

TEST(TheExecutor, FoldsATransposeIntoTheMatMulsThatReadItAsTheNaiveProductComputesThem) {
  // y = (aᵀ · b) · wᵀ with a [2, 3, 4, 5], b [2, 3, 4, 6], w [7, 6]: a batched transposed A, then a shared
  // transposed B (the one-GEMM path).
  testing::OnnxBuilder b;
  b.input({"a", DType::kFloat32, {2, 3, 4, 5}}).input({"b", DType::kFloat32, {2, 3, 4, 6}});
  b.input({"w", DType::kFloat32, {7, 6}}).output({"y", DType::kFloat32, {2, 3, 5, 7}});
  testing::OnnxBuilder::set_ints(b.node("Transpose", {"a"}, {"at"}), "perm", {0, 1, 3, 2});
  b.node("MatMul", {"at", "b"}, {"h"});
  b.node("Transpose", {"w"}, {"wt"});
  b.node("MatMul", {"h", "wt"}, {"y"});
  ImportedModel m = import_model(b.write("folded.onnx"));
  Executor exec(m);
  EXPECT_FALSE(exec.memory_plan().planned(*m.graph.find_value("at")));  // no copy of aᵀ
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1, 1);
  auto random = [&](std::vector<int64_t> shape) {
    Tensor t(DType::kFloat32, std::move(shape));
    for (int64_t i = 0; i < t.elements(); ++i) t.data<float>()[i] = u(rng);
    return t;
  };
  const Tensor a = random({2, 3, 4, 5}), bt = random({2, 3, 4, 6}), w = random({7, 6});
  const Tensor y = exec.run({{"a", a}, {"b", bt}, {"w", w}}).at(0).second;
  for (int64_t batch = 0; batch < 6; ++batch)
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t o = 0; o < 7; ++o) {
        double want = 0;
        for (int64_t j = 0; j < 6; ++j) {
          double h = 0;
          for (int64_t k = 0; k < 4; ++k)
            h += a.data<float>()[batch * 20 + k * 5 + i] * bt.data<float>()[batch * 24 + k * 6 + j];
          want += h * w.data<float>()[o * 6 + j];
        }
        EXPECT_NEAR(y.data<float>()[batch * 35 + i * 7 + o], want, 1e-5) << batch << " " << i << " " << o;
      }
}

}  // namespace
}  // namespace apart
