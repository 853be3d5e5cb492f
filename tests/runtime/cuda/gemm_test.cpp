// The cuBLASLt MatMul and Gemm against the CPU kernels on random shapes with odd sizes (1, 7, 129, 1000), 1-D
// operands, stacked, strided and mixed batches, every transposition and every form of C: ≤ 1e-5 in fp32, 2e-3 in
// tf32, 1e-2 in mixed (bf16 operands). tf32 keeps 10 mantissa bits; where the tensor cores truncate rather than
// round, every product is ~2⁻¹⁰ low on average, a bias of ~1e-3 of Y itself, so 1e-3 would fail a correct kernel
// about half the time. MatMul's error is measured against |A|·|B| (the sum of the products' magnitudes), the scale a
// dot product's rounding error has: a bf16 operand is within 2⁻⁹ of its value, so every product is within 2⁻⁸ and
// the whole within 0.4 % of that scale plus the fp32 sum's own error, whatever the cancellation in Y. Divided by
// max|Y| instead, one 1000-long dot product that happened to cancel (|Y| ≈ 10 against |A|·|B| ≈ 250) missed 1e-2 on
// an H200 with a correct kernel. Gemm (alpha, beta, C) keeps max|Y|.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/runtime/cuda/device_test_support.h"

namespace apart::cuda {
namespace {

using testing::float_attr;
using testing::gpu;
using testing::int_attr;
using testing::make_task;
using testing::normalised_error;
using testing::random_tensor;
using testing::run_kernel;

struct PrecisionCase {
  Precision precision;
  double tolerance;
};
const std::vector<PrecisionCase> kPrecisions = {
    {Precision::kFp32, 1e-5}, {Precision::kTf32, 2e-3}, {Precision::kMixed, 1e-2}};

// The CPU kernel's and the CUDA kernel's outputs for the same task and inputs.
std::pair<Tensor, Tensor> both(Precision precision, const Task& task, const std::vector<Tensor>& inputs) {
  const Tensor want = run_kernel(cpu_backend(), find_kernel(task.op_type), task, inputs).at(0);
  const Tensor got = run_kernel(gpu(precision), find_cuda_kernel(task.op_type), task, inputs).at(0);
  return {got, want};
}

// max|got − want| / max (|a|·|b|): the error of a product against the scale its rounding errors have.
double matmul_error(const Tensor& got, const Tensor& want, const Tensor& a, const Tensor& b) {
  auto magnitudes = [](Tensor t) {
    for (float& v : t.span<float>()) v = std::fabs(v);
    return t;
  };
  const Tensor scale =
      run_kernel(cpu_backend(), find_kernel("MatMul"), make_task("MatMul"), {magnitudes(a), magnitudes(b)}).at(0);
  if (got.shape() != want.shape() || scale.shape() != want.shape()) return INFINITY;
  double diff = 0, most = 0;
  for (int64_t i = 0; i < want.elements(); ++i) {
    diff = std::max(diff, std::fabs(double(got.data<float>()[i]) - want.data<float>()[i]));
    most = std::max(most, double(scale.data<float>()[i]));
  }
  return most == 0 ? diff : diff / most;
}

TEST(CudaMatMul, MatchesTheCpuOnOddShapesVectorsAndEveryBatchForm) {
  APART_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{1, 1}, {1, 1}},           {{7, 129}, {129, 1000}},      {{1000, 7}, {7, 129}},
      {{1, 1000}, {1000, 1}},     {{129}, {129, 7}},            {{7, 129}, {129}},
      {{1000}, {1000}},           {{3, 7, 129}, {129, 33}},     {{3, 7, 129}, {3, 129, 33}},
      {{7, 129}, {5, 129, 33}},   {{2, 1, 7, 9}, {1, 3, 9, 11}}, {{4, 1, 3, 7, 9}, {3, 1, 9, 1}},
      {{2, 16, 128, 64}, {2, 16, 64, 128}},
  };
  std::mt19937 rng(5);
  for (const PrecisionCase& p : kPrecisions)
    for (const auto& [as, bs] : shapes) {
      const Tensor a = random_tensor(as, rng), b = random_tensor(bs, rng);
      const auto [got, want] = both(p.precision, make_task("MatMul"), {a, b});
      EXPECT_LE(matmul_error(got, want, a, b), p.tolerance)
          << precision_name(p.precision) << " " << shape_string(as) << " x " << shape_string(bs);
    }
}

