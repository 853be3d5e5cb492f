// The opset-20/23 transformer kernels (Gelu, RMSNormalization, RotaryEmbedding, Attention) against naive
// references written here from the ONNX specification (onnx/reference/ops/op_*.py), index by index.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <random>

#include "graph/error.h"
#include "runtime/executor.h"
#include "tests/runtime/compare.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {

using testing::Io;
using testing::OnnxBuilder;

Tensor random_floats(std::vector<int64_t> shape, std::mt19937& rng, double lo = -1, double hi = 1) {
  Tensor t(DType::kFloat32, std::move(shape));
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.elements(); ++i) t.data<float>()[i] = static_cast<float>(u(rng));
  return t;
}

// Runs one node at opset 23 on `inputs` (graph inputs, in node order; "" for an absent one) and returns output 0.
Tensor run_node(const std::string& op, const std::vector<std::pair<std::string, Tensor>>& inputs,
                const std::vector<int64_t>& out_shape, const std::function<void(onnx::NodeProto&)>& attrs = {}) {
  OnnxBuilder b(23, 10);
  std::vector<std::string> names;
  std::map<std::string, Tensor> feed;
  for (const auto& [name, t] : inputs) {
    names.push_back(name);
    if (name.empty()) continue;
    b.input({name, t.dtype(), t.shape()});
    feed[name] = t;
  }
  b.output({"y", inputs.front().second.dtype(), out_shape});
  auto& n = b.node(op, names, {"y"}, "op");
  if (attrs) attrs(n);
  Executor exec(b.model(), {});
  return exec.run(feed).front().second;
}

void set_float(onnx::NodeProto& n, const std::string& name, float v) {
  auto* a = n.add_attribute();
  a->set_name(name), a->set_type(onnx::AttributeProto::FLOAT), a->set_f(v);
}

TEST(AGeluKernel, MatchesTheErfAndTanhFormulas) {
  std::mt19937 rng(1);
  const Tensor x = random_floats({4, 7}, rng, -4, 4);
  for (const std::string approximate : {"none", "tanh"}) {
    Tensor want(DType::kFloat32, x.shape());
    for (int64_t i = 0; i < x.elements(); ++i) {
      const double v = x.data<float>()[i];
      want.data<float>()[i] = static_cast<float>(
          approximate == "none" ? 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))
                                : 0.5 * v * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v))));
    }
    const Tensor got = run_node("Gelu", {{"x", x}}, x.shape(), [&](onnx::NodeProto& n) {
      auto* a = n.add_attribute();
      a->set_name("approximate"), a->set_type(onnx::AttributeProto::STRING), a->set_s(approximate);
    });
    EXPECT_EQ(testing::compare_tensors(got, want, 1e-6, 1e-6), "") << approximate;
  }
}

TEST(AnRmsNormalizationKernel, DividesByTheRootMeanSquareOfTheTrailingAxesAndScales) {
  std::mt19937 rng(2);
  const Tensor x = random_floats({2, 3, 4}, rng), scale = random_floats({3, 4}, rng);
  const double eps = 1e-3;
  Tensor want(DType::kFloat32, x.shape());
  for (int64_t b = 0; b < 2; ++b) {
    double squares = 0;
    for (int64_t j = 0; j < 12; ++j) squares += std::pow(x.data<float>()[b * 12 + j], 2);
    const double rms = std::sqrt(squares / 12 + eps);
    for (int64_t j = 0; j < 12; ++j)
      want.data<float>()[b * 12 + j] = static_cast<float>(x.data<float>()[b * 12 + j] / rms * scale.data<float>()[j]);
  }
  const Tensor got = run_node("RMSNormalization", {{"x", x}, {"s", scale}}, x.shape(), [&](onnx::NodeProto& n) {
    OnnxBuilder::set_int(n, "axis", 1);
    set_float(n, "epsilon", static_cast<float>(eps));
  });
  EXPECT_EQ(testing::compare_tensors(got, want, 1e-5, 1e-6), "");
}

