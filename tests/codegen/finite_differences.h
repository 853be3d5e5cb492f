// Finite-difference checks of training graphs, shared by autodiff_test.cpp (every op) and
// autodiff_models_test.cpp (whole models, label slow).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "codegen/autodiff.h"
#include "runtime/executor.h"

namespace apart::testing {

inline Tensor random_tensor(DType dt, std::vector<int64_t> shape, std::mt19937& rng, double lo = -1, double hi = 1) {
  Tensor t(dt, std::move(shape));
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.elements(); ++i) {
    if (dt == DType::kFloat64) t.data<double>()[i] = u(rng);
    else t.data<float>()[i] = static_cast<float>(u(rng));
  }
  return t;
}

inline Tensor ints(std::vector<int64_t> shape, std::vector<int64_t> values) {
  Tensor t(DType::kInt64, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) t.data<int64_t>()[i] = values[i];
  return t;
}

inline double get(const Tensor& t, int64_t i) { return t.scalar_as_double(i); }
inline void set(Tensor& t, int64_t i, double v) {
  if (t.dtype() == DType::kFloat64) t.data<double>()[i] = v;
  else t.data<float>()[i] = static_cast<float>(v);
}

struct Tolerance {
  double eps = 1e-6, atol = 1e-6, rtol = 1e-4;
};
constexpr Tolerance kDouble{1e-6, 1e-6, 1e-4};
constexpr Tolerance kFloat{1e-2, 2e-3, 5e-2};  // float32 kernels: eps 1e-2, loose

// Each gradient `a` holds (`gradients`: param → output name) within `relative` × the largest entry of the one `b`
// holds (a normalised error: a fused kernel against the graph it replaces, same params and inputs).
inline void expect_same_gradients(const std::vector<std::pair<std::string, std::string>>& gradients,
                                  const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b,
                                  double relative) {
  for (const auto& [param, grad] : gradients) {
    const Tensor &ga = a.at(grad), &gb = b.at(grad);
    ASSERT_EQ(ga.shape(), gb.shape()) << param;
    double largest = 0, worst = 0;
    for (int64_t i = 0; i < gb.elements(); ++i) {
      largest = std::max(largest, std::abs(get(gb, i)));
      worst = std::max(worst, std::abs(get(ga, i) - get(gb, i)));
    }
    EXPECT_LE(worst, relative * std::max(largest, 1e-12)) << param;
  }
}

// Runs the training graph; for up to `samples` entries of every param compares the gradient with
// (L(p + eps) − L(p − eps)) / 2 eps computed by the same executor.
inline void expect_gradients_match(const TrainingGraph& tg, const std::map<std::string, Tensor>& inputs, Tolerance tol,
                                   int samples = 6, const std::filesystem::path& base_dir = {}) {
  Executor exec(tg.model, base_dir);
  auto out = exec.run(inputs);
  std::map<std::string, Tensor> got;
  for (auto& [name, t] : out) got[name] = t;
  auto loss = [&] { return get(exec.run(inputs).front().second, 0); };
  std::mt19937 rng(7);
  for (const auto& [param, grad_name] : tg.gradients) {
    Tensor* p = exec.param(param);
    ASSERT_NE(p, nullptr) << param;
    const Tensor& g = got.at(grad_name);
    ASSERT_EQ(g.shape(), p->shape()) << param;
    const int64_t n = p->elements();
    for (int s = 0; s < std::min<int64_t>(samples, n); ++s) {
      const int64_t i = n <= samples ? s : std::uniform_int_distribution<int64_t>(0, n - 1)(rng);
      const double orig = get(*p, i);
      set(*p, i, orig + tol.eps);
      const double up = loss();
      set(*p, i, orig - tol.eps);
      const double down = loss();
      set(*p, i, orig);
      const double fd = (up - down) / (2 * tol.eps), analytic = get(g, i);
      EXPECT_NEAR(analytic, fd, tol.atol + tol.rtol * std::fabs(fd)) << param << "[" << i << "]";
    }
  }
}

inline std::map<std::string, Tensor> gpt_inputs(int64_t batch, int64_t seq, int64_t vocab) {
  std::mt19937 rng(5);
  Tensor ids(DType::kInt64, {batch, seq}), labels(DType::kInt64, {batch, seq});
  for (int64_t i = 0; i < batch * seq; ++i) {
    ids.data<int64_t>()[i] = std::uniform_int_distribution<int64_t>(0, vocab - 1)(rng);
    labels.data<int64_t>()[i] = std::uniform_int_distribution<int64_t>(0, vocab - 1)(rng);
  }
  return {{"input_ids", ids}, {"labels", labels}};
}

