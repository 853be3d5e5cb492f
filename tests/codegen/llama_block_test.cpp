// A Llama-style decoder block (RMSNorm, RoPE, causal GQA with 4 query and 2 KV heads, SwiGLU MLP, an MSE loss)
// written twice with the same weights: with the opset-23 fused ops, and with the primitive ops a torch export at
// opset 18 writes (ReduceMean/Pow/Sqrt, rotate_half from Slice/Neg/Concat, Expand-based repeat_kv, a Trilu/Where
// causal mask, MatMul–Softmax–MatMul). Trained by SGD through their training graphs, the two lose the same.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "codegen/autodiff.h"
#include "runtime/executor.h"
#include "train/trainer.h"
#include "tests/codegen/finite_differences.h"
#include "tests/support/onnx_builder.h"
#include "tests/support/printed_numbers.h"
#include "tests/support/run_apart.h"
#include "tests/support/temp_dir.h"

namespace apart {
namespace {

using namespace apart::testing;
namespace fs = std::filesystem;

constexpr int64_t kBatch = 2, kSeq = 5, kHidden = 16, kQHeads = 4, kKvHeads = 2, kHead = 4, kFfn = 24;

struct Weights {
  std::vector<std::pair<std::string, Tensor>> params, constants;
};

Weights block_weights() {
  std::mt19937 rng(9);
  Weights w;
  auto param = [&](const std::string& name, std::vector<int64_t> shape, double lo, double hi) {
    w.params.emplace_back(name, random_tensor(DType::kFloat32, std::move(shape), rng, lo, hi));
  };
  param("norm1", {kHidden}, 0.8, 1.2);
  param("norm2", {kHidden}, 0.8, 1.2);
  param("wq", {kHidden, kQHeads * kHead}, -0.4, 0.4);
  param("wk", {kHidden, kKvHeads * kHead}, -0.4, 0.4);
  param("wv", {kHidden, kKvHeads * kHead}, -0.4, 0.4);
  param("wo", {kQHeads * kHead, kHidden}, -0.4, 0.4);
  param("wgate", {kHidden, kFfn}, -0.4, 0.4);
  param("wup", {kHidden, kFfn}, -0.4, 0.4);
  param("wdown", {kFfn, kHidden}, -0.4, 0.4);
  // RoPE caches [B, S, D/2] (θ = 10000), the input and the regression target.
  Tensor cos(DType::kFloat32, {kBatch, kSeq, kHead / 2}), sin(DType::kFloat32, {kBatch, kSeq, kHead / 2});
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t s = 0; s < kSeq; ++s)
      for (int64_t i = 0; i < kHead / 2; ++i) {
        const double angle = static_cast<double>(s) / std::pow(10000.0, 2.0 * static_cast<double>(i) / kHead);
        cos.data<float>()[(b * kSeq + s) * (kHead / 2) + i] = static_cast<float>(std::cos(angle));
        sin.data<float>()[(b * kSeq + s) * (kHead / 2) + i] = static_cast<float>(std::sin(angle));
      }
  w.constants.emplace_back("cos", cos);
  w.constants.emplace_back("sin", sin);
  w.constants.emplace_back("x", random_tensor(DType::kFloat32, {kBatch, kSeq, kHidden}, rng));
  w.constants.emplace_back("target", random_tensor(DType::kFloat32, {kBatch, kSeq, kHidden}, rng));
  return w;
}

// What both forms share: projections, head split/merge, residuals, SwiGLU and the loss; `norm`, `rope` and
// `attend` write the three parts that differ.
struct BlockWriter {
  OnnxBuilder& b;
  bool any_batch = false;                // reshape targets copy the batch (0) instead of naming it
  std::string cos = "cos", sin = "sin";  // the RoPE caches [B, S, D/2]
  int counter = 0;
  std::string fresh(const std::string& hint) { return hint + "_" + std::to_string(counter++); }
  std::string op(const std::string& type, std::vector<std::string> in, const std::function<void(onnx::NodeProto&)>& attrs = {}) {
    const std::string out = fresh(type);
    auto& n = b.node(type, std::move(in), {out}, out);
    if (attrs) attrs(n);
    return out;
  }
  std::string ints(std::vector<int64_t> values) {
    const std::string name = fresh("ints");
    b.int_initializer(name, values);
    return name;
  }
  std::string heads(const std::string& x, const std::string& w, int64_t count) {  // [B, S, H] → [B, heads, S, D]
    const std::string r = op("Reshape", {op("MatMul", {x, w}), ints({any_batch ? 0 : kBatch, kSeq, count, kHead})});
    return op("Transpose", {r}, [](onnx::NodeProto& n) { OnnxBuilder::set_ints(n, "perm", {0, 2, 1, 3}); });
  }
};

using Part = std::function<std::string(BlockWriter&, const std::string&)>;

// `data_inputs`: x and target are graph inputs [batch, S, hidden] (what apart train feeds), else initializers.
// `any_batch` (with data_inputs): nothing bakes the batch in — reshape targets copy it, the RoPE caches are one row
// [1, S, D/2] (Constant nodes, as torch exports its buffers) expanded to x's batch by a target computed from Shape(x).
onnx::ModelProto llama_block(
    int64_t opset, const Part& norm1, const Part& norm2,
    const std::function<std::string(BlockWriter&, const std::string&)>& rope,
    const std::function<std::string(BlockWriter&, const std::string&, const std::string&, const std::string&)>& attend,
    bool data_inputs = false, bool any_batch = false) {
  OnnxBuilder b(opset);
  const Weights w = block_weights();
  for (const auto& [name, t] : w.params) b.initializer(t, name);
  for (const auto& [name, t] : w.constants) {
    if (data_inputs && (name == "x" || name == "target")) {
      b.input(name, {"batch", kSeq, kHidden});
    } else if (any_batch && (name == "cos" || name == "sin")) {
      Tensor row(DType::kFloat32, {1, kSeq, kHead / 2});
      std::copy(t.data<float>(), t.data<float>() + row.elements(), row.data<float>());
      b.initializer(row, name + "_row");  // moved into a Constant node: a buffer, not a param
      onnx::TensorProto value = b.graph().initializer(b.graph().initializer_size() - 1);
      b.graph().mutable_initializer()->RemoveLast();
      auto* attr = b.node("Constant", {}, {name + "_row"}, name + "_row").add_attribute();
      attr->set_name("value"), attr->set_type(onnx::AttributeProto::TENSOR);
      *attr->mutable_t() = value;
    } else {
      b.initializer(t, name);
    }
  }
  BlockWriter bw{b};
  bw.any_batch = any_batch;
  if (any_batch) {
    const std::string batch = bw.op("Gather", {bw.op("Shape", {"x"}), bw.ints({0})});
    const std::string target = bw.op("Concat", {batch, bw.ints({kSeq, kHead / 2})},
                                     [](onnx::NodeProto& n) { OnnxBuilder::set_int(n, "axis", 0); });
    bw.cos = bw.op("Expand", {"cos_row", target});
    bw.sin = bw.op("Expand", {"sin_row", target});
  }
  const std::string h = norm1(bw, "x");
  const std::string q = rope(bw, bw.heads(h, "wq", kQHeads)), k = rope(bw, bw.heads(h, "wk", kKvHeads));
  const std::string v = bw.heads(h, "wv", kKvHeads);
  const std::string a = bw.op("Transpose", {attend(bw, q, k, v)}, [](onnx::NodeProto& n) { OnnxBuilder::set_ints(n, "perm", {0, 2, 1, 3}); });
  const std::string merged = bw.op("Reshape", {a, bw.ints({any_batch ? 0 : kBatch, kSeq, kQHeads * kHead})});
  const std::string x1 = bw.op("Add", {"x", bw.op("MatMul", {merged, "wo"})});
  const std::string h2 = norm2(bw, x1);
  const std::string gate = bw.op("MatMul", {h2, "wgate"});
  const std::string silu = bw.op("Mul", {gate, bw.op("Sigmoid", {gate})});
  const std::string down = bw.op("MatMul", {bw.op("Mul", {silu, bw.op("MatMul", {h2, "wup"})}), "wdown"});
  const std::string diff = bw.op("Sub", {bw.op("Add", {x1, down}), "target"});
  b.node("ReduceMean", {bw.op("Mul", {diff, diff})}, {"loss"}).add_attribute()->CopyFrom([] {
    onnx::AttributeProto a;
    a.set_name("keepdims"), a.set_type(onnx::AttributeProto::INT), a.set_i(0);
    return a;
  }());
  b.output({"loss", DType::kFloat32, {}});
  return b.model();
}

onnx::ModelProto fused_block(bool data_inputs = false, bool any_batch = false) {
  auto norm = [](const std::string& scale) {
    return [scale](BlockWriter& bw, const std::string& x) {
      return bw.op("RMSNormalization", {x, scale}, [](onnx::NodeProto& n) {
        auto* a = n.add_attribute();
        a->set_name("epsilon"), a->set_type(onnx::AttributeProto::FLOAT), a->set_f(1e-5f);
      });
    };
  };
  return llama_block(
      23, norm("norm1"), norm("norm2"),
      [](BlockWriter& bw, const std::string& x) {
        return bw.op("RotaryEmbedding", {x, bw.cos, bw.sin});
      },
      [](BlockWriter& bw, const std::string& q, const std::string& k, const std::string& v) {
        return bw.op("Attention", {q, k, v}, [](onnx::NodeProto& n) { OnnxBuilder::set_int(n, "is_causal", 1); });
      },
      data_inputs, any_batch);
}

onnx::ModelProto primitive_block() {
  auto scalar = [](BlockWriter& bw, float value) {
    const std::string name = bw.fresh("scalar");
    Tensor t(DType::kFloat32, {});
    t.data<float>()[0] = value;
    bw.b.initializer(t, name);
    return name;
  };
  auto norm = [scalar](const std::string& scale) {
    return [scale, scalar](BlockWriter& bw, const std::string& x) {
      const std::string ms = bw.op("ReduceMean", {bw.op("Pow", {x, scalar(bw, 2)}), bw.ints({-1})});
      const std::string rms = bw.op("Sqrt", {bw.op("Add", {ms, scalar(bw, 1e-5f)})});
      return bw.op("Mul", {bw.op("Div", {x, rms}), scale});
    };
  };
  auto rope = [](BlockWriter& bw, const std::string& x) {  // x·cos + rotate_half(x)·sin, caches [B, 1, S, D]
    const std::string axes1 = bw.ints({1}), last = bw.ints({-1});
    auto full = [&](const std::string& cache) {
      const std::string both = bw.op("Concat", {cache, cache}, [](onnx::NodeProto& n) { OnnxBuilder::set_int(n, "axis", -1); });
      return bw.op("Unsqueeze", {both, axes1});
    };
    const std::string x1 = bw.op("Slice", {x, bw.ints({0}), bw.ints({kHead / 2}), last});
    const std::string x2 = bw.op("Slice", {x, bw.ints({kHead / 2}), bw.ints({kHead}), last});
    const std::string rotated =
        bw.op("Concat", {bw.op("Neg", {x2}), x1}, [](onnx::NodeProto& n) { OnnxBuilder::set_int(n, "axis", -1); });
    return bw.op("Add", {bw.op("Mul", {x, full("cos")}), bw.op("Mul", {rotated, full("sin")})});
  };
  auto attend = [scalar](BlockWriter& bw, const std::string& q, const std::string& k, const std::string& v) {
    auto repeat_kv = [&](const std::string& t) {  // [B, Hkv, S, D] → [B, Hkv, n_rep, S, D] → [B, Hq, S, D]
      const std::string e = bw.op("Expand", {bw.op("Unsqueeze", {t, bw.ints({2})}),
                                             bw.ints({kBatch, kKvHeads, kQHeads / kKvHeads, kSeq, kHead})});
      return bw.op("Reshape", {e, bw.ints({kBatch, kQHeads, kSeq, kHead})});
    };
    const std::string kt = bw.op("Transpose", {repeat_kv(k)}, [](onnx::NodeProto& n) { OnnxBuilder::set_ints(n, "perm", {0, 1, 3, 2}); });
    const std::string scores = bw.op("Mul", {bw.op("MatMul", {q, kt}), scalar(bw, 1 / std::sqrt(static_cast<float>(kHead)))});
    // torch.tril(ones(S, S)) as the keep mask: masked_fill(~keep, −inf) is Where(keep, 0, −inf) added to the scores.
    const std::string ones = bw.op("ConstantOfShape", {bw.ints({kSeq, kSeq})}, [](onnx::NodeProto& n) {
      auto* a = n.add_attribute();
      a->set_name("value"), a->set_type(onnx::AttributeProto::TENSOR);
      a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT), a->mutable_t()->add_dims(1), a->mutable_t()->add_float_data(1);
    });
    const std::string keep = bw.op("Cast", {bw.op("Trilu", {ones}, [](onnx::NodeProto& n) { OnnxBuilder::set_int(n, "upper", 0); })},
                                   [](onnx::NodeProto& n) { OnnxBuilder::set_int(n, "to", onnx::TensorProto::BOOL); });
    const std::string mask = bw.op("Where", {keep, scalar(bw, 0), scalar(bw, -std::numeric_limits<float>::infinity())});
    const std::string weights = bw.op("Softmax", {bw.op("Add", {scores, mask})}, [](onnx::NodeProto& n) { OnnxBuilder::set_int(n, "axis", -1); });
    return bw.op("MatMul", {weights, repeat_kv(v)});
  };
  return llama_block(18, norm("norm1"), norm("norm2"), rope, attend);
}

