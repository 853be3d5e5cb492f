// Written files: determinism, the bundled gpt-tiny.onnx, streamed external weights, python onnx's checker.
#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <cstdlib>
#include <map>

#include "graph/error.h"
#include "models/zoo.h"
#include "tests/models/zoo_test_util.h"

namespace apart::models {
namespace {

using testing::read_bytes;
using testing::TempDir;

onnx::ModelProto load(const std::string& path) {
  onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromString(read_bytes(path))) << path;
  return m;
}

TEST(AZooWriter, WritesByteIdenticalFilesForTheSameSeed) {
  TempDir dir("zoo_determinism");
  ZooOptions o = options_for("gpt");
  o.seed = 7;
  write_zoo_model(o, dir.file("a.onnx"));
  write_zoo_model(o, dir.file("b.onnx"));
  EXPECT_EQ(read_bytes(dir.file("a.onnx")), read_bytes(dir.file("b.onnx")));
  o.seed = 8;
  write_zoo_model(o, dir.file("c.onnx"));
  EXPECT_NE(read_bytes(dir.file("a.onnx")), read_bytes(dir.file("c.onnx")));
}

TEST(ABundledGptTiny, IsExactlyWhatTheZooGeneratesToday) {
  const std::string bundled = std::string(APART_SOURCE_DIR) + "/models/gpt-tiny.onnx";
  TempDir dir("zoo_bundled");
  const ZooResult r = write_zoo_model(options_for("gpt-tiny"), dir.file("gpt-tiny.onnx"));
  EXPECT_LT(r.model_bytes, 1 << 20);
  EXPECT_EQ(read_bytes(dir.file("gpt-tiny.onnx")), read_bytes(bundled))
      << "models/gpt-tiny.onnx drifted; regenerate: apart zoo gpt-tiny -o models/gpt-tiny.onnx";
}

TEST(AZooWriter, StreamsLargeRandomWeightsToAnAlignedExternalFile) {
  TempDir dir("zoo_external");
  ZooOptions o = options_for("gpt");
  const onnx::ModelProto inline_model = build_zoo_model(o);
  o.inline_limit_bytes = 1;  // force the > 2 GiB path on a small model
  const ZooResult r = write_zoo_model(o, dir.file("big.onnx"));
  EXPECT_TRUE(r.weights_written);
  EXPECT_EQ(r.weights_location, "big.weights");
  const std::string data = read_bytes(dir.file("big.weights"));
  const onnx::ModelProto m = load(dir.file("big.onnx"));
  ASSERT_EQ(m.graph().initializer_size(), inline_model.graph().initializer_size());
  for (int i = 0; i < m.graph().initializer_size(); ++i) {
    const auto& t = m.graph().initializer(i);
    std::map<std::string, std::string> kv;
    for (const auto& e : t.external_data()) kv[e.key()] = e.value();
    const int64_t offset = std::stoll(kv["offset"]), length = std::stoll(kv["length"]);
    EXPECT_EQ(offset % 4096, 0);
    ASSERT_LE(offset + length, static_cast<int64_t>(data.size()));
    // The same values as the inline model: weights depend on (seed, name) only.
    EXPECT_EQ(data.substr(static_cast<size_t>(offset), static_cast<size_t>(length)),
              inline_model.graph().initializer(i).raw_data())
        << t.name();
  }
  onnx::checker::check_model(dir.file("big.onnx"));  // resolves the external file beside the model
}

TEST(AZooWriter, WritesNoWeightsFileForShapesOnly) {
  TempDir dir("zoo_none");
  ZooOptions o = options_for("gpt3-175b");
  const ZooResult r = write_zoo_model(o, dir.file("gpt3.onnx"));
  EXPECT_FALSE(r.weights_written);
  EXPECT_EQ(r.weights_location, "gpt3.weights");
  EXPECT_FALSE(std::filesystem::exists(dir.file("gpt3.weights")));
  EXPECT_LT(r.model_bytes, 16 << 20);
  EXPECT_EQ(r.params, closed_form_params(o));
}

TEST(AZooWriter, LeavesNoFileBehindOnBadOptions) {
  TempDir dir("zoo_bad");
  ZooOptions o = options_for("gpt");
  o.heads = 5;
  EXPECT_THROW(write_zoo_model(o, dir.file("bad.onnx")), InvalidArgument);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  EXPECT_THROW(write_zoo_model(options_for("gpt"), dir.file("missing/dir/x.onnx")), SystemError);
  EXPECT_THROW(write_zoo_model(options_for("gpt"), dir.path().string()), InvalidArgument);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

bool python_has_onnx() { return std::system("/usr/bin/python3 -c 'import onnx' >/dev/null 2>&1") == 0; }

TEST(APythonOnnxChecker, AcceptsEveryFamilyWithFullCheck) {
  if (!python_has_onnx()) GTEST_SKIP() << "/usr/bin/python3 has no onnx package (apt install python3-onnx)";
  TempDir dir("zoo_python");
  std::vector<std::pair<std::string, ZooOptions>> cases;
  for (const char* name : {"gpt-tiny", "bert", "t5", "llama-tiny", "mlp-tiny"}) cases.emplace_back(name, options_for(name));
  ZooOptions resnet = options_for("resnet50");
  resnet.image = 64;
  resnet.dtype = FloatType::kFp16;
  cases.emplace_back("resnet50", resnet);
  ZooOptions fused = options_for("gpt");
  fused.layernorm = LayerNormStyle::kFused;
  fused.dtype = FloatType::kBf16;
  cases.emplace_back("gpt-fused-bf16", fused);
  ZooOptions streamed = options_for("bert");
  streamed.inline_limit_bytes = 1;
  cases.emplace_back("bert-external", streamed);
  for (const auto& [label, o] : cases) {
    SCOPED_TRACE(label);
    const std::string path = dir.file(label + ".onnx");
    write_zoo_model(o, path);
    const std::string cmd =
        "/usr/bin/python3 -c \"import onnx,sys; m=onnx.load(sys.argv[1]); "
        "onnx.checker.check_model(m, full_check=True)\" '" + path + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
}

// Runs the models through tests/models/zoo_semantics.py, a numpy interpreter of the ops they use.
TEST(AGptTinyModel, StartsNearLnVocabLossAndOnlyLooksBackwards) {
  if (std::system("/usr/bin/python3 -c 'import onnx, numpy' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 lacks onnx or numpy";
  TempDir dir("zoo_semantics");
  auto no_loss = [](const char* name) {
    ZooOptions o = options_for(name);
    o.loss = Loss::kNone;
    return o;
  };
  write_zoo_model(no_loss("gpt-tiny"), dir.file("gpt.onnx"));
  write_zoo_model(no_loss("t5"), dir.file("t5.onnx"));
  write_zoo_model(no_loss("bert"), dir.file("bert.onnx"));
  const std::string cmd = "/usr/bin/python3 " + std::string(APART_SOURCE_DIR) + "/tests/models/zoo_semantics.py " +
                          APART_SOURCE_DIR + "/models/gpt-tiny.onnx " + dir.file("gpt.onnx").string() + " " +
                          dir.file("t5.onnx").string() + " " + dir.file("bert.onnx").string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace
}  // namespace apart::models
