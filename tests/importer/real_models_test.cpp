// The PyTorch exports in ../shared/models: complete shapes, exact counts, published FLOPs.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "importer/importer.h"
#include "profiler/op_work.h"
#include "tests/support/read_model.h"

namespace apart {
namespace {

namespace fs = std::filesystem;

class ARealModel : public ::testing::TestWithParam<std::string> {
 protected:
  fs::path path() const { return fs::path(APART_SHARED_MODELS_DIR) / GetParam(); }
  void SetUp() override {
    if (!fs::exists(path())) GTEST_SKIP() << path() << " is not present";
  }
  ImportedModel import_at_batch(int64_t batch) const {
    ImportOptions o;
    o.dims = {{"batch", batch}};
    return import_model(path(), o);
  }
};

TEST_P(ARealModel, ImportsWithEveryShapeKnownOnceTheBatchIsBound) {
  auto m = import_at_batch(2);
  EXPECT_TRUE(m.unknown_shape_values.empty()) << m.unknown_shape_values.size() << " unknown, first "
                                              << m.unknown_shape_values.front();
  for (const Value& v : m.graph.values()) EXPECT_TRUE(v.shape_known) << v.name;
}

TEST_P(ARealModel, CountsParamsAsTheSumOfInitializerElements) {
  const auto proto = testing::read_proto(path());
  int64_t expected = 0;
  for (const auto& t : proto.graph().initializer()) {
    int64_t n = 1;
    for (int64_t d : t.dims()) n *= d;
    expected += n;
  }
  auto m = import_at_batch(1);
  int64_t params = 0;
  for (const Value& v : m.graph.values())
    if (v.kind == ValueKind::kParam) params += v.elements;
  EXPECT_EQ(params, expected);
}

TEST_P(ARealModel, HasOneTaskPerOnnxNodeAndAnOpHistogramThatSumsToIt) {
  const auto proto = testing::read_proto(path());
  std::map<std::string, int> expected;
  for (const auto& n : proto.graph().node()) ++expected[n.op_type()];
  auto m = import_at_batch(1);
  std::map<std::string, int> histogram;
  for (const Task& t : m.graph.tasks()) ++histogram[t.op_type];
  EXPECT_EQ(m.graph.num_tasks(), static_cast<size_t>(proto.graph().node_size()));
  EXPECT_EQ(histogram, expected);
}

INSTANTIATE_TEST_SUITE_P(SharedModels, ARealModel,
                         ::testing::Values("resnet50.onnx", "densenet121.onnx", "inception_v3.onnx", "gpt2_small.onnx"),
                         [](const auto& info) { return info.param.substr(0, info.param.find('.')); });

// Published multiply-adds per 224² (299² for Inception) image, torchvision's model documentation.
TEST(TorchvisionModels, HaveThePublishedForwardFlopsAtBatchOne) {
  const std::map<std::string, double> published_gmacs = {
      {"resnet50.onnx", 4.09}, {"densenet121.onnx", 2.83}, {"inception_v3.onnx", 5.71}};
  for (const auto& [file, gmacs] : published_gmacs) {
    const fs::path path = fs::path(APART_SHARED_MODELS_DIR) / file;
    if (!fs::exists(path)) continue;
    ImportOptions o;
    o.dims = {{"batch", 1}};
    auto m = import_model(path, o);
    double flops = 0;
    for (size_t i = 0; i < m.graph.num_tasks(); ++i) flops += forward_work(m.graph, TaskId(static_cast<uint32_t>(i))).flops;
    EXPECT_NEAR(flops / 2e9, gmacs, gmacs * 0.03) << file;
  }
}

}  // namespace
}  // namespace apart