// Losses of `steps` SGD steps (lr 0.05) on the block's training graph.
std::vector<double> sgd_losses(const onnx::ModelProto& forward, int steps) {
  TrainingGraphOptions options;
  for (const auto& [name, t] : block_weights().params) options.params.push_back(name);
  const TrainingGraph tg = build_training_graph(forward, options);
  Executor exec(tg.model, {});
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    std::map<std::string, Tensor> got;
    for (auto& [name, t] : exec.run({})) got[name] = t;
    losses.push_back(get(got.at(tg.loss_output), 0));
    for (const auto& [param, grad] : tg.gradients) {
      Tensor* p = exec.param(param);
      const Tensor& g = got.at(grad);
      for (int64_t i = 0; i < p->elements(); ++i) p->data<float>()[i] -= 0.05f * g.data<float>()[i];
    }
  }
  return losses;
}

// `apart partition MODEL --tp 2` on 2 CPU devices, batch 2 in one micro-batch, sequence parallelism `sp`.
testing::CommandRun plan_tp2(const fs::path& model, const std::string& sp, const fs::path& plan) {
  return testing::run_apart("partition " + model.string() +
                            " --device cpu --devices 2 --tp 2 --pp 1 --dp 1 --microbatches 1 --batch 2 --no-baselines "
                            "--sequence-parallel " +
                            sp + " -o " + plan.string());
}