// --precision fp16: cuBLASLt reads float16 operands; the CPU backend under fp16 rounds its operands alike, so the two
// differ only in the order of the float32 sums (a product of two float16 values is exact in float32): 1e-5 of
// |A|·|B|. A value past float16's 65504 is inf on both.
TEST(CudaMatMul, UnderFp16MatchesTheCpusFloat16RoundedOperands) {
  APART_SKIP_WITHOUT_GPU();
  const BackendOptions fp16{0, Precision::kMixed, HalfFormat::kFp16};
  const std::unique_ptr<Backend> device = make_backend(BackendKind::kCuda, fp16);
  const std::unique_ptr<Backend> cpu = make_backend(BackendKind::kCpu, fp16);
  ASSERT_EQ(device->gemm_operands(), DType::kFloat16);
  std::mt19937 rng(11);
  for (const auto& [as, bs] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{7, 129}, {129, 1000}}, {{3, 7, 129}, {3, 129, 33}}, {{1000}, {1000}}}) {
    const Tensor a = random_tensor(as, rng), b = random_tensor(bs, rng);
    const Tensor want = run_kernel(*cpu, find_kernel("MatMul"), make_task("MatMul"), {a, b}).at(0);
    const Tensor got = run_kernel(*device, find_cuda_kernel("MatMul"), make_task("MatMul"), {a, b}).at(0);
    EXPECT_LE(matmul_error(got, want, a, b), 1e-5) << shape_string(as) << " x " << shape_string(bs);
  }
  Tensor big(DType::kFloat32, {1, 1}), one(DType::kFloat32, {1, 1});
  big.data<float>()[0] = 70000.0f;
  one.data<float>()[0] = 1.0f;
  const Tensor overflow = run_kernel(*device, find_cuda_kernel("MatMul"), make_task("MatMul"), {big, one}).at(0);
  EXPECT_TRUE(std::isinf(overflow.data<float>()[0])) << overflow.data<float>()[0];
}

TEST(CudaMatMul, WritesZerosForAnEmptyInnerDimAndNothingForAnEmptyOutput) {
  APART_SKIP_WITHOUT_GPU();
  std::mt19937 rng(6);
  const auto [zeros, want] = both(Precision::kFp32, make_task("MatMul"), {random_tensor({5, 0}, rng), random_tensor({0, 3}, rng)});
  EXPECT_EQ(zeros.shape(), (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(normalised_error(zeros, want), 0.0);
  const auto [empty, want_empty] =
      both(Precision::kFp32, make_task("MatMul"), {random_tensor({0, 4, 5}, rng), random_tensor({5, 3}, rng)});
  EXPECT_EQ(empty.shape(), (std::vector<int64_t>{0, 4, 3}));
}

TEST(CudaMatMul, LeavesFloat64ToTheCpuKernel) {
  APART_SKIP_WITHOUT_GPU();
  const Tensor a(DType::kFloat64, {2, 3}), b(DType::kFloat64, {3, 2});
  EXPECT_THROW(run_kernel(gpu(), find_cuda_kernel("MatMul"), make_task("MatMul"), {a, b}), Unsupported);
}

TEST(CudaGemm, MatchesTheCpuForEveryTranspositionAlphaBetaAndFormOfC) {
  APART_SKIP_WITHOUT_GPU();
  struct Dims {
    int64_t m, n, k;
  };
  const std::vector<Dims> dims = {{1, 1, 1}, {7, 129, 1000}, {129, 7, 1}, {1000, 129, 7}, {1, 1000, 129}};
  std::mt19937 rng(8);
  for (const PrecisionCase& p : kPrecisions)
    for (const Dims& d : dims)
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
          // C: none, a row vector [n] and [1,n] (beta 1: the bias epilogue), a column [m,1], a scalar, a full [m,n].
          const std::vector<std::vector<int64_t>> c_shapes = {{}, {d.n}, {1, d.n}, {d.m, 1}, {d.m, d.n}};
          for (size_t ci = 0; ci <= c_shapes.size(); ++ci)
            for (double beta : {1.0, 2.5}) {
              const Tensor a = random_tensor(ta ? std::vector<int64_t>{d.k, d.m} : std::vector<int64_t>{d.m, d.k}, rng);
              const Tensor b = random_tensor(tb ? std::vector<int64_t>{d.n, d.k} : std::vector<int64_t>{d.k, d.n}, rng);
              std::vector<Tensor> inputs = {a, b};
              if (ci < c_shapes.size()) inputs.push_back(random_tensor(c_shapes[ci], rng));
              const Task task = make_task("Gemm", {int_attr("transA", ta), int_attr("transB", tb),
                                                   float_attr("alpha", 0.75), float_attr("beta", beta)});
              const auto [got, want] = both(p.precision, task, inputs);
              EXPECT_LE(normalised_error(got, want), p.tolerance)
                  << precision_name(p.precision) << " m=" << d.m << " n=" << d.n << " k=" << d.k << " ta=" << ta
                  << " tb=" << tb << " C=" << (ci < c_shapes.size() ? shape_string(c_shapes[ci]) : "none")
                  << " beta=" << beta;
            }
        }
}

TEST(CudaGemm, IsBetaTimesCWhenTheInnerDimIsEmpty) {
  APART_SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  const Task task = make_task("Gemm", {float_attr("beta", 2.0)});
  const auto [got, want] =
      both(Precision::kFp32, task, {random_tensor({4, 0}, rng), random_tensor({0, 3}, rng), random_tensor({3}, rng)});
  EXPECT_EQ(normalised_error(got, want), 0.0);
}

}  // namespace
}  // namespace apart::cuda
