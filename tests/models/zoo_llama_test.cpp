// The Llama family: Meta's published parameter counts, the torch-export layout, and llama-tiny imported, planned and
// trained end to end by the apart binary.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "graph/error.h"
#include "models/zoo.h"
#include "tests/models/zoo_test_util.h"

namespace apart::models {
namespace {

using testing::initializer_elements;
using testing::run_command;
using testing::TempDir;

const std::string kLlamaApart = APART_BINARY;

int64_t llama_preset_params(const std::string& name) { return closed_form_params(options_for(name)); }

int64_t llama_generated_params(const std::string& name) {
  ZooOptions o = options_for(name);
  o.weights = WeightsMode::kNone;
  return initializer_elements(build_zoo_model(o));
}

// Meta's config.json: hidden, intermediate, layers, heads, kv heads; vocab 128256, untied head.
TEST(ALlamaPreset, CountsMetasPublishedParametersExactly) {
  EXPECT_EQ(llama_preset_params("llama3-8b"), 8'030'261'248);
  EXPECT_EQ(llama_preset_params("llama3-70b"), 70'553'706'496);
  EXPECT_EQ(llama_preset_params("llama3-405b"), 405'853'388'800);
  EXPECT_EQ(llama_generated_params("llama3-8b"), 8'030'261'248);
  EXPECT_EQ(llama_generated_params("llama3-70b"), 70'553'706'496);
}

TEST(ALlamaPreset, KeepsTheConfigsGroupedQueryAttentionAndRopeBase) {
  const ZooOptions o = options_for("llama3-70b");
  EXPECT_EQ(o.family, Family::kLlama);
  EXPECT_EQ(o.heads, 64);
  EXPECT_EQ(o.resolved_kv_heads(), 8);
  EXPECT_EQ(o.resolved_head_dim(), 128);
  EXPECT_EQ(o.resolved_ffn(), 28672);
  EXPECT_EQ(o.vocab, 128256);
  EXPECT_EQ(o.rope_theta, 500000);
}

std::map<std::string, int> op_counts(const onnx::ModelProto& m) {
  std::map<std::string, int> ops;
  for (const auto& n : m.graph().node()) ++ops[n.op_type()];
  return ops;
}

TEST(ALlamaModel, IsLaidOutAsATorchExportOfLlamaForCausalLM) {
  ZooOptions o = options_for("llama-tiny");
  o.loss = Loss::kNone;
  const onnx::ModelProto m = build_zoo_model(o);
  std::set<std::string> names, params;
  for (const auto& n : m.graph().node()) names.insert(n.name());
  for (const auto& t : m.graph().initializer()) params.insert(t.name());
  for (const char* name : {"/model/embed_tokens/Gather", "/model/layers.0/input_layernorm/ReduceMean",
                           "/model/layers.0/self_attn/q_proj/MatMul", "/model/layers.0/self_attn/k_proj/MatMul",
                           "/model/layers.0/self_attn/Expand", "/model/layers.0/self_attn/Softmax",
                           "/model/layers.1/mlp/gate_proj/MatMul", "/model/layers.1/mlp/act_fn/Sigmoid",
                           "/model/layers.1/mlp/down_proj/MatMul", "/model/norm/Sqrt", "/lm_head/MatMul"})
    EXPECT_TRUE(names.count(name)) << name;
  for (const char* p : {"model.embed_tokens.weight", "model.layers.0.self_attn.k_proj.weight",
                        "model.layers.1.post_attention_layernorm.weight", "model.norm.weight", "lm_head.weight"})
    EXPECT_TRUE(params.count(p)) << p;
  // k_proj is [hidden, kv_heads * head_dim]: 64 x (2 * 16).
  for (const auto& t : m.graph().initializer())
    if (t.name() == "model.layers.0.self_attn.k_proj.weight") {
      ASSERT_EQ(t.dims_size(), 2);
      EXPECT_EQ(t.dims(1), 32);
    }
  const auto ops = op_counts(m);
  // Per layer: RMSNorm x2 (Pow, ReduceMean, Add, Sqrt, Div, Mul, Mul), RoPE on q and k (2 Slices, Neg, Concat each),
  // repeat_kv on k and v (Unsqueeze, Expand, Reshape), SwiGLU (Sigmoid, Mul, Mul); the untied head's MatMul.
  EXPECT_EQ(ops.at("Expand"), 2 * 2);
  EXPECT_EQ(ops.at("Neg"), 2 * 2);
  EXPECT_EQ(ops.at("Slice"), 2 * 2 * 2);
  EXPECT_EQ(ops.at("Concat"), 2 * 2);
  EXPECT_EQ(ops.at("Sigmoid"), 2);
  EXPECT_EQ(ops.at("Sqrt"), 2 * 2 + 1);
  EXPECT_EQ(ops.at("MatMul"), 2 * (7 + 2) + 1);
  EXPECT_EQ(ops.at("Transpose"), 2 * 5);  // q, k, v into heads, k^T, the context back
  ASSERT_EQ(m.graph().output_size(), 1);
  EXPECT_EQ(m.graph().output(0).name(), "logits");
  EXPECT_EQ(m.opset_import(0).version(), 17);
}

TEST(ALlamaModel, RejectsKvHeadsThatDoNotDivideTheHeads) {
  ZooOptions o = options_for("llama");
  o.kv_heads = 3;
  EXPECT_THROW(o.validate(), InvalidArgument);
  o.kv_heads = 2;
  o.layernorm = LayerNormStyle::kFused;
  EXPECT_THROW(o.validate(), InvalidArgument);
}

// `apart zoo llama-tiny` into dir; returns the model's path.
std::string write_llama_tiny(const TempDir& dir) {
  const std::string path = dir.file("llama.onnx");
  EXPECT_EQ(run_command(kLlamaApart + " zoo llama-tiny -q -o " + path + " >/dev/null").code, 0);
  return path;
}

TEST(ALlamaTinyModel, ImportsWithEveryValuesShapeStaticOnceTheBatchIsBound) {
  TempDir dir("zoo_llama_inspect");
  const std::string path = write_llama_tiny(dir);
  const auto r = run_command(kLlamaApart + " inspect " + path + " --json --dim batch=4");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out.substr(0, 300);
  EXPECT_EQ(j["params"].get<int64_t>(), llama_preset_params("llama-tiny"));
  EXPECT_TRUE(j["unknown_shape_values"].empty()) << j["unknown_shape_values"].dump();
}

TEST(ALlamaTinyModel, TrainsWithAFallingLoss) {
  TempDir dir("zoo_llama_train");
  const std::string path = write_llama_tiny(dir);
  const auto r = run_command(kLlamaApart + " train " + path + " --steps 30 --batch 4 --lr 0.01 --quiet 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::regex summary(R"(loss ([0-9.]+) -> ([0-9.]+))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, summary)) << r.out;
  EXPECT_LT(std::stod(m[2]), std::stod(m[1]) * 0.9) << r.out;
}

}  // namespace
}  // namespace apart::models