TEST(ALlamaBlock, WithTheOpset23FusedOpsTrainsToAFiniteDecreasingLoss) {
  const std::vector<double> losses = sgd_losses(fused_block(), 6);
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(losses.back(), losses.front());
}

TEST(ALlamaBlock, WithTheOpset23FusedOpsLosesWhatItsPrimitiveOpset18FormLosesStepByStep) {
  const std::vector<double> fused = sgd_losses(fused_block(), 4), primitive = sgd_losses(primitive_block(), 4);
  ASSERT_EQ(fused.size(), primitive.size());
  for (size_t i = 0; i < fused.size(); ++i)
    EXPECT_NEAR(fused[i], primitive[i], 1e-5 * std::fabs(primitive[i])) << "step " << i;
}

TEST(ALlamaBlock, WithTheOpset23FusedOpsTrainsUnderApartTrainsTrainerToAFiniteDecreasingLoss) {
  // apart train's own path (runtime/trainer.h): import with the batch bound, training graph, AdamW, synthetic data.
  TempDir dir("llama_block");
  const fs::path model = dir / "llama_block_23.onnx";
  {
    std::ofstream out(model, std::ios::binary);
    fused_block(true).SerializeToOstream(&out);
  }
  TrainOptions o;
  o.model = model.string();
  o.batch = kBatch;
  o.steps = 12;
  o.optimizer.kind = Optimizer::kAdamW;
  o.optimizer.lr = 1e-2;
  o.seed = 3;
  std::vector<double> losses;
  for (const StepRecord& step : train(o).steps) losses.push_back(step.loss);
  ASSERT_EQ(losses.size(), 12u);
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
  // Each step draws a fresh batch, so compare the first four steps' mean with the last four's.
  const auto mean = [&](size_t from) { return (losses[from] + losses[from + 1] + losses[from + 2] + losses[from + 3]) / 4; };
  EXPECT_LT(mean(8), mean(0));
}

