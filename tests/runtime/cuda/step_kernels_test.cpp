// CudaBackend's step operations against cpu_backend(): fill/add/scale bitwise, Σx² to 1e-12 and the same every run,
// the finiteness check, and every optimizer within 2 ulp of the CPU over 3 steps; and what needs no GPU: the
// registry, the error of a failed call, make_backend without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "runtime/cuda/cuda_check.h"
#include "tests/runtime/cuda/device_test_support.h"

namespace apart::cuda {
namespace {

using testing::gpu;
using testing::random_tensor;

// Sizes around the launch geometry: 1, odd, one block, a chunk (65536) and a bit, several chunks.
const std::vector<int64_t> kSizes = {1, 7, 129, 256, 1000, 65537, 3 * 65536 + 5};

std::vector<Tensor> random_tensors(std::mt19937& rng, float low = -1, float high = 1) {
  std::vector<Tensor> ts;
  for (int64_t n : kSizes) ts.push_back(random_tensor({n}, rng, low, high));
  return ts;
}

// Distance in representable floats (0: bitwise equal).
int64_t ulp_distance(float a, float b) {
  auto ordered = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, sizeof i);
    return i < 0 ? int64_t{std::numeric_limits<int32_t>::min()} - i : int64_t{i};
  };
  return std::llabs(ordered(a) - ordered(b));
}
int64_t max_ulp(const Tensor& a, const Tensor& b) {
  int64_t worst = 0;
  for (int64_t i = 0; i < a.elements(); ++i) worst = std::max(worst, ulp_distance(a.data<float>()[i], b.data<float>()[i]));
  return worst;
}
bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.bytes())) == 0;
}

TEST(CudaStepOps, FillAddAndScaleMatchTheCpuBitwise) {
  APART_SKIP_WITHOUT_GPU();
  CudaBackend& cuda = gpu();
  std::mt19937 rng(1);
  for (int64_t n : kSizes) {
    const Tensor a = random_tensor({n}, rng), b = random_tensor({n}, rng);
    Tensor cpu_sum = a.clone();
    cpu_backend().add_into(cpu_sum, b);
    cpu_backend().scale(cpu_sum, 0.37);
    Tensor dev = cuda.to_device(a);
    cuda.add_into(dev, cuda.to_device(b));
    cuda.scale(dev, 0.37);
    EXPECT_TRUE(bitwise_equal(cuda.to_host(dev), cpu_sum)) << "n=" << n;
    cuda.fill_zero(dev);
    EXPECT_TRUE(bitwise_equal(cuda.to_host(dev), Tensor(DType::kFloat32, {n}))) << "n=" << n;
  }
}

TEST(CudaStepOps, SumOfSquaresMatchesTheCpuTo1e12AndIsTheSameEveryRun) {
  APART_SKIP_WITHOUT_GPU();
  CudaBackend& cuda = gpu();
  std::mt19937 rng(2);
  const std::vector<Tensor> host = random_tensors(rng, -3, 3);
  std::vector<Tensor> dev;
  std::vector<const Tensor*> host_ptrs, dev_ptrs;
  for (const Tensor& t : host) dev.push_back(cuda.to_device(t));
  for (size_t i = 0; i < host.size(); ++i) host_ptrs.push_back(&host[i]), dev_ptrs.push_back(&dev[i]);
  const double want = cpu_backend().sum_of_squares(host_ptrs);
  const double got = cuda.sum_of_squares(dev_ptrs);
  EXPECT_LE(std::fabs(got - want) / want, 1e-12) << got << " vs " << want;
  for (int run = 0; run < 3; ++run) EXPECT_EQ(cuda.sum_of_squares(dev_ptrs), got) << "run " << run;
  EXPECT_EQ(cuda.sum_of_squares({}), 0.0);
}

TEST(CudaStepOps, AllFiniteFindsOneNanOrInfinityAnywhere) {
  APART_SKIP_WITHOUT_GPU();
  CudaBackend& cuda = gpu();
  std::mt19937 rng(3);
  std::vector<Tensor> host = random_tensors(rng);
  auto check = [&](bool want, const char* what) {
    std::vector<Tensor> dev;
    std::vector<const Tensor*> ptrs;
    for (const Tensor& t : host) dev.push_back(cuda.to_device(t));
    for (const Tensor& t : dev) ptrs.push_back(&t);
    EXPECT_EQ(cuda.all_finite(ptrs), want) << what;
  };
  check(true, "finite");
  host.back().data<float>()[host.back().elements() - 1] = std::numeric_limits<float>::quiet_NaN();
  check(false, "NaN as the very last element");
  host.back().data<float>()[host.back().elements() - 1] = 0;
  host[2].data<float>()[5] = -std::numeric_limits<float>::infinity();
  check(false, "-inf in the middle of a small tensor");
}

struct OptimizerCase {
  const char* name;
  OptimizerUpdate update;
  int slots;
};

