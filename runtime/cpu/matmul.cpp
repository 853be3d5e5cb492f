// MatMul (numpy semantics: batched, broadcast, 1-D promotion) and Gemm, over cblas_sgemm/dgemm. Under mixed
// precision (Backend::gemm_operands) float32 operands are rounded to bfloat16/float16 first, as a GPU's are.
#include "runtime/backend.h"
#include "runtime/cpu/broadcast.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/families.h"
#include "runtime/half_precision.h"

namespace apart::cpu {
namespace {

// Input i as the GEMM reads it: itself, or its values rounded to the backend's 16-bit operand type (`keep` holds
// the rounded copy for the kernel's duration).
const Tensor& gemm_operand(KernelContext& ctx, size_t i, Tensor& keep) {
  const Tensor& x = ctx.input(i);
  const DType operands = ctx.backend().gemm_operands();
  if (x.dtype() != DType::kFloat32 || operands == DType::kFloat32) return x;
  keep = rounded_through(x, operands);
  return keep;
}

void matmul_k(KernelContext& ctx) {
  Tensor a_rounded, b_rounded;
  const Tensor& a = gemm_operand(ctx, 0, a_rounded);
  const Tensor& b = gemm_operand(ctx, 1, b_rounded);
  if (a.dtype() != b.dtype()) ctx.invalid("operand dtypes differ");
  if (a.rank() == 0 || b.rank() == 0) ctx.invalid("MatMul operands must have rank >= 1");
  // A folded Transpose's input (KernelContext::input_transposed): the operand is it with the last two axes swapped.
  const bool ta = ctx.input_transposed(0), tb = ctx.input_transposed(1);
  if ((ta && a.rank() < 2) || (tb && b.rank() < 2)) ctx.invalid("a transposed operand of rank < 2");
  std::vector<int64_t> as = a.shape(), bs = b.shape();
  if (ta) std::swap(as[as.size() - 2], as.back());
  if (tb) std::swap(bs[bs.size() - 2], bs.back());
  const bool a_vec = as.size() == 1, b_vec = bs.size() == 1;
  if (a_vec) as.insert(as.begin(), 1);
  if (b_vec) bs.push_back(1);
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  if (bs[bs.size() - 2] != k)
    ctx.invalid("inner dims differ: " + shape_string(a.shape()) + " x " + shape_string(b.shape()));
  std::vector<int64_t> a_batch(as.begin(), as.end() - 2), b_batch(bs.begin(), bs.end() - 2);
  std::vector<int64_t> batch = broadcast_shapes(ctx, a_batch, b_batch);
  std::vector<int64_t> out = batch;
  if (!a_vec) out.push_back(m);
  if (!b_vec) out.push_back(n);
  dispatch(ctx, a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& y = ctx.output(0, a.dtype(), out);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* py = y.data<T>();
    const int64_t batches = product(batch);
    const int64_t lda = ta ? m : k, ldb = tb ? k : n;
    if (!ta && product(b_batch) == 1 && product(a_batch) == batches) {
      // Weights shared by every batch: one GEMM over the stacked rows of A.
      gemm<T>(false, tb, batches * m, n, k, T(1), pa, k, pb, ldb, T(0), py, n);
      return;
    }
    const auto sa = broadcast_strides(a_batch, batch), sb = broadcast_strides(b_batch, batch);
    for (int64_t i = 0; i < batches; ++i) {
      int64_t oa = 0, ob = 0, rem = i;
      for (size_t d = batch.size(); d-- > 0;) {
        const int64_t idx = rem % batch[d];
        rem /= batch[d];
        oa += idx * sa[d];
        ob += idx * sb[d];
      }
      gemm<T>(ta, tb, m, n, k, T(1), pa + oa * m * k, lda, pb + ob * k * n, ldb, T(0), py + i * m * n, n);
    }
  });
}

void gemm_k(KernelContext& ctx) {
  Tensor a_rounded, b_rounded;  // C (the bias) stays float32, as cuBLASLt's epilogue reads it
  const Tensor& a = gemm_operand(ctx, 0, a_rounded);
  const Tensor& b = gemm_operand(ctx, 1, b_rounded);
  if (a.rank() != 2 || b.rank() != 2) ctx.invalid("Gemm operands must be 2-D");
  const bool ta = ctx.attr_int("transA", 0) != 0, tb = ctx.attr_int("transB", 0) != 0;
  const int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  const int64_t n = tb ? b.dim(0) : b.dim(1);
  if ((tb ? b.dim(1) : b.dim(0)) != k) ctx.invalid("inner dims differ");
  const double alpha = ctx.attr_float("alpha", 1.0), beta = ctx.attr_float("beta", 1.0);
  dispatch(ctx, a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& y = ctx.output(0, a.dtype(), {m, n});
    T gemm_beta = T(0);
    if (ctx.has_input(2) && beta != 0) {
      const Tensor& c = ctx.input(2);
      broadcast_shapes(ctx, c.shape(), {m, n});
      binary_broadcast<T, T, T>(c, Tensor(a.dtype(), {}), y, [](T v, T) { return v; });
      gemm_beta = static_cast<T>(beta);
    }
    gemm<T>(ta, tb, m, n, k, static_cast<T>(alpha), a.data<T>(), a.dim(1), b.data<T>(), b.dim(1), gemm_beta,
            y.data<T>(), n);
  });
}

}  // namespace

void register_matmul_kernels() {
  // Every element: a GEMM with beta 0 (or over the broadcast C) writes all of Y.
  register_kernel("MatMul", matmul_k, OutputWrites::kEvery);
  register_kernel("Gemm", gemm_k, OutputWrites::kEvery);
}

}  // namespace apart::cpu
