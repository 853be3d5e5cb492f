// The CUDA GEMM's host-side plans (runtime/cuda/gemm_plan.h) on the CPU: the row-major → column-major mapping and the
// MatMul batch plan, each checked by running the plan with naive loops against a direct product.
#include "runtime/cuda/gemm_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <random>
#include <vector>

#include "graph/task_graph.h"

namespace apart::cuda {
namespace {

// What cuBLASLt computes, naively: D = op(A)·op(B), column-major, A/B/D as the layouts describe them.
void column_major_gemm(const LtGemmShape& s, const float* a, const float* b, float* d) {
  for (int64_t col = 0; col < s.n; ++col)
    for (int64_t row = 0; row < s.m; ++row) {
      float acc = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        const float av = s.trans_a ? a[p + row * s.a.ld] : a[row + p * s.a.ld];  // op(A)[row, p]
        const float bv = s.trans_b ? b[col + p * s.b.ld] : b[p + col * s.b.ld];  // op(B)[p, col]
        acc += av * bv;
      }
      d[row + col * s.d.ld] = acc;
    }
}

// Row-major Y[m,n] = op(A)·op(B), A stored m×k (k×m when ta), B stored k×n (n×k when tb).
std::vector<float> row_major_reference(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const std::vector<float>& a,
                                       const std::vector<float>& b) {
  std::vector<float> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0;
      for (int64_t p = 0; p < k; ++p)
        acc += (ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
      y[i * n + j] = acc;
    }
  return y;
}

std::vector<float> small_ints(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> dist(-3, 3);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(dist(rng));
  return v;
}

TEST(RowMajorGemm, IsTheColumnMajorProductWithTheOperandsSwappedForEveryTransposition) {
  std::mt19937 rng(7);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [m, n, k] : {std::array<int64_t, 3>{1, 1, 1}, {3, 5, 7}, {7, 1, 4}, {1, 6, 3}, {5, 4, 1}}) {
        const auto a = small_ints(static_cast<size_t>(m * k), rng), b = small_ints(static_cast<size_t>(k * n), rng);
        const LtGemmShape s = row_major_gemm(ta, tb, m, n, k, ta ? m : k, tb ? k : n, n);
        EXPECT_GE(s.a.ld, s.a.rows);
        EXPECT_GE(s.b.ld, s.b.rows);
        EXPECT_GE(s.d.ld, s.d.rows);
        std::vector<float> y(static_cast<size_t>(m * n), -99.0f);
        column_major_gemm(s, b.data(), a.data(), y.data());
        EXPECT_EQ(y, row_major_reference(ta, tb, m, n, k, a, b)) << "ta=" << ta << " tb=" << tb << " m=" << m
                                                                 << " n=" << n << " k=" << k;
      }
}

// numpy's matmul by direct broadcasting of batch indices.
std::vector<float> matmul_reference(std::vector<int64_t> as, std::vector<int64_t> bs, const std::vector<float>& a,
                                    const std::vector<float>& b) {
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  const size_t rank = std::max(as.size(), bs.size()) - 2;
  std::vector<int64_t> ab(rank, 1), bb(rank, 1), batch(rank);
  std::copy(as.begin(), as.end() - 2, ab.end() - static_cast<std::ptrdiff_t>(as.size() - 2));
  std::copy(bs.begin(), bs.end() - 2, bb.end() - static_cast<std::ptrdiff_t>(bs.size() - 2));
  int64_t batches = 1;
  for (size_t d = 0; d < rank; ++d) batches *= (batch[d] = std::max(ab[d], bb[d]));
  std::vector<float> y(static_cast<size_t>(batches * m * n));
  for (int64_t i = 0; i < batches; ++i) {
    int64_t rem = i, ai = 0, bi = 0, a_mul = 1, b_mul = 1;
    for (size_t d = rank; d-- > 0;) {
      const int64_t idx = rem % batch[d];
      rem /= batch[d];
      ai += (ab[d] == 1 ? 0 : idx) * a_mul;
      bi += (bb[d] == 1 ? 0 : idx) * b_mul;
      a_mul *= ab[d];
      b_mul *= bb[d];
    }
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        float acc = 0;
        for (int64_t p = 0; p < k; ++p) acc += a[(ai * m + r) * k + p] * b[(bi * k + p) * n + c];
        y[(i * m + r) * n + c] = acc;
      }
  }
  return y;
}

// The plan carried out as gemm.cu does: per launch, batch_count products of rows×n×k (column-major, swapped).
std::vector<float> matmul_by_plan(const MatMulPlan& plan, const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> y(static_cast<size_t>(plan.batches * plan.m * plan.n), -99.0f);
  const LtGemmShape s = row_major_gemm(false, false, plan.rows, plan.n, plan.k, plan.k, plan.n, plan.n);
  for (size_t i = 0; i < plan.launches.size(); ++i)
    for (int64_t j = 0; j < plan.batch_count; ++j) {
      const auto& l = plan.launches[i];
      column_major_gemm(s, b.data() + l.b_offset + j * plan.b_stride, a.data() + l.a_offset + j * plan.a_stride,
                        y.data() + (static_cast<int64_t>(i) * plan.batch_count + j) * plan.rows * plan.n);
    }
  return y;
}

int64_t elements(const std::vector<int64_t>& shape) {
  int64_t p = 1;
  for (int64_t d : shape) p *= d;
  return p;
}

