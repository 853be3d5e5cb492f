// CudaBackend: the device, its streams and library handles, the caching pool over cudaMalloc, copies; the CUDA
// kernel registry; the entry points of cuda_entry.h. The step's vector ops are in step_kernels.cu.
#include "runtime/cuda/cuda_backend.h"

#include <cstdio>
#include <map>
#include <mutex>
#include <string>

#include "graph/error.h"
#include "runtime/cuda/families.h"

namespace apart::cuda {

namespace {

// The pool's raw allocator; `user` carries the device index, so that a block allocated from any host thread lands on
// the backend's GPU (cudaSetDevice is per thread). A non-memory failure throws CudaError, out of memory returns
// nullptr for the pool to release its cache and retry.
void* raw_device_alloc(size_t bytes, void* user) {
  APART_CUDA_CHECK(cudaSetDevice(static_cast<int>(reinterpret_cast<intptr_t>(user))));
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // clear it, so that the next cudaGetLastError() does not report it
    return nullptr;
  }
  APART_CUDA_CHECK(status);
  return p;
}
// Runs from a block's last reference, perhaps during unwinding or exit: reports, never throws.
void raw_device_free(void* p, void* /*user*/) {
  const cudaError_t status = cudaFree(p);
  if (status != cudaSuccess && status != cudaErrorCudartUnloading)
    std::fprintf(stderr, "apart: cudaFree failed: %s\n", cudaGetErrorString(status));
}

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", bytes / double(1ll << 30));
  return text;
}

// The handles and streams, from the destructor or a constructor that failed half way. Never throws.
void destroy_handles(cudaStream_t& compute, cudaStream_t& comm, cublasLtHandle_t& cublaslt, cudnnHandle_t& cudnn) {
  if (cudnn) (void)cudnnDestroy(cudnn);
  if (cublaslt) (void)cublasLtDestroy(cublaslt);
  if (comm) (void)cudaStreamDestroy(comm);
  if (compute) (void)cudaStreamDestroy(compute);
  compute = comm = nullptr;
  cublaslt = nullptr;
  cudnn = nullptr;
}

}  // namespace

CudaBackend::CudaBackend(const BackendOptions& options) : options_(options) {
  try {
    APART_CUDA_CHECK(cudaSetDevice(options_.device));
    APART_CUDA_CHECK(cudaGetDeviceProperties(&properties_, options_.device));
    // Non-blocking: neither stream waits for work on the legacy default stream (a library's stray launch).
    APART_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    APART_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
    APART_CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
    APART_CUDNN_CHECK(cudnnCreate(&cudnn_));
    APART_CUDNN_CHECK(cudnnSetStream(cudnn_, compute_));
    pool_ = std::make_unique<DevicePool>(raw_device_alloc, raw_device_free,
                                         reinterpret_cast<void*>(static_cast<intptr_t>(options_.device)));
    workspace_ = pool_->allocate(kGemmWorkspaceBytes);
  } catch (...) {
    workspace_.reset();
    pool_.reset();
    destroy_handles(compute_, comm_, cublaslt_, cudnn_);
    throw;
  }
}

CudaBackend::~CudaBackend() {
  // Kernels still running may use the workspace and scratch: wait, then hand everything back. Never throws.
  if (compute_) (void)cudaStreamSynchronize(compute_);
  if (comm_) (void)cudaStreamSynchronize(comm_);
  scratch_.reset();
  workspace_.reset();
  pool_.reset();  // frees the cached blocks; tensors still alive free theirs when they go
  destroy_handles(compute_, comm_, cublaslt_, cudnn_);
}

std::string CudaBackend::describe() const {
  int runtime = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  const size_t cudnn = cudnnGetVersion();  // cuDNN 9: major·10000 + minor·100 + patch
  return "cuda:" + std::to_string(options_.device) + " " + properties_.name + ", " +
         gib(static_cast<double>(properties_.totalGlobalMem)) + ", sm_" + std::to_string(properties_.major) +
         std::to_string(properties_.minor) + ", CUDA " + std::to_string(runtime / 1000) + "." +
         std::to_string(runtime % 1000 / 10) + ", cuDNN " + std::to_string(cudnn / 10000) + "." +
         std::to_string(cudnn % 10000 / 100) + "." + std::to_string(cudnn % 100);
}

