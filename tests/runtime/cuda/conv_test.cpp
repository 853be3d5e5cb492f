// The CUDA conv family (runtime/cuda/conv.cpp) against the CPU kernels: Conv, ai.apart.ConvGrad, the pools and their
// gradients, the global pools and BatchNormalization, on random shapes with odd sizes, groups, strides, dilations and
// pads, by normalised error (max |gpu − cpu| / max |cpu|). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/kernel.h"

namespace apart {
namespace {

Attribute ints(std::string name, std::vector<int64_t> v) {
  Attribute a;
  a.name = std::move(name);
  a.type = Attribute::Type::kInts;
  a.ints = std::move(v);
  return a;
}
Attribute integer(std::string name, int64_t v) {
  Attribute a;
  a.name = std::move(name);
  a.type = Attribute::Type::kInt;
  a.i = v;
  return a;
}
Attribute real(std::string name, double v) {
  Attribute a;
  a.name = std::move(name);
  a.type = Attribute::Type::kFloat;
  a.f = v;
  return a;
}
Attribute text(std::string name, std::string v) {
  Attribute a;
  a.name = std::move(name);
  a.type = Attribute::Type::kString;
  a.s = std::move(v);
  return a;
}

// A node of `op` with `inputs` inputs and the outputs flagged in `wanted`.
Task node(std::string op, size_t inputs, std::vector<bool> wanted, std::vector<Attribute> attributes) {
  Task t;
  t.name = op + "_under_test";
  const auto dot = op.rfind('.');
  if (dot != std::string::npos) {
    t.domain = op.substr(0, dot);
    t.op_type = op.substr(dot + 1);
  } else {
    t.op_type = op;
  }
  for (size_t i = 0; i < inputs; ++i) t.inputs.push_back(ValueId(static_cast<uint32_t>(i)));
  for (size_t i = 0; i < wanted.size(); ++i)
    t.outputs.push_back(wanted[i] ? ValueId(static_cast<uint32_t>(100 + i)) : ValueId::invalid());
  t.attributes = std::move(attributes);
  return t;
}

Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed, DType dtype = DType::kFloat32, int levels = 0) {
  Tensor t(dtype, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::uniform_int_distribution<int> level(0, std::max(levels - 1, 0));
  for (int64_t i = 0; i < t.elements(); ++i) {
    const double v = levels > 0 ? level(rng) : uniform(rng);  // levels: few distinct values, so windows tie
    if (dtype == DType::kFloat64) t.data<double>()[i] = v;
    else t.data<float>()[i] = static_cast<float>(v);
  }
  return t;
}
Tensor positive_tensor(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t = random_tensor(std::move(shape), seed);
  for (float& v : t.span<float>()) v = 0.5f + std::fabs(v);
  return t;
}

// Runs `op`'s kernel of `backend` on copies of `inputs` there; the wanted outputs, back on the host.
std::vector<Tensor> run(Backend& backend, const Task& task, const std::vector<Tensor>& inputs) {
  const std::string op = task.domain.empty() ? task.op_type : task.domain + "." + task.op_type;
  const KernelFn fn = backend.find_kernel(op);
  if (!fn) throw std::runtime_error(std::string(backend_name(backend.kind())) + " has no kernel for " + op);
  std::vector<Tensor> placed;
  for (const Tensor& t : inputs) placed.push_back(backend.to_device(t));
  std::vector<const Tensor*> pointers;
  for (const Tensor& t : placed) pointers.push_back(&t);
  std::vector<Tensor> outputs(task.outputs.size());
  const std::vector<std::pair<std::string, Tensor>> tensor_attributes;
  KernelContext ctx(task, 17, pointers, tensor_attributes, outputs,
                    [&](size_t, DType dtype, const std::vector<int64_t>& shape) { return backend.empty(dtype, shape); });
  ctx.set_backend(&backend, [&](size_t i) -> const Tensor& { return inputs.at(i); });
  fn(ctx);
  backend.synchronize();
  std::vector<Tensor> host;
  for (size_t i = 0; i < outputs.size(); ++i) host.push_back(task.outputs[i].valid() ? backend.to_host(outputs[i]) : Tensor());
  return host;
}

// "" when max |got − want| ≤ tolerance · max |want| (and shapes agree); else what differs, and where.
std::string normalised_error(const Tensor& got, const Tensor& want, double tolerance) {
  if (got.shape() != want.shape()) return "shape " + shape_string(got.shape()) + " != " + shape_string(want.shape());
  double scale = 0, worst = 0;
  int64_t at = -1;
  for (int64_t i = 0; i < want.elements(); ++i) {
    const double g = got.scalar_as_double(i), w = want.scalar_as_double(i);
    if ((std::isnan(g) && std::isnan(w)) || (std::isinf(w) && g == w)) continue;
    scale = std::max(scale, std::fabs(w));
    const double diff = std::isfinite(g) ? std::fabs(g - w) : INFINITY;
    if (diff > worst || at < 0) worst = diff, at = i;
  }
  if (at < 0 || worst <= tolerance * std::max(scale, 1e-30)) return "";
  return "normalised error " + std::to_string(worst / std::max(scale, 1e-30)) + " at element " + std::to_string(at) +
         ": " + std::to_string(got.scalar_as_double(at)) + " vs CPU " + std::to_string(want.scalar_as_double(at));
}

class CudaConvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_built()) GTEST_SKIP() << "built without CUDA (cmake --preset gpu)";
    if (cuda_device_count() == 0) {
      try {
        make_backend(BackendKind::kCuda);
      } catch (const std::exception& e) {
        GTEST_SKIP() << "no CUDA device: " << e.what();
      }
      GTEST_SKIP() << "no CUDA device";
    }
    gpu_ = make_backend(BackendKind::kCuda, BackendOptions{0, Precision::kFp32});
  }
  // The GPU's outputs against the CPU's, output by output.
  void expect_matches_cpu(const Task& task, const std::vector<Tensor>& inputs, double tolerance = 1e-4,
                          Backend* gpu = nullptr) {
    const std::vector<Tensor> want = run(cpu_backend(), task, inputs);
    const std::vector<Tensor> got = run(gpu ? *gpu : *gpu_, task, inputs);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      if (!task.outputs[i].valid()) continue;
      EXPECT_EQ(normalised_error(got[i], want[i], tolerance), "") << task.op_type << " output " << i;
    }
  }
  std::unique_ptr<Backend> gpu_;
};

