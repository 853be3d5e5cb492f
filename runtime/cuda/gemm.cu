// MatMul (ONNX/numpy semantics) and Gemm on the GPU through cuBLASLt: row-major products as cuBLASLt's column-major
// ones (gemm_plan.h), batches as strided-batched launches, Gemm's row-vector C as the bias epilogue. The precision is
// the backend's: fp32 (pedantic: no reduced-precision shortcut, even under NVIDIA_TF32_OVERRIDE), tf32 (tensor cores
// on float operands), mixed (operands rounded to bf16, or fp16 under --precision fp16, in scratch, fp32 accumulation and output). float32 only: other
// dtypes are Unsupported, for the CPU kernel to run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/gemm_plan.h"
#include "runtime/kernel.h"

namespace apart::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;
// Strided batches per cuBLASLt call: no kernel of any algorithm meets a grid's 65535 limit in y/z.
constexpr int64_t kMaxBatchPerCall = 65535;

int grid_for(int64_t n) { return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks)); }

__global__ void to_bf16_kernel(const float* in, __nv_bfloat16* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

// float16 operands (--precision fp16): to nearest even, ±inf past 65504, as the CPU's rounded_through.
__global__ void to_fp16_kernel(const float* in, __half* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = __float2half_rn(in[i]);
}

// y[i, j] = factor · c[i·row_stride + j·col_stride] over [rows, cols] (Gemm's C broadcast into Y).
__global__ void broadcast_c_kernel(const float* c, int64_t row_stride, int64_t col_stride, float factor, float* y,
                                   int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, col = i % cols;
    y[i] = __fmul_rn(c[r * row_stride + col * col_stride], factor);
  }
}

// --- cuBLASLt descriptors, destroyed on every path -----------------------------------------------------------------

struct MatmulDesc {
  cublasLtMatmulDesc_t handle = nullptr;
  ~MatmulDesc() {
    if (handle) (void)cublasLtMatmulDescDestroy(handle);
  }
};
struct Layout {
  cublasLtMatrixLayout_t handle = nullptr;
  ~Layout() {
    if (handle) (void)cublasLtMatrixLayoutDestroy(handle);
  }
};
struct Preference {
  cublasLtMatmulPreference_t handle = nullptr;
  ~Preference() {
    if (handle) (void)cublasLtMatmulPreferenceDestroy(handle);
  }
};

// One cuBLASLt call: D = alpha · op(A)·op(B) (+ beta · D) (+ bias), in cuBLASLt's column-major terms.
struct LtCall {
  LtGemmShape shape;
  int64_t batch_count = 1, stride_a = 0, stride_b = 0, stride_d = 0;  // elements
  const void* a = nullptr;
  const void* b = nullptr;
  float* d = nullptr;
  cudaDataType_t operand_type = CUDA_R_32F;  // CUDA_R_16BF / CUDA_R_16F under mixed precision
  float alpha = 1, beta = 0;
  const float* bias = nullptr;  // length shape.m (our n): CUBLASLT_EPILOGUE_BIAS
};

// The heuristic's choice per key (nullopt: none fits, the caller falls back), shared by every backend of the process.
std::mutex algo_mutex;
std::map<GemmKey, std::optional<cublasLtMatmulAlgo_t>> algo_cache;

void make_layout(Layout& layout, cudaDataType_t type, const LtLayout& l, const LtCall& call, int64_t stride) {
  APART_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout.handle, type, static_cast<uint64_t>(l.rows),
                                                static_cast<uint64_t>(l.cols), l.ld));
  if (call.batch_count > 1) {
    const int32_t count = static_cast<int32_t>(call.batch_count);
    APART_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout.handle, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                        sizeof count));
    APART_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout.handle, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                        &stride, sizeof stride));
  }
}