TEST(ALlamaBlock, WithTheOpset23FusedOpsTrainsWithTheApartTrainCommand) {
  TempDir dir("llama_block_cli");
  const fs::path model = dir / "llama_block_23.onnx";
  {
    std::ofstream out(model, std::ios::binary);
    fused_block(true).SerializeToOstream(&out);
  }
  const auto r = testing::run_apart("train " + model.string() + " --batch 2 --steps 12 --optimizer adamw --lr 1e-2");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<double> losses;
  for (size_t at = r.out.find("loss="); at != std::string::npos; at = r.out.find("loss=", at + 5))
    losses.push_back(std::stod(r.out.substr(at + 5)));
  ASSERT_GE(losses.size(), 12u) << r.out;
  for (double l : losses) EXPECT_TRUE(std::isfinite(l)) << r.out;
  EXPECT_LT((losses[8] + losses[9] + losses[10] + losses[11]) / 4, (losses[0] + losses[1] + losses[2] + losses[3]) / 4) << r.out;
}

// The fused block under apart partition --tp 2. Its reshape targets and rotary caches bake in the batch (2), so the
// planner, reading the model at batch 1, finds no static shape inside the attention and splits the SwiGLU MLP only.
// Without sequence parallelism apart run --in-process trains as apart train (3 SGD steps, printed losses within
// printed_loss_tolerance). With it, the parts would be cut along that baked-in batch axis while the [batch, S, H]
// target reads as 1 there at batch 1: the shard pass took it for a broadcast and every rank subtracted the whole
// target from its half (loss 2.496318 against 2.336883, silently); it refuses, naming the operand, and so apart
// partition, asking the same pass, leaves the MLP whole (a note says why) and the plan trains as apart train.
TEST(ALlamaBlock, WithTheOpset23FusedOpsTrainsUnderTensorParallelismAsApartTrainOrIsRefused) {
  TempDir dir("llama_block_tp");
  const fs::path model = dir / "llama_block_23.onnx";
  {
    std::ofstream out(model, std::ios::binary);
    fused_block(true).SerializeToOstream(&out);
  }
  const std::string steps = " --steps 3 --seed 3 --optimizer sgd --lr 0.05";
  const auto train = testing::run_apart("train " + model.string() + " --batch 2" + steps);
  ASSERT_EQ(train.code, 0) << train.out;
  const auto reference = testing::number_after(train.out, "step=3 loss=");
  ASSERT_TRUE(reference.has_value()) << train.out;
  for (const char* sp : {"off", "on"}) {
    const fs::path plan = dir / (std::string("plan_sp_") + sp);
    const auto p = plan_tp2(model, sp, plan);
    ASSERT_EQ(p.code, 0) << p.out;
    if (std::string(sp) == "on") {
      EXPECT_NE(p.out.find("region 'MatMul_22' stays whole on every TP rank"), std::string::npos) << p.out;
      EXPECT_NE(p.out.find("'target') grows with the batch"), std::string::npos) << p.out;
    } else {
      EXPECT_NE(p.out.find("regions: 1 MLP"), std::string::npos) << p.out;
    }
    const auto run = testing::run_apart("run " + plan.string() + " --in-process" + steps);
    ASSERT_EQ(run.code, 0) << run.out;
    const auto loss = testing::number_after(run.out, "step=3 loss=");
    ASSERT_TRUE(loss.has_value()) << run.out;
    EXPECT_NEAR(*loss, *reference, testing::printed_loss_tolerance(*reference)) << run.out;
  }
}

