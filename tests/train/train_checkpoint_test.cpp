// Checkpoints round-trip and refuse damaged files; trained models are valid ONNX that re-import with
// the new values, inline or with one aligned external-data file.
#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "graph/crc32c.h"
#include "graph/error.h"
#include "importer/importer.h"
#include "models/zoo.h"
#include "train/checkpoint.h"
#include "runtime/executor.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {
namespace fs = std::filesystem;

using testing::TempDir;

Tensor ramp(DType dtype, std::vector<int64_t> shape, float start) {
  Tensor t(dtype, std::move(shape));
  for (int64_t i = 0; i < t.elements(); ++i) {
    if (dtype == DType::kFloat32) t.data<float>()[i] = start + static_cast<float>(i);
    else t.data<int64_t>()[i] = static_cast<int64_t>(start) + i;
  }
  return t;
}

std::string checkpoint_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

// The temporary files the writers rename into place (graph/atomic_file.h) that are still there.
std::vector<std::string> leftover_temporaries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().find(".tmp") != std::string::npos) names.push_back(entry.path().filename().string());
  return names;
}

TEST(ACheckpoint, RoundTripsTensorsStepAndMeta) {
  TempDir dir;
  Tensor w = ramp(DType::kFloat32, {3, 5}, 0.5f), m = ramp(DType::kFloat32, {3, 5}, -2.0f);
  Tensor scalar = ramp(DType::kInt64, {}, 42.0f);
  write_checkpoint(dir.path() / "ck", 17, {{"optimizer", "adamw"}}, {{"param/w", &w}, {"optim/w/exp_avg", &m}, {"s", &scalar}});
  EXPECT_TRUE(leftover_temporaries(dir.path() / "ck").empty());
  const Checkpoint ck = read_checkpoint(dir.path() / "ck");
  EXPECT_EQ(ck.step, 17);
  EXPECT_EQ(ck.meta.at("optimizer"), "adamw");
  ASSERT_EQ(ck.tensors.size(), 3u);
  EXPECT_EQ(ck.tensors[0].first, "param/w");
  EXPECT_EQ(ck.tensors[0].second.shape(), w.shape());
  for (int64_t i = 0; i < 15; ++i) {
    EXPECT_EQ(ck.tensors[0].second.data<float>()[i], w.data<float>()[i]);
    EXPECT_EQ(ck.tensors[1].second.data<float>()[i], m.data<float>()[i]);
  }
  EXPECT_EQ(ck.tensors[2].second.to_int64s(), std::vector<int64_t>{42});
}

TEST(ACheckpoint, OverwritesThePreviousOneAtomically) {
  TempDir dir;
  Tensor w = ramp(DType::kFloat32, {4}, 0);
  write_checkpoint(dir.path(), 1, {}, {{"param/w", &w}});
  w.data<float>()[0] = 9;
  write_checkpoint(dir.path(), 2, {}, {{"param/w", &w}});
  const Checkpoint ck = read_checkpoint(dir.path() / kCheckpointFile);
  EXPECT_EQ(ck.step, 2);
  EXPECT_EQ(ck.tensors[0].second.data<float>()[0], 9.0f);
}

// The header's CRC-32C (bytes 12–15) made to match an edited header: what the reader says of a header apart might
// have written wrong, past the checksum that refuses one damaged after writing (train_preemption_test.cpp).
std::string resealed(std::string bytes) {
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(bytes[16 + static_cast<size_t>(i)]);
  const uint32_t crc = crc32c(bytes.data() + 24, static_cast<size_t>(length));
  for (int i = 0; i < 4; ++i) bytes[12 + static_cast<size_t>(i)] = static_cast<char>((crc >> (8 * i)) & 0xff);
  return bytes;
}

