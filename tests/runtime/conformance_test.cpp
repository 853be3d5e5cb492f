// ONNX's backend node tests (Debian libonnx-testdata): every test whose ops and dtypes the runtime
// supports must reproduce the reference outputs. Skips follow rules, never test names.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <bit>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "graph/error.h"
#include "importer/importer.h"
#include "runtime/executor.h"
#include "runtime/half_precision.h"
#include "tests/runtime/compare.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
const fs::path kNodeTests = "/usr/share/libonnx-testdata/data/node";

// Element types the kernels handle; a test feeding or expecting another type is skipped.
bool dtype_supported(DType t) {
  switch (t) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kInt64:
    case DType::kInt32:
    case DType::kInt16:
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kUInt16:
    case DType::kUInt32:
    case DType::kUInt64:
    case DType::kBool:
    case DType::kFloat16:   // computed in float32 (runtime/half_precision.h)
    case DType::kBFloat16: return true;
    default: return false;
  }
}

// ONNX 1.12 writes bfloat16 test data as uint16 bit patterns (numpy has no bfloat16): read them as the model declares.
Tensor as_declared(Tensor t, const onnx::ValueInfoProto* declared) {
  if (!declared || t.dtype() != DType::kUInt16 || declared->type().tensor_type().elem_type() != onnx::TensorProto::BFLOAT16)
    return t;
  Tensor bf16(DType::kBFloat16, t.shape());
  std::memcpy(bf16.raw(), t.raw(), static_cast<size_t>(t.bytes()));
  return bf16;
}

// Whether `expected` is a one-Cast model's float32 input truncated to bfloat16 (its top 16 bits) rather than rounded.
bool truncates(const onnx::ModelProto& proto, const std::map<std::string, Tensor>& inputs, const Tensor& expected) {
  if (proto.graph().node_size() != 1 || proto.graph().node(0).op_type() != "Cast" || inputs.size() != 1) return false;
  const Tensor& x = inputs.begin()->second;
  if (x.dtype() != DType::kFloat32 || x.elements() != expected.elements()) return false;
  for (int64_t i = 0; i < x.elements(); ++i)
    if (std::bit_cast<uint32_t>(x.data<float>()[i]) >> 16 != expected.data<uint16_t>()[i]) return false;
  return true;
}

std::vector<fs::path> numbered(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> files;
  for (int i = 0;; ++i) {
    fs::path p = dir / (prefix + std::to_string(i) + ".pb");
    if (!fs::exists(p)) break;
    files.push_back(p);
  }
  return files;
}

enum class Outcome { kPass, kFail, kSkipImport, kSkipOp, kSkipDtype, kSkipFeature };

struct Result {
  Outcome outcome;
  std::string detail;
};

