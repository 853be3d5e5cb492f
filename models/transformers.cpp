// The transformer families (GPT, BERT, T5), the plain MLP, and the loss heads, as torch.onnx.export emits them.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "models/graph_builder.h"

namespace apart::models {
namespace {

constexpr int64_t kBatch = -1;  // marks the batch dim in GraphBuilder::input/output

// [B, S, heads*hd] -> [B, heads, S, hd] (perm 0,2,1,3) or, for keys, [B, heads, hd, S] (perm 0,2,3,1).
std::string split_heads(GraphBuilder& b, const std::string& x, int64_t heads, int64_t hd, bool key) {
  const std::string r = b.node("Reshape", {x, b.int64s({0, 0, heads, hd})}, {attr_int("allowzero", 0)});
  return b.node("Transpose", {r}, {attr_ints("perm", key ? std::vector<int64_t>{0, 2, 3, 1}
                                                           : std::vector<int64_t>{0, 2, 1, 3})});
}

struct AttentionCore {
  int64_t heads = 1;
  int64_t head_dim = 1;
  bool scale = true;          // divide scores by sqrt(head_dim) (T5 does not)
  std::string bias;           // added to the scores when set ([1, heads, S, S])
  std::string causal;         // Where(mask, -inf, scores) when set
};

// softmax(q k^T / sqrt(d) [+ bias] [masked]) v, heads merged back: [B, S, heads*hd].
std::string attention_core(GraphBuilder& b, const std::string& q, const std::string& k, const std::string& v,
                           const AttentionCore& a) {
  const std::string qh = split_heads(b, q, a.heads, a.head_dim, false);
  const std::string kh = split_heads(b, k, a.heads, a.head_dim, true);
  const std::string vh = split_heads(b, v, a.heads, a.head_dim, false);
  std::string scores = b.node("MatMul", {qh, kh});
  if (a.scale) scores = b.node("Div", {scores, b.scalar(std::sqrt(static_cast<double>(a.head_dim)))});
  if (!a.bias.empty()) scores = b.node("Add", {scores, a.bias});
  if (!a.causal.empty())
    scores = b.node("Where", {a.causal, b.scalar(-std::numeric_limits<double>::infinity()), scores});
  const std::string probs = b.node("Softmax", {scores}, {attr_int("axis", -1)});
  const std::string ctx = b.node("Transpose", {b.node("MatMul", {probs, vh})}, {attr_ints("perm", {0, 2, 1, 3})});
  return b.node("Reshape", {ctx, b.int64s({0, 0, a.heads * a.head_dim})}, {attr_int("allowzero", 0)});
}

// Tied output embedding: x @ table^T, with the transpose kept in the graph so the table stays one parameter.
std::string tied_head(GraphBuilder& b, const std::string& x, const std::string& table) {
  const std::string t = b.node("Transpose", {table}, {attr_ints("perm", {1, 0})});
  return b.node("MatMul", {x, t});
}

}  // namespace

std::vector<int64_t> arange(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

std::string causal_mask(GraphBuilder& b, int64_t seq) {
  std::vector<uint8_t> masked(static_cast<size_t>(seq * seq), 0);
  for (int64_t i = 0; i < seq; ++i)
    for (int64_t j = i + 1; j < seq; ++j) masked[static_cast<size_t>(i * seq + j)] = 1;
  return b.bool_tensor({seq, seq}, masked);
}

void finish_with_loss(GraphBuilder& b, const ZooOptions& o, const std::string& output, const std::string& output_name,
                      const std::vector<int64_t>& dims, int64_t classes) {
  const int32_t ft = b.float_elem();
  if (o.loss == Loss::kNone) {
    b.rename(output, output_name);
    b.output(output_name, ft, dims);
    return;
  }
  std::string loss;
  if (o.loss == Loss::kCrossEntropy) {
    // F.cross_entropy(logits.view(-1, C), labels.view(-1)): Reshape both, SoftmaxCrossEntropyLoss(mean, -100).
    std::vector<int64_t> label_dims(dims.begin(), dims.end() - 1);
    b.input("labels", onnx::TensorProto::INT64, label_dims);
    std::string scores = output;
    std::string labels = "labels";
    if (dims.size() > 2) {
      scores = b.node("Reshape", {output, b.int64s({-1, classes})}, {attr_int("allowzero", 0)});
      labels = b.node("Reshape", {labels, b.int64s({-1})}, {attr_int("allowzero", 0)});
    }
    loss = b.node("SoftmaxCrossEntropyLoss", {scores, labels},
                  {attr_int("ignore_index", -100), attr_string("reduction", "mean")});
  } else {
    // F.mse_loss(output, target): Sub, Mul(d, d), ReduceMean over everything.
    b.input("target", ft, dims);
    const std::string diff = b.node("Sub", {output, "target"});
    loss = b.node("ReduceMean", {b.node("Mul", {diff, diff})}, {attr_int("keepdims", 0)});
  }
  b.rename(loss, "loss");
  b.output("loss", ft, {});
}

void build_gpt(GraphBuilder& b, const ZooOptions& o) {
  const int64_t H = o.hidden, S = o.seq, V = o.vocab, F = o.resolved_ffn();
  const int64_t hd = o.resolved_head_dim(), inner = o.heads * hd;
  const Init w_init = Init::normal(0.02);
  // GPT-2/Megatron: residual projections scaled by 1/sqrt(2 * layers).
  const Init proj_init = Init::normal(0.02 / std::sqrt(2.0 * static_cast<double>(o.layers)));
  b.input("input_ids", onnx::TensorProto::INT64, {kBatch, S});

  std::string wte, x;
  {
    auto s = b.scope("wte");
    wte = b.param("weight", {V, H}, w_init);
    x = b.node("Gather", {wte, "input_ids"});
  }
  {
    auto s = b.scope("wpe");
    const std::string wpe = b.param("weight", {o.resolved_max_positions(), H}, w_init);
    x = b.node("Add", {x, b.node("Gather", {wpe, b.int64s(arange(S))})});
  }
  const std::string mask = causal_mask(b, S);

  for (int64_t i = 0; i < o.layers; ++i) {
    auto block = b.scope("blocks." + std::to_string(i));
    std::string h = b.layer_norm("ln1", x, H, 1e-5f, o.layernorm);
    {
      auto attn = b.scope("attn");
      const std::string qkv = b.linear("qkv", h, H, 3 * inner, true, w_init, Init::zeros());
      const auto parts = b.node_n("Split", {qkv, b.int64s({inner, inner, inner})}, 3, {attr_int("axis", 2)});
      AttentionCore core{o.heads, hd, true, "", mask};
      const std::string ctx = attention_core(b, parts[0], parts[1], parts[2], core);
      h = b.linear("proj", ctx, inner, H, true, proj_init, Init::zeros());
    }
    x = b.node("Add", {x, h});
    h = b.layer_norm("ln2", x, H, 1e-5f, o.layernorm);
    {
      auto mlp = b.scope("mlp");
      h = b.linear("0", h, H, F, true, w_init, Init::zeros());
      h = b.gelu("1", h);
      h = b.linear("2", h, F, H, true, proj_init, Init::zeros());
    }
    x = b.node("Add", {x, h});
  }
  x = b.layer_norm("lnf", x, H, 1e-5f, o.layernorm);
  std::string logits;
  {
    auto s = b.scope("head");
    logits = tied_head(b, x, wte);
  }
  finish_with_loss(b, o, logits, "logits", {kBatch, S, V}, V);
}

void build_bert(GraphBuilder& b, const ZooOptions& o) {
  const int64_t H = o.hidden, S = o.seq, V = o.vocab, F = o.resolved_ffn();
  const int64_t hd = o.resolved_head_dim(), inner = o.heads * hd;
  const Init w_init = Init::normal(0.02);
  const float eps = 1e-12f;
  b.input("input_ids", onnx::TensorProto::INT64, {kBatch, S});

  std::string word, x;
  {
    auto emb = b.scope("embeddings");
    {
      auto s = b.scope("word_embeddings");
      word = b.param("weight", {V, H}, w_init);
      x = b.node("Gather", {word, "input_ids"});
    }
    {
      // token_type_ids defaults to a zeros buffer in HF BertModel.
      auto s = b.scope("token_type_embeddings");
      const std::string table = b.param("weight", {2, H}, w_init);
      x = b.node("Add", {x, b.node("Gather", {table, b.int64s(std::vector<int64_t>(static_cast<size_t>(S), 0))})});
    }
    {
      auto s = b.scope("position_embeddings");
      const std::string table = b.param("weight", {o.resolved_max_positions(), H}, w_init);
      x = b.node("Add", {x, b.node("Gather", {table, b.int64s(arange(S))})});
    }
    x = b.layer_norm("LayerNorm", x, H, eps, o.layernorm);
  }
  {
    auto enc = b.scope("encoder");
    for (int64_t i = 0; i < o.layers; ++i) {
      auto layer = b.scope("layer." + std::to_string(i));
      std::string attn_out;
      {
        auto attention = b.scope("attention");
        std::string ctx;
        {
          auto self = b.scope("self");
          const std::string q = b.linear("query", x, H, inner, true, w_init, Init::zeros());
          const std::string k = b.linear("key", x, H, inner, true, w_init, Init::zeros());
          const std::string v = b.linear("value", x, H, inner, true, w_init, Init::zeros());
          ctx = attention_core(b, q, k, v, AttentionCore{o.heads, hd, true, "", ""});
        }
        auto out = b.scope("output");
        const std::string d = b.linear("dense", ctx, inner, H, true, w_init, Init::zeros());
        attn_out = b.layer_norm("LayerNorm", b.node("Add", {d, x}), H, eps, o.layernorm);
      }
      std::string inter;
      {
        auto s = b.scope("intermediate");
        inter = b.gelu("intermediate_act_fn", b.linear("dense", attn_out, H, F, true, w_init, Init::zeros()));
      }
      auto out = b.scope("output");
      const std::string d = b.linear("dense", inter, F, H, true, w_init, Init::zeros());
      x = b.layer_norm("LayerNorm", b.node("Add", {d, attn_out}), H, eps, o.layernorm);
    }
  }
  std::string logits;
  {
    // Masked-LM head (BertForMaskedLM): transform, then the decoder tied to the word embeddings plus a bias.
    auto cls = b.scope("cls");
    auto pred = b.scope("predictions");
    std::string t;
    {
      auto s = b.scope("transform");
      t = b.linear("dense", x, H, H, true, w_init, Init::zeros());
      t = b.gelu("transform_act_fn", t);
      t = b.layer_norm("LayerNorm", t, H, eps, o.layernorm);
    }
    {
      auto s = b.scope("decoder");
      logits = tied_head(b, t, word);
    }
    logits = b.node("Add", {logits, b.param("bias", {V}, Init::zeros())});
  }
  finish_with_loss(b, o, logits, "logits", {kBatch, S, V}, V);
}

namespace {

// HF T5Attention._relative_position_bucket for one (query i, key j) pair.
int64_t t5_bucket(int64_t i, int64_t j, bool bidirectional, int64_t num_buckets = 32, int64_t max_distance = 128) {
  int64_t rel = j - i;
  int64_t bucket = 0;
  if (bidirectional) {
    num_buckets /= 2;
    if (rel > 0) bucket += num_buckets;
    rel = rel < 0 ? -rel : rel;
  } else {
    rel = rel < 0 ? -rel : 0;
  }
  const int64_t max_exact = num_buckets / 2;
  if (rel < max_exact) return bucket + rel;
  const double scaled = std::log(static_cast<double>(rel) / static_cast<double>(max_exact)) /
                        std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)) *
                        static_cast<double>(num_buckets - max_exact);
  const int64_t large = std::min<int64_t>(max_exact + static_cast<int64_t>(scaled), num_buckets - 1);
  return bucket + large;
}

// The shared relative position bias of one T5 stack: [1, heads, S, S] (computed in block 0, reused by all).
std::string t5_position_bias(GraphBuilder& b, int64_t seq, int64_t heads, int64_t hidden, bool bidirectional) {
  std::vector<int64_t> buckets(static_cast<size_t>(seq * seq));
  for (int64_t i = 0; i < seq; ++i)
    for (int64_t j = 0; j < seq; ++j) buckets[static_cast<size_t>(i * seq + j)] = t5_bucket(i, j, bidirectional);
  auto s = b.scope("relative_attention_bias");
  const std::string table = b.param("weight", {32, heads}, Init::normal(1.0 / std::sqrt(static_cast<double>(hidden))));
  const std::string g = b.node("Gather", {table, b.int64_tensor({seq, seq}, buckets)});
  const std::string t = b.node("Transpose", {g}, {attr_ints("perm", {2, 0, 1})});
  return b.node("Unsqueeze", {t, b.int64s({0})});
}

struct T5Dims {
  int64_t d, inner, heads, hd, ffn;
};

// T5Attention without biases: q, k, v, o projections (HF init scales), optional position bias.
std::string t5_attention(GraphBuilder& b, const std::string& module, const std::string& x, const std::string& kv,
                         const T5Dims& t, const std::string& bias, std::string* bias_out, bool bidirectional,
                         const std::string& causal, int64_t seq) {
  auto s = b.scope(module);
  const double d = static_cast<double>(t.d), hd = static_cast<double>(t.hd), nh = static_cast<double>(t.heads);
  const std::string q = b.linear("q", x, t.d, t.inner, false, Init::normal(1.0 / std::sqrt(d * hd)), {});
  const std::string k = b.linear("k", kv, t.d, t.inner, false, Init::normal(1.0 / std::sqrt(d)), {});
  const std::string v = b.linear("v", kv, t.d, t.inner, false, Init::normal(1.0 / std::sqrt(d)), {});
  std::string use_bias = bias;
  if (bias_out != nullptr) {
    use_bias = t5_position_bias(b, seq, t.heads, t.d, bidirectional);
    if (!causal.empty())  // the causal mask is folded into the shared bias once, as HF's extended mask is
      use_bias = b.node("Where", {causal, b.scalar(-std::numeric_limits<double>::infinity()), use_bias});
    *bias_out = use_bias;
  }
  const std::string ctx = attention_core(b, q, k, v, AttentionCore{t.heads, t.hd, false, use_bias, ""});
  return b.linear("o", ctx, t.inner, t.d, false, Init::normal(1.0 / std::sqrt(nh * hd)), {});
}

std::string t5_ffn(GraphBuilder& b, const std::string& x, const T5Dims& t) {
  auto s = b.scope("DenseReluDense");
  std::string h = b.linear("wi", x, t.d, t.ffn, false, Init::normal(1.0 / std::sqrt(static_cast<double>(t.d))), {});
  h = b.node("Relu", {h});
  return b.linear("wo", h, t.ffn, t.d, false, Init::normal(1.0 / std::sqrt(static_cast<double>(t.ffn))), {});
}

}  // namespace

