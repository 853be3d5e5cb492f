// The runtime on a Backend, proven on the CPU: a test-only device backend in host memory (host_device_backend.h)
// runs models and trains them bitwise as the CPU backend does, with each task on the backend's kernel or the CPU's,
// persistent values copied once, and no raw allocation after the first step; the caching pool; names and errors.
#include <gtest/gtest.h>

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>

#include "graph/error.h"
#include "importer/importer.h"
#include "runtime/backend.h"
#include "runtime/device_pool.h"
#include "runtime/executor.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "tests/runtime/host_device_backend.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {
namespace fs = std::filesystem;
using testing::HostDeviceBackend;
using testing::OnnxBuilder;
using testing::TempDir;

std::string gpt_tiny() { return std::string(APART_SOURCE_DIR) + "/models/gpt-tiny.onnx"; }

Tensor random_floats(std::mt19937& rng, std::vector<int64_t> shape) {
  Tensor t(DType::kFloat32, std::move(shape));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : t.span<float>()) v = normal(rng);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::equal(a.raw(), a.raw() + a.bytes(), b.raw());
}

// --- Names and construction ---

TEST(ABackendName, ParsesBackAndRefusesUnknownNamesListingTheKnownOnes) {
  EXPECT_EQ(parse_backend(backend_name(BackendKind::kCpu)), BackendKind::kCpu);
  EXPECT_EQ(parse_backend(backend_name(BackendKind::kCuda)), BackendKind::kCuda);
  try {
    parse_backend("tpu");
    FAIL() << "parse_backend accepted tpu";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cpu or cuda"), std::string::npos) << e.what();
  }
}

TEST(MakeBackend, OfTheCpuRoundsGemmOperandsOnlyUnderMixedPrecision) {
  EXPECT_EQ(make_backend(BackendKind::kCpu)->gemm_operands(), DType::kFloat32);
  EXPECT_EQ(make_backend(BackendKind::kCpu, {0, Precision::kTf32})->gemm_operands(), DType::kFloat32);
  EXPECT_EQ(make_backend(BackendKind::kCpu, {0, Precision::kMixed})->gemm_operands(), DType::kBFloat16);
  EXPECT_EQ(make_backend(BackendKind::kCpu, {0, Precision::kMixed, HalfFormat::kFp16})->gemm_operands(), DType::kFloat16);
  EXPECT_EQ(cpu_backend().gemm_operands(), DType::kFloat32);
}

TEST(MakeBackend, OfCudaIsUnsupportedWithoutCudaOrAGpu) {
  if (cuda_built() && cuda_device_count() > 0) GTEST_SKIP() << "this build has CUDA and sees a GPU";
  try {
    make_backend(BackendKind::kCuda);
    FAIL() << "make_backend(kCuda) succeeded without CUDA or a GPU";
  } catch (const Unsupported& e) {
    EXPECT_EQ(exit_code(ErrorKind::kUnsupported), 4);
    if (!cuda_built()) EXPECT_NE(std::string(e.what()).find("cmake --preset gpu"), std::string::npos) << e.what();
  }
}

TEST(TheCpuBackend, CopiesTensorsBetweenAnyPlacementsItKnows) {
  Backend& cpu = cpu_backend();
  Tensor a(DType::kFloat32, {3});
  a.span<float>()[1] = 2.5f;
  Tensor b(DType::kFloat32, {3});
  cpu.copy(a, b);
  EXPECT_TRUE(same_bytes(a, b));
  EXPECT_EQ(cpu.to_host(a).raw(), a.raw()) << "to_host of a host tensor shares it";
  Tensor longer(DType::kFloat32, {4});
  EXPECT_THROW(cpu.copy(a, longer), Error);
}

// --- The caching pool ---

struct CountingAllocator {
  int64_t allocations = 0, frees = 0;
  int fail = 0;
  static void* alloc(size_t bytes, void* self) {
    auto* me = static_cast<CountingAllocator*>(self);
    if (me->fail > 0) {
      --me->fail;
      return nullptr;
    }
    ++me->allocations;
    return std::malloc(bytes);
  }
  static void release(void* p, void* self) {
    ++static_cast<CountingAllocator*>(self)->frees;
    std::free(p);
  }
};

