// Optimizer updates equal PyTorch's: expected values are torch.optim 1.13 (float32) after three steps
// of p0 = [1, -2, 0.5] with gradients g_t = [0.5(t+1), -1 + 0.3t, 2 - t], lr 0.1.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "graph/error.h"
#include "train/optimizer.h"

namespace apart {
namespace {

std::vector<float> run_three_steps(OptimizerOptions o) {
  o.lr = 0.1;
  ParamOptimizer opt(o, {"w"});
  Tensor p(DType::kFloat32, {3});
  const float p0[3] = {1.0f, -2.0f, 0.5f};
  std::copy(p0, p0 + 3, p.data<float>());
  for (int t = 0; t < 3; ++t) {
    Tensor g(DType::kFloat32, {3});
    g.data<float>()[0] = 0.5f * static_cast<float>(t + 1);
    g.data<float>()[1] = -1.0f + 0.3f * static_cast<float>(t);
    g.data<float>()[2] = 2.0f - static_cast<float>(t);
    std::vector<Tensor*> grads{&g};
    opt.step({&p}, grads, o.lr);
  }
  return {p.data<float>()[0], p.data<float>()[1], p.data<float>()[2]};
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-6) << "element " << i;
}

OptimizerOptions with(Optimizer kind, double weight_decay = 0, bool nesterov = false) {
  OptimizerOptions o;
  o.kind = kind;
  o.weight_decay = weight_decay;
  o.nesterov = nesterov;
  return o;
}

TEST(AnSgdOptimizer, MatchesTorchSgd) {
  expect_near(run_three_steps(with(Optimizer::kSgd)), {0.7f, -1.79f, 0.2f});
}

TEST(AnSgdOptimizer, AddsWeightDecayToTheGradient) {
  expect_near(run_three_steps(with(Optimizer::kSgd, 0.1)), {0.672294f, -1.733288f, 0.1901295f});
}

TEST(AMomentumOptimizer, MatchesTorchSgdWithMomentum) {
  expect_near(run_three_steps(with(Optimizer::kMomentum)), {0.5245f, -1.556f, -0.232f});
  expect_near(run_three_steps(with(Optimizer::kMomentum, 0.1)), {0.471774f, -1.449248f, -0.2512305f});
}

TEST(AMomentumOptimizer, MatchesTorchNesterov) {
  expect_near(run_three_steps(with(Optimizer::kMomentum, 0, true)), {0.27205f, -1.3903999f, -0.4588f});
}

TEST(AnAdamOptimizer, MatchesTorchAdamWithBiasCorrection) {
  expect_near(run_three_steps(with(Optimizer::kAdam)), {0.7076817f, -1.7108527f, 0.2347243f});
}

TEST(AnAdamOptimizer, AddsL2WeightDecayToTheGradient) {
  expect_near(run_three_steps(with(Optimizer::kAdam, 0.1)), {0.7056953f, -1.7079867f, 0.2335023f});
}

TEST(AnAdamWOptimizer, DecaysWeightsDecoupledFromTheGradient) {
  expect_near(run_three_steps(with(Optimizer::kAdamW, 0.1)), {0.6809359f, -1.6544164f, 0.222796f});
}

TEST(GradientClipping, ScalesAllGradientsToTheGlobalNormLikeTorch) {
  Tensor a(DType::kFloat32, {2}), b(DType::kFloat32, {1});
  a.data<float>()[0] = 3;
  a.data<float>()[1] = 4;
  b.data<float>()[0] = 12;
  std::vector<Tensor*> grads{&a, &b};
  EXPECT_DOUBLE_EQ(clip_grad_norm(grads, 6.5), 13.0);
  // torch.nn.utils.clip_grad_norm_: coefficient 6.5 / (13 + 1e-6).
  EXPECT_NEAR(a.data<float>()[0], 1.4999999f, 1e-6);
  EXPECT_NEAR(a.data<float>()[1], 1.9999999f, 1e-6);
  EXPECT_NEAR(b.data<float>()[0], 5.9999995f, 1e-6);
}

TEST(GradientClipping, LeavesSmallGradientsAlone) {
  Tensor a(DType::kFloat32, {2});
  a.data<float>()[0] = 0.3f;
  a.data<float>()[1] = 0.4f;
  std::vector<Tensor*> grads{&a};
  EXPECT_NEAR(clip_grad_norm(grads, 1.0), 0.5, 1e-7);
  EXPECT_FLOAT_EQ(a.data<float>()[1], 0.4f);
}

TEST(AnOptimizerStep, ClipsBeforeUpdating) {
  OptimizerOptions o = with(Optimizer::kSgd);
  o.lr = 1.0;
  o.clip_grad_norm = 1.0;
  ParamOptimizer opt(o, {"w"});
  Tensor p(DType::kFloat32, {2}), g(DType::kFloat32, {2});
  g.data<float>()[0] = 30;
  g.data<float>()[1] = 40;
  std::vector<Tensor*> grads{&g};
  EXPECT_DOUBLE_EQ(opt.step({&p}, grads, 1.0), 50.0);
  EXPECT_NEAR(p.data<float>()[0], -0.6f, 1e-6);
  EXPECT_NEAR(p.data<float>()[1], -0.8f, 1e-6);
}

TEST(AnOptimizer, RestoredStateContinuesExactlyWhereItStopped) {
  OptimizerOptions o = with(Optimizer::kAdamW, 0.1);
  ParamOptimizer straight(o, {"w"});
  Tensor p1(DType::kFloat32, {3}), p2(DType::kFloat32, {3});
  auto grad = [](int t) {
    Tensor g(DType::kFloat32, {3});
    for (int j = 0; j < 3; ++j) g.data<float>()[j] = static_cast<float>(j + 1) * (t % 2 ? -1.0f : 0.7f);
    return g;
  };
  for (int t = 0; t < 4; ++t) {
    Tensor g = grad(t);
    std::vector<Tensor*> grads{&g};
    straight.step({&p1}, grads, 0.01);
  }
  ParamOptimizer first(o, {"w"});
  for (int t = 0; t < 2; ++t) {
    Tensor g = grad(t);
    std::vector<Tensor*> grads{&g};
    first.step({&p2}, grads, 0.01);
  }
  std::vector<std::pair<std::string, Tensor>> saved;
  for (auto& [name, t] : first.state()) saved.emplace_back(name, t->clone());
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved[0].first, "w/exp_avg");
  ParamOptimizer resumed(o, {"w"});
  resumed.restore(first.steps_taken(), std::move(saved));
  for (int t = 2; t < 4; ++t) {
    Tensor g = grad(t);
    std::vector<Tensor*> grads{&g};
    resumed.step({&p2}, grads, 0.01);
  }
  for (int j = 0; j < 3; ++j) EXPECT_EQ(p1.data<float>()[j], p2.data<float>()[j]);
}

