// Training data: input roles read off real models, the synthetic task, .bin token files and .npy arrays,
// each with malformed files that must give typed errors naming the file.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "graph/error.h"
#include "importer/importer.h"
#include "models/zoo.h"
#include "train/data.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {
namespace fs = std::filesystem;

using testing::TempDir;

std::vector<ModelInput> gpt_tiny_inputs(int64_t batch) {
  ImportOptions o;
  o.dims["batch"] = batch;
  return classify_inputs(import_model(std::string(APART_SOURCE_DIR) + "/models/gpt-tiny.onnx", o).graph);
}

std::vector<ModelInput> token_inputs(int64_t batch, int64_t seq, int64_t vocab) {
  return {{"input_ids", DType::kInt64, {batch, seq}, InputRole::kTokens, vocab},
          {"labels", DType::kInt64, {batch, seq}, InputRole::kLabels, vocab}};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const InvalidModel& e) {
    return e.what();
  }
  return "(no InvalidArgument/InvalidModel error)";
}

TEST(ClassifyInputs, FindsTokenIdsAndLabelsWithTheirRangesInGptTiny) {
  const auto inputs = gpt_tiny_inputs(4);
  ASSERT_EQ(inputs.size(), 2u);
  EXPECT_EQ(inputs[0].name, "input_ids");
  EXPECT_EQ(inputs[0].role, InputRole::kTokens);
  EXPECT_EQ(inputs[0].range, 512);
  EXPECT_EQ(inputs[0].shape, (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(inputs[1].role, InputRole::kLabels);
  EXPECT_EQ(inputs[1].range, 512);
}

TEST(ClassifyInputs, FindsFeaturesAndTargetsInAnMlp) {
  auto zo = models::options_for("mlp-tiny");
  zo.batch = 3;
  const fs::path dir = fs::temp_directory_path() / ("apart_train_mlp_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  models::write_zoo_model(zo, (dir / "mlp.onnx").string());
  const auto inputs = classify_inputs(import_model(dir / "mlp.onnx").graph);
  fs::remove_all(dir);
  ASSERT_EQ(inputs.size(), 2u);
  EXPECT_EQ(inputs[0].role, InputRole::kFeatures);
  EXPECT_EQ(inputs[1].name, "target");
  EXPECT_EQ(inputs[1].role, InputRole::kTargets);
}

TEST(SyntheticData, FollowsOneFixedPermutationSoTheNextTokenIsLearnable) {
  auto data = make_synthetic_data(gpt_tiny_inputs(8), 7);
  std::map<int64_t, int64_t> next;
  for (int64_t step = 0; step < 3; ++step) {
    auto b = data->batch(step);
    const auto x = b.at("input_ids").to_int64s(), y = b.at("labels").to_int64s();
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_GE(x[i], 0);
      ASSERT_LT(x[i], 512);
      if ((i + 1) % 32 != 0) {
        EXPECT_EQ(x[i + 1], y[i]);  // labels = inputs shifted by one
      }
      auto [it, fresh] = next.emplace(x[i], y[i]);
      EXPECT_EQ(it->second, y[i]) << "token " << x[i] << " has two successors";
    }
  }
  EXPECT_GT(next.size(), 200u);
}

TEST(SyntheticData, IsAFunctionOfSeedAndStep) {
  auto a = make_synthetic_data(gpt_tiny_inputs(2), 1), b = make_synthetic_data(gpt_tiny_inputs(2), 1);
  auto c = make_synthetic_data(gpt_tiny_inputs(2), 2);
  EXPECT_EQ(a->batch(5).at("input_ids").to_int64s(), b->batch(5).at("input_ids").to_int64s());
  EXPECT_NE(a->batch(5).at("input_ids").to_int64s(), a->batch(6).at("input_ids").to_int64s());
  EXPECT_NE(a->batch(5).at("labels").to_int64s(), c->batch(5).at("labels").to_int64s());
}

TEST(SyntheticData, GivesFloatModelsALinearTeacher) {
  std::vector<ModelInput> inputs{{"input", DType::kFloat32, {4, 16}, InputRole::kFeatures, 0},
                                 {"target", DType::kFloat32, {4, 16}, InputRole::kTargets, 0}};
  auto data = make_synthetic_data(inputs, 3);
  auto b0 = data->batch(0);
  // Linear: doubling the input doubles the target (same teacher for every batch).
  const Tensor& x = b0.at("input");
  const Tensor& y = b0.at("target");
  double energy = 0;
  for (float v : y.span<const float>()) energy += v * v;
  EXPECT_GT(energy / 64, 0.2);
  EXPECT_LT(energy / 64, 5.0);
  EXPECT_EQ(x.shape(), (std::vector<int64_t>{4, 16}));
}

TEST(SyntheticData, RefusesIntegerInputsItCannotInterpret) {
  std::vector<ModelInput> inputs{{"mask", DType::kInt64, {2, 8}, InputRole::kOther, 0}};
  EXPECT_NE(error_of([&] { make_synthetic_data(inputs, 0); }).find("mask"), std::string::npos);
}

TEST(TokenFileData, TakesWindowsOfSeqPlusOneTokensShiftedForLabels) {
  TempDir dir;
  std::string bytes;
  for (uint16_t t = 0; t < 1000; ++t) {
    const uint16_t v = t % 500;
    bytes.push_back(static_cast<char>(v & 0xff));
    bytes.push_back(static_cast<char>(v >> 8));
  }
  write_bytes(dir.file("tok.bin"), bytes);
  DataOptions o;
  o.spec = dir.file("tok.bin").string();
  auto data = make_data_source(o, token_inputs(4, 16, 512));
  auto b = data->batch(0);
  const auto x = b.at("input_ids").to_int64s(), y = b.at("labels").to_int64s();
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], (x[i] + 1) % 500);
  EXPECT_EQ(make_data_source(o, token_inputs(4, 16, 512))->batch(3).at("input_ids").to_int64s(),
            data->batch(3).at("input_ids").to_int64s());
}