// Runs `call`; false (and nothing launched) when no algorithm supports it and `may_refuse` (the bias epilogue, which
// the caller then replaces by a copy of C and beta = 1).
bool run_lt(CudaBackend& backend, const LtCall& call, bool may_refuse) {
  const Precision precision = backend.precision();
  const cublasComputeType_t compute = precision == Precision::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                      : precision == Precision::kMixed ? CUBLAS_COMPUTE_32F
                                                                       : CUBLAS_COMPUTE_32F_PEDANTIC;
  const cudaDataType_t operand_type = call.operand_type;
  MatmulDesc op;
  APART_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op.handle, compute, CUDA_R_32F));
  const cublasOperation_t trans_a = call.shape.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_b = call.shape.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  APART_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.handle, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a));
  APART_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.handle, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b));
  if (call.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    APART_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op.handle, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    const void* bias = call.bias;
    APART_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.handle, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    const cudaDataType_t bias_type = CUDA_R_32F;
    APART_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op.handle, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
  }
  Layout a, b, d;
  make_layout(a, operand_type, call.shape.a, call, call.stride_a);
  make_layout(b, operand_type, call.shape.b, call, call.stride_b);
  make_layout(d, CUDA_R_32F, call.shape.d, call, call.stride_d);

  GemmKey key;
  key.device = backend.device();
  key.precision = static_cast<int32_t>(precision) | static_cast<int32_t>(call.operand_type) << 8;  // bf16 vs fp16 operands
  key.epilogue = call.bias ? 1 : 0;
  key.trans_a = call.shape.trans_a;
  key.trans_b = call.shape.trans_b;
  key.a = call.shape.a;
  key.b = call.shape.b;
  key.d = call.shape.d;
  key.m = call.shape.m;
  key.n = call.shape.n;
  key.k = call.shape.k;
  key.batch_count = call.batch_count;
  key.stride_a = call.stride_a;
  key.stride_b = call.stride_b;
  key.stride_d = call.stride_d;
  key.align_a = pointer_alignment(reinterpret_cast<uint64_t>(call.a));
  key.align_b = pointer_alignment(reinterpret_cast<uint64_t>(call.b));
  key.align_d = pointer_alignment(reinterpret_cast<uint64_t>(call.d));
  key.align_bias = call.bias ? pointer_alignment(reinterpret_cast<uint64_t>(call.bias)) : 256;

  std::optional<cublasLtMatmulAlgo_t> algo;
  {
    std::lock_guard lock(algo_mutex);
    auto it = algo_cache.find(key);
    if (it != algo_cache.end()) {
      algo = it->second;
    } else {
      Preference preference;
      APART_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference.handle));
      const uint64_t workspace = CudaBackend::kGemmWorkspaceBytes;
      APART_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          preference.handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
      // The pointers' real alignment (the heuristic assumes 256 B otherwise), so the algorithm fits these operands.
      const uint32_t align_a = static_cast<uint32_t>(key.align_a), align_b = static_cast<uint32_t>(key.align_b);
      const uint32_t align_d = static_cast<uint32_t>(key.align_d);
      APART_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a));
      APART_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b));
      APART_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof align_d));
      APART_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof align_d));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(backend.cublaslt(), op.handle, a.handle, b.handle,
                                                                   d.handle, d.handle, preference.handle, 1, &result,
                                                                   &found);
      if (status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS)
        algo = result.algo;
      else if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED)
        APART_CUBLAS_CHECK(status);
      algo_cache.emplace(key, algo);
    }
  }
  if (!algo) {
    if (may_refuse) return false;
    throw Unsupported("cuBLASLt has no algorithm for a " + std::to_string(call.shape.n) + "x" +
                      std::to_string(call.shape.m) + "x" + std::to_string(call.shape.k) + " GEMM (batch " +
                      std::to_string(call.batch_count) + ", precision " + std::string(precision_name(precision)) + ")");
  }
  APART_CUBLAS_CHECK(cublasLtMatmul(backend.cublaslt(), op.handle, &call.alpha, call.a, a.handle, call.b, b.handle,
                                    &call.beta, call.d, d.handle, call.d, d.handle, &*algo, backend.gemm_workspace(),
                                    CudaBackend::kGemmWorkspaceBytes, backend.compute_stream()));
  return true;
}

