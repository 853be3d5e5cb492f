// ONNX's own backend test models: every one imports, or fails with a typed error; none crashes.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "graph/error.h"
#include "importer/importer.h"
#include "profiler/op_work.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
const fs::path kTestData = "/usr/share/libonnx-testdata/data";

TEST(TheOnnxBackendCorpus, ImportsEveryModelOrFailsWithATypedError) {
  if (!fs::exists(kTestData)) GTEST_SKIP() << kTestData << " is missing (Debian package libonnx-testdata)";
  std::vector<fs::path> models;
  for (const auto& entry : fs::recursive_directory_iterator(kTestData))
    if (entry.is_regular_file() && entry.path().filename() == "model.onnx") models.push_back(entry.path());
  std::sort(models.begin(), models.end());
  ASSERT_GT(models.size(), 1000u);

  size_t ok = 0, unknown_shapes = 0;
  std::map<std::string, size_t> typed;
  for (const auto& path : models) {
    try {
      ImportedModel m = import_model(path);
      for (size_t i = 0; i < m.graph.num_tasks(); ++i) forward_work(m.graph, TaskId(static_cast<uint32_t>(i)));
      ++ok;
      unknown_shapes += !m.unknown_shape_values.empty();
    } catch (const Error& e) {
      EXPECT_NE(e.kind(), ErrorKind::kInternal) << path << ": " << e.what();
      ++typed[error_kind_name(e.kind())];
    } catch (const std::exception& e) {
      ADD_FAILURE() << path << " raised an untyped exception: " << e.what();
    }
  }
  std::string summary;
  for (const auto& [kind, n] : typed) summary += " " + kind + "=" + std::to_string(n);
  std::printf("[ corpus   ] %zu models: %zu imported (%zu with some shape unknown), typed errors:%s\n", models.size(), ok,
              unknown_shapes, summary.empty() ? " none" : summary.c_str());
  EXPECT_GT(ok, models.size() * 9 / 10);
}

}  // namespace
}  // namespace apart