struct ConvCase {
  std::vector<int64_t> x, w;  // x: N, C, spatial; w: M, C/group, kernel
  int64_t group = 1;
  std::vector<int64_t> strides, pads, dilations;
  std::string auto_pad;  // "" = explicit pads
  bool bias = true;
};
std::vector<Attribute> conv_attributes(const ConvCase& c) {
  std::vector<Attribute> a{integer("group", c.group)};
  if (!c.strides.empty()) a.push_back(ints("strides", c.strides));
  if (!c.dilations.empty()) a.push_back(ints("dilations", c.dilations));
  if (!c.pads.empty()) a.push_back(ints("pads", c.pads));
  if (!c.auto_pad.empty()) a.push_back(text("auto_pad", c.auto_pad));
  a.push_back(ints("kernel_shape", std::vector<int64_t>(c.w.begin() + 2, c.w.end())));
  return a;
}
// Odd sizes, groups (also depthwise), strides, dilations, symmetric and asymmetric pads, SAME with a border, 1×1
// strided (ResNet's downsample), the 7×7 stem, 1-D.
const std::vector<ConvCase> kConvCases = {
    {{2, 3, 9, 11}, {5, 3, 3, 3}, 1, {}, {1, 1, 1, 1}, {}, ""},
    {{3, 4, 13, 7}, {6, 2, 3, 2}, 2, {2, 1}, {1, 0, 1, 1}, {}, ""},
    {{2, 6, 10, 10}, {6, 1, 3, 3}, 6, {1, 1}, {2, 2, 2, 2}, {2, 2}, ""},
    {{1, 5, 12, 15}, {4, 5, 2, 2}, 1, {2, 2}, {}, {}, "SAME_UPPER"},
    {{2, 3, 11, 8}, {4, 3, 4, 3}, 1, {3, 2}, {}, {}, "SAME_LOWER", false},
    {{2, 8, 14, 14}, {16, 8, 1, 1}, 1, {2, 2}, {0, 0, 0, 0}, {}, ""},
    {{2, 3, 32, 29}, {8, 3, 7, 7}, 1, {2, 2}, {3, 3, 3, 3}, {}, ""},
    {{3, 4, 17}, {6, 2, 5}, 2, {2}, {2, 1}, {1}, ""},
    {{2, 3, 9, 9}, {4, 3, 3, 3}, 1, {1, 1}, {0, 2, 1, 0}, {1, 2}, "", false},
};