// The same model in float64: float initializers, Constant tensors, graph inputs/outputs and Cast targets.
inline onnx::ModelProto to_float64(onnx::ModelProto m) {
  auto fix_type = [](onnx::TypeProto* t) {
    if (t->has_tensor_type() && t->tensor_type().elem_type() == onnx::TensorProto::FLOAT)
      t->mutable_tensor_type()->set_elem_type(onnx::TensorProto::DOUBLE);
  };
  auto fix_tensor = [](onnx::TensorProto* t) {
    if (t->data_type() != onnx::TensorProto::FLOAT) return;
    std::vector<double> values;
    const std::string& raw = t->raw_data();
    for (size_t i = 0; i + 4 <= raw.size(); i += 4) {
      float f;
      std::memcpy(&f, raw.data() + i, 4);
      values.push_back(f);
    }
    for (float f : t->float_data()) values.push_back(f);
    t->clear_raw_data();
    t->clear_float_data();
    t->set_data_type(onnx::TensorProto::DOUBLE);
    for (double v : values) t->add_double_data(v);
  };
  auto* g = m.mutable_graph();
  for (auto& i : *g->mutable_input()) fix_type(i.mutable_type());
  for (auto& o : *g->mutable_output()) fix_type(o.mutable_type());
  for (auto& v : *g->mutable_value_info()) fix_type(v.mutable_type());
  for (auto& t : *g->mutable_initializer()) fix_tensor(&t);
  for (auto& n : *g->mutable_node())
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_t()) fix_tensor(a.mutable_t());
      if (a.name() == "to" && a.i() == onnx::TensorProto::FLOAT) a.set_i(onnx::TensorProto::DOUBLE);
    }
  return m;
}

// Directional check over all params at once: one random direction d (entries N(0,1)·RMS of their param,
// so a step h moves every weight by about h relative; RMS 1 for all-zero params), the analytic ⟨∇L, d⟩
// against (L(p + h·d) − L(p − h·d)) / 2h. L is evaluated by `forward` (the training graph's forward: same
// kernels, BatchNormalization in the same mode), which is cheaper than rerunning the backward.
inline void expect_directional_derivative_matches(const TrainingGraph& tg, const onnx::ModelProto& forward,
                                                  const std::map<std::string, Tensor>& inputs, double h, double rtol) {
  Executor training(tg.model, {});
  std::map<std::string, Tensor> grads;
  for (auto& [name, t] : training.run(inputs)) grads[name] = t;
  Executor exec(forward, {});
  std::mt19937 rng(23);
  std::normal_distribution<double> normal;
  struct Step {
    Tensor* param;
    std::vector<double> orig, dir;
  };
  std::vector<Step> steps;
  double analytic = 0;
  for (const auto& [param, grad_name] : tg.gradients) {
    Step s{exec.param(param), {}, {}};
    ASSERT_NE(s.param, nullptr) << param;
    const Tensor& g = grads.at(grad_name);
    ASSERT_EQ(g.shape(), s.param->shape()) << param;
    double rms = 0;
    for (int64_t i = 0; i < g.elements(); ++i) rms += get(*s.param, i) * get(*s.param, i);
    rms = rms > 0 ? std::sqrt(rms / static_cast<double>(g.elements())) : 1.0;
    for (int64_t i = 0; i < g.elements(); ++i) {
      s.orig.push_back(get(*s.param, i));
      s.dir.push_back(normal(rng) * rms);
      analytic += s.dir.back() * get(g, i);
    }
    steps.push_back(std::move(s));
  }
  auto loss_at = [&](double t) {
    for (auto& s : steps)
      for (size_t i = 0; i < s.dir.size(); ++i) set(*s.param, static_cast<int64_t>(i), s.orig[i] + t * s.dir[i]);
    return get(exec.run(inputs).front().second, 0);
  };
  const double fd = (loss_at(h) - loss_at(-h)) / (2 * h);
  EXPECT_NEAR(analytic, fd, rtol * std::fabs(fd)) << "directional derivative over " << steps.size() << " params";
}

}  // namespace apart::testing
