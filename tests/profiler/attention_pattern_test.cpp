// The attention pattern on a task graph (profiler/attention_pattern.h) and its price: one flash kernel forward and
// backward, no seq × seq tensor moved, saved or held, the causal blocks the CPU kernel computes.
#include "profiler/attention_pattern.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "profiler/cost_model.h"
#include "profiler/device.h"
#include "tests/profiler/graph_builder.h"

namespace apart {
namespace {

using testing::GraphBuilder;
using testing::int_attr;
using testing::ints_attr;

constexpr int64_t kHeads = 2, kSeq = 96, kHead = 8;
constexpr double kScoreBytes = 4.0 * kHeads * kSeq * kSeq;  // one [1, H, S, S] float32 tensor
constexpr double kHeadBytes = 4.0 * kHeads * kSeq * kHead;  // one [1, H, S, D] float32 tensor

// x → Q, K, V projections (params), Kᵀ by a Transpose, then MatMul · Div(√D) · [Where(mask, −∞, ·)] · Softmax ·
// MatMul. `mask`: none, a causal [S, S] bool literal, or a bool input; `softmax_read_elsewhere`: P is also a graph
// output.
struct Attention {
  enum class Mask { kNone, kCausalLiteral, kInput };
  GraphBuilder b;
  TaskId scores, div, where, softmax, pv, k_transpose;
  ValueId q, kt, v, y, p;
  explicit Attention(Mask mask = Mask::kNone, bool softmax_read_elsewhere = false) {
    auto x = b.input("x", {1, kHeads, kSeq, kHead});
    auto shape = std::vector<int64_t>{1, kHeads, kSeq, kHead};
    q = b.value("q", shape), v = b.value("v", shape);
    auto k = b.value("k", shape);
    kt = b.value("kt", {1, kHeads, kHead, kSeq});
    b.task("MatMul", {x, b.param("wq", {kHead, kHead})}, {q});
    b.task("MatMul", {x, b.param("wk", {kHead, kHead})}, {k});
    b.task("MatMul", {x, b.param("wv", {kHead, kHead})}, {v});
    k_transpose = b.task("Transpose", {k}, {kt}, {ints_attr("perm", {0, 1, 3, 2})});
    auto s = b.value("s", {1, kHeads, kSeq, kSeq});
    scores = b.task("MatMul", {q, kt}, {s});
    auto root_d = b.value("root_d", {}, ValueKind::kConstant);
    b.task("Constant", {}, {root_d});
    auto scaled = b.value("scaled", {1, kHeads, kSeq, kSeq});
    div = b.task("Div", {s, root_d}, {scaled});
    ValueId logits = scaled;
    if (mask != Mask::kNone) {
      ValueId m;
      if (mask == Mask::kInput) {
        m = b.input("mask", {1, 1, kSeq, kSeq}, DType::kBool);
      } else {
        m = b.value("causal", {kSeq, kSeq}, ValueKind::kConstant, DType::kBool);
        b.task("Constant", {}, {m});
      }
      auto minus_inf = b.value("minus_inf", {}, ValueKind::kConstant);
      b.task("Constant", {}, {minus_inf});
      logits = b.value("masked", {1, kHeads, kSeq, kSeq});
      where = b.task("Where", {m, minus_inf, scaled}, {logits});
    }
    p = b.value("p", {1, kHeads, kSeq, kSeq}, softmax_read_elsewhere ? ValueKind::kOutput : ValueKind::kActivation);
    softmax = b.task("Softmax", {logits}, {p}, {int_attr("axis", -1)});
    y = b.value("y", shape, ValueKind::kOutput);
    pv = b.task("MatMul", {p, v}, {y});
    b.g.mark_graph_output(y);
    if (softmax_read_elsewhere) b.g.mark_graph_output(p);
    b.finish();
  }
  const TaskGraph& g() const { return b.g; }
};

TEST(FindAttention, FindsTheMatMulScaleSoftmaxMatMulChainAndKeepsKsTransposeOutsideIt) {
  const Attention a;
  const auto found = find_attention(a.g());
  ASSERT_EQ(found.size(), 1u);
  const AttentionMatch& m = found[0];
  EXPECT_EQ(m.tasks, (std::vector<TaskId>{a.scores, a.div, a.softmax, a.pv}));
  EXPECT_EQ(m.last, a.pv);
  EXPECT_EQ(m.q, a.q);
  EXPECT_EQ(m.k_transposed, a.kt);
  EXPECT_EQ(m.v, a.v);
  EXPECT_EQ(m.k_transpose, a.k_transpose);
  EXPECT_FALSE(m.mask.valid() && !m.causal);
  EXPECT_FALSE(m.causal);
}

TEST(FindAttention, LeavesAnAttentionWhoseWeightsAreReadElsewhere) {
  const Attention a(Attention::Mask::kNone, true);
  EXPECT_TRUE(find_attention(a.g()).empty());
}

TEST(FindAttention, TakesALiteralSquareBoolMaskForTheCausalOneAndKeepsAnInputMask) {
  const Attention causal(Attention::Mask::kCausalLiteral), input(Attention::Mask::kInput);
  const auto c = find_attention(causal.g()), i = find_attention(input.g());
  ASSERT_EQ(c.size(), 1u);
  ASSERT_EQ(i.size(), 1u);
  EXPECT_TRUE(c[0].causal);
  EXPECT_TRUE(c[0].mask_hides);
  EXPECT_FALSE(i[0].causal);
  EXPECT_EQ(i[0].mask, input.g().find_value("mask"));
  EXPECT_NE(std::find(c[0].tasks.begin(), c[0].tasks.end(), causal.where), c[0].tasks.end());
}

TEST(FindAttention, ChecksTheTriangleWhereTheImporterKeptTheMasksContents) {
  Attention a(Attention::Mask::kCausalLiteral);
  Value& mask = a.b.g.value(*a.g().find_value("causal"));
  std::vector<int64_t> upper(static_cast<size_t>(kSeq * kSeq), 0);
  for (int64_t i = 0; i < kSeq; ++i)
    for (int64_t j = i + 1; j < kSeq; ++j) upper[static_cast<size_t>(i * kSeq + j)] = 1;
  mask.known_ints = upper;
  EXPECT_TRUE(find_attention(a.g())[0].causal);
  upper[1] = 0;  // one hidden key fewer: no longer the causal triangle, so kept as a mask
  mask.known_ints = upper;
  EXPECT_FALSE(find_attention(a.g())[0].causal);
}

// Summed over the tasks an attention replaces (with its last one).
TaskCost summed(const CostTable& table, const AttentionMatch& m) {
  TaskCost s;
  for (TaskId t : m.tasks) {
    const TaskCost& c = table.tasks[t.value()];
    s.flops += c.flops, s.backward_flops += c.backward_flops, s.bytes_accessed += c.bytes_accessed;
    s.backward_bytes += c.backward_bytes, s.saved_bytes += c.saved_bytes, s.launches += c.launches;
    s.output_bytes = std::max(s.output_bytes, c.output_bytes);
    s.workspace_bytes = std::max(s.workspace_bytes, c.workspace_bytes);
  }
  return s;
}

TEST(EstimateCosts, PricesAnAttentionAsOneFlashKernelThatNeitherMovesNorKeepsASeqBySeqTensor) {
  const Attention a;
  for (const char* device : {"cpu", "a100-80gb"}) {
    const CostTable table = estimate_costs(a.g(), device_preset(device));
    const TaskCost s = summed(table, find_attention(a.g())[0]);
    const double flops = 2.0 * kHeads * kSeq * kSeq * (kHead + kHead);  // Q·Kᵀ and P·V
    EXPECT_DOUBLE_EQ(s.flops, flops) << device;
    EXPECT_DOUBLE_EQ(s.backward_flops, 3.5 * flops) << device;
    EXPECT_DOUBLE_EQ(s.bytes_accessed, 4 * kHeadBytes) << device;  // Q, K, V read, Y written
    EXPECT_DOUBLE_EQ(s.backward_bytes, 7 * kHeadBytes) << device;  // dY, Q, K, V read, dQ, dK, dV written
    EXPECT_EQ(s.saved_bytes, 3 * kHeadBytes) << device;            // Q, Kᵀ, V
    EXPECT_EQ(s.launches, 2) << device;
    EXPECT_LT(s.output_bytes, kScoreBytes) << device;
    EXPECT_LT(s.workspace_bytes, kScoreBytes) << device;
    EXPECT_EQ(table.tasks[a.softmax.value()].forward_s, 0) << device;
  }
}

TEST(EstimateCosts, PricesTheScoresOfAnAttentionItCannotFuse) {
  const Attention a(Attention::Mask::kNone, true);
  const CostTable table = estimate_costs(a.g(), device_preset("cpu"));
  EXPECT_GE(static_cast<double>(table.tasks[a.softmax.value()].output_bytes), kScoreBytes);
  EXPECT_GE(table.tasks[a.softmax.value()].bytes_accessed, 2 * kScoreBytes);
}

TEST(EstimateCosts, PricesACausalAttentionAtTheBlocksTheKernelComputes) {
  const Attention full, causal(Attention::Mask::kCausalLiteral);
  const CostTable f = estimate_costs(full.g(), device_preset("cpu"));
  const CostTable c = estimate_costs(causal.g(), device_preset("cpu"));
  // 96 queries in blocks of 64 rows (head 8): 64 · 64 + 32 · 96 of 96 · 96 pairs.
  const double fraction = (64.0 * 64 + 32.0 * 96) / (96.0 * 96);
  EXPECT_DOUBLE_EQ(summed(c, find_attention(causal.g())[0]).flops,
                   fraction * summed(f, find_attention(full.g())[0]).flops);
  EXPECT_DOUBLE_EQ(summed(c, find_attention(causal.g())[0]).bytes_accessed,
                   summed(f, find_attention(full.g())[0]).bytes_accessed);  // the mask is not read: is_causal
}

TEST(EstimateCosts, SavesAndReadsABatchMaskBesideQKV) {
  const Attention a(Attention::Mask::kInput);
  const CostTable table = estimate_costs(a.g(), device_preset("cpu"));
  const TaskCost s = summed(table, find_attention(a.g())[0]);
  const double mask = static_cast<double>(kSeq * kSeq);  // bool
  EXPECT_EQ(s.saved_bytes, 3 * kHeadBytes + mask);
  // Forward: Q, K, V, the mask, its Not (read and written), Y; two launches forward (Not, Attention), one backward.
  EXPECT_DOUBLE_EQ(s.bytes_accessed, 4 * kHeadBytes + 3 * mask);
  EXPECT_EQ(s.launches, 3);
}

CostTable priced(const TaskGraph& g, const char* device, AttentionKernel attention) {
  CostOptions o;
  o.attention = attention;
  return estimate_costs(g, device_preset(device), o);
}

TEST(EstimateCosts, PricesOnlyTheAttentionsTasksDifferentlyWhenAttentionIsMaterialized) {
  for (auto mask : {Attention::Mask::kNone, Attention::Mask::kCausalLiteral, Attention::Mask::kInput}) {
    const Attention a(mask);
    const std::vector<bool> inside = attention_tasks(a.g(), find_attention(a.g()));
    for (const char* device : {"cpu", "a100-80gb"}) {
      const CostTable flash = priced(a.g(), device, AttentionKernel::kFused);
      const CostTable materialized = priced(a.g(), device, AttentionKernel::kMaterialized);
      ASSERT_EQ(flash.tasks.size(), materialized.tasks.size());
      for (uint32_t t = 0; t < a.g().num_tasks(); ++t) {
        if (inside[t]) continue;
        const TaskCost &f = flash.tasks[t], &m = materialized.tasks[t];
        EXPECT_EQ(f.forward_s, m.forward_s) << device << " task " << t;
        EXPECT_EQ(f.backward_s, m.backward_s) << device << " task " << t;
        EXPECT_EQ(f.flops, m.flops) << device << " task " << t;
        EXPECT_EQ(f.bytes_accessed, m.bytes_accessed) << device << " task " << t;
        EXPECT_EQ(f.backward_bytes, m.backward_bytes) << device << " task " << t;
        EXPECT_EQ(f.saved_bytes, m.saved_bytes) << device << " task " << t;
        EXPECT_EQ(f.workspace_bytes, m.workspace_bytes) << device << " task " << t;
      }
      const TaskCost f = summed(flash, find_attention(a.g())[0]), m = summed(materialized, find_attention(a.g())[0]);
      EXPECT_GT(m.saved_bytes, f.saved_bytes) << device;  // the probabilities, kept for P·V's backward
      EXPECT_GT(m.bytes_accessed, f.bytes_accessed) << device;
    }
  }
}

TEST(EstimateCosts, PricesAMaterializedAttentionOpByOpWithItsScoresInMemory) {
  const Attention a;
  const CostTable table = priced(a.g(), "cpu", AttentionKernel::kMaterialized);
  const TaskCost s = summed(table, find_attention(a.g())[0]);
  // Q·Kᵀ and P·V, every (query, key) pair; the Div and Softmax's per-element FLOPs on top.
  const double products = 2.0 * kHeads * kSeq * kSeq * (kHead + kHead);
  EXPECT_GT(s.flops, products);
  EXPECT_LT(s.flops, products + 10 * kScoreBytes / 4);
  // Softmax's output P is written, then saved for P·V's backward (as MatMul's rule: A when B needs a gradient).
  EXPECT_GE(table.tasks[a.softmax.value()].output_bytes, kScoreBytes);
  EXPECT_GE(s.saved_bytes, kScoreBytes + 3 * kHeadBytes);
  EXPECT_GT(table.tasks[a.softmax.value()].forward_s, 0);
  // The cpu device fuses nothing: four kernels forward.
  EXPECT_EQ(table.tasks[a.scores.value()].launches + table.tasks[a.div.value()].launches +
                table.tasks[a.softmax.value()].launches + table.tasks[a.pv.value()].launches,
            s.launches);
  EXPECT_GE(s.launches, 4 + 4);
}

}  // namespace
}  // namespace apart