// The GEMM operands as cuBLASLt reads them: the float32 tensors themselves, or (mixed precision) bf16 or fp16
// copies of both in one scratch block (Backend::gemm_operands).
struct Operands {
  const std::byte* a = nullptr;
  const std::byte* b = nullptr;
  cudaDataType_t type = CUDA_R_32F;
  int64_t element_bytes = 4;
};
// One operand converted into `to` on the compute stream.
void convert_operand(CudaBackend& backend, const Tensor& x, DType half, std::byte* to) {
  if (x.elements() == 0) return;
  if (half == DType::kFloat16)
    to_fp16_kernel<<<grid_for(x.elements()), kThreads, 0, backend.compute_stream()>>>(
        x.data<float>(), reinterpret_cast<__half*>(to), x.elements());
  else
    to_bf16_kernel<<<grid_for(x.elements()), kThreads, 0, backend.compute_stream()>>>(
        x.data<float>(), reinterpret_cast<__nv_bfloat16*>(to), x.elements());
  APART_CUDA_CHECK(cudaGetLastError());
}
Operands gemm_operands(CudaBackend& backend, const Tensor& a, const Tensor& b) {
  const DType half = backend.gemm_operands();
  if (half == DType::kFloat32) return {a.raw(), b.raw(), CUDA_R_32F, 4};
  const int64_t a_bytes = (a.elements() * 2 + 255) / 256 * 256;
  auto* scratch = static_cast<std::byte*>(backend.scratch(a_bytes + b.elements() * 2));
  convert_operand(backend, a, half, scratch);
  convert_operand(backend, b, half, scratch + a_bytes);
  return {scratch, scratch + a_bytes, half == DType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF, 2};
}

// float32 device operands, else Unsupported (float64 and integers run on the CPU kernel).
void require_float32(const KernelContext& ctx, const Tensor& t) {
  if (t.dtype() != DType::kFloat32)
    throw Unsupported("node '" + ctx.task().name + "' (" + ctx.task().op_type +
                      "): the CUDA backend does not support dtype " + std::string(dtype_name(t.dtype())) +
                      " (float32 only; the CPU kernel runs it)");
}

void zero(CudaBackend& backend, Tensor& y) {
  APART_CUDA_CHECK(cudaMemsetAsync(y.raw(), 0, static_cast<size_t>(y.bytes()), backend.compute_stream()));
}

void matmul_k(KernelContext& ctx) {
  CudaBackend& backend = backend_of(ctx);
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != b.dtype()) ctx.invalid("operand dtypes differ");
  require_float32(ctx, a);
  if (a.rank() == 0 || b.rank() == 0) ctx.invalid("MatMul operands must have rank >= 1");
  std::vector<int64_t> as = a.shape(), bs = b.shape();
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  if (bs[bs.size() - 2] != as.back())
    ctx.invalid("inner dims differ: " + shape_string(a.shape()) + " x " + shape_string(b.shape()));
  broadcast_shapes(ctx, std::vector<int64_t>(as.begin(), as.end() - 2), std::vector<int64_t>(bs.begin(), bs.end() - 2));
  const MatMulPlan plan = plan_matmul(a.shape(), b.shape());
  Tensor& y = ctx.output(0, DType::kFloat32, plan.output_shape);
  if (y.elements() == 0) return;
  if (plan.k == 0) return zero(backend, y);
  const Operands ops = gemm_operands(backend, a, b);
  const LtGemmShape shape = row_major_gemm(false, false, plan.rows, plan.n, plan.k, plan.k, plan.n, plan.n);
  const int64_t y_matrix = plan.rows * plan.n;
  for (size_t launch = 0; launch < plan.launches.size(); ++launch) {
    const MatMulPlan::Launch& l = plan.launches[launch];
    for (int64_t first = 0; first < plan.batch_count; first += kMaxBatchPerCall) {
      LtCall call;
      call.shape = shape;
      call.batch_count = std::min(kMaxBatchPerCall, plan.batch_count - first);
      // cuBLASLt's A is our B, its B our A (gemm_plan.h).
      call.stride_a = plan.b_stride;
      call.stride_b = plan.a_stride;
      call.stride_d = y_matrix;
      call.a = ops.b + (l.b_offset + first * plan.b_stride) * ops.element_bytes;
      call.b = ops.a + (l.a_offset + first * plan.a_stride) * ops.element_bytes;
      call.d = y.data<float>() + (static_cast<int64_t>(launch) * plan.batch_count + first) * y_matrix;
      call.operand_type = ops.type;
      run_lt(backend, call, false);
    }
  }
}