// The fused block with nothing baked to its batch: apart partition --tp 2 splits the attention (RotaryEmbedding and
// GQA Attention over 2 of the 4 query heads and 1 of the 2 kv heads per rank, RMSNormalization between the regions)
// and the SwiGLU MLP, and apart run --in-process trains as apart train does, with sequence parallelism off and on
// (S = 5 cut 3 + 2): 3 AdamW steps, each printed loss within printed_loss_tolerance of apart train's.
TEST(ALlamaBlock, WithTheOpset23FusedOpsSplitsItsAttentionUnderTensorParallelismAndTrainsAsApartTrain) {
  TempDir dir("llama_block_tp_any_batch");
  const fs::path model = dir / "llama_block_23.onnx";
  {
    std::ofstream out(model, std::ios::binary);
    fused_block(true, true).SerializeToOstream(&out);
  }
  const std::string steps = " --steps 3 --seed 3 --optimizer adamw --lr 0.01";
  const auto train = testing::run_apart("train " + model.string() + " --batch 2" + steps);
  ASSERT_EQ(train.code, 0) << train.out;
  for (const char* sp : {"off", "on"}) {
    const fs::path plan = dir / (std::string("plan_sp_") + sp);
    const auto p = plan_tp2(model, sp, plan);
    ASSERT_EQ(p.code, 0) << p.out;
    EXPECT_NE(p.out.find("regions: 1 attention, 1 MLP; split in 1 of 1 stages"), std::string::npos) << p.out;
    const auto check = testing::run_apart("check " + plan.string());
    EXPECT_EQ(check.code, 0) << check.out;
    const auto run = testing::run_apart("run " + plan.string() + " --in-process" + steps);
    ASSERT_EQ(run.code, 0) << run.out;
    EXPECT_EQ(testing::printed_losses_differ(run.out, train.out, 3), "") << "SP " << sp << "\n" << run.out;
  }
}

TEST(ALlamaBlock, WithTheOpset23FusedOpsMatchesFiniteDifferences) {
  TrainingGraphOptions options;
  for (const auto& [name, t] : block_weights().params) options.params.push_back(name);
  expect_gradients_match(build_training_graph(fused_block(), options), {}, kFloat, 3);
}

}  // namespace
}  // namespace apart
