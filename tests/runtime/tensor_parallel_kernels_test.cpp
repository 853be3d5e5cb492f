// The tensor-parallel collectives' CPU kernels (runtime/cpu/tensor_parallel.cpp) over an in-process TP group of 3
// ranks, one executor per rank: sequence parallelism's all-gather, reduce-scatter and scatter along each axis of a
// [3, 6, 9] tensor, float32 and float64, against the same cut written out index by index.
#include <gtest/gtest.h>

#include <cmath>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "graph/error.h"
#include "runtime/communicator.h"
#include "plan/training.h"  // tp_sequence_part
#include "runtime/executor.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {

using testing::OnnxBuilder;

constexpr int kDegree = 3;
const std::vector<int64_t> kWhole = {3, 6, 9};

std::vector<int64_t> part_shape(int axis) {
  std::vector<int64_t> s = kWhole;
  s[static_cast<size_t>(axis)] /= kDegree;
  return s;
}

// A one-node model: ai.apart.<op>(x) → y along `axis` (and `backward`, for TpAllGather).
onnx::ModelProto collective(const std::string& op, int axis, DType dtype, const std::vector<int64_t>& in,
                            const std::vector<int64_t>& out) {
  OnnxBuilder b;
  b.input({"x", dtype, in}).output({"y", dtype, out});
  onnx::NodeProto& n = b.node(op, {"x"}, {"y"}, "collective");
  n.set_domain("ai.apart");
  OnnxBuilder::set_int(n, "axis", axis);
  auto* apart = b.model().add_opset_import();
  apart->set_domain("ai.apart");
  apart->set_version(1);
  return b.model();
}

// x[i] of a tensor of `shape`, seen as [outer, length, inner] around `axis`: the index along the axis.
int64_t index_along(const std::vector<int64_t>& shape, int axis, int64_t flat) {
  int64_t inner = 1;
  for (size_t a = static_cast<size_t>(axis) + 1; a < shape.size(); ++a) inner *= shape[a];
  return (flat / inner) % shape[static_cast<size_t>(axis)];
}

// Each rank's value at flat index i of a whole [3, 6, 9] tensor: distinct per rank and position.
double value(int rank, int64_t i) { return 1000.0 * rank + static_cast<double>(i) + 0.25; }

Tensor filled(DType dtype, const std::vector<int64_t>& shape, const std::function<double(int64_t)>& f) {
  Tensor t(dtype, shape);
  for (int64_t i = 0; i < t.elements(); ++i) {
    if (dtype == DType::kFloat32) t.data<float>()[i] = static_cast<float>(f(i));
    else t.data<double>()[i] = f(i);
  }
  return t;
}

double at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kFloat32 ? static_cast<double>(t.data<float>()[i]) : t.data<double>()[i];
}