void gemm_k(KernelContext& ctx) {
  CudaBackend& backend = backend_of(ctx);
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.rank() != 2 || b.rank() != 2) ctx.invalid("Gemm operands must be 2-D");
  require_float32(ctx, a);
  require_float32(ctx, b);
  const bool ta = ctx.attr_int("transA", 0) != 0, tb = ctx.attr_int("transB", 0) != 0;
  const int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  const int64_t n = tb ? b.dim(0) : b.dim(1);
  if ((tb ? b.dim(1) : b.dim(0)) != k) ctx.invalid("inner dims differ");
  const float alpha = static_cast<float>(ctx.attr_float("alpha", 1.0));
  const float beta = static_cast<float>(ctx.attr_float("beta", 1.0));
  const bool with_c = ctx.has_input(2) && beta != 0;
  const Tensor* c = with_c ? &ctx.input(2) : nullptr;
  std::vector<int64_t> c_strides;
  if (c) {
    require_float32(ctx, *c);
    if (broadcast_shapes(ctx, c->shape(), {m, n}) != std::vector<int64_t>{m, n})
      ctx.invalid("C of shape " + shape_string(c->shape()) + " does not broadcast to [" + std::to_string(m) + "," +
                  std::to_string(n) + "]");
    c_strides = broadcast_strides(c->shape(), {m, n});
  }
  Tensor& y = ctx.output(0, DType::kFloat32, {m, n});
  if (y.elements() == 0) return;
  const cudaStream_t stream = backend.compute_stream();
  auto broadcast_c = [&](float factor) {
    broadcast_c_kernel<<<grid_for(m * n), kThreads, 0, stream>>>(c->data<float>(), c_strides[0], c_strides[1], factor,
                                                                 y.data<float>(), m, n);
    APART_CUDA_CHECK(cudaGetLastError());
  };
  if (k == 0) {  // the product is empty: Y = beta · C
    if (c) broadcast_c(beta);
    else zero(backend, y);
    return;
  }
  const Operands ops = gemm_operands(backend, a, b);
  LtCall call;
  call.shape = row_major_gemm(ta, tb, m, n, k, a.dim(1), b.dim(1), n);
  call.a = ops.b;
  call.b = ops.a;
  call.d = y.data<float>();
  call.operand_type = ops.type;
  call.alpha = alpha;
  // C a row vector (one value per column of Y) and beta 1: the bias epilogue, no pass over Y.
  const bool row_vector = c && c->elements() == n && c_strides[0] == 0 && (c_strides[1] == 1 || n == 1);
  if (row_vector && beta == 1.0f) {
    call.bias = c->data<float>();
    if (run_lt(backend, call, true)) return;
    call.bias = nullptr;
  }
  if (c) broadcast_c(1.0f);
  call.beta = c ? beta : 0.0f;
  run_lt(backend, call, false);
}

}  // namespace

void register_gemm_kernels() {
  register_cuda_kernel("MatMul", matmul_k);
  register_cuda_kernel("Gemm", gemm_k);
}

}  // namespace apart::cuda