TEST(CudaStepOps, EveryOptimizerMatchesTheCpuWithin2UlpOverThreeSteps) {
  APART_SKIP_WITHOUT_GPU();
  CudaBackend& cuda = gpu();
  auto make = [](Optimizer kind, double lr, double wd, double momentum, bool nesterov) {
    OptimizerUpdate u;
    u.kind = kind;
    u.lr = lr;
    u.weight_decay = wd;
    u.momentum = momentum;
    u.nesterov = nesterov;
    return u;
  };
  const std::vector<OptimizerCase> cases = {
      {"sgd", make(Optimizer::kSgd, 0.1, 0.01, 0, false), 0},
      {"momentum", make(Optimizer::kMomentum, 0.05, 0.01, 0.9, false), 1},
      {"nesterov", make(Optimizer::kMomentum, 0.05, 0, 0.9, true), 1},
      {"adam", make(Optimizer::kAdam, 1e-3, 0.01, 0, false), 2},
      {"adamw", make(Optimizer::kAdamW, 1e-3, 0.1, 0, false), 2},
  };
  for (const OptimizerCase& c : cases) {
    std::mt19937 rng(4);
    std::vector<Tensor> cpu_params = random_tensors(rng), cpu_states, dev_params, dev_grads, dev_states;
    for (const Tensor& p : cpu_params) {
      dev_params.push_back(cuda.to_device(p));
      for (int s = 0; s < c.slots; ++s) {
        cpu_states.emplace_back(DType::kFloat32, p.shape());
        dev_states.push_back(cuda.empty(DType::kFloat32, p.shape()));
      }
    }
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<Tensor> cpu_grads = random_tensors(rng);
      dev_grads.clear();
      for (const Tensor& g : cpu_grads) dev_grads.push_back(cuda.to_device(g));
      auto pointers = [](std::vector<Tensor>& ts) {
        std::vector<Tensor*> ps;
        for (Tensor& t : ts) ps.push_back(&t);
        return ps;
      };
      OptimizerUpdate u = c.update;
      u.step = step;
      cpu_backend().optimizer_step(u, pointers(cpu_params), pointers(cpu_grads), pointers(cpu_states));
      cuda.optimizer_step(u, pointers(dev_params), pointers(dev_grads), pointers(dev_states));
    }
    for (size_t i = 0; i < cpu_params.size(); ++i)
      EXPECT_LE(max_ulp(cuda.to_host(dev_params[i]), cpu_params[i]), 2) << c.name << " param " << i;
    for (size_t i = 0; i < cpu_states.size(); ++i)
      EXPECT_LE(max_ulp(cuda.to_host(dev_states[i]), cpu_states[i]), 2) << c.name << " state " << i;
  }
}

TEST(CudaStepOps, RefuseHostTensors) {
  APART_SKIP_WITHOUT_GPU();
  Tensor host(DType::kFloat32, {4});
  EXPECT_THROW(gpu().fill_zero(host), Error);
}

TEST(CudaBackend, DescribesTheDeviceAndHandsOutAlignedReusedBlocks) {
  APART_SKIP_WITHOUT_GPU();
  CudaBackend& cuda = gpu();
  const std::string line = cuda.describe();
  EXPECT_EQ(line.rfind("cuda:0 ", 0), 0u) << line;
  EXPECT_NE(line.find(", sm_"), std::string::npos) << line;
  EXPECT_NE(line.find(", cuDNN "), std::string::npos) << line;
  const int64_t raw_before = [&] {
    auto block = cuda.allocate(1000);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(block.get()) % 256, 0u);
    return cuda.pool().raw_allocations();
  }();
  auto again = cuda.allocate(1000);  // the block just freed, from the cache
  EXPECT_EQ(cuda.pool().raw_allocations(), raw_before);
}

// --- No GPU needed ---------------------------------------------------------------------------------------------------

TEST(CudaRegistry, HasTheGemmKernels) {
  EXPECT_NE(find_cuda_kernel("MatMul"), nullptr);
  EXPECT_NE(find_cuda_kernel("Gemm"), nullptr);
  EXPECT_EQ(find_cuda_kernel("NoSuchOp"), nullptr);
}

TEST(CudaCheck, NamesTheLibraryStatementFileLineAndCudasError) {
  try {
    APART_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "no throw";
  } catch (const CudaError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kSystemError);
    EXPECT_NE(what.find("CUDA call failed: cudaErrorInvalidValue at tests/runtime/cuda/step_kernels_test.cpp:"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("(cudaErrorInvalidValue)"), std::string::npos) << what;
  }
}

TEST(MakeCudaBackend, WithoutAGpuIsUnsupportedNamingCudasReason) {
  if (testing::why_no_gpu().empty()) GTEST_SKIP() << "a GPU is visible: the no-device path cannot be taken";
  EXPECT_EQ(cuda_device_count(), 0);
  try {
    make_backend(BackendKind::kCuda);
    FAIL() << "no throw";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device is visible: "), std::string::npos) << e.what();
  }
}

TEST(MakeCudaBackend, RefusesADeviceThatDoesNotExist) {
  APART_SKIP_WITHOUT_GPU();
  EXPECT_THROW(make_backend(BackendKind::kCuda, {cuda_device_count(), Precision::kFp32}), InvalidArgument);
}

}  // namespace
}  // namespace apart::cuda