// `half_rtol`: above its default, float16/bfloat16 outputs compare as float32 values within it (else bitwise).
Result run_case(const fs::path& dir, double half_rtol = 1e-3) {
  const fs::path model_path = dir / "model.onnx";
  const fs::path data = dir / "test_data_set_0";
  if (!fs::exists(model_path) || !fs::exists(data)) return {Outcome::kSkipImport, "no model or test_data_set_0"};
  onnx::ModelProto proto;
  {
    std::ifstream in(model_path, std::ios::binary);
    if (!proto.ParseFromIstream(&in)) return {Outcome::kSkipImport, "unparseable model"};
  }
  std::set<std::string> initialized;
  for (const auto& init : proto.graph().initializer()) initialized.insert(init.name());
  std::vector<std::string> input_names;
  for (const auto& in : proto.graph().input())
    if (!initialized.count(in.name())) input_names.push_back(in.name());

  // Inputs first: their shapes bind the model's dynamic dims.
  std::map<std::string, Tensor> inputs;
  ImportOptions options;
  const auto input_files = numbered(data, "input_");
  const auto output_files = numbered(data, "output_");
  try {
    for (size_t i = 0; i < input_files.size(); ++i) {
      std::string name;
      Tensor t = read_tensor_file(input_files[i], &name);
      if (name.empty() && i < input_names.size()) name = input_names[i];
      const onnx::ValueInfoProto* declared = nullptr;
      for (const auto& in : proto.graph().input())
        if (in.name() == name) declared = &in;
      t = as_declared(std::move(t), declared);
      if (!dtype_supported(t.dtype())) return {Outcome::kSkipDtype, std::string(dtype_name(t.dtype()))};
      options.input_shapes.emplace_back(name, t.shape());
      inputs.emplace(name, std::move(t));
    }
  } catch (const Unsupported& e) {
    return {Outcome::kSkipDtype, e.what()};
  } catch (const Error& e) {
    return {Outcome::kSkipImport, e.what()};  // e.g. optional/sequence inputs the runtime does not model
  }
  // A training-mode Dropout with a non-zero ratio draws its mask from numpy's RNG when ONNX made the
  // expected outputs: no other implementation can reproduce it (ONNX Runtime skips these too).
  for (const auto& node : proto.graph().node()) {
    if (node.op_type() != "Dropout" || node.input_size() < 3) continue;
    const auto ratio = inputs.find(node.input(1));
    const auto training = inputs.find(node.input(2));
    if (training == inputs.end() || training->second.dtype() != DType::kBool || training->second.elements() != 1 ||
        !training->second.data<bool>()[0])
      continue;
    const bool zero_ratio = ratio != inputs.end() && ratio->second.dtype() == DType::kFloat32 &&
                            ratio->second.elements() == 1 && ratio->second.data<float>()[0] == 0.0f;
    if (!zero_ratio) return {Outcome::kSkipFeature, "random output: training-mode Dropout's mask comes from numpy's RNG"};
  }
  std::vector<Tensor> expected;
  try {
    for (size_t i = 0; i < output_files.size(); ++i) {
      const auto& outs = proto.graph().output();
      expected.push_back(as_declared(read_tensor_file(output_files[i]), i < static_cast<size_t>(outs.size()) ? &outs[static_cast<int>(i)] : nullptr));
      if (!dtype_supported(expected.back().dtype())) return {Outcome::kSkipDtype, std::string(dtype_name(expected.back().dtype()))};
    }
  } catch (const Unsupported& e) {
    return {Outcome::kSkipDtype, e.what()};
  } catch (const Error& e) {
    return {Outcome::kSkipImport, std::string("output: ") + e.what()};
  }

  std::unique_ptr<ImportedModel> model;
  try {
    model = std::make_unique<ImportedModel>(import_model(model_path, options));
  } catch (const Error& e) {
    return {Outcome::kSkipImport, e.what()};
  }
  for (const Value& v : model->graph.values())
    if (v.dtype != DType::kUndefined && !dtype_supported(v.dtype)) return {Outcome::kSkipDtype, v.name + ": " + std::string(dtype_name(v.dtype))};
  std::unique_ptr<Executor> exec;
  try {
    exec = std::make_unique<Executor>(*model);
  } catch (const Unsupported& e) {
    return {Outcome::kSkipOp, e.what()};
  } catch (const Error& e) {
    return {Outcome::kFail, std::string("load: ") + e.what()};
  }
  NamedTensors outputs;
  try {
    outputs = exec->run(inputs);
  } catch (const Unsupported& e) {
    return {Outcome::kSkipFeature, e.what()};
  } catch (const std::exception& e) {
    return {Outcome::kFail, std::string("run: ") + e.what()};
  }
  if (outputs.size() != expected.size())
    return {Outcome::kFail, std::to_string(outputs.size()) + " outputs, expected " + std::to_string(expected.size())};
  for (size_t i = 0; i < outputs.size(); ++i) {
    // A half output is computed in float32 and stored (rounded to nearest even) as the model declares it; then exact.
    Tensor& got = outputs[i].second;
    if (is_half(expected[i].dtype()) && got.dtype() == DType::kFloat32) got = narrow_from_float32(got, expected[i].dtype());
    // Half outputs compare exactly (bitwise), unless a tolerance is asked for: then as float32 values within it.
    const bool half_tolerance = is_half(expected[i].dtype()) && got.dtype() == expected[i].dtype() && half_rtol > 1e-3;
    const std::string diff =
        half_tolerance ? testing::compare_tensors(widen_to_float32(got), widen_to_float32(expected[i]), half_rtol)
                       : testing::compare_tensors(got, expected[i]);
    if (!diff.empty() && expected[i].dtype() == DType::kBFloat16 && truncates(proto, inputs, expected[i]))
      return {Outcome::kSkipFeature, "ONNX 1.12's expected bfloat16 values truncate float32; apart rounds to nearest even, "
                                     "as ONNX's later reference (1.14), torch and the hardware do"};
    if (!diff.empty()) return {Outcome::kFail, "output " + outputs[i].first + ": " + diff};
  }
  return {Outcome::kPass, ""};
}

