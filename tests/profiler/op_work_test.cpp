// Forward FLOPs and bytes of single ops against hand formulas.
#include "profiler/op_work.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "tests/profiler/graph_builder.h"

namespace apart {
namespace {

using testing::GraphBuilder;
using testing::int_attr;
using testing::ints_attr;
using testing::string_attr;

TEST(ForwardWork, CountsBatchedMatMulWithBroadcastingAsTwoFlopsPerMultiplyAdd) {
  GraphBuilder b;
  // [2,1,4,8] x [3,8,5] -> [2,3,4,5]: batch dims broadcast to 2x3.
  auto a = b.input("a", {2, 1, 4, 8});
  auto w = b.value("w", {3, 8, 5}, ValueKind::kInput);
  auto y = b.value("y", {2, 3, 4, 5});
  auto t = b.task("MatMul", {a, w}, {y});
  auto& g = b.finish();
  OpWork work = forward_work(g, t);
  EXPECT_TRUE(work.known);
  EXPECT_DOUBLE_EQ(work.flops, 2.0 * (2 * 3) * 4 * 5 * 8);
  EXPECT_DOUBLE_EQ(work.bytes_read, 4.0 * (2 * 4 * 8 + 3 * 8 * 5));
  EXPECT_DOUBLE_EQ(work.bytes_written, 4.0 * (2 * 3 * 4 * 5));
}

TEST(ForwardWork, CountsAttentionAsOneFusedKernelWithoutTheScoresInItsBytes) {
  // GQA, 4-D: Q [2, 8, 16, 32], K/V [2, 2, 16, 32]: 2·B·Hq·S·L·(D + Dv) = 4·B·H·S²·D; causal skips nothing at 16
  // queries, all in one block of rows whose diagonal square the kernel computes whole.
  GraphBuilder b;
  auto q = b.input("q", {2, 8, 16, 32});
  auto k = b.input("k", {2, 2, 16, 32});
  auto v = b.input("v", {2, 2, 16, 32});
  auto y = b.value("y", {2, 8, 16, 32}), yc = b.value("yc", {2, 8, 16, 32});
  auto full = b.task("Attention", {q, k, v}, {y});
  auto causal = b.task("Attention", {q, k, v}, {yc}, {int_attr("is_causal", 1)});
  auto& g = b.finish();
  const OpWork w = forward_work(g, full);
  EXPECT_TRUE(w.known);
  EXPECT_DOUBLE_EQ(w.flops, 4.0 * 2 * 8 * 16 * 16 * 32);
  EXPECT_DOUBLE_EQ(forward_work(g, causal).flops, w.flops);
  // Q, K, V read and Y written once: nothing of size S × L.
  EXPECT_DOUBLE_EQ(w.bytes_read, 4.0 * (2 * 8 * 16 * 32 + 2 * 2 * 2 * 16 * 32));
  EXPECT_DOUBLE_EQ(w.bytes_written, 4.0 * 2 * 8 * 16 * 32);
  EXPECT_EQ(op_class(g.task(full)), OpClass::kMatMul);
}

TEST(ForwardWork, CountsCausalAttentionAsThePairsTheBlockedKernelComputes) {
  // 200 queries and keys, head 32: blocks of 64 rows (graph/flash_tiles.h); row i reads the keys up to its block's
  // last row. The oracle counts row by row.
  const int64_t seq = 200, head = 32, rows = 64;
  GraphBuilder b;
  auto q = b.input("q", {1, 2, seq, head});
  auto y = b.value("y", {1, 2, seq, head});
  auto t = b.task("Attention", {q, q, q}, {y}, {int_attr("is_causal", 1)});
  auto& g = b.finish();
  double pairs = 0;
  for (int64_t i = 0; i < seq; ++i) pairs += static_cast<double>(std::min(seq, (i / rows + 1) * rows));
  EXPECT_DOUBLE_EQ(forward_work(g, t).flops, 2.0 * 2 * pairs * (head + head));
  EXPECT_GT(pairs, seq * seq / 2.0);  // more than half: the diagonal blocks are computed whole
  EXPECT_LT(pairs, 0.7 * seq * seq);
}

TEST(ForwardWork, CountsThreeDimensionalAttentionFromItsHeadAttributes) {
  // [B, S, H·D] with 4 query heads on 2 KV heads, V head 16: 2·B·S·L·Hq·(D + Dv).
  GraphBuilder b;
  auto q = b.input("q", {2, 10, 4 * 8});
  auto k = b.input("k", {2, 12, 2 * 8});
  auto v = b.input("v", {2, 12, 2 * 16});
  auto y = b.value("y", {2, 10, 4 * 16});
  auto t = b.task("Attention", {q, k, v}, {y}, {int_attr("q_num_heads", 4), int_attr("kv_num_heads", 2)});
  auto& g = b.finish();
  EXPECT_DOUBLE_EQ(forward_work(g, t).flops, 2.0 * 2 * 10 * 12 * 4 * (8 + 16));
}

TEST(ForwardWork, PromotesRankOneMatMulOperands) {
  GraphBuilder b;
  auto a = b.input("a", {8});
  auto w = b.param("w", {8, 5});
  auto y = b.value("y", {5});
  auto t = b.task("MatMul", {a, w}, {y});
  auto& g = b.finish();
  EXPECT_DOUBLE_EQ(forward_work(g, t).flops, 2.0 * 8 * 5);
  EXPECT_DOUBLE_EQ(forward_work(g, t).fixed_bytes_read, 4.0 * 8 * 5);
}

TEST(ForwardWork, CountsGemmWithTransposeAndBias) {
  GraphBuilder b;
  auto a = b.input("a", {16, 32});
  auto w = b.param("w", {64, 32});
  auto c = b.param("c", {64});
  auto y = b.value("y", {16, 64});
  auto t = b.task("Gemm", {a, w, c}, {y}, {int_attr("transB", 1)});
  auto& g = b.finish();
  EXPECT_DOUBLE_EQ(forward_work(g, t).flops, 2.0 * 16 * 64 * 32 + 16 * 64);
}

TEST(ForwardWork, CountsGroupedConvolutionPerGroup) {
  GraphBuilder b;
  // N=2, C_in=8, 10x10, group=4, C_out=12, 3x3 kernel, stride 2, pad 1 -> 5x5 output.
  auto x = b.input("x", {2, 8, 10, 10});
  auto w = b.param("w", {12, 2, 3, 3});
  auto bias = b.param("bias", {12});
  auto y = b.value("y", {2, 12, 5, 5});
  auto t = b.task("Conv", {x, w, bias}, {y},
                  {int_attr("group", 4), ints_attr("strides", {2, 2}), ints_attr("pads", {1, 1, 1, 1})});
  auto& g = b.finish();
  const double out = 2 * 12 * 5 * 5;
  EXPECT_DOUBLE_EQ(forward_work(g, t).flops, 2.0 * out * (8 / 4) * 3 * 3 + out);
}

TEST(ForwardWork, CountsDepthwiseConvolution) {
  GraphBuilder b;
  auto x = b.input("x", {1, 32, 7, 7});
  auto w = b.param("w", {32, 1, 3, 3});
  auto y = b.value("y", {1, 32, 7, 7});
  auto t = b.task("Conv", {x, w}, {y}, {int_attr("group", 32), ints_attr("pads", {1, 1, 1, 1})});
  auto& g = b.finish();
  EXPECT_DOUBLE_EQ(forward_work(g, t).flops, 2.0 * 32 * 7 * 7 * 9);
}

TEST(ForwardWork, CountsConvTransposeFromInputElements) {
  GraphBuilder b;
  auto x = b.input("x", {1, 4, 5, 5});
  auto w = b.param("w", {4, 6, 2, 2});  // [C_in, C_out/group, k, k]
  auto y = b.value("y", {1, 6, 10, 10});
  auto t = b.task("ConvTranspose", {x, w}, {y}, {ints_attr("strides", {2, 2})});
  auto& g = b.finish();
  EXPECT_DOUBLE_EQ(forward_work(g, t).flops, 2.0 * (4 * 5 * 5) * 6 * 2 * 2);
}

TEST(ForwardWork, CountsOneFlopPerOutputElementForBroadcastElementwise) {
  GraphBuilder b;
  auto x = b.input("x", {4, 1, 6});
  auto z = b.value("z", {5, 1}, ValueKind::kInput);
  auto y = b.value("y", {4, 5, 6});
  auto t = b.task("Add", {x, z}, {y});
  auto& g = b.finish();
  OpWork work = forward_work(g, t);
  EXPECT_DOUBLE_EQ(work.flops, 4 * 5 * 6);
  EXPECT_DOUBLE_EQ(work.bytes_read, 4.0 * (24 + 5));
  EXPECT_DOUBLE_EQ(work.bytes_written, 4.0 * 120);
}

TEST(ForwardWork, CountsTranscendentalsAsOneFlop) {
  GraphBuilder b;
  auto x = b.input("x", {10, 10});
  auto y = b.value("y", {10, 10});
  auto t = b.task("Erf", {x}, {y});
  auto& g = b.finish();
  EXPECT_DOUBLE_EQ(forward_work(g, t).flops, 100);
}

TEST(ForwardWork, CountsPoolingWindows) {
  GraphBuilder b;
  auto x = b.input("x", {1, 3, 8, 8});
  auto y = b.value("y", {1, 3, 4, 4});
  auto t = b.task("MaxPool", {x}, {y}, {ints_attr("kernel_shape", {3, 3}), ints_attr("strides", {2, 2})});
  auto z = b.value("z", {1, 3, 1, 1});
  auto t2 = b.task("GlobalAveragePool", {y}, {z});
  auto& g = b.finish();
  EXPECT_DOUBLE_EQ(forward_work(g, t).flops, 3 * 4 * 4 * 9);
  EXPECT_DOUBLE_EQ(forward_work(g, t2).flops, 3 * 4 * 4 + 3);
}

TEST(ForwardWork, CountsNormalizationSoftmaxAndReductionsPerElement) {
  GraphBuilder b;
  auto x = b.input("x", {2, 3, 4});
  auto s = b.param("s", {4});
  auto y = b.value("y", {2, 3, 4});
  auto ln = b.task("LayerNormalization", {x, s, s}, {y});
  auto z = b.value("z", {2, 3, 4});
  auto sm = b.task("Softmax", {y}, {z});
  auto r = b.value("r", {2, 3, 1});
  auto rs = b.task("ReduceSum", {z}, {r});
  auto& g = b.finish();
  EXPECT_DOUBLE_EQ(forward_work(g, ln).flops, 8 * 24);
  EXPECT_DOUBLE_EQ(forward_work(g, sm).flops, 5 * 24);
  EXPECT_DOUBLE_EQ(forward_work(g, rs).flops, 24);
}

TEST(ForwardWork, CountsGatherAsRowsReadNotTheWholeTable) {
  GraphBuilder b;
  auto table = b.param("table", {1000, 16});
  auto ids = b.input("ids", {2, 3}, DType::kInt64);
  auto y = b.value("y", {2, 3, 16});
  auto t = b.task("Gather", {table, ids}, {y});
  auto& g = b.finish();
  OpWork work = forward_work(g, t);
  EXPECT_DOUBLE_EQ(work.flops, 0);
  EXPECT_DOUBLE_EQ(work.bytes_read, 6 * 8 + 6 * 16 * 4);
  EXPECT_DOUBLE_EQ(work.bytes_written, 6 * 16 * 4);
  EXPECT_TRUE(work.known);
}

TEST(ForwardWork, GivesShapeOpsZeroFlops) {
  GraphBuilder b;
  auto x = b.input("x", {2, 3, 4});
  auto shape = b.value("shape", {2}, ValueKind::kConstant, DType::kInt64);
  auto y = b.value("y", {6, 4});
  auto t = b.task("Reshape", {x, shape}, {y});
  auto z = b.value("z", {4, 6});
  auto tr = b.task("Transpose", {y}, {z});
  auto& g = b.finish();
  EXPECT_DOUBLE_EQ(forward_work(g, t).flops, 0);
  EXPECT_DOUBLE_EQ(forward_work(g, t).bytes_read, 0);
  EXPECT_DOUBLE_EQ(forward_work(g, tr).flops, 0);
  EXPECT_DOUBLE_EQ(forward_work(g, tr).bytes_written, 96);
}

TEST(ForwardWork, CountsEinsumContractions) {
  GraphBuilder b;
  auto q = b.input("q", {2, 4, 8, 16});
  auto k = b.value("k", {2, 4, 10, 16}, ValueKind::kInput);
  auto y = b.value("y", {2, 4, 8, 10});
  auto t = b.task("Einsum", {q, k}, {y}, {string_attr("equation", "bhqd,bhkd->bhqk")});
  auto& g = b.finish();
  EXPECT_DOUBLE_EQ(forward_work(g, t).flops, 2.0 * 2 * 4 * 8 * 10 * 16);
}

TEST(ForwardWork, MarksOpaqueOpsUnknownAndUsesTheFallback) {
  GraphBuilder b;
  auto x = b.input("x", {4, 4});
  auto y = b.value("y", {4, 4});
  auto t = b.task("MyCustomOp", {x}, {y});
  auto& g = b.finish();
  OpWork work = forward_work(g, t);
  EXPECT_FALSE(work.known);
  EXPECT_DOUBLE_EQ(work.flops, 16);
  EXPECT_DOUBLE_EQ(work.bytes_read + work.bytes_written, 128);
}

TEST(ForwardWork, SurvivesUnknownShapesAndMarksThemUnknown) {
  GraphBuilder b;
  auto x = b.input("x", {4, 8});
  auto w = b.unshaped("w_dyn", ValueKind::kInput);
  auto y = b.unshaped("y");
  auto t = b.task("MatMul", {x, w}, {y});
  auto z = b.unshaped("z");
  auto r = b.task("Relu", {y}, {z});
  auto c = b.unshaped("c");
  auto cv = b.task("Conv", {z, w}, {c});
  auto& g = b.finish();
  for (TaskId id : {t, r, cv}) {
    OpWork work = forward_work(g, id);
    EXPECT_FALSE(work.known);
    EXPECT_GE(work.flops, 0);
  }
  EXPECT_DOUBLE_EQ(forward_work(g, t).bytes_read, 4 * 8 * 4);
}

}  // namespace
}  // namespace apart