// op_rotary_embedding.py, for X as [B, S, H, D] (4-D input transposed from [B, H, S, D]).
Tensor naive_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor* pos, int64_t heads,
                    bool interleaved, int64_t rotary) {
  const bool four = x.rank() == 4;
  const int64_t batch = x.dim(0), seq = four ? x.dim(2) : x.dim(1), head = four ? x.dim(3) : x.dim(2) / heads;
  if (four) heads = x.dim(1);
  if (rotary == 0) rotary = head;
  const int64_t half = rotary / 2;
  auto index = [&](int64_t b, int64_t s, int64_t h, int64_t d) {
    return four ? ((b * heads + h) * seq + s) * head + d : ((b * seq + s) * heads + h) * head + d;
  };
  Tensor y(DType::kFloat32, x.shape());
  const float* px = x.data<float>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s) {
      const int64_t row = pos ? pos->data<int64_t>()[b * seq + s] : b * seq + s;
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t d = rotary; d < head; ++d) y.data<float>()[index(b, s, h, d)] = px[index(b, s, h, d)];
        for (int64_t i = 0; i < half; ++i) {
          const int64_t d1 = interleaved ? 2 * i : i, d2 = interleaved ? 2 * i + 1 : i + half;
          const double c = cos.data<float>()[row * half + i], sn = sin.data<float>()[row * half + i];
          const double x1 = px[index(b, s, h, d1)], x2 = px[index(b, s, h, d2)];
          y.data<float>()[index(b, s, h, d1)] = static_cast<float>(c * x1 - sn * x2);
          y.data<float>()[index(b, s, h, d2)] = static_cast<float>(sn * x1 + c * x2);
        }
      }
    }
  return y;
}

TEST(ARotaryEmbeddingKernel, RotatesHalvesOrInterleavedPairsIn3dAnd4dWithAndWithoutPositionIds) {
  std::mt19937 rng(3);
  {  // 4-D, halves, caches per (batch, position)
    const Tensor x = random_floats({2, 3, 5, 8}, rng), c = random_floats({2, 5, 4}, rng), s = random_floats({2, 5, 4}, rng);
    EXPECT_EQ(testing::compare_tensors(run_node("RotaryEmbedding", {{"x", x}, {"c", c}, {"s", s}}, x.shape()),
                                       naive_rotary(x, c, s, nullptr, 0, false, 0), 1e-6, 1e-6), "");
  }
  {  // 3-D with num_heads, interleaved, partial rotation, position_ids into a longer cache
    const Tensor x = random_floats({2, 4, 12}, rng), c = random_floats({9, 2}, rng), s = random_floats({9, 2}, rng);
    Tensor pos(DType::kInt64, {2, 4});
    for (int64_t i = 0; i < 8; ++i) pos.data<int64_t>()[i] = (i * 5) % 9;
    const Tensor got = run_node("RotaryEmbedding", {{"x", x}, {"c", c}, {"s", s}, {"p", pos}}, x.shape(), [](onnx::NodeProto& n) {
      OnnxBuilder::set_int(n, "num_heads", 2);
      OnnxBuilder::set_int(n, "interleaved", 1);
      OnnxBuilder::set_int(n, "rotary_embedding_dim", 4);
    });
    EXPECT_EQ(testing::compare_tensors(got, naive_rotary(x, c, s, &pos, 2, true, 4), 1e-6, 1e-6), "");
  }
}

// op_attention.py for 4-D Q [B, Hq, S, D], K/V [B, Hkv, L, D]: repeat the KV heads, scale, softcap, mask, softmax.
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* mask, bool causal,
                       double softcap) {
  const int64_t batch = q.dim(0), hq = q.dim(1), s = q.dim(2), d = q.dim(3), hkv = k.dim(1), l = k.dim(2), dv = v.dim(3);
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  Tensor y(DType::kFloat32, {batch, hq, s, dv});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kv = h / (hq / hkv);
      for (int64_t i = 0; i < s; ++i) {
        std::vector<double> logits(static_cast<size_t>(l));
        for (int64_t j = 0; j < l; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e)
            dot += q.data<float>()[((b * hq + h) * s + i) * d + e] * k.data<float>()[((b * hkv + kv) * l + j) * d + e];
          double logit = dot * scale;
          if (softcap > 0) logit = softcap * std::tanh(logit / softcap);
          if (mask) logit += mask->data<float>()[i * l + j];  // a [S, L] mask in these tests
          if (causal && j > i) logit = -std::numeric_limits<double>::infinity();
          logits[static_cast<size_t>(j)] = logit;
        }
        double mx = -std::numeric_limits<double>::infinity(), sum = 0;
        for (double x : logits) mx = std::max(mx, x);
        for (double& x : logits) sum += (x = std::exp(x - mx));
        for (int64_t e = 0; e < dv; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < l; ++j)
            acc += logits[static_cast<size_t>(j)] / sum * v.data<float>()[((b * hkv + kv) * l + j) * dv + e];
          y.data<float>()[((b * hq + h) * s + i) * dv + e] = static_cast<float>(acc);
        }
      }
    }
  return y;
}

