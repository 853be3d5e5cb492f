// Host-side plans of the CUDA GEMM kernels (gemm.cu), without a CUDA header so the dev preset unit-tests them: how a
// row-major product maps onto cuBLASLt's column-major one, how an ONNX MatMul's batch dims become strided-batched
// launches, and the key of the algorithm cache.
#pragma once

#include <algorithm>
#include <compare>
#include <cstdint>
#include <vector>

#include "graph/error.h"

namespace apart::cuda {

// A stored matrix as cuBLASLt's layout describes it: column-major, rows × cols, leading dimension ld.
struct LtLayout {
  int64_t rows = 0, cols = 0, ld = 0;
  auto operator<=>(const LtLayout&) const = default;
};

// Row-major Y[m,n] = op(A)·op(B) is column-major Yᵀ[n,m] = op(B)ᵀ·op(A)ᵀ, and a row-major matrix's bytes are its
// transpose's column-major bytes: cuBLASLt's A is our B, its B is our A, its D is our Y, with the same op flags.
struct LtGemmShape {
  int64_t m = 0, n = 0, k = 0;  // cuBLASLt's: m = our n, n = our m
  bool trans_a = false, trans_b = false;  // cuBLASLt's opA (on our B) and opB (on our A)
  LtLayout a, b, d;  // a: our B as stored; b: our A as stored; d: our Y
};
// `ta`/`tb`: whether A (stored k×m) and B (stored n×k) are transposed; lda/ldb/ldc: row-major leading dims.
inline LtGemmShape row_major_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                                  int64_t ldc) {
  LtGemmShape s;
  s.m = n;
  s.n = m;
  s.k = k;
  s.trans_a = tb;
  s.trans_b = ta;
  s.a = tb ? LtLayout{k, n, ldb} : LtLayout{n, k, ldb};
  s.b = ta ? LtLayout{m, k, lda} : LtLayout{k, m, lda};
  s.d = LtLayout{n, m, ldc};
  return s;
}

// An ONNX MatMul (numpy semantics: 1-D operands promoted, batch dims broadcast) as launches of strided-batched GEMMs
// of `rows`×n×k each: product j of launch i reads A at a_offset + j·a_stride and B at b_offset + j·b_stride and
// writes Y at (i·batch_count + j)·rows·n (element offsets; a stride of 0 broadcasts the operand). Batch dims whose
// strides are regular end up in batch_count, the rest in the list of launches.
struct MatMulPlan {
  int64_t m = 0, n = 0, k = 0;
  std::vector<int64_t> output_shape;
  int64_t batches = 1;  // the product of the broadcast batch dims
  int64_t rows = 0;     // m, or batches·m where B is shared by every batch: A's batches stacked as one GEMM's rows
  int64_t batch_count = 1;
  int64_t a_stride = 0, b_stride = 0;
  struct Launch {
    int64_t a_offset = 0, b_offset = 0;
    bool operator==(const Launch&) const = default;
  };
  std::vector<Launch> launches;  // empty when Y is empty
};