TEST(TheOnnxNodeConformanceSuite, PassesEveryTestWhoseOpsAndDtypesAreSupported) {
  if (!fs::exists(kNodeTests)) GTEST_SKIP() << kNodeTests << " is missing (Debian package libonnx-testdata)";
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(kNodeTests))
    if (e.is_directory()) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  std::map<Outcome, int> counts;
  std::map<std::string, int> skipped_ops;
  std::vector<std::string> passed;
  for (const auto& dir : dirs) {
    const Result r = run_case(dir);
    ++counts[r.outcome];
    const std::string name = dir.filename().string();
    if (r.outcome == Outcome::kFail) ADD_FAILURE() << name << ": " << r.detail;
    if (r.outcome == Outcome::kPass) passed.push_back(name);
    if (r.outcome == Outcome::kSkipOp) {
      const auto at = r.detail.find(": op ");
      ++skipped_ops[at == std::string::npos ? r.detail : r.detail.substr(at + 5, r.detail.find(' ', at + 5) - at - 5)];
    }
    if (r.outcome == Outcome::kSkipFeature || r.outcome == Outcome::kSkipImport)
      std::printf("[ skip     ] %s: %s\n", name.c_str(), r.detail.substr(0, 160).c_str());
  }
  const int skips = counts[Outcome::kSkipImport] + counts[Outcome::kSkipOp] + counts[Outcome::kSkipDtype] + counts[Outcome::kSkipFeature];
  std::printf("[ conform  ] %zu node tests: %d pass, %d fail, %d skip (op unsupported %d, dtype unsupported %d, "
              "feature unsupported %d, not importable %d)\n",
              dirs.size(), counts[Outcome::kPass], counts[Outcome::kFail], skips, counts[Outcome::kSkipOp],
              counts[Outcome::kSkipDtype], counts[Outcome::kSkipFeature], counts[Outcome::kSkipImport]);
  std::string ops;
  for (const auto& [op, n] : skipped_ops) ops += " " + op + "(" + std::to_string(n) + ")";
  std::printf("[ conform  ] ops without a kernel:%s\n", ops.c_str());
  EXPECT_EQ(counts[Outcome::kFail], 0);
  EXPECT_GE(counts[Outcome::kPass], 594);
  // The ops real exports use beyond torch's transformers (issue 18) pass every case but the 3-D ConvTranspose.
  int exporter_cases = 0;
  for (const auto& dir : dirs) {
    const std::string name = dir.filename().string();
    bool exporter_op = name == "test_constant_pad" || name == "test_edge_pad" || name == "test_reflect_pad";
    for (const char* prefix : {"test_convtranspose", "test_resize_", "test_upsample_", "test_hardsigmoid",
                               "test_hardswish", "test_argmax_", "test_argmin_"})
      exporter_op |= name.rfind(prefix, 0) == 0;
    if (!exporter_op || name == "test_convtranspose_3d") continue;
    ++exporter_cases;
    EXPECT_NE(std::find(passed.begin(), passed.end(), name), passed.end()) << name << " does not pass";
  }
  EXPECT_EQ(exporter_cases, 73);
  // float16/bfloat16, computed in float32 (runtime/half_precision.h): every case the rules do not skip (CastLike has
  // no kernel, its shapes do not import, Mod has no kernel; FLOAT_to_BFLOAT16's expected values truncate).
  std::vector<std::string> half_passed;
  for (const std::string& name : passed)
    if (name.find("FLOAT16") != std::string::npos || name.find("float16") != std::string::npos) half_passed.push_back(name);
  EXPECT_EQ(half_passed, (std::vector<std::string>{
                             "test_cast_BFLOAT16_to_FLOAT", "test_cast_DOUBLE_to_FLOAT16", "test_cast_FLOAT16_to_DOUBLE",
                             "test_cast_FLOAT16_to_FLOAT", "test_cast_FLOAT_to_FLOAT16",
                             "test_castlike_DOUBLE_to_FLOAT16_expanded", "test_castlike_FLOAT16_to_DOUBLE_expanded",
                             "test_castlike_FLOAT16_to_FLOAT_expanded", "test_castlike_FLOAT_to_FLOAT16_expanded",
                             "test_max_float16", "test_min_float16"}));
}