TEST(ADevicePool, ReusesAFreedBlockForAnyRequestOfItsSizeClass) {
  CountingAllocator raw;
  DevicePool pool(CountingAllocator::alloc, CountingAllocator::release, &raw);
  EXPECT_EQ(DevicePool::size_class(1), 512);
  EXPECT_EQ(DevicePool::size_class(513), 1024);
  EXPECT_EQ(DevicePool::size_class((1 << 20) + 1), 2 << 20);
  void* first = nullptr;
  {
    auto block = pool.allocate(1000);
    first = block.get();
    EXPECT_EQ(pool.bytes_in_use(), 1024);
  }
  EXPECT_EQ(pool.bytes_in_use(), 0);
  EXPECT_EQ(pool.bytes_cached(), 1024);
  auto again = pool.allocate(600);  // the same class, 1024
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(raw.allocations, 1);
  auto other = pool.allocate(5000);  // another class: a raw allocation
  EXPECT_EQ(raw.allocations, 2);
  EXPECT_EQ(pool.raw_allocations(), 2);
  EXPECT_EQ(pool.peak_bytes_in_use(), 1024 + 5120);
}

TEST(ADevicePool, FreesItsCacheAndRetriesOnceWhenTheRawAllocatorFails) {
  CountingAllocator raw;
  DevicePool pool(CountingAllocator::alloc, CountingAllocator::release, &raw);
  pool.allocate(4096).reset();  // one cached block
  EXPECT_EQ(pool.bytes_cached(), 4096);
  raw.fail = 1;
  auto block = pool.allocate(100000);
  EXPECT_NE(block, nullptr);
  EXPECT_EQ(pool.bytes_cached(), 0) << "the cache went back to the raw allocator before the retry";
  EXPECT_EQ(raw.frees, 1);
}

TEST(ADevicePool, ThrowsInfeasibleNamingTheBytesWhenTheRetryFailsToo) {
  CountingAllocator raw;
  DevicePool pool(CountingAllocator::alloc, CountingAllocator::release, &raw);
  auto held = pool.allocate(3 << 20);
  raw.fail = 2;
  try {
    pool.allocate(5 << 20);
    FAIL() << "allocate succeeded";
  } catch (const Infeasible& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot allocate"), std::string::npos) << what;
    EXPECT_NE(what.find("in use"), std::string::npos) << what;
    EXPECT_NE(what.find("MiB"), std::string::npos) << what;
  }
  EXPECT_EQ(pool.bytes_in_use(), 4 << 20) << "the failed request holds nothing";
}

TEST(ADevicePool, LetsBlocksOutliveItAndFreesThemWhenTheirLastReferenceGoes) {
  CountingAllocator raw;
  std::shared_ptr<std::byte> survivor;
  {
    DevicePool pool(CountingAllocator::alloc, CountingAllocator::release, &raw);
    survivor = pool.allocate(100);
    pool.allocate(200).reset();  // cached: freed with the pool
  }
  EXPECT_EQ(raw.frees, 1);
  survivor.reset();
  EXPECT_EQ(raw.frees, 2);
  EXPECT_EQ(raw.allocations, 2);
}

// --- The executor on a device backend ---

// x [2,3] · w [3,4] → Reshape to [4,2] (host-only on the test device) → Relu → + c (a Constant node): the backend
// runs MatMul, Relu and Add, the CPU the Reshape.
fs::path write_mixed_model(const TempDir& dir) {
  OnnxBuilder b;
  b.input("x", {2, 3}).output("y");
  std::mt19937 rng(3);
  b.initializer(random_floats(rng, {3, 4}), "w");
  b.int_initializer("shape", {4, 2});
  auto& c = b.node("Constant", {}, {"c"});
  onnx::AttributeProto* value = c.add_attribute();
  value->set_name("value");
  value->set_type(onnx::AttributeProto::TENSOR);
  tensor_to_proto(random_floats(rng, {4, 2}), "c", *value->mutable_t());
  b.node("MatMul", {"x", "w"}, {"h"});
  b.node("Reshape", {"h", "shape"}, {"r"});
  b.node("Relu", {"r"}, {"a"});
  b.node("Add", {"a", "c"}, {"y"});
  const fs::path file = dir / "mixed.onnx";
  b.save(file);
  return file;
}