TEST(ACosineSchedule, WarmsUpLinearlyThenDecaysToTheMinimum) {
  LrSchedule s{LrScheduleKind::kCosine, 10, 110, 0.1};
  EXPECT_DOUBLE_EQ(s.lr_at(0, 1.0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(4, 1.0), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(9, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(10, 1.0), 1.0);
  EXPECT_NEAR(s.lr_at(60, 1.0), 0.55, 1e-12);  // halfway: min + (max − min)/2
  EXPECT_NEAR(s.lr_at(110, 1.0), 0.1, 1e-12);
  EXPECT_NEAR(s.lr_at(500, 1.0), 0.1, 1e-12);
  for (int64_t k = 11; k < 110; ++k) EXPECT_LE(s.lr_at(k, 1.0), s.lr_at(k - 1, 1.0));
}

TEST(AConstantSchedule, KeepsThePeakRate) {
  LrSchedule s;
  EXPECT_DOUBLE_EQ(s.lr_at(0, 3e-4), 3e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(1000, 3e-4), 3e-4);
}

TEST(OptimizerOptions, RejectBadValuesNamingTheFlag) {
  OptimizerOptions o;
  o.lr = -1;
  try {
    o.validate();
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--lr"), std::string::npos);
  }
  o = {};
  o.beta2 = 1.0;
  EXPECT_THROW(o.validate(), InvalidArgument);
  EXPECT_THROW(parse_optimizer("lamb"), InvalidArgument);
  EXPECT_THROW(parse_lr_schedule("step"), InvalidArgument);
  EXPECT_EQ(parse_optimizer("momentum"), Optimizer::kMomentum);
}

}  // namespace
}  // namespace apart
