// cuBLASLt's best plain bf16 GEMM on this GPU, measured: the yardstick the GPU benchmark puts its layers next to.
#include <cuda_bf16.h>

#include <algorithm>
#include <random>
#include <vector>

#include "runtime/cuda/cuda_backend.h"

namespace apart::cuda {
namespace {

// Owns the cuBLASLt descriptors of one GEMM (destroyed in reverse, also when a check throws).
struct GemmDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~GemmDescriptors() {
    if (stop) (void)cudaEventDestroy(stop);
    if (start) (void)cudaEventDestroy(start);
    if (preference) (void)cublasLtMatmulPreferenceDestroy(preference);
    if (c) (void)cublasLtMatrixLayoutDestroy(c);
    if (b) (void)cublasLtMatrixLayoutDestroy(b);
    if (a) (void)cublasLtMatrixLayoutDestroy(a);
    if (op) (void)cublasLtMatmulDescDestroy(op);
  }
};

// Random bf16 values in [-1, 1): zeros would flatter the tensor cores (less switching power, higher clocks).
std::shared_ptr<std::byte> random_bf16(CudaBackend& backend, int64_t elements, uint32_t seed) {
  std::vector<__nv_bfloat16> host(static_cast<size_t>(elements));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (auto& v : host) v = __float2bfloat16(dist(rng));
  auto device = backend.allocate(elements * static_cast<int64_t>(sizeof(__nv_bfloat16)));
  backend.copy_to_device(reinterpret_cast<const std::byte*>(host.data()), device.get(),
                         elements * static_cast<int64_t>(sizeof(__nv_bfloat16)));
  return device;
}

}  // namespace

GemmMeasurement measure_best_bf16_gemm(Backend& cuda_backend, int64_t m, int64_t n, int64_t k, int repeats,
                                       int candidates) {
  auto* backend = dynamic_cast<CudaBackend*>(&cuda_backend);
  if (backend == nullptr) throw InvalidArgument("measure_best_bf16_gemm needs the CUDA backend, not " + cuda_backend.describe());
  if (m <= 0 || n <= 0 || k <= 0 || repeats <= 0 || candidates <= 0)
    throw InvalidArgument("measure_best_bf16_gemm: sizes, repeats and candidates must be > 0");
  APART_CUDA_CHECK(cudaSetDevice(backend->device()));
  auto a = random_bf16(*backend, m * k, 1), b = random_bf16(*backend, k * n, 2), c = random_bf16(*backend, m * n, 3);

  GemmDescriptors d;
  APART_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  APART_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose));
  APART_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep));
  // Column-major: A is stored k×m (used transposed), B k×n, C m×n.
  APART_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_16BF, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k));
  APART_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_16BF, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k));
  APART_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_16BF, static_cast<uint64_t>(m), static_cast<uint64_t>(n), m));
  APART_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.preference));
  const uint64_t workspace_bytes = CudaBackend::kGemmWorkspaceBytes;
  APART_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &workspace_bytes, sizeof workspace_bytes));
  std::vector<cublasLtMatmulHeuristicResult_t> heuristics(static_cast<size_t>(candidates));
  int found = 0;
  APART_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(backend->cublaslt(), d.op, d.a, d.b, d.c, d.c, d.preference,
                                                    candidates, heuristics.data(), &found));
  if (found == 0) throw Unsupported("cuBLASLt has no bf16 GEMM algorithm for " + std::to_string(m) + "x" +
                                    std::to_string(n) + "x" + std::to_string(k));

  APART_CUDA_CHECK(cudaEventCreate(&d.start));
  APART_CUDA_CHECK(cudaEventCreate(&d.stop));
  const cudaStream_t stream = backend->compute_stream();
  const float alpha = 1, beta = 0;
  GemmMeasurement best;
  for (int i = 0; i < found; ++i) {
    if (heuristics[i].state != CUBLAS_STATUS_SUCCESS) continue;
    auto launch = [&] {
      APART_CUBLAS_CHECK(cublasLtMatmul(backend->cublaslt(), d.op, &alpha, a.get(), d.a, b.get(), d.b, &beta,
                                        c.get(), d.c, c.get(), d.c, &heuristics[i].algo, backend->gemm_workspace(),
                                        workspace_bytes, stream));
    };
    launch();
    launch();
    APART_CUDA_CHECK(cudaEventRecord(d.start, stream));
    for (int r = 0; r < repeats; ++r) launch();
    APART_CUDA_CHECK(cudaEventRecord(d.stop, stream));
    APART_CUDA_CHECK(cudaEventSynchronize(d.stop));
    float ms = 0;
    APART_CUDA_CHECK(cudaEventElapsedTime(&ms, d.start, d.stop));
    const double seconds = ms * 1e-3 / repeats;
    ++best.algorithms_tried;
    if (best.seconds == 0 || seconds < best.seconds) best.seconds = seconds;
  }
  if (best.seconds > 0) best.flops_per_s = 2.0 * static_cast<double>(m) * n * k / best.seconds;
  return best;
}

}  // namespace apart::cuda