// ONNX 1.23's own node test cases of Attention-23, RMSNormalization-23, RotaryEmbedding-23 and Gelu-20
// (tests/data/transformer_ops/make_cases.py wrote them; libonnx-testdata 1.12 has none): every case of a form the
// runtime runs reproduces onnx.reference's outputs; the others (a KV cache, qk_matmul_output) are refused by name.
TEST(TheTransformerOpNodeCases, PassWhereTheRuntimeRunsTheirFormAndAreRefusedByNameElsewhere) {
  const fs::path root = fs::path(APART_SOURCE_DIR) / "tests/data/transformer_ops";
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory()) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  std::map<Outcome, int> counts;
  int rms = 0, rotary = 0, gelu = 0;
  for (const auto& dir : dirs) {
    // onnx.reference computes the float16/bfloat16 cases in half arithmetic (numpy), rounding every product and sum;
    // the runtime computes in float32 and rounds once: the two differ by up to 2 ulps of the half type (2^-7 each
    // for bfloat16).
    const Result r = run_case(dir, 1.6e-2);
    ++counts[r.outcome];
    const std::string name = dir.filename().string();
    if (r.outcome == Outcome::kFail) ADD_FAILURE() << name << ": " << r.detail;
    if (r.outcome != Outcome::kPass && r.outcome != Outcome::kFail)
      std::printf("[ skip     ] %s: %s\n", name.c_str(), r.detail.substr(0, 160).c_str());
    if (r.outcome == Outcome::kPass) {
      rms += name.rfind("test_rms_normalization", 0) == 0;
      rotary += name.rfind("test_rotary_embedding", 0) == 0;
      gelu += name.rfind("test_gelu", 0) == 0;
    }
  }
  std::printf("[ conform  ] %zu transformer-op cases: %d pass, %d fail, %d skip\n", dirs.size(), counts[Outcome::kPass],
              counts[Outcome::kFail], static_cast<int>(dirs.size()) - counts[Outcome::kPass] - counts[Outcome::kFail]);
  EXPECT_EQ(counts[Outcome::kFail], 0);
  EXPECT_EQ(rms, 19);
  EXPECT_EQ(rotary, 8);
  EXPECT_EQ(gelu, 4);
  EXPECT_EQ(counts[Outcome::kPass], 76);  // 45 of Attention's 69: all but the KV-cache and qk_matmul_output forms
}

}  // namespace
}  // namespace apart