TEST(AnExecutorOnADeviceBackend, RunsEachTaskOnTheBackendOrTheCpuAndComputesWhatTheCpuComputes) {
  TempDir dir;
  const ImportedModel model = import_model(write_mixed_model(dir));
  HostDeviceBackend device;
  ExecutorOptions on_device;
  on_device.backend = &device;
  Executor cpu(model), dev(model, on_device);
  EXPECT_TRUE(cpu.fallback_ops().empty());
  EXPECT_EQ(dev.fallback_ops(), std::vector<std::string>{"Reshape"});
  ASSERT_NE(dev.param("w"), nullptr);
  EXPECT_FALSE(dev.param("w")->on_host()) << "a float param lives on the backend";
  std::mt19937 rng(5);
  const Tensor x = random_floats(rng, {2, 3});
  const NamedTensors expected = cpu.run({{"x", x}});
  const NamedTensors got = dev.run({{"x", x}});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].second.on_host()) << "run() returns host copies";
  EXPECT_TRUE(same_bytes(got[0].second, expected[0].second));
}

TEST(AnExecutorOnADeviceBackend, CopiesParamsAndConstantsOnceAtLoadAndOnlyActivationsPerStep) {
  TempDir dir;
  const ImportedModel model = import_model(write_mixed_model(dir));
  HostDeviceBackend device;
  ExecutorOptions on_device;
  on_device.backend = &device;
  Executor dev(model, on_device);
  // At load: w (a float param) and c (a constant Add reads on the backend); the shape stays on the host (only the
  // CPU's Reshape reads it).
  EXPECT_EQ(device.to_device_copies, 2);
  EXPECT_EQ(device.to_host_copies, 0);
  std::mt19937 rng(5);
  for (int step = 1; step <= 3; ++step) {
    dev.run({{"x", random_floats(rng, {2, 3})}});
    // Per step: x and Reshape's output go to the backend; MatMul's output to the host for Reshape, y back to the caller.
    EXPECT_EQ(device.to_device_copies, 2 + 2 * step) << "step " << step;
    EXPECT_EQ(device.to_host_copies, 2 * step) << "step " << step;
  }
}

TEST(AnExecutorOnADeviceBackend, ReturnsOutputsInTheBackendsMemoryWhenAskedAndTakesDeviceInputs) {
  TempDir dir;
  const ImportedModel model = import_model(write_mixed_model(dir));
  HostDeviceBackend device;
  ExecutorOptions on_device;
  on_device.backend = &device;
  on_device.outputs_on_backend = true;
  Executor cpu(model), dev(model, on_device);
  std::mt19937 rng(9);
  const Tensor x = random_floats(rng, {2, 3});
  const NamedTensors expected = cpu.run({{"x", x}});
  const Tensor x_on_device = device.to_device(x);
  const int64_t uploads = device.to_device_copies;
  NamedTensors first = dev.run({{"x", x_on_device}});
  EXPECT_EQ(device.to_device_copies, uploads + 1) << "only Reshape's output goes up: x is there already";
  ASSERT_FALSE(first[0].second.on_host());
  const Tensor kept = device.to_host(first[0].second);
  dev.run({{"x", device.to_device(random_floats(rng, {2, 3}))}});
  EXPECT_TRUE(same_bytes(device.to_host(first[0].second), kept)) << "an output is not a slice the next run overwrites";
  EXPECT_TRUE(same_bytes(kept, expected[0].second));
}

TEST(AnExecutorOnADeviceBackend, RunsGptTinyBitwiseAsTheCpuAndFallsBackForExactlyTheHostOnlyOps) {
  ImportOptions import;
  import.dims["batch"] = 2;
  const ImportedModel model = import_model(gpt_tiny(), import);
  HostDeviceBackend device;
  ExecutorOptions on_device;
  on_device.backend = &device;
  Executor cpu(model), dev(model, on_device);
  std::mt19937 rng(1);
  Tensor ids(DType::kInt64, {2, 32}), labels(DType::kInt64, {2, 32});
  std::uniform_int_distribution<int64_t> token(0, 511);
  for (auto* t : {&ids, &labels})
    for (int64_t& v : t->span<int64_t>()) v = token(rng);
  const double expected = cpu.run({{"input_ids", ids}, {"labels", labels}})[0].second.scalar_as_double();
  const double got = dev.run({{"input_ids", ids}, {"labels", labels}})[0].second.scalar_as_double();
  EXPECT_EQ(got, expected);
  // Every fallback is a host-only op of the test device, and the ones every GPT step runs are there.
  for (const std::string& op : dev.fallback_ops()) EXPECT_TRUE(HostDeviceBackend::host_only_ops().count(op)) << op;
  for (const char* op : {"Gather", "SoftmaxCrossEntropyLoss"})
    EXPECT_NE(std::find(dev.fallback_ops().begin(), dev.fallback_ops().end(), op), dev.fallback_ops().end()) << op;
}

