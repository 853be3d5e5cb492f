// The bundled gpt-tiny: its initial loss is about ln(vocab), and matches a numpy interpreter.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "importer/importer.h"
#include "runtime/executor.h"
#include "tests/support/temp_dir.h"

namespace apart {
namespace {

namespace fs = std::filesystem;

Tensor random_ids(std::mt19937& rng, int64_t batch, int64_t seq, int64_t vocab) {
  Tensor t(DType::kInt64, {batch, seq});
  std::uniform_int_distribution<int64_t> dist(0, vocab - 1);
  for (auto& v : t.span<int64_t>()) v = dist(rng);
  return t;
}

TEST(TheBundledGptTiny, HasAnInitialLossNearLnVocabMatchingANumpyInterpreter) {
  const fs::path model_path = fs::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx";
  ImportOptions options;
  options.dims["batch"] = 3;
  ImportedModel model = import_model(model_path, options);
  Executor exec(model);
  std::mt19937 rng(7);
  Tensor ids = random_ids(rng, 3, 32, 512), labels = random_ids(rng, 3, 32, 512);
  NamedTensors out = exec.run({{"input_ids", ids}, {"labels", labels}});
  ASSERT_EQ(out.size(), 1u);
  const double loss = out[0].second.scalar_as_double();
  std::printf("[ gpt-tiny ] loss %.6f (ln 512 = %.6f), arena %lld bytes (no reuse: %lld)\n", loss, std::log(512.0),
              static_cast<long long>(exec.memory_plan().peak_bytes), static_cast<long long>(exec.memory_plan().total_bytes));
  EXPECT_NEAR(loss, std::log(512.0), 0.5);
  // Same inputs, same loss: the arena is reused without leaking state between steps.
  EXPECT_EQ(exec.run({{"input_ids", ids}, {"labels", labels}})[0].second.scalar_as_double(), loss);

  if (std::system("/usr/bin/python3 -c 'import onnx, numpy' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 lacks onnx or numpy: the numpy comparison is skipped";
  const testing::TempDir scratch("gpt_tiny");
  const fs::path& dir = scratch.path();
  write_tensor_file(ids, "input_ids", dir / "ids.pb");
  write_tensor_file(labels, "labels", dir / "labels.pb");
  const std::string cmd = "/usr/bin/python3 " + (fs::path(APART_SOURCE_DIR) / "tests/runtime/gpt_tiny_reference.py").string() +
                          " " + model_path.string() + " " + (dir / "ids.pb").string() + " " + (dir / "labels.pb").string();
  FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  double reference = NAN;
  ASSERT_EQ(std::fscanf(pipe, "%lf", &reference), 1) << cmd;
  ::pclose(pipe);
  std::printf("[ gpt-tiny ] numpy reference loss %.6f\n", reference);
  EXPECT_NEAR(loss, reference, 1e-4 * std::fabs(reference));
}

}  // namespace
}  // namespace apart