TEST(TokenFileData, ReadsUint32Tokens) {
  TempDir dir;
  std::string bytes;
  for (uint32_t t = 0; t < 100; ++t)
    for (int k = 0; k < 4; ++k) bytes.push_back(static_cast<char>((t >> (8 * k)) & 0xff));
  write_bytes(dir.file("tok32.bin"), bytes);
  DataOptions o;
  o.spec = dir.file("tok32.bin").string();
  o.token_dtype = DType::kUInt32;
  const auto x = make_data_source(o, token_inputs(2, 8, 512))->batch(0).at("input_ids").to_int64s();
  for (size_t i = 1; i < 8; ++i) EXPECT_EQ(x[i], x[i - 1] + 1);
}

TEST(TokenFileData, RejectsMalformedFilesNamingThem) {
  TempDir dir;
  write_bytes(dir.file("odd.bin"), std::string(11, '\0'));
  write_bytes(dir.file("short.bin"), std::string(8, '\0'));
  std::string big;
  for (int i = 0; i < 64; ++i) big += std::string("\xff\x7f", 2);  // token 32767 ≥ vocab 512
  write_bytes(dir.file("oov.bin"), big);
  DataOptions o;
  o.spec = dir.file("odd.bin").string();
  EXPECT_NE(error_of([&] { make_data_source(o, token_inputs(2, 8, 512)); }).find("odd.bin"), std::string::npos);
  EXPECT_NE(error_of([&] { make_data_source(o, token_inputs(2, 8, 512)); }).find("multiple of 2"), std::string::npos);
  o.spec = dir.file("short.bin").string();
  EXPECT_NE(error_of([&] { make_data_source(o, token_inputs(2, 8, 512)); }).find("window needs 9"), std::string::npos);
  o.spec = dir.file("oov.bin").string();
  EXPECT_NE(error_of([&] { make_data_source(o, token_inputs(2, 8, 512))->batch(0); }).find("vocabulary"), std::string::npos);
  o.spec = dir.file("missing.bin").string();
  EXPECT_NE(error_of([&] { make_data_source(o, token_inputs(2, 8, 512)); }).find("missing.bin"), std::string::npos);
  std::vector<ModelInput> floats{{"input", DType::kFloat32, {2, 4}, InputRole::kFeatures, 0}};
  o.spec = dir.file("odd.bin").string();
  EXPECT_NE(error_of([&] { make_data_source(o, floats); }).find("input"), std::string::npos);
}