TEST(AnAttentionKernel, MatchesTheReferenceWithGqaCausalMaskAndSoftcap) {
  std::mt19937 rng(4);
  const Tensor q = random_floats({2, 4, 5, 8}, rng, -2, 2), k = random_floats({2, 2, 5, 8}, rng, -2, 2),
               v = random_floats({2, 2, 5, 6}, rng);
  const Tensor causal = run_node("Attention", {{"q", q}, {"k", k}, {"v", v}}, {2, 4, 5, 6},
                                 [](onnx::NodeProto& n) { OnnxBuilder::set_int(n, "is_causal", 1); });
  EXPECT_EQ(testing::compare_tensors(causal, naive_attention(q, k, v, nullptr, true, 0), 1e-5, 1e-6), "");
  const Tensor mask = random_floats({5, 5}, rng, -3, 0);
  const Tensor capped = run_node("Attention", {{"q", q}, {"k", k}, {"v", v}, {"m", mask}}, {2, 4, 5, 6},
                                 [](onnx::NodeProto& n) { set_float(n, "softcap", 1.5f); });
  EXPECT_EQ(testing::compare_tensors(capped, naive_attention(q, k, v, &mask, false, 1.5), 1e-5, 1e-6), "");
}

TEST(AnAttentionKernel, Reads3dInputsAsHeadsAlongTheHiddenAxis) {
  // [B, S, H·D] is the 4-D [B, H, S, D] transposed: the same attention, the output transposed back.
  std::mt19937 rng(5);
  const Tensor q = random_floats({1, 4, 3, 2}, rng), k = random_floats({1, 2, 3, 2}, rng), v = random_floats({1, 2, 3, 2}, rng);
  auto to_3d = [](const Tensor& t) {
    Tensor o(DType::kFloat32, {t.dim(0), t.dim(2), t.dim(1) * t.dim(3)});
    for (int64_t h = 0; h < t.dim(1); ++h)
      for (int64_t s = 0; s < t.dim(2); ++s)
        for (int64_t d = 0; d < t.dim(3); ++d)
          o.data<float>()[(s * t.dim(1) + h) * t.dim(3) + d] = t.data<float>()[(h * t.dim(2) + s) * t.dim(3) + d];
    return o;
  };
  const Tensor got = run_node("Attention", {{"q", to_3d(q)}, {"k", to_3d(k)}, {"v", to_3d(v)}}, {1, 3, 8},
                              [](onnx::NodeProto& n) {
                                OnnxBuilder::set_int(n, "q_num_heads", 4);
                                OnnxBuilder::set_int(n, "kv_num_heads", 2);
                                OnnxBuilder::set_int(n, "is_causal", 1);
                              });
  EXPECT_EQ(testing::compare_tensors(got, to_3d(naive_attention(q, k, v, nullptr, true, 0)), 1e-5, 1e-6), "");
}

TEST(AnAttentionKernel, RefusesAKvCacheNamingTheNode) {
  std::mt19937 rng(6);
  const Tensor q = random_floats({1, 2, 3, 4}, rng), past = random_floats({1, 2, 2, 4}, rng);
  try {
    run_node("Attention", {{"q", q}, {"k", q}, {"v", q}, {"", Tensor()}, {"pk", past}, {"pv", past}}, {1, 2, 3, 4});
    ADD_FAILURE() << "no error";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("'op'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("KV cache"), std::string::npos) << e.what();
  } catch (const Error& e) {
    ADD_FAILURE() << "not Unsupported: " << e.what();
  }
}

}  // namespace
}  // namespace apart