TEST(AnExecutorOnADeviceBackend, SynchronizesAroundEachTimedTask) {
  TempDir dir;
  const ImportedModel model = import_model(write_mixed_model(dir));
  HostDeviceBackend device;
  ExecutorOptions options;
  options.backend = &device;
  options.time_tasks = true;
  Executor dev(model, options);
  device.synchronizations = 0;
  std::mt19937 rng(2);
  dev.run({{"x", random_floats(rng, {2, 3})}});
  EXPECT_EQ(device.synchronizations, 2 * 4) << "before and after each of the 4 tasks";
}

// --- The optimizer on a device backend ---

TEST(AParamOptimizerOnADeviceBackend, KeepsItsStateThereAndUpdatesBitwiseAsOnTheCpu) {
  for (Optimizer kind : {Optimizer::kSgd, Optimizer::kMomentum, Optimizer::kAdam, Optimizer::kAdamW}) {
    std::mt19937 rng(4);
    Tensor p_cpu = random_floats(rng, {5, 3}), g_cpu = random_floats(rng, {5, 3});
    HostDeviceBackend device;
    Tensor p_dev = device.to_device(p_cpu.clone()), g_dev = device.to_device(g_cpu.clone());
    OptimizerOptions o;
    o.kind = kind;
    o.lr = 0.1;
    o.weight_decay = 0.01;
    o.clip_grad_norm = 1.0;
    ParamOptimizer on_cpu(o, {"p"}), on_device(o, {"p"}, device);
    for (int step = 0; step < 3; ++step) {
      std::vector<Tensor*> gc{&g_cpu}, gd{&g_dev};
      const double norm_cpu = on_cpu.step({&p_cpu}, gc, 0.1);
      const double norm_dev = on_device.step({&p_dev}, gd, 0.1);
      EXPECT_EQ(norm_dev, norm_cpu);
    }
    EXPECT_TRUE(same_bytes(device.to_host(p_dev), p_cpu)) << optimizer_name(kind);
    EXPECT_EQ(device.optimizer_steps, 3);
    for (const auto& [name, t] : on_device.state()) EXPECT_FALSE(t->on_host()) << name;
  }
}

// --- apart train's code path on a device backend ---

struct Trained {
  TrainResult result;
  std::string saved_model;  // the bytes --save-model wrote
  std::vector<int64_t> raw_allocations;  // the pool's, after each step
  std::vector<int64_t> uploads;          // host → device copies, after each step
};

Trained train_on(const TrainOptions& base, Backend* backend, const TempDir& dir, const std::string& tag) {
  TrainOptions o = base;
  o.backend = backend;
  o.save_model = (dir / (tag + ".onnx")).string();
  Trained t;
  auto* device = dynamic_cast<HostDeviceBackend*>(backend);
  t.result = train(o, [&](const StepRecord&) {
    if (!device) return;
    t.raw_allocations.push_back(device->pool().raw_allocations());
    t.uploads.push_back(device->to_device_copies);
  });
  t.saved_model = testing::read_file(o.save_model);
  return t;
}

void expect_same_training(const Trained& cpu, const Trained& dev) {
  ASSERT_EQ(cpu.result.steps.size(), dev.result.steps.size());
  for (size_t i = 0; i < cpu.result.steps.size(); ++i) {
    EXPECT_EQ(dev.result.steps[i].loss, cpu.result.steps[i].loss) << "step " << i + 1;
    EXPECT_EQ(dev.result.steps[i].grad_norm, cpu.result.steps[i].grad_norm) << "step " << i + 1;
  }
  EXPECT_FALSE(cpu.saved_model.empty());
  EXPECT_TRUE(dev.saved_model == cpu.saved_model) << "the trained weights differ";
}