TEST(NpyData, FeedsConsecutiveRowsWrappingAround) {
  TempDir dir;
  Tensor x(DType::kInt32, {5, 4}), y(DType::kFloat32, {5, 2});
  for (int64_t i = 0; i < 20; ++i) x.data<int32_t>()[i] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < 10; ++i) y.data<float>()[i] = static_cast<float>(i) * 0.5f;
  write_npy(dir.file("x.npy"), x);
  write_npy(dir.file("y.npy"), y);
  std::vector<ModelInput> inputs{{"ids", DType::kInt64, {2, 4}, InputRole::kTokens, 100},
                                 {"y", DType::kFloat32, {2, 2}, InputRole::kTargets, 0}};
  DataOptions o;
  o.spec = "ids=" + dir.file("x.npy").string() + ",y=" + dir.file("y.npy").string();
  auto data = make_data_source(o, inputs);
  auto b2 = data->batch(2);  // rows 4, 0
  EXPECT_EQ(b2.at("ids").dtype(), DType::kInt64);
  EXPECT_EQ(b2.at("ids").to_int64s(), (std::vector<int64_t>{16, 17, 18, 19, 0, 1, 2, 3}));
  EXPECT_FLOAT_EQ(b2.at("y").data<float>()[0], 4.0f);
  EXPECT_FLOAT_EQ(b2.at("y").data<float>()[2], 0.0f);
}

TEST(NpyHeader, ParsesVersionOneAndTwoHeaders) {
  TempDir dir;
  std::string dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }";
  dict.append(64 - (12 + dict.size() + 1) % 64, ' ');
  dict += '\n';
  std::string v2 = std::string("\x93NUMPY\x02\x00", 8);
  const uint32_t n = static_cast<uint32_t>(dict.size());
  for (int k = 0; k < 4; ++k) v2.push_back(static_cast<char>((n >> (8 * k)) & 0xff));
  v2 += dict + std::string(6, '\x01');
  write_bytes(dir.file("v2.npy"), v2);
  const NpyHeader h = read_npy_header(dir.file("v2.npy"));
  EXPECT_EQ(h.dtype, DType::kUInt16);
  EXPECT_EQ(h.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(h.data_offset % 64, 0);
}

TEST(NpyData, RejectsMalformedFilesNamingThemAndTheProblem) {
  TempDir dir;
  std::vector<ModelInput> inputs{{"x", DType::kFloat32, {2, 3}, InputRole::kFeatures, 0}};
  auto spec = [&](const std::string& f) {
    DataOptions o;
    o.spec = "x=" + dir.file(f).string();
    return o;
  };
  auto npy = [&](const std::string& name, const std::string& dict, size_t data_bytes) {
    std::string d = dict;
    d.append(64 - (10 + d.size() + 1) % 64, ' ');
    d += '\n';
    std::string s = std::string("\x93NUMPY\x01\x00", 8);
    s.push_back(static_cast<char>(d.size() & 0xff));
    s.push_back(static_cast<char>(d.size() >> 8));
    write_bytes(dir.file(name), s + d + std::string(data_bytes, '\0'));
  };
  write_bytes(dir.file("magic.npy"), "PK\x03\x04 not an npy");
  npy("f8.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (4, 3), }", 96);
  npy("fortran.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (4, 3), }", 48);
  npy("cols.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 5), }", 80);
  npy("trunc.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }", 20);
  npy("noshape.npy", "{'descr': '<f4', 'fortran_order': False, }", 48);
  npy("int.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (4, 3), }", 96);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"magic.npy", "bad magic"}, {"f8.npy", "<f8"}, {"fortran.npy", "fortran_order"}, {"cols.npy", "do not fit"},
      {"trunc.npy", "truncated"}, {"noshape.npy", "'shape'"}, {"int.npy", "does not fit input 'x'"},
      {"absent.npy", "cannot open"}};
  for (const auto& [file, problem] : cases) {
    const std::string e = error_of([&] { make_data_source(spec(file), inputs); });
    EXPECT_NE(e.find(file), std::string::npos) << e;
    EXPECT_NE(e.find(problem), std::string::npos) << file << ": " << e;
  }
  DataOptions o;
  o.spec = "nosuch=" + dir.file("f8.npy").string();
  EXPECT_NE(error_of([&] { make_data_source(o, inputs); }).find("no input 'nosuch'"), std::string::npos);
  std::vector<ModelInput> two{inputs[0], {"y", DType::kFloat32, {2, 1}, InputRole::kTargets, 0}};
  npy("ok.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }", 48);
  EXPECT_NE(error_of([&] { make_data_source(spec("ok.npy"), two); }).find("no .npy for model input 'y'"), std::string::npos);
}

// Issue 11: a FIFO named as data blocked `apart train` for ever in open(); it is refused from its stat.
TEST(NpyHeader, RefusesAFifoWithoutOpeningIt) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir / "x.npy").c_str(), 0600), 0);
  EXPECT_THROW(read_npy_header(dir / "x.npy"), InvalidArgument);
}

}  // namespace
}  // namespace apart