// Runs model_of(r) on kDegree threads, rank r's input made by input(r); returns each rank's y.
std::vector<Tensor> run_on_group(const std::function<onnx::ModelProto(int)>& model_of,
                                 const std::function<Tensor(int)>& input) {
  auto comms = make_in_process_communicators(kDegree, CommOptions{30});
  std::vector<Tensor> out(kDegree);
  std::vector<std::exception_ptr> errors(kDegree);
  std::vector<std::thread> threads;
  for (int r = 0; r < kDegree; ++r)
    threads.emplace_back([&, r] {
      try {
        ExecutorOptions options;
        options.tensor_parallel = comms[static_cast<size_t>(r)].get();
        Executor exec(model_of(r), {}, options);
        out[static_cast<size_t>(r)] = exec.run({{"x", input(r)}})[0].second;
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}
std::vector<Tensor> run_on_group(const onnx::ModelProto& model, const std::function<Tensor(int)>& input) {
  return run_on_group([&](int) { return model; }, input);
}

struct Axis {
  int axis;
  DType dtype;
};

class TensorParallelKernels : public ::testing::TestWithParam<Axis> {};

// Rank r's part of the whole tensor along the axis, all-gathered: every rank holds the whole, each position from
// the rank whose part it is.
TEST_P(TensorParallelKernels, AllGatherConcatenatesTheRanksPartsInRankOrder) {
  const auto [axis, dtype] = GetParam();
  const std::vector<int64_t> part = part_shape(axis);
  const auto ys = run_on_group(collective("TpAllGather", axis, dtype, part, kWhole), [&](int r) {
    return filled(dtype, part, [&](int64_t i) { return value(r, i); });
  });
  const int64_t length = part[static_cast<size_t>(axis)];
  for (int r = 0; r < kDegree; ++r) {
    ASSERT_EQ(ys[static_cast<size_t>(r)].shape(), kWhole);
    // Position i of the whole comes from rank j = its index along the axis / length, at that rank's own index.
    std::vector<int64_t> seen(kDegree, 0);
    for (int64_t i = 0; i < ys[0].elements(); ++i) {
      const int j = static_cast<int>(index_along(kWhole, axis, i) / length);
      const double want = value(j, seen[static_cast<size_t>(j)]++);
      ASSERT_EQ(at(ys[static_cast<size_t>(r)], i), want) << "rank " << r << " index " << i;
    }
  }
}

// Every rank's whole x summed, each rank keeping its part: rank r holds positions [r·L/3, (r+1)·L/3) of the sum.
TEST_P(TensorParallelKernels, ReduceScatterKeepsEachRanksPartOfTheSum) {
  const auto [axis, dtype] = GetParam();
  const std::vector<int64_t> part = part_shape(axis);
  const auto ys = run_on_group(collective("TpReduceScatter", axis, dtype, kWhole, part), [&](int r) {
    return filled(dtype, kWhole, [&](int64_t i) { return value(r, i); });
  });
  const int64_t length = part[static_cast<size_t>(axis)];
  for (int r = 0; r < kDegree; ++r) {
    ASSERT_EQ(ys[static_cast<size_t>(r)].shape(), part);
    int64_t k = 0;
    for (int64_t i = 0; i < Tensor(DType::kFloat32, kWhole).elements(); ++i) {
      if (index_along(kWhole, axis, i) / length != r) continue;
      double sum = 0;
      for (int s = 0; s < kDegree; ++s) sum += value(s, i);
      ASSERT_EQ(at(ys[static_cast<size_t>(r)], k++), sum) << "rank " << r << " index " << i;
    }
  }
}

// A value the same on every rank: each keeps its part, no message.
TEST_P(TensorParallelKernels, ScatterKeepsEachRanksPartOfTheSameValue) {
  const auto [axis, dtype] = GetParam();
  const std::vector<int64_t> part = part_shape(axis);
  const auto ys = run_on_group(collective("TpScatter", axis, dtype, kWhole, part), [&](int) {
    return filled(dtype, kWhole, [&](int64_t i) { return value(0, i); });
  });
  const int64_t length = part[static_cast<size_t>(axis)];
  for (int r = 0; r < kDegree; ++r) {
    int64_t k = 0;
    for (int64_t i = 0; i < Tensor(DType::kFloat32, kWhole).elements(); ++i) {
      if (index_along(kWhole, axis, i) / length != r) continue;
      ASSERT_EQ(at(ys[static_cast<size_t>(r)], k++), value(0, i)) << "rank " << r << " index " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Axes, TensorParallelKernels,
                         ::testing::Values(Axis{0, DType::kFloat32}, Axis{1, DType::kFloat32}, Axis{2, DType::kFloat32},
                                           Axis{1, DType::kFloat64}),
                         [](const ::testing::TestParamInfo<Axis>& info) {
                           return "axis" + std::to_string(info.param.axis) +
                                  (info.param.dtype == DType::kFloat32 ? "_float32" : "_float64");
                         });

// Without a TP group (a shard run at degree 1) the three are identities.
TEST(TensorParallelKernelsWithoutAGroup, AreIdentities) {
  for (const char* op : {"TpAllGather", "TpReduceScatter", "TpScatter"}) {
    Executor exec(collective(op, 1, DType::kFloat32, kWhole, kWhole), {});
    const Tensor x = filled(DType::kFloat32, kWhole, [](int64_t i) { return value(0, i); });
    const Tensor y = exec.run({{"x", x}})[0].second;
    ASSERT_EQ(y.shape(), kWhole) << op;
    for (int64_t i = 0; i < x.elements(); ++i) ASSERT_EQ(at(y, i), at(x, i)) << op;
  }
}

// An axis the group does not cut into equal parts (7 positions on 3 ranks): rank r holds tp_sequence_part's
// [0, 3), [3, 5), [5, 7); the all-gather reads the whole length from its `length` attribute. Each kernel is checked
// position by position against the whole tensor.
TEST(TensorParallelKernelsOnUnevenParts, ScatterReduceScatterAndAllGatherMoveEachRanksPositions) {
  const std::vector<int64_t> whole = {3, 7, 2};
  const int axis = 1;
  auto part_of = [&](int r) {
    std::vector<int64_t> s = whole;
    const auto [begin, end] = tp_sequence_part(7, kDegree, r);
    s[1] = end - begin;
    return s;
  };
  auto owner = [&](int64_t i) {  // the rank holding flat position i of the whole, and the index in its part
    const int64_t at_axis = index_along(whole, axis, i);
    for (int r = 0; r < kDegree; ++r) {
      const auto [begin, end] = tp_sequence_part(7, kDegree, r);
      if (at_axis >= begin && at_axis < end) {
        const int64_t outer = i / (7 * 2), inner = i % 2;
        return std::make_pair(r, (outer * (end - begin) + (at_axis - begin)) * 2 + inner);
      }
    }
    return std::make_pair(-1, int64_t{-1});
  };
  // Rank r's one-node model, its part side of rank r's length.
  auto model = [&](const char* op, DType dtype, bool part_in) {
    return [=](int r) {
      return part_in ? collective(op, axis, dtype, part_of(r), whole) : collective(op, axis, dtype, whole, part_of(r));
    };
  };
  EXPECT_EQ(part_of(0)[1], 3);
  EXPECT_EQ(part_of(2)[1], 2);
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const auto scattered = run_on_group(model("TpScatter", dtype, false), [&](int) {
      return filled(dtype, whole, [&](int64_t i) { return value(0, i); });
    });
    const auto reduced = run_on_group(model("TpReduceScatter", dtype, false), [&](int r) {
      return filled(dtype, whole, [&](int64_t i) { return value(r, i); });
    });
    auto gather = [&](int r) {
      onnx::ModelProto m = model("TpAllGather", dtype, true)(r);
      OnnxBuilder::set_int(*m.mutable_graph()->mutable_node(0), "length", 7);
      return m;
    };
    const auto gathered =
        run_on_group(gather, [&](int r) { return filled(dtype, part_of(r), [&](int64_t k) { return value(r, k); }); });
    for (int r = 0; r < kDegree; ++r) {
      ASSERT_EQ(scattered[static_cast<size_t>(r)].shape(), part_of(r));
      ASSERT_EQ(reduced[static_cast<size_t>(r)].shape(), part_of(r));
      ASSERT_EQ(gathered[static_cast<size_t>(r)].shape(), whole);
    }
    for (int64_t i = 0; i < 3 * 7 * 2; ++i) {
      const auto [r, k] = owner(i);
      double sum = 0;
      for (int s = 0; s < kDegree; ++s) sum += value(s, i);
      ASSERT_EQ(at(scattered[static_cast<size_t>(r)], k), value(0, i)) << "index " << i;
      ASSERT_EQ(at(reduced[static_cast<size_t>(r)], k), sum) << "index " << i;
      for (int g = 0; g < kDegree; ++g)
        ASSERT_EQ(at(gathered[static_cast<size_t>(g)], i), value(r, k)) << "index " << i;
    }
  }
}

// An axis shorter than the group (2 positions on 3 ranks) leaves a rank none: InvalidModel naming the node.
TEST(ATensorParallelKernel, RefusesAnAxisShorterThanTheGroupNamingTheNode) {
  try {
    run_on_group(collective("TpReduceScatter", 2, DType::kFloat32, {2, 6, 2}, {2, 6, 1}), [](int) {
      return filled(DType::kFloat32, {2, 6, 2}, [](int64_t i) { return value(0, i); });
    });
    ADD_FAILURE() << "no error";
  } catch (const InvalidModel& e) {
    EXPECT_NE(std::string(e.what()).find("'collective'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("length 2 leaves some of 3 TP ranks no position"), std::string::npos)
        << e.what();
  }
}

// --- The vocabulary-parallel loss ---------------------------------------------------------------------------------

// 6 rows of scores over a vocabulary of 9 (3 columns per rank), labels spread over every rank's columns, one ignored.
constexpr int64_t kLossRows = 6, kVocab = 9;
const std::vector<int64_t> kLabels = {0, 4, 8, 3, -100, 7};
double score(int64_t row, int64_t column) { return std::sin(0.7 * static_cast<double>(row * kVocab + column)) * 3.0; }

// ai.apart.VocabParallelCrossEntropy (rank r holding columns [3r, 3r + 3)) and its gradient op, fed dloss = 1, in one
// model: outputs loss, lse and dscores.
onnx::ModelProto vocab_parallel_loss(int rank) {
  OnnxBuilder b;
  b.input({"scores", DType::kFloat64, {kLossRows, kVocab / kDegree}}).input({"labels", DType::kInt64, {kLossRows}});
  b.input({"dloss", DType::kFloat64, {}});
  b.output({"loss", DType::kFloat64, {}}).output({"lse", DType::kFloat64, {kLossRows}});
  b.output({"dscores", DType::kFloat64, {kLossRows, kVocab / kDegree}});
  for (auto* n : {&b.node("VocabParallelCrossEntropy", {"scores", "labels"}, {"loss", "lse"}, "loss"),
                  &b.node("VocabParallelCrossEntropyGrad", {"dloss", "scores", "labels", "lse"}, {"dscores"}, "grad")}) {
    n->set_domain("ai.apart");
    OnnxBuilder::set_int(*n, "vocab_start", rank * (kVocab / kDegree));
    OnnxBuilder::set_int(*n, "ignore_index", -100);
  }
  auto* apart = b.model().add_opset_import();
  apart->set_domain("ai.apart");
  apart->set_version(1);
  return b.model();
}

// Each rank's loss is the whole vocabulary's mean cross-entropy (log Σ exp over all 9 columns minus the target's
// score, the ignored row left out), as SoftmaxCrossEntropyLoss computes it whole, and each rank's gradient is its
// columns of (softmax − one-hot) / 5 rows.
TEST(TheVocabularyParallelLoss, GivesEveryRankTheWholeLossAndItsColumnsOfTheGradient) {
  auto comms = make_in_process_communicators(kDegree, CommOptions{30});
  std::vector<std::vector<Tensor>> out(kDegree);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(kDegree);
  for (int r = 0; r < kDegree; ++r)
    threads.emplace_back([&, r] {
      try {
        ExecutorOptions options;
        options.tensor_parallel = comms[static_cast<size_t>(r)].get();
        Executor exec(vocab_parallel_loss(r), {}, options);
        Tensor scores(DType::kFloat64, {kLossRows, kVocab / kDegree});
        for (int64_t i = 0; i < kLossRows; ++i)
          for (int64_t c = 0; c < kVocab / kDegree; ++c) scores.data<double>()[i * 3 + c] = score(i, r * 3 + c);
        Tensor labels(DType::kInt64, {kLossRows});
        for (int64_t i = 0; i < kLossRows; ++i) labels.data<int64_t>()[i] = kLabels[static_cast<size_t>(i)];
        Tensor dloss(DType::kFloat64, {});
        dloss.data<double>()[0] = 1.0;
        for (auto& [name, t] : exec.run({{"scores", scores}, {"labels", labels}, {"dloss", dloss}}))
          out[static_cast<size_t>(r)].push_back(t);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  double total = 0;
  std::vector<double> lse(kLossRows);
  for (int64_t i = 0; i < kLossRows; ++i) {
    double sum = 0;
    for (int64_t c = 0; c < kVocab; ++c) sum += std::exp(score(i, c));
    lse[static_cast<size_t>(i)] = std::log(sum);
    if (kLabels[static_cast<size_t>(i)] >= 0) total += lse[static_cast<size_t>(i)] - score(i, kLabels[static_cast<size_t>(i)]);
  }
  for (int r = 0; r < kDegree; ++r) {
    const std::vector<Tensor>& o = out[static_cast<size_t>(r)];
    ASSERT_EQ(o.size(), 3u);
    EXPECT_NEAR(o[0].data<double>()[0], total / 5, 1e-12) << "rank " << r;
    for (int64_t i = 0; i < kLossRows; ++i) {
      EXPECT_NEAR(o[1].data<double>()[i], lse[static_cast<size_t>(i)], 1e-12) << "rank " << r;
      for (int64_t c = 0; c < 3; ++c) {
        const int64_t column = r * 3 + c;
        const int64_t label = kLabels[static_cast<size_t>(i)];
        const double want = label < 0 ? 0.0
                                      : (std::exp(score(i, column) - lse[static_cast<size_t>(i)]) - (column == label ? 1.0 : 0.0)) / 5;
        EXPECT_NEAR(o[2].data<double>()[i * 3 + c], want, 1e-12) << "rank " << r << " row " << i << " column " << column;
      }
    }
  }
}

}  // namespace
}  // namespace apart