TEST(GptTinyOnADeviceBackend, TrainsBitwiseAsOnTheCpuWithNoRawAllocationOrParamCopyAfterTheFirstStep) {
  TempDir dir;
  TrainOptions o;
  o.model = gpt_tiny();
  o.batch = 2;
  o.steps = 3;
  o.optimizer.kind = Optimizer::kAdamW;
  o.optimizer.lr = 1e-2;
  o.optimizer.weight_decay = 0.1;
  o.optimizer.clip_grad_norm = 0.5;
  const Trained cpu = train_on(o, nullptr, dir, "cpu");
  HostDeviceBackend device;
  const Trained dev = train_on(o, &device, dir, "device");
  expect_same_training(cpu, dev);
  EXPECT_TRUE(cpu.result.fallback_ops.empty());
  EXPECT_FALSE(dev.result.fallback_ops.empty());
  ASSERT_EQ(dev.raw_allocations.size(), 3u);
  EXPECT_EQ(dev.raw_allocations[2], dev.raw_allocations[0]) << "steps 2 and 3 reuse the pool's blocks";
  EXPECT_EQ(dev.raw_allocations[1], dev.raw_allocations[0]);
  // Each step uploads the same activations (the batch, CPU-fallback outputs): nothing persistent goes up again.
  EXPECT_EQ(dev.uploads[2] - dev.uploads[1], dev.uploads[1] - dev.uploads[0]);
  EXPECT_EQ(device.optimizer_steps, 3);
}

// x [batch,1,6,6] → Conv 3×3 (2 channels, pad 1) → Relu → MaxPool 2 → Flatten → Gemm → SoftmaxCrossEntropyLoss.
fs::path write_conv_model(const TempDir& dir) {
  OnnxBuilder b;
  b.input("x", {"batch", 1, 6, 6}).input("labels", {"batch"}, onnx::TensorProto::INT64).output("loss");
  b.weight("conv.weight", {2, 1, 3, 3}).weight("conv.bias", {2}).weight("fc.weight", {18, 3}).weight("fc.bias", {3});
  auto& conv = b.node("Conv", {"x", "conv.weight", "conv.bias"}, {"c"});
  OnnxBuilder::set_ints(conv, "pads", {1, 1, 1, 1});
  OnnxBuilder::set_ints(conv, "kernel_shape", {3, 3});
  b.node("Relu", {"c"}, {"r"});
  auto& pool = b.node("MaxPool", {"r"}, {"p"});
  OnnxBuilder::set_ints(pool, "kernel_shape", {2, 2});
  OnnxBuilder::set_ints(pool, "strides", {2, 2});
  b.node("Flatten", {"p"}, {"f"});
  b.node("Gemm", {"f", "fc.weight", "fc.bias"}, {"scores"});
  b.node("SoftmaxCrossEntropyLoss", {"scores", "labels"}, {"loss"});
  const fs::path file = dir / "conv.onnx";
  b.save(file);
  return file;
}

TEST(AConvModelOnADeviceBackend, TrainsBitwiseAsOnTheCpu) {
  TempDir dir;
  TrainOptions o;
  o.model = write_conv_model(dir).string();
  o.batch = 4;
  o.steps = 3;
  o.init = ParamInit::kRandom;
  o.optimizer.kind = Optimizer::kMomentum;
  o.optimizer.lr = 0.05;
  const Trained cpu = train_on(o, nullptr, dir, "cpu");
  HostDeviceBackend device;
  const Trained dev = train_on(o, &device, dir, "device");
  expect_same_training(cpu, dev);
  // The loss on the host, and Flatten's gradient (a Reshape).
  EXPECT_EQ(dev.result.fallback_ops, (std::vector<std::string>{"Reshape", "SoftmaxCrossEntropyLoss"}));
}

TEST(ATrainingRunOnADeviceBackend, ResumesFromItsCheckpointAsAnUninterruptedRunDoes) {
  TempDir dir;
  TrainOptions o;
  o.model = write_conv_model(dir).string();
  o.batch = 4;
  o.steps = 4;
  o.init = ParamInit::kRandom;
  o.optimizer.kind = Optimizer::kAdam;
  o.optimizer.lr = 0.01;
  HostDeviceBackend device;
  const Trained whole = train_on(o, &device, dir, "whole");
  TrainOptions first = o;
  first.steps = 2;
  first.checkpoint_dir = (dir / "ck").string();
  train_on(first, &device, dir, "first");
  TrainOptions rest = o;
  rest.resume = (dir / "ck").string();
  const Trained resumed = train_on(rest, &device, dir, "resumed");
  ASSERT_EQ(resumed.result.steps.size(), 2u);
  EXPECT_EQ(resumed.result.steps.back().loss, whole.result.steps.back().loss);
  EXPECT_TRUE(resumed.saved_model == whole.saved_model);
}

}  // namespace
}  // namespace apart