void build_t5(GraphBuilder& b, const ZooOptions& o) {
  const T5Dims t{o.hidden, o.heads * o.resolved_head_dim(), o.heads, o.resolved_head_dim(), o.resolved_ffn()};
  const int64_t S = o.seq, V = o.vocab;
  const float eps = 1e-6f;
  b.input("input_ids", onnx::TensorProto::INT64, {kBatch, S});
  b.input("decoder_input_ids", onnx::TensorProto::INT64, {kBatch, S});
  const std::string shared = b.param("shared.weight", {V, t.d}, Init::normal(1.0));

  // Encoder: the first long branch.
  std::string enc;
  {
    auto stack = b.scope("encoder");
    {
      auto s = b.scope("embed_tokens");
      enc = b.node("Gather", {shared, "input_ids"});
    }
    std::string bias;
    for (int64_t i = 0; i < o.layers; ++i) {
      auto block = b.scope("block." + std::to_string(i));
      {
        auto l = b.scope("layer.0");
        const std::string h = b.rms_norm("layer_norm", enc, t.d, eps);
        enc = b.node("Add", {enc, t5_attention(b, "SelfAttention", h, h, t, bias, i == 0 ? &bias : nullptr, true, "",
                                              S)});
      }
      auto l = b.scope("layer.1");
      enc = b.node("Add", {enc, t5_ffn(b, b.rms_norm("layer_norm", enc, t.d, eps), t)});
    }
    enc = b.rms_norm("final_layer_norm", enc, t.d, eps);
  }
  // Decoder: the second long branch; every block reads the encoder output (cross-attention joins them).
  std::string dec;
  {
    auto stack = b.scope("decoder");
    {
      auto s = b.scope("embed_tokens");
      dec = b.node("Gather", {shared, "decoder_input_ids"});
    }
    const std::string mask = causal_mask(b, S);
    std::string bias;
    for (int64_t i = 0; i < o.layers; ++i) {
      auto block = b.scope("block." + std::to_string(i));
      {
        auto l = b.scope("layer.0");
        const std::string h = b.rms_norm("layer_norm", dec, t.d, eps);
        dec = b.node("Add", {dec, t5_attention(b, "SelfAttention", h, h, t, bias, i == 0 ? &bias : nullptr, false,
                                              mask, S)});
      }
      {
        auto l = b.scope("layer.1");
        const std::string h = b.rms_norm("layer_norm", dec, t.d, eps);
        dec = b.node("Add", {dec, t5_attention(b, "EncDecAttention", h, enc, t, "", nullptr, false, "", S)});
      }
      auto l = b.scope("layer.2");
      dec = b.node("Add", {dec, t5_ffn(b, b.rms_norm("layer_norm", dec, t.d, eps), t)});
    }
    dec = b.rms_norm("final_layer_norm", dec, t.d, eps);
  }
  std::string logits;
  {
    // Tied lm_head: sequence_output * d_model^-0.5 @ shared^T.
    auto s = b.scope("lm_head");
    const std::string scaled = b.node("Mul", {dec, b.scalar(1.0 / std::sqrt(static_cast<double>(t.d)))});
    logits = tied_head(b, scaled, shared);
  }
  finish_with_loss(b, o, logits, "logits", {kBatch, S, V}, V);
}

void build_mlp(GraphBuilder& b, const ZooOptions& o) {
  const int64_t H = o.hidden;
  b.input("input", b.float_elem(), {kBatch, H});
  const Init bound = Init::uniform(1.0 / std::sqrt(static_cast<double>(H)));  // nn.Linear's default init
  std::string x = "input";
  {
    auto s = b.scope("layers");
    for (int64_t i = 0; i < o.layers; ++i) {
      x = b.linear(std::to_string(2 * i), x, H, H, true, bound, bound);
      if (i + 1 < o.layers) {
        auto r = b.scope(std::to_string(2 * i + 1));
        x = b.node("Relu", {x});
      }
    }
  }
  finish_with_loss(b, o, x, "output", {kBatch, H}, H);
}

}  // namespace apart::models