TEST_F(CudaConvTest, ConvMatchesTheCpuKernel) {
  uint32_t seed = 1;
  for (const ConvCase& c : kConvCases) {
    SCOPED_TRACE("x " + shape_string(c.x) + " w " + shape_string(c.w));
    std::vector<Tensor> inputs{random_tensor(c.x, seed++), random_tensor(c.w, seed++)};
    if (c.bias) inputs.push_back(random_tensor({c.w[0]}, seed++));
    expect_matches_cpu(node("Conv", inputs.size(), {true}, conv_attributes(c)), inputs);
  }
}

TEST_F(CudaConvTest, ConvMatchesTheCpuKernelInFloat64) {
  const ConvCase c = kConvCases[1];
  std::vector<Tensor> inputs{random_tensor(c.x, 7, DType::kFloat64), random_tensor(c.w, 8, DType::kFloat64),
                             random_tensor({c.w[0]}, 9, DType::kFloat64)};
  expect_matches_cpu(node("Conv", 3, {true}, conv_attributes(c)), inputs, 1e-12);
}

TEST_F(CudaConvTest, ConvUnderTf32StaysWithinTf32Rounding) {
  auto tf32 = make_backend(BackendKind::kCuda, BackendOptions{0, Precision::kTf32});
  const ConvCase c = kConvCases[6];
  std::vector<Tensor> inputs{random_tensor(c.x, 11), random_tensor(c.w, 12), random_tensor({c.w[0]}, 13)};
  // TF32 keeps 10 mantissa bits: ~1e-3 relative per product, averaging out over the 147-term sums.
  expect_matches_cpu(node("Conv", 3, {true}, conv_attributes(c)), inputs, 5e-3, tf32.get());
}

// ConvGrad takes explicit pads (autodiff resolves auto_pad); dY has the forward's output shape.
TEST_F(CudaConvTest, ConvGradMatchesTheCpuKernelForDxAndDw) {
  uint32_t seed = 100;
  for (ConvCase c : kConvCases) {
    if (!c.auto_pad.empty()) continue;
    SCOPED_TRACE("x " + shape_string(c.x) + " w " + shape_string(c.w));
    const Tensor x = random_tensor(c.x, seed++), w = random_tensor(c.w, seed++);
    const std::vector<Tensor> y = run(cpu_backend(), node("Conv", 2, {true}, conv_attributes(c)), {x, w});
    const Tensor dy = random_tensor(y[0].shape(), seed++);
    expect_matches_cpu(node("ai.apart.ConvGrad", 3, {true, true}, conv_attributes(c)), {dy, x, w});
  }
}

TEST_F(CudaConvTest, ConvGradComputesEitherOutputAlone) {
  const ConvCase c = kConvCases[8];  // asymmetric pads: the bordered paths
  const Tensor x = random_tensor(c.x, 21), w = random_tensor(c.w, 22);
  const std::vector<Tensor> y = run(cpu_backend(), node("Conv", 2, {true}, conv_attributes(c)), {x, w});
  const Tensor dy = random_tensor(y[0].shape(), 23);
  expect_matches_cpu(node("ai.apart.ConvGrad", 3, {true, false}, conv_attributes(c)), {dy, x, w});
  expect_matches_cpu(node("ai.apart.ConvGrad", 3, {false, true}, conv_attributes(c)), {dy, x, w});
}

// 3-D (no CPU kernel): against a direct loop, and the gradients by the adjoint identities
// <ConvGrad_dX(dY), V> = <dY, Conv(V, W)> and <ConvGrad_dW(dY), V> = <dY, Conv(X, V)>.
Tensor direct_conv3d(const Tensor& x, const Tensor& w, const std::vector<int64_t>& stride,
                     const std::vector<int64_t>& pad, const std::vector<int64_t>& dilation) {
  const int64_t n = x.dim(0), c = x.dim(1), m = w.dim(0);
  std::vector<int64_t> out{n, m};
  for (int d = 0; d < 3; ++d)
    out.push_back((x.dim(2 + d) + pad[d] + pad[3 + d] - (w.dim(2 + d) - 1) * dilation[d] - 1) / stride[d] + 1);
  Tensor y(DType::kFloat32, out);
  const float *px = x.data<float>(), *pw = w.data<float>();
  float* py = y.data<float>();
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < m; ++o)
      for (int64_t z = 0; z < out[2]; ++z)
        for (int64_t r = 0; r < out[3]; ++r)
          for (int64_t q = 0; q < out[4]; ++q) {
            double acc = 0;
            for (int64_t ch = 0; ch < c; ++ch)
              for (int64_t kz = 0; kz < w.dim(2); ++kz)
                for (int64_t kr = 0; kr < w.dim(3); ++kr)
                  for (int64_t kq = 0; kq < w.dim(4); ++kq) {
                    const int64_t iz = z * stride[0] - pad[0] + kz * dilation[0];
                    const int64_t ir = r * stride[1] - pad[1] + kr * dilation[1];
                    const int64_t iq = q * stride[2] - pad[2] + kq * dilation[2];
                    if (iz < 0 || iz >= x.dim(2) || ir < 0 || ir >= x.dim(3) || iq < 0 || iq >= x.dim(4)) continue;
                    acc += static_cast<double>(px[(((b * c + ch) * x.dim(2) + iz) * x.dim(3) + ir) * x.dim(4) + iq]) *
                           pw[(((o * c + ch) * w.dim(2) + kz) * w.dim(3) + kr) * w.dim(4) + kq];
                  }
            py[(((b * m + o) * out[2] + z) * out[3] + r) * out[4] + q] = static_cast<float>(acc);
          }
  return y;
}
double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.elements(); ++i) s += a.scalar_as_double(i) * b.scalar_as_double(i);
  return s;
}

