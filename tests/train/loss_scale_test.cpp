// Dynamic loss scaling's state machine (train/loss_scale.h) against torch.cuda.amp.GradScaler's rules, its flags'
// ranges and checkpoint state; and the CPU backend's reduced-precision GEMM operands it relies on.
#include "train/loss_scale.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "graph/error.h"
#include "runtime/backend.h"
#include "runtime/executor.h"
#include "runtime/half_precision.h"
#include "runtime/kernel.h"

namespace apart {
namespace {

TEST(ALossScaler, StartsAtTorchsDefaultScaleOf2To16) {
  EXPECT_EQ(LossScaler(LossScaleOptions::on()).scale(), 65536.0);
  const LossScaleOptions defaults;
  EXPECT_EQ(defaults.growth_factor, 2.0);
  EXPECT_EQ(defaults.backoff_factor, 0.5);
  EXPECT_EQ(defaults.growth_interval, 2000);
}

TEST(ALossScaler, SkipsAnOverflowingStepAndHalvesTheScale) {
  LossScaler s(LossScaleOptions::on(1024, 3));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.clean_steps(), 1);
  EXPECT_FALSE(s.update(true));  // skipped
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.clean_steps(), 0);  // the clean run restarts
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 256.0);
}

TEST(ALossScaler, DoublesTheScaleAfterGrowthIntervalCleanStepsInARow) {
  LossScaler s(LossScaleOptions::on(8, 3));
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 8.0);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 16.0);
  EXPECT_EQ(s.clean_steps(), 0);
  // An overflow in between restarts the count: 2 clean, overflow, 2 clean is no growth.
  s.update(false);
  s.update(false);
  s.update(true);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 8.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 16.0);
}

TEST(ALossScaler, IsOneAndTakesEveryFiniteStepWhenDisabled) {
  LossScaler s{LossScaleOptions{}};
  EXPECT_FALSE(s.enabled());
  EXPECT_EQ(s.scale(), 1.0);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 1.0);
  nlohmann::json meta = nlohmann::json::object();
  s.save(meta);
  EXPECT_TRUE(meta.empty());
}

TEST(ALossScaler, SaysTheRunDivergedWhenItOverflowsAtTheLeastScale) {
  LossScaler s(LossScaleOptions::on(0x1p-23, 10));
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 0x1p-24);
  EXPECT_THROW(s.update(true), Infeasible);
}

TEST(ALossScaler, KeepsItsStateThroughACheckpointsMeta) {
  LossScaler s(LossScaleOptions::on(1024, 4));
  s.update(false);
  s.update(true);
  s.update(false);  // scale 512, 1 clean step
  nlohmann::json meta = {{"step", 3}};
  s.save(meta);
  EXPECT_EQ(meta["loss_scale"], 512.0);
  EXPECT_EQ(meta["loss_scale_clean_steps"], 1);
  LossScaler resumed(LossScaleOptions::on(1024, 4));
  resumed.load(meta);
  EXPECT_EQ(resumed.scale(), 512.0);
  EXPECT_EQ(resumed.clean_steps(), 1);
  LossScaler fresh(LossScaleOptions::on(1024, 4));
  fresh.load(nlohmann::json{{"step", 3}});  // written without loss scaling: the initial scale
  EXPECT_EQ(fresh.scale(), 1024.0);
  EXPECT_THROW(resumed.load(nlohmann::json{{"loss_scale", -1.0}}), InvalidArgument);
  EXPECT_THROW(resumed.load(nlohmann::json{{"loss_scale", 2.0}, {"loss_scale_clean_steps", 4}}), InvalidArgument);
}

TEST(LossScaleOptions, RefuseValuesOutsideTheirRangesNamingTheFlag) {
  auto refused = [](LossScaleOptions o, const std::string& flag) {
    try {
      o.validate();
      ADD_FAILURE() << flag << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
  };
  LossScaleOptions o = LossScaleOptions::on();
  o.validate();
  o.init_scale = 0;
  refused(o, "--loss-scale-init");
  o.init_scale = std::numeric_limits<double>::infinity();
  refused(o, "--loss-scale-init");
  o = LossScaleOptions::on();
  o.growth_factor = 1;
  refused(o, "--loss-scale-growth");
  o = LossScaleOptions::on();
  o.backoff_factor = 1;
  refused(o, "--loss-scale-backoff");
  o.backoff_factor = 0;
  refused(o, "--loss-scale-backoff");
  o = LossScaleOptions::on();
  o.growth_interval = 0;
  refused(o, "--loss-scale-interval");
}

TEST(ALossScaler, SeedsTheBackwardWithTheScaleInTheLossShape) {
  const Tensor seed = LossScaler(LossScaleOptions::on(4096)).seed({});
  EXPECT_EQ(seed.dtype(), DType::kFloat32);
  EXPECT_EQ(seed.elements(), 1);
  EXPECT_EQ(seed.data<float>()[0], 4096.0f);
}

// The CPU backend under --precision fp16 multiplies float16-rounded operands: a value past 65504 is inf, one below
// float16's least subnormal is zero, and 1 + 2^-11 rounds to 1 — what a GPU's fp16 GEMM reads.
TEST(ACpuBackendUnderFp16, MultipliesOperandsRoundedToFloat16) {
  auto product = [](Backend& backend, float a, float b) {
    Task task;
    task.name = "mm";
    task.op_type = "MatMul";
    Tensor x(DType::kFloat32, {1, 1}), y(DType::kFloat32, {1, 1});
    x.data<float>()[0] = a;
    y.data<float>()[0] = b;
    std::vector<Tensor> outputs(1);
    KernelContext ctx(task, 17, {&x, &y}, {}, outputs,
                      [](size_t, DType d, const std::vector<int64_t>& shape) { return Tensor(d, shape); });
    ctx.set_backend(&backend, {});
    find_kernel("MatMul")(ctx);
    return outputs[0].data<float>()[0];
  };
  const auto fp16 = make_backend(BackendKind::kCpu, {0, Precision::kMixed, HalfFormat::kFp16});
  const auto bf16 = make_backend(BackendKind::kCpu, {0, Precision::kMixed, HalfFormat::kBf16});
  EXPECT_EQ(product(cpu_backend(), 70000.0f, 1.0f), 70000.0f);
  EXPECT_TRUE(std::isinf(product(*fp16, 70000.0f, 1.0f)));
  EXPECT_EQ(product(*bf16, 70000.0f, 1.0f), bfloat16_to_float(float_to_bfloat16(70000.0f)));
  EXPECT_EQ(product(*fp16, 1e-8f, 1.0f), 0.0f);
  EXPECT_EQ(product(cpu_backend(), 1.0f + 0x1p-11f, 1.0f), 1.0f + 0x1p-11f);
  EXPECT_EQ(product(*fp16, 1.0f + 0x1p-11f, 1.0f), 1.0f);
}

}  // namespace
}  // namespace apart
