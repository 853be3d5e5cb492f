// Zoo presets, option validation, and each family's closed-form parameter count.
#include <algorithm>
#include <cstdio>
#include <string>

#include "graph/error.h"
#include "models/zoo.h"

namespace apart::models {

std::string_view family_name(Family f) {
  switch (f) {
    case Family::kGpt: return "gpt";
    case Family::kBert: return "bert";
    case Family::kT5: return "t5";
    case Family::kResnet: return "resnet";
    case Family::kMlp: return "mlp";
    case Family::kLlama: return "llama";
  }
  return "?";
}
std::string_view loss_name(Loss l) {
  switch (l) {
    case Loss::kNone: return "none";
    case Loss::kCrossEntropy: return "cross_entropy";
    case Loss::kMse: return "mse";
  }
  return "?";
}
std::string_view weights_name(WeightsMode w) { return w == WeightsMode::kNone ? "none" : "random"; }
std::string_view float_type_name(FloatType t) {
  switch (t) {
    case FloatType::kFp32: return "fp32";
    case FloatType::kFp16: return "fp16";
    case FloatType::kBf16: return "bf16";
  }
  return "?";
}
std::string_view layernorm_name(LayerNormStyle s) { return s == LayerNormStyle::kFused ? "fused" : "decomposed"; }

std::vector<int64_t> resnet_blocks(int64_t depth) {
  switch (depth) {
    case 50: return {3, 4, 6, 3};
    case 101: return {3, 4, 23, 3};
    case 152: return {3, 8, 36, 3};
    default: return {};
  }
}

int64_t ZooOptions::resolved_max_positions() const {
  if (max_positions > 0) return max_positions;
  return family == Family::kBert ? std::max<int64_t>(512, seq) : seq;
}

namespace {

void require(bool ok, const std::string& flag, const std::string& what) {
  if (!ok) throw InvalidArgument(flag + ": " + what);
}

bool is_transformer(Family f) {
  return f == Family::kGpt || f == Family::kBert || f == Family::kT5 || f == Family::kLlama;
}

}  // namespace

void ZooOptions::validate() const {
  const std::string fam(family_name(family));
  if (family == Family::kResnet) {
    require(!resnet_blocks(layers).empty(), "--layers", "resnet depth must be 50, 101 or 152 (got " +
                                                            std::to_string(layers) + ")");
    require(width >= 1 && width <= 64, "--width", "must be in [1, 64] (got " + std::to_string(width) + ")");
    require(classes >= 1 && classes <= (1 << 24), "--classes", "must be in [1, 16777216]");
    require(image >= 32 && image <= 4096, "--image", "must be in [32, 4096] pixels");
    require(dtype != FloatType::kBf16, "--dtype",
            "bf16 is not expressible for resnet: ONNX opset 17 defines Conv and MaxPool only for fp16/fp32/fp64; "
            "use --dtype fp16 or fp32");
  } else {
    require(layers >= 1 && layers <= 100000, "--layers", "must be in [1, 100000] (got " + std::to_string(layers) + ")");
    require(hidden >= 1 && hidden <= (1 << 20), "--hidden", "must be in [1, 1048576] (got " + std::to_string(hidden) + ")");
  }
  if (is_transformer(family)) {
    require(heads >= 1 && heads <= 4096, "--heads", "must be in [1, 4096]");
    require(head_dim > 0 || hidden % heads == 0, "--heads",
            std::to_string(heads) + " heads do not divide --hidden " + std::to_string(hidden));
    require(head_dim >= 0 && head_dim <= 65536, "--head-dim", "must be in [0, 65536] (0: hidden / heads)");
    require(ffn >= 0 && ffn <= (1 << 24), "--ffn", "must be in [0, 16777216] (0: 4 * hidden)");
    require(vocab >= 2 && vocab <= (1 << 24), "--vocab", "must be in [2, 16777216]");
    // The causal mask (gpt, t5) and T5's bucket table are [seq, seq] constants inside the model file.
    const int64_t max_seq = family == Family::kBert ? (1 << 20) : family == Family::kT5 ? 4096 : 8192;
    require(seq >= 1 && seq <= max_seq, "--seq", "must be in [1, " + std::to_string(max_seq) + "] for " + fam);
    require(max_positions == 0 || max_positions >= seq, "--seq", "exceeds the position table (" +
                                                                     std::to_string(max_positions) + " rows)");
  }
  if (family == Family::kT5 || family == Family::kLlama)
    require(layernorm == LayerNormStyle::kDecomposed, "--layernorm",
            fam + " uses RMSNorm, which has no fused op at opset 17; use decomposed");
  if (family == Family::kLlama) {
    const int64_t kv = resolved_kv_heads();
    require(kv >= 1 && heads % kv == 0, "--kv-heads",
            std::to_string(kv) + " key/value heads do not divide the " + std::to_string(heads) + " query heads");
    require(resolved_head_dim() % 2 == 0, "--head-dim", "rotary embeddings need an even head width (got " +
                                                            std::to_string(resolved_head_dim()) + ")");
    require(rope_theta > 1 && rope_theta <= 1e12, "--rope-theta", "must be in (1, 1e12]");
  }
  require(batch >= 0 && batch <= (1 << 24), "--batch", "must be in [1, 16777216], or omitted for a symbolic batch");
}

namespace {

ZooOptions gpt(std::string name, int64_t layers, int64_t hidden, int64_t heads, int64_t seq, int64_t vocab) {
  ZooOptions o;
  o.family = Family::kGpt;
  o.name = std::move(name);
  o.layers = layers;
  o.hidden = hidden;
  o.heads = heads;
  o.seq = seq;
  o.vocab = vocab;
  return o;
}

ZooOptions bert(std::string name, int64_t layers, int64_t hidden, int64_t heads, int64_t seq) {
  ZooOptions o = gpt(std::move(name), layers, hidden, heads, seq, 30522);
  o.family = Family::kBert;
  return o;
}

ZooOptions t5(std::string name, int64_t layers, int64_t hidden, int64_t heads, int64_t head_dim, int64_t ffn) {
  ZooOptions o = gpt(std::move(name), layers, hidden, heads, 512, 32128);
  o.family = Family::kT5;
  o.head_dim = head_dim;
  o.ffn = ffn;
  return o;
}

// Llama 3 (Meta's published config.json): untied head, vocab 128256, RoPE theta 500000, seq 8192.
ZooOptions llama(std::string name, int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t ffn,
                 int64_t seq, int64_t vocab) {
  ZooOptions o = gpt(std::move(name), layers, hidden, heads, seq, vocab);
  o.family = Family::kLlama;
  o.kv_heads = kv_heads;
  o.ffn = ffn;
  o.rope_theta = 500000;
  return o;
}

ZooOptions resnet(std::string name, int64_t depth, int64_t width) {
  ZooOptions o;
  o.family = Family::kResnet;
  o.name = std::move(name);
  o.layers = depth;
  o.width = width;
  return o;
}

ZooOptions mlp(std::string name, int64_t layers, int64_t hidden) {
  ZooOptions o;
  o.family = Family::kMlp;
  o.name = std::move(name);
  o.layers = layers;
  o.hidden = hidden;
  o.loss = Loss::kMse;
  return o;
}

std::vector<Preset> make_presets() {
  std::vector<Preset> p = {
      {"gpt-tiny", "2-layer GPT, hidden 64, seq 32, vocab 512: the bundled test model", gpt("gpt-tiny", 2, 64, 2, 32, 512)},
      {"gpt2-small", "GPT-2 small (124M)", gpt("gpt2-small", 12, 768, 12, 1024, 50257)},
      {"gpt2-medium", "GPT-2 medium (355M)", gpt("gpt2-medium", 24, 1024, 16, 1024, 50257)},
      {"gpt2-large", "GPT-2 large (774M)", gpt("gpt2-large", 36, 1280, 20, 1024, 50257)},
      {"gpt2-xl", "GPT-2 XL (1.5B)", gpt("gpt2-xl", 48, 1600, 25, 1024, 50257)},
      {"gpt3-1.3b", "GPT-3 XL (Brown et al. 2020, Table 2.1)", gpt("gpt3-1.3b", 24, 2048, 16, 2048, 50257)},
      {"gpt3-2.7b", "GPT-3 2.7B", gpt("gpt3-2.7b", 32, 2560, 32, 2048, 50257)},
      {"gpt3-6.7b", "GPT-3 6.7B", gpt("gpt3-6.7b", 32, 4096, 32, 2048, 50257)},
      {"gpt3-13b", "GPT-3 13B (hidden 5120 as in Megatron; the paper lists 5140)", gpt("gpt3-13b", 40, 5120, 40, 2048, 50257)},
      {"gpt3-175b", "GPT-3 175B", gpt("gpt3-175b", 96, 12288, 96, 2048, 50257)},
      {"bert-base", "BERT-base with MLM head, seq 512", bert("bert-base", 12, 768, 12, 512)},
      {"bert-large", "BERT-large with MLM head, seq 512", bert("bert-large", 24, 1024, 16, 512)},
      {"bert-1.2b", "RaNNC-style enlarged BERT: hidden 1024, 96 layers", bert("bert-1.2b", 96, 1024, 16, 512)},
      {"bert-1.3b", "RaNNC-style enlarged BERT: hidden 2048, 24 layers", bert("bert-1.3b", 24, 2048, 32, 512)},
      {"bert-2.5b", "RaNNC-style enlarged BERT: hidden 2048, 48 layers", bert("bert-2.5b", 48, 2048, 32, 512)},
      {"bert-4.9b", "RaNNC-style enlarged BERT: hidden 2048, 96 layers", bert("bert-4.9b", 96, 2048, 32, 512)},
      {"t5-small", "T5 small (60M), encoder-decoder", t5("t5-small", 6, 512, 8, 64, 2048)},
      {"t5-base", "T5 base (220M)", t5("t5-base", 12, 768, 12, 64, 3072)},
      {"t5-large", "T5 large (770M)", t5("t5-large", 24, 1024, 16, 64, 4096)},
      {"t5-3b", "T5 3B (d_kv 128, d_ff 16384)", t5("t5-3b", 24, 1024, 32, 128, 16384)},
      {"t5-11b", "T5 11B (128 heads, d_ff 65536)", t5("t5-11b", 24, 1024, 128, 128, 65536)},
      {"llama-tiny", "2-layer Llama, hidden 64, 4 heads / 2 kv heads, seq 32, vocab 512: trains in seconds",
       llama("llama-tiny", 2, 64, 4, 2, 176, 32, 512)},
      {"llama3-8b", "Llama 3 8B (Meta's config: GQA 32/8 heads, SwiGLU 14336, untied head)",
       llama("llama3-8b", 32, 4096, 32, 8, 14336, 8192, 128256)},
      {"llama3-70b", "Llama 3 70B (GQA 64/8 heads, SwiGLU 28672)", llama("llama3-70b", 80, 8192, 64, 8, 28672, 8192, 128256)},
      {"llama3-405b", "Llama 3.1 405B (GQA 128/8 heads, SwiGLU 53248)",
       llama("llama3-405b", 126, 16384, 128, 8, 53248, 8192, 128256)},
      {"resnet50", "ResNet-50 (torchvision)", resnet("resnet50", 50, 1)},
      {"resnet101", "ResNet-101", resnet("resnet101", 101, 1)},
      {"resnet152", "ResNet-152", resnet("resnet152", 152, 1)},
      {"resnet152x8", "ResNet-152, every conv widened 8x (RaNNC, 3.7B)", resnet("resnet152x8", 152, 8)},
      {"mlp-tiny", "4-layer MLP, width 64, MSE loss: the smallest test case", mlp("mlp-tiny", 4, 64)},
      {"mlp-deep", "32-layer MLP, width 4096", mlp("mlp-deep", 32, 4096)},
  };
  for (auto& preset : p) preset.options.weights = default_weights_for(preset.options);
  return p;
}

}  // namespace

const std::vector<Preset>& zoo_presets() {
  static const std::vector<Preset> presets = make_presets();
  return presets;
}

WeightsMode default_weights_for(const ZooOptions& options) {
  return closed_form_params(options) > 1'000'000'000 ? WeightsMode::kNone : WeightsMode::kRandom;
}

ZooOptions options_for(std::string_view name) {
  for (const auto& p : zoo_presets())
    if (p.name == name) return p.options;
  // A family name: small defaults of that family (gpt-tiny-sized), to be overridden by flags.
  ZooOptions o;
  if (name == "gpt") {
    o = gpt("gpt", 2, 64, 2, 32, 512);
  } else if (name == "bert") {
    o = bert("bert", 2, 64, 2, 32);
    o.vocab = 512;
  } else if (name == "t5") {
    o = t5("t5", 2, 64, 2, 0, 0);
    o.seq = 32;
    o.vocab = 512;
  } else if (name == "resnet") {
    o = resnet("resnet", 50, 1);
  } else if (name == "mlp") {
    o = mlp("mlp", 4, 64);
  } else if (name == "llama") {
    o = llama("llama", 2, 64, 4, 2, 176, 32, 512);
  } else {
    std::string known = "gpt, bert, t5, llama, resnet, mlp";
    for (const auto& p : zoo_presets()) known += ", " + p.name;
    throw InvalidArgument("unknown zoo model '" + std::string(name) + "'; known families and presets: " + known +
                          " (apart zoo --list shows them with sizes)");
  }
  o.weights = default_weights_for(o);
  return o;
}

int64_t closed_form_params(const ZooOptions& o) {
  const int64_t H = o.hidden, V = o.vocab, F = o.resolved_ffn(), L = o.layers;
  const int64_t I = o.heads * o.resolved_head_dim();  // attention inner width (= H unless head_dim is set)
  const int64_t P = o.resolved_max_positions();
  switch (o.family) {
    case Family::kGpt: {
      // wte + wpe + L * (ln1, qkv, proj, ln2, fc, fc-proj) + lnf; the LM head is tied to wte.
      const int64_t block = 2 * H + (H * 3 * I + 3 * I) + (I * H + H) + 2 * H + (H * F + F) + (F * H + H);
      return V * H + P * H + L * block + 2 * H;
    }
    case Family::kBert: {
      // embeddings (word, position, token type, LayerNorm) + L * layer + MLM head (dense, LN, bias; decoder tied).
      const int64_t layer = 3 * (H * I + I) + (I * H + H) + 2 * H + (H * F + F) + (F * H + H) + 2 * H;
      return V * H + P * H + 2 * H + 2 * H + L * layer + (H * H + H) + 2 * H + V;
    }
    case Family::kT5: {
      // shared embedding; per stack a 32-bucket relative bias and a final RMSNorm; no biases anywhere.
      const int64_t enc_block = 4 * H * I + 2 * H * F + 2 * H;
      const int64_t dec_block = 8 * H * I + 2 * H * F + 3 * H;
      return V * H + 2 * (32 * o.heads + H) + L * (enc_block + dec_block);
    }
    case Family::kResnet: {
      const int64_t w = o.width;
      int64_t n = 3 * 64 * w * 49 + 2 * 64 * w;  // conv1 + bn1
      int64_t in = 64 * w;
      const auto blocks = resnet_blocks(o.layers);
      for (size_t s = 0; s < blocks.size(); ++s) {
        const int64_t p = (64 << s) * w;
        // Bottleneck: 1x1 (in->p), 3x3 (p->p), 1x1 (p->4p), three BNs; the first block adds a 1x1 projection + BN.
        n += (in * p + 2 * p) + (9 * p * p + 2 * p) + (4 * p * p + 8 * p) + (in * 4 * p + 8 * p);
        n += (blocks[s] - 1) * ((4 * p * p + 2 * p) + (9 * p * p + 2 * p) + (4 * p * p + 8 * p));
        in = 4 * p;
      }
      return n + in * o.classes + o.classes;
    }
    case Family::kMlp:
      return L * (H * H + H);
    case Family::kLlama: {
      // embed_tokens + L * (two RMSNorms, q/k/v/o without bias, SwiGLU gate/up/down) + norm + untied lm_head.
      const int64_t kv_width = o.resolved_kv_heads() * o.resolved_head_dim();
      const int64_t layer = 2 * H + H * I + 2 * H * kv_width + I * H + 3 * H * F;
      return V * H + L * layer + H + H * V;
    }
  }
  return 0;
}

std::string format_count(int64_t n) {
  char buf[32];
  const double v = static_cast<double>(n);
  if (n >= 1'000'000'000) {
    std::snprintf(buf, sizeof buf, "%.1fB", v / 1e9);
  } else if (n >= 1'000'000) {
    std::snprintf(buf, sizeof buf, "%.1fM", v / 1e6);
  } else if (n >= 1'000) {
    std::snprintf(buf, sizeof buf, "%.1fK", v / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  }
  return buf;
}

}  // namespace apart::models