TEST_F(CudaConvTest, Conv3dMatchesADirectLoopAndItsGradientsAreTheAdjoints) {
  const std::vector<int64_t> strides{1, 2, 1}, pads{1, 0, 1, 0, 1, 2}, dilations{1, 1, 2};
  const std::vector<Attribute> attributes{ints("strides", strides), ints("pads", pads), ints("dilations", dilations)};
  const Tensor x = random_tensor({2, 3, 5, 7, 6}, 800), w = random_tensor({4, 3, 2, 3, 2}, 801);
  const Tensor y = run(*gpu_, node("Conv", 2, {true}, attributes), {x, w})[0];
  EXPECT_EQ(normalised_error(y, direct_conv3d(x, w, strides, pads, dilations), 1e-4), "");
  const Tensor dy = random_tensor(y.shape(), 802), vx = random_tensor(x.shape(), 803), vw = random_tensor(w.shape(), 804);
  const std::vector<Tensor> grads = run(*gpu_, node("ai.apart.ConvGrad", 3, {true, true}, attributes), {dy, x, w});
  const double dx_side = dot(grads[0], vx), dx_want = dot(dy, direct_conv3d(vx, w, strides, pads, dilations));
  const double dw_side = dot(grads[1], vw), dw_want = dot(dy, direct_conv3d(x, vw, strides, pads, dilations));
  EXPECT_NEAR(dx_side, dx_want, 1e-4 * (1 + std::fabs(dx_want)));
  EXPECT_NEAR(dw_side, dw_want, 1e-4 * (1 + std::fabs(dw_want)));
}

struct PoolCase {
  std::vector<int64_t> x, kernel, strides, pads, dilations;
  bool ceil_mode = false, include_pad = false;
};
std::vector<Attribute> pool_attributes(const PoolCase& c, bool average) {
  std::vector<Attribute> a{ints("kernel_shape", c.kernel)};
  if (!c.strides.empty()) a.push_back(ints("strides", c.strides));
  if (!c.pads.empty()) a.push_back(ints("pads", c.pads));
  if (!c.dilations.empty()) a.push_back(ints("dilations", c.dilations));
  if (c.ceil_mode) a.push_back(integer("ceil_mode", 1));
  if (average) a.push_back(integer("count_include_pad", c.include_pad ? 1 : 0));
  return a;
}
// ResNet's 3×3/2 pad 1, odd sizes, dilations, asymmetric pads, include-pad counting, 1-D.
const std::vector<PoolCase> kPoolCases = {
    {{2, 3, 15, 17}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {}},
    {{1, 4, 9, 10}, {2, 3}, {2, 1}, {0, 1, 0, 1}, {}, false, true},
    {{2, 2, 12, 11}, {3, 2}, {1, 2}, {1, 0, 1, 0}, {2, 1}, false, true},
    {{3, 2, 13}, {4}, {3}, {2, 2}, {}, false, true},
    {{2, 3, 7, 7}, {7, 7}, {1, 1}, {}, {}},
    {{1, 3, 8, 9}, {3, 3}, {2, 2}, {1, 0, 0, 1}, {}, false, true},
};