std::shared_ptr<std::byte> CudaBackend::allocate(int64_t bytes) { return pool_->allocate(bytes); }

KernelFn CudaBackend::find_kernel(std::string_view op) const { return find_cuda_kernel(op); }

void CudaBackend::copy_to_device(const std::byte* host, std::byte* device, int64_t bytes) {
  if (bytes <= 0) return;
  APART_CUDA_CHECK(cudaMemcpyAsync(device, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, compute_));
  APART_CUDA_CHECK(cudaStreamSynchronize(compute_));
}

void CudaBackend::copy_to_host(const std::byte* device, std::byte* host, int64_t bytes) {
  if (bytes <= 0) return;
  APART_CUDA_CHECK(cudaMemcpyAsync(host, device, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, compute_));
  APART_CUDA_CHECK(cudaStreamSynchronize(compute_));
}

void CudaBackend::copy_on_device(const std::byte* from, std::byte* to, int64_t bytes) {
  if (bytes <= 0 || from == to) return;
  APART_CUDA_CHECK(cudaMemcpyAsync(to, from, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, compute_));
  APART_CUDA_CHECK(cudaStreamSynchronize(compute_));
}

void CudaBackend::synchronize() { APART_CUDA_CHECK(cudaStreamSynchronize(compute_)); }

void* CudaBackend::scratch(int64_t bytes) {
  if (bytes > scratch_bytes_) {
    // The old block may still be read by a kernel in flight; once back in the pool another stream could get it.
    APART_CUDA_CHECK(cudaStreamSynchronize(compute_));
    scratch_.reset();
    scratch_bytes_ = DevicePool::size_class(bytes);
    scratch_ = pool_->allocate(scratch_bytes_);
  }
  return scratch_.get();
}

// --- The registry ----------------------------------------------------------------

namespace {
// CMake defines APART_CUDA_HAS_<FAMILY> for each family whose file is in the tree (runtime/CMakeLists.txt).
void register_all_cuda_kernels() {
#if APART_CUDA_HAS_GEMM
  register_gemm_kernels();
#endif
#if APART_CUDA_HAS_ELEMENTWISE
  register_elementwise_kernels();
#endif
#if APART_CUDA_HAS_REDUCE
  register_reduce_kernels();
#endif
#if APART_CUDA_HAS_SHAPE
  register_shape_kernels();
#endif
#if APART_CUDA_HAS_LOSS
  register_loss_kernels();
#endif
#if APART_CUDA_HAS_CONV
  register_conv_kernels();
#endif
}

KernelRegistry& cuda_kernels() {
  static KernelRegistry registry(register_all_cuda_kernels);
  return registry;
}
}  // namespace

void register_cuda_kernel(std::string_view op, KernelFn fn) { cuda_kernels().add(op, fn); }

KernelFn find_cuda_kernel(std::string_view op) { return cuda_kernels().find(op); }

CudaBackend& backend_of(const KernelContext& ctx) {
  auto* backend = dynamic_cast<CudaBackend*>(&ctx.backend());
  APART_CHECK(backend != nullptr, "node '" + ctx.task().name + "' (" + ctx.task().op_type +
                                      "): a CUDA kernel ran on the " + std::string(backend_name(ctx.backend().kind())) +
                                      " backend");
  return *backend;
}

// --- cuda_entry.h ------------------------------------------------------------------

int visible_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    const std::string why = status != cudaSuccess
                                ? std::string(cudaGetErrorString(status)) + " (" + cudaGetErrorName(status) + ")"
                                : std::string("the driver reports 0 devices");
    (void)cudaGetLastError();
    throw Unsupported("--backend cuda: no CUDA device is visible: " + why);
  }
  if (options.device < 0 || options.device >= count)
    throw InvalidArgument("--backend cuda: device " + std::to_string(options.device) + " does not exist (" +
                          std::to_string(count) + " visible)");
  return std::make_unique<CudaBackend>(options);
}

}  // namespace apart::cuda