TEST(ACheckpoint, RefusesDamagedFilesNamingThem) {
  TempDir dir;
  Tensor w = ramp(DType::kFloat32, {64}, 0);
  write_checkpoint(dir.path() / "good", 3, {}, {{"param/w", &w}});
  std::string bytes;
  {
    std::ifstream in(dir.path() / "good" / kCheckpointFile, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write_variant = [&](const std::string& name, std::string content) {
    fs::create_directories(dir.path() / name);
    std::ofstream(dir.path() / name / kCheckpointFile, std::ios::binary) << content;
    return dir.path() / name;
  };
  const auto truncated = write_variant("truncated", bytes.substr(0, bytes.size() - 100));
  std::string magic = bytes;
  magic[0] = 'X';
  const auto bad_magic = write_variant("magic", magic);
  std::string version = bytes;
  version[8] = 9;
  const auto bad_version = write_variant("version", version);
  std::string json = bytes;
  json[24] = '#';
  const auto bad_json = write_variant("json", resealed(json));
  EXPECT_NE(checkpoint_error_of([&] { read_checkpoint(truncated); }).find("truncated"), std::string::npos);
  EXPECT_NE(checkpoint_error_of([&] { read_checkpoint(bad_magic); }).find("bad magic"), std::string::npos);
  EXPECT_NE(checkpoint_error_of([&] { read_checkpoint(bad_version); }).find("version 9"), std::string::npos);
  EXPECT_NE(checkpoint_error_of([&] { read_checkpoint(bad_json); }).find("JSON"), std::string::npos);
  EXPECT_NE(checkpoint_error_of([&] { read_checkpoint(dir.path() / "nothing"); }).find("does not exist"),
            std::string::npos);
  EXPECT_NE(checkpoint_error_of([&] { read_checkpoint(truncated); }).find(truncated.string()), std::string::npos);
}

// Issue 11: a header field of the wrong type gave nlohmann's "[json.exception.type_error.302]" without its name.
TEST(ACheckpoint, NamesAHeaderFieldOfTheWrongType) {
  TempDir dir;
  Tensor w = ramp(DType::kFloat32, {64}, 0);
  write_checkpoint(dir.path() / "ck", 30, {}, {{"param/w", &w}});
  std::string bytes;
  {
    std::ifstream in(dir.path() / "ck" / kCheckpointFile, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = bytes.find("\"step\":30");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 9, "\"step\":\"\"");  // same length: the header stays in place
  std::ofstream(dir.path() / "ck" / kCheckpointFile, std::ios::binary | std::ios::trunc) << resealed(bytes);
  const std::string message = checkpoint_error_of([&] { read_checkpoint(dir.path() / "ck"); });
  EXPECT_NE(message.find("step must be an integer in [0, 1099511627776] (got a string)"), std::string::npos) << message;
}

// mlp-tiny at batch 2 with inline weights, in `dir`.
fs::path write_mlp(const fs::path& dir) {
  auto o = models::options_for("mlp-tiny");
  o.batch = 2;
  models::write_zoo_model(o, (dir / "mlp.onnx").string());
  return dir / "mlp.onnx";
}

// New values for every float initializer: its old values + 1.
std::map<std::string, Tensor> shifted_params(const fs::path& model) {
  const ImportedModel m = import_model(model);
  Executor ex(m);
  std::map<std::string, Tensor> out;
  for (const Value& v : m.graph.values()) {
    if (v.kind != ValueKind::kParam) continue;
    Tensor t = ex.param(v.name)->clone();
    for (float& x : t.span<float>()) x += 1.0f;
    out[v.name] = t;
  }
  return out;
}

void expect_reimport_has(const fs::path& model, const std::map<std::string, Tensor>& values) {
  onnx::checker::check_model(model.string());
  ImportOptions options;
  options.require_external_data = true;
  const ImportedModel m = import_model(model, options);
  Executor ex(m);
  for (const auto& [name, t] : values) {
    const Tensor* got = ex.param(name);
    ASSERT_NE(got, nullptr) << name;
    ASSERT_EQ(got->shape(), t.shape());
    for (int64_t i = 0; i < t.elements(); ++i) ASSERT_EQ(got->data<float>()[i], t.data<float>()[i]) << name;
  }
}

TEST(ATrainedModel, IsValidOnnxWithTheNewValuesInline) {
  TempDir dir;
  const fs::path model = write_mlp(dir.path());
  const auto values = shifted_params(model);
  std::map<std::string, const Tensor*> refs;
  for (const auto& [n, t] : values) refs[n] = &t;
  write_trained_model(model, dir.file("trained.onnx"), refs);
  EXPECT_FALSE(fs::exists(dir.file("trained.onnx.data")));
  EXPECT_TRUE(leftover_temporaries(dir.path()).empty());
  expect_reimport_has(dir.file("trained.onnx"), values);
}

TEST(ATrainedModel, GoesToOneAlignedExternalFileAboveTheThreshold) {
  TempDir dir;
  const fs::path model = write_mlp(dir.path());
  const auto values = shifted_params(model);
  std::map<std::string, const Tensor*> refs;
  for (const auto& [n, t] : values) refs[n] = &t;
  fs::create_directories(dir.file("out"));
  write_trained_model(model, dir.file("out") / "trained.onnx", refs, /*external_threshold_bytes=*/1024);
  ASSERT_TRUE(fs::exists(dir.file("out") / "trained.onnx.data"));
  onnx::ModelProto proto;
  std::ifstream in(dir.file("out") / "trained.onnx", std::ios::binary);
  ASSERT_TRUE(proto.ParseFromIstream(&in));
  for (const auto& init : proto.graph().initializer()) {
    ASSERT_EQ(init.data_location(), onnx::TensorProto::EXTERNAL) << init.name();
    for (const auto& kv : init.external_data()) {
      if (kv.key() == "offset") {
        EXPECT_EQ(std::stoll(kv.value()) % 4096, 0) << init.name();
      }
      if (kv.key() == "location") {
        EXPECT_EQ(kv.value(), "trained.onnx.data");
      }
    }
  }
  expect_reimport_has(dir.file("out") / "trained.onnx", values);
}

TEST(ATrainedModel, RefusesValuesThatDoNotMatchTheModel) {
  TempDir dir;
  const fs::path model = write_mlp(dir.path());
  Tensor wrong(DType::kFloat32, {3});
  EXPECT_THROW(write_trained_model(model, dir.file("t.onnx"), {{"nonexistent", &wrong}}), InvalidArgument);
  const auto values = shifted_params(model);
  EXPECT_THROW(write_trained_model(model, dir.file("t.onnx"), {{values.begin()->first, &wrong}}), InvalidArgument);
  EXPECT_FALSE(fs::exists(dir.file("t.onnx")));
}

}  // namespace
}  // namespace apart