TEST_F(CudaConvTest, PoolsMatchTheCpuKernels) {
  uint32_t seed = 200;
  std::vector<PoolCase> cases = kPoolCases;
  cases.push_back({{2, 3, 10, 13}, {3, 3}, {2, 2}, {1, 1, 0, 0}, {}, true, true});  // ceil_mode
  cases.push_back({{1, 2, 5, 6, 7}, {2, 3, 2}, {2, 1, 2}, {0, 1, 1, 1, 0, 0}, {}});  // 3-D
  for (const PoolCase& c : cases) {
    SCOPED_TRACE("x " + shape_string(c.x) + " kernel " + shape_string(c.kernel));
    const Tensor x = random_tensor(c.x, seed++);
    expect_matches_cpu(node("MaxPool", 1, {true}, pool_attributes(c, false)), {x});
    expect_matches_cpu(node("AveragePool", 1, {true}, pool_attributes(c, true)), {x});
  }
}

TEST_F(CudaConvTest, PoolGradientsMatchTheCpuKernels) {
  uint32_t seed = 300;
  for (const PoolCase& c : kPoolCases) {
    SCOPED_TRACE("x " + shape_string(c.x) + " kernel " + shape_string(c.kernel));
    const Tensor x = random_tensor(c.x, seed++);
    const std::vector<Tensor> y = run(cpu_backend(), node("MaxPool", 1, {true}, pool_attributes(c, false)), {x});
    const Tensor dy = random_tensor(y[0].shape(), seed++);
    expect_matches_cpu(node("ai.apart.MaxPoolGrad", 2, {true}, pool_attributes(c, false)), {dy, x});
    expect_matches_cpu(node("ai.apart.AveragePoolGrad", 2, {true}, pool_attributes(c, true)), {dy, x});
  }
}

TEST_F(CudaConvTest, MaxPoolGradSendsTiesToTheFirstMaximumAsTheCpuDoes) {
  const PoolCase c = kPoolCases[0];
  const Tensor x = random_tensor(c.x, 400, DType::kFloat32, 3);  // values 0, 1, 2: most windows tie
  const std::vector<Tensor> y = run(cpu_backend(), node("MaxPool", 1, {true}, pool_attributes(c, false)), {x});
  const Tensor dy = random_tensor(y[0].shape(), 401);
  expect_matches_cpu(node("ai.apart.MaxPoolGrad", 2, {true}, pool_attributes(c, false)), {dy, x});
}

TEST_F(CudaConvTest, GlobalPoolsMatchTheCpuKernels) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{3, 5, 7, 9}, std::vector<int64_t>{2, 3, 64, 65},
                                            std::vector<int64_t>{4, 6, 11}}) {
    SCOPED_TRACE("x " + shape_string(shape));
    const Tensor x = random_tensor(shape, 500);
    expect_matches_cpu(node("GlobalAveragePool", 1, {true}, {}), {x});
    expect_matches_cpu(node("GlobalMaxPool", 1, {true}, {}), {x});
  }
}

TEST_F(CudaConvTest, BatchNormalizationMatchesTheCpuKernelInInferenceMode) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{4, 3, 9, 7}, std::vector<int64_t>{5, 6}}) {
    SCOPED_TRACE("x " + shape_string(shape));
    const int64_t c = shape[1];
    const std::vector<Tensor> inputs{random_tensor(shape, 600), random_tensor({c}, 601), random_tensor({c}, 602),
                                     random_tensor({c}, 603), positive_tensor({c}, 604)};
    expect_matches_cpu(node("BatchNormalization", 5, {true}, {real("epsilon", 1e-3)}), inputs);
  }
}

TEST_F(CudaConvTest, BatchNormalizationMatchesTheCpuKernelInTrainingModeWithRunningStatistics) {
  // [8, 3, 40, 40]: 12800 values per channel, several partial blocks each; [6, 5, 7]: one; [9, 4]: no inner dims.
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{8, 3, 40, 40}, std::vector<int64_t>{6, 5, 7}, std::vector<int64_t>{9, 4}}) {
    SCOPED_TRACE("x " + shape_string(shape));
    const int64_t c = shape[1];
    Tensor x = random_tensor(shape, 700);
    for (float& v : x.span<float>()) v = 3.0f + 2.0f * v;  // a mean far from 0: the two-pass variance matters
    const std::vector<Tensor> inputs{x, random_tensor({c}, 701), random_tensor({c}, 702), random_tensor({c}, 703),
                                     positive_tensor({c}, 704)};
    expect_matches_cpu(node("BatchNormalization", 5, {true, true, true},
                            {integer("training_mode", 1), real("momentum", 0.7), real("epsilon", 1e-5)}),
                       inputs);
  }
}

}  // namespace
}  // namespace apart