// `a_shape`, `b_shape`: a valid MatMul's (rank ≥ 1, inner dims equal, batch dims broadcastable; the kernel checks).
inline MatMulPlan plan_matmul(std::vector<int64_t> as, std::vector<int64_t> bs) {
  APART_CHECK(!as.empty() && !bs.empty(), "plan_matmul: rank-0 operand");
  const bool a_vec = as.size() == 1, b_vec = bs.size() == 1;
  if (a_vec) as.insert(as.begin(), 1);
  if (b_vec) bs.push_back(1);
  MatMulPlan plan;
  plan.m = as[as.size() - 2];
  plan.k = as.back();
  plan.n = bs.back();
  APART_CHECK(bs[bs.size() - 2] == plan.k, "plan_matmul: inner dims differ");
  // Batch dims, right-aligned and padded with 1s.
  const size_t rank = std::max(as.size(), bs.size()) - 2;
  std::vector<int64_t> a_batch(rank, 1), b_batch(rank, 1), batch(rank, 1);
  std::copy(as.begin(), as.end() - 2, a_batch.end() - static_cast<std::ptrdiff_t>(as.size() - 2));
  std::copy(bs.begin(), bs.end() - 2, b_batch.end() - static_cast<std::ptrdiff_t>(bs.size() - 2));
  for (size_t d = 0; d < rank; ++d) {
    APART_CHECK(a_batch[d] == b_batch[d] || a_batch[d] == 1 || b_batch[d] == 1, "plan_matmul: batch dims differ");
    batch[d] = a_batch[d] == 1 ? b_batch[d] : a_batch[d];
  }
  auto product = [](const std::vector<int64_t>& v) {
    int64_t p = 1;
    for (int64_t x : v) p *= x;
    return p;
  };
  plan.batches = product(batch);
  plan.output_shape = batch;
  if (!a_vec) plan.output_shape.push_back(plan.m);
  if (!b_vec) plan.output_shape.push_back(plan.n);
  plan.rows = plan.m;
  if (plan.batches == 0 || plan.m == 0 || plan.n == 0) return plan;
  const int64_t a_matrix = plan.m * plan.k, b_matrix = plan.k * plan.n;
  if (product(b_batch) == 1 && product(a_batch) == plan.batches) {
    plan.rows = plan.batches * plan.m;
    plan.launches.push_back({});
    return plan;
  }
  // Strides in matrices (0 where the operand broadcasts); dims of size 1 do not move any offset.
  struct Dim {
    int64_t size, a, b;
  };
  std::vector<Dim> dims;
  int64_t a_step = 1, b_step = 1;
  for (size_t d = rank; d-- > 0;) {
    if (batch[d] != 1) dims.insert(dims.begin(), Dim{batch[d], a_batch[d] == 1 ? 0 : a_step, b_batch[d] == 1 ? 0 : b_step});
    a_step *= a_batch[d];
    b_step *= b_batch[d];
  }
  // The longest run of innermost dims over which each operand is either broadcast throughout or contiguous.
  bool a_zero = true, a_contiguous = true, b_zero = true, b_contiguous = true;
  int64_t inner = 1;
  size_t outer_dims = dims.size();
  while (outer_dims > 0) {
    const Dim& d = dims[outer_dims - 1];
    const bool az = a_zero && d.a == 0, ac = a_contiguous && d.a == inner;
    const bool bz = b_zero && d.b == 0, bc = b_contiguous && d.b == inner;
    if (!(az || ac) || !(bz || bc)) break;
    a_zero = az, a_contiguous = ac, b_zero = bz, b_contiguous = bc;
    inner *= d.size;
    --outer_dims;
  }
  plan.batch_count = inner;
  plan.a_stride = inner > 1 && a_contiguous ? a_matrix : 0;
  plan.b_stride = inner > 1 && b_contiguous ? b_matrix : 0;
  int64_t launches = 1;
  for (size_t d = 0; d < outer_dims; ++d) launches *= dims[d].size;
  plan.launches.reserve(static_cast<size_t>(launches));
  for (int64_t i = 0; i < launches; ++i) {
    int64_t rem = i, a_off = 0, b_off = 0;
    for (size_t d = outer_dims; d-- > 0;) {
      const int64_t idx = rem % dims[d].size;
      rem /= dims[d].size;
      a_off += idx * dims[d].a;
      b_off += idx * dims[d].b;
    }
    plan.launches.push_back({a_off * a_matrix, b_off * b_matrix});
  }
  return plan;
}

// The largest power of two, at most 256, that divides `address` (cuBLASLt's heuristic assumes 256-byte aligned
// operands unless told otherwise, and an algorithm chosen for more alignment than the pointer has fails).
inline int32_t pointer_alignment(uint64_t address) {
  int32_t alignment = 256;
  while (alignment > 1 && address % static_cast<uint64_t>(alignment) != 0) alignment /= 2;
  return alignment;
}

// What cuBLASLt's algorithm choice depends on: one heuristic query per distinct key, cached.
struct GemmKey {
  int32_t device = 0;
  int32_t precision = 0;  // Precision, as int
  int32_t epilogue = 0;   // 0 none, 1 bias
  bool trans_a = false, trans_b = false;
  LtLayout a, b, d;
  int64_t m = 0, n = 0, k = 0;
  int64_t batch_count = 1, stride_a = 0, stride_b = 0, stride_d = 0;
  int32_t align_a = 256, align_b = 256, align_d = 256, align_bias = 256;
  auto operator<=>(const GemmKey&) const = default;
};

}  // namespace apart::cuda
