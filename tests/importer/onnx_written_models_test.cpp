// Models ONNX itself wrote at opsets 18–23 (tests/data/opset/make_models.py: onnx.version_converter's conversions of
// opset-17 forms, and the newer forms and ops written directly) import with the shapes ONNX's own inference gives them.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "graph/text.h"
#include "importer/importer.h"

namespace apart {
namespace {

const std::string kDir = std::string(APART_TEST_DATA_DIR) + "/opset/";

// expected_shapes.txt: model → value → shape ("scalar" for rank 0).
std::map<std::string, std::map<std::string, std::vector<int64_t>>> expected_shapes() {
  std::map<std::string, std::map<std::string, std::vector<int64_t>>> out;
  std::ifstream in(kDir + "expected_shapes.txt");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string model, value, shape;
    fields >> model >> value >> shape;
    std::vector<int64_t> dims;
    if (shape != "scalar") {
      std::istringstream parts(shape);
      for (std::string d; std::getline(parts, d, 'x');) dims.push_back(std::stoll(d));
    }
    out[model][value] = dims;
  }
  return out;
}

TEST(AModelOnnxWroteAtOpsets18To23, ImportsWithTheShapesOnnxInfersForIt) {
  const auto expected = expected_shapes();
  ASSERT_EQ(expected.size(), 25u) << "run tests/data/opset/make_models.py";
  for (const auto& [file, values] : expected) {
    const ImportedModel m = import_model(kDir + file);
    EXPECT_TRUE(m.unknown_shape_values.empty()) << file;
    EXPECT_TRUE(m.warnings.empty()) << file << ": " << (m.warnings.empty() ? "" : m.warnings.front());
    for (const auto& [name, dims] : values) {
      const auto id = m.graph.find_value(name);
      ASSERT_TRUE(id.has_value()) << file << " " << name;
      const Value& v = m.graph.value(*id);
      EXPECT_TRUE(v.shape_known) << file << " " << name;
      EXPECT_EQ(v.shape, dims) << file << " " << name << ": [" << shape_string(v.shape) << "]";
    }
  }
}

}  // namespace
}  // namespace apart