TEST(PlanMatmul, ComputesNumpysMatmulForVectorsStacksBroadcastsAndMixedBatches) {
  std::mt19937 rng(11);
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> cases = {
      {{3, 4}, {4, 5}},        {{4}, {4, 5}},          {{3, 4}, {4}},             {{4}, {4}},
      {{2, 3, 4, 5}, {5, 6}},  {{2, 3, 4, 5}, {2, 3, 5, 6}}, {{4, 5}, {7, 5, 6}}, {{2, 1, 4, 5}, {1, 3, 5, 6}},
      {{3, 1, 2, 4, 5}, {2, 1, 5, 6}}, {{1, 3, 1, 4, 5}, {2, 1, 4, 5, 2}}, {{5, 1, 1}, {1, 1, 4}},
      {{2, 1, 3, 4}, {2, 5, 4, 3}},
  };
  for (const auto& [as, bs] : cases) {
    const auto a = small_ints(static_cast<size_t>(elements(as)), rng), b = small_ints(static_cast<size_t>(elements(bs)), rng);
    const MatMulPlan plan = plan_matmul(as, bs);
    const std::vector<float> want = matmul_reference(as, bs, a, b);
    ASSERT_EQ(elements(plan.output_shape), static_cast<int64_t>(want.size()));
    EXPECT_EQ(matmul_by_plan(plan, a, b), want) << shape_string(as) << " x " << shape_string(bs);
  }
}

TEST(PlanMatmul, StacksSharedWeightsIntoOneGemmAndKeepsRegularBatchesInOneLaunch) {
  const MatMulPlan shared = plan_matmul({2, 3, 4, 5}, {5, 6});
  EXPECT_EQ(shared.output_shape, (std::vector<int64_t>{2, 3, 4, 6}));
  EXPECT_EQ(shared.rows, 24);
  EXPECT_EQ(shared.batch_count, 1);
  EXPECT_EQ(shared.launches.size(), 1u);

  const MatMulPlan batched = plan_matmul({2, 3, 4, 5}, {2, 3, 5, 6});
  EXPECT_EQ(batched.rows, 4);
  EXPECT_EQ(batched.batch_count, 6);
  EXPECT_EQ(batched.a_stride, 20);
  EXPECT_EQ(batched.b_stride, 30);
  EXPECT_EQ(batched.launches.size(), 1u);

  const MatMulPlan a_broadcast = plan_matmul({4, 5}, {7, 5, 6});
  EXPECT_EQ(a_broadcast.batch_count, 7);
  EXPECT_EQ(a_broadcast.a_stride, 0);
  EXPECT_EQ(a_broadcast.b_stride, 30);

  // Batch [2,3]: A varies over the outer dim only, B over the inner one: 2 launches of 3.
  const MatMulPlan mixed = plan_matmul({2, 1, 4, 5}, {1, 3, 5, 6});
  EXPECT_EQ(mixed.batch_count, 3);
  EXPECT_EQ(mixed.a_stride, 0);
  EXPECT_EQ(mixed.b_stride, 30);
  EXPECT_EQ(mixed.launches, (std::vector<MatMulPlan::Launch>{{0, 0}, {20, 0}}));
}

TEST(PlanMatmul, HasNoLaunchWhenTheOutputIsEmptyAndDropsThePromotedDims) {
  EXPECT_TRUE(plan_matmul({0, 4, 5}, {5, 6}).launches.empty());
  EXPECT_TRUE(plan_matmul({3, 0}, {0, 6}).launches.size() == 1);  // k = 0: Y is zeros, the kernel fills them
  EXPECT_TRUE(plan_matmul({3, 4}, {4, 0}).launches.empty());
  EXPECT_EQ(plan_matmul({4}, {4}).output_shape, std::vector<int64_t>{});
  EXPECT_EQ(plan_matmul({2, 3, 4}, {4}).output_shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(plan_matmul({4}, {2, 4, 3}).output_shape, (std::vector<int64_t>{2, 3}));
}

TEST(PointerAlignment, IsTheLargestPowerOfTwoUpTo256DividingTheAddress) {
  EXPECT_EQ(pointer_alignment(0), 256);
  EXPECT_EQ(pointer_alignment(0x7f0000000200), 256);
  EXPECT_EQ(pointer_alignment(0x1010), 16);
  EXPECT_EQ(pointer_alignment(0x1004), 4);
  EXPECT_EQ(pointer_alignment(0x1006), 2);
  EXPECT_EQ(pointer_alignment(0x1001), 1);
}

TEST(GemmKey, SeparatesShapesThatDifferOnlyInAlignmentBatchOrPrecision) {
  GemmKey base;
  base.m = 7, base.n = 129, base.k = 1000;
  std::map<GemmKey, int> cache;
  cache[base] = 0;
  GemmKey aligned = base;
  aligned.align_a = 4;
  GemmKey batched = base;
  batched.batch_count = 3;
  GemmKey tf32 = base;
  tf32.precision = 1;
  cache[aligned] = 1;
  cache[batched] = 2;
  cache[tf32] = 3;
  cache[base] = 4;
  EXPECT_EQ(cache.size(), 4u);
  EXPECT_EQ(cache.at(base), 4);
}

}  // namespace
}  // namespace apart::cuda
