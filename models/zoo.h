// The model zoo: ONNX models of the architectures people train, at any size, shaped like torch.onnx.export output.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace onnx {
class ModelProto;
}

namespace apart::models {

enum class Family { kGpt, kBert, kT5, kResnet, kMlp, kLlama };
enum class Loss { kNone, kCrossEntropy, kMse };
enum class WeightsMode { kNone, kRandom };
enum class FloatType { kFp32, kFp16, kBf16 };
enum class LayerNormStyle { kDecomposed, kFused };

std::string_view family_name(Family f);
std::string_view loss_name(Loss l);
std::string_view weights_name(WeightsMode w);
std::string_view float_type_name(FloatType t);
std::string_view layernorm_name(LayerNormStyle s);

// Everything that decides a generated model. The fields a family does not use are ignored by it.
struct ZooOptions {
  Family family = Family::kGpt;
  std::string name = "gpt";  // preset or family name, recorded in the model's metadata

  // Transformers (gpt, bert, t5) and mlp.
  int64_t layers = 2;     // transformer blocks (t5: per stack); mlp: linear layers; resnet: depth 50/101/152
  int64_t hidden = 64;    // d_model; mlp: width
  int64_t heads = 2;
  int64_t head_dim = 0;   // 0: hidden / heads (t5-3b/11b use 128 with hidden 1024)
  int64_t ffn = 0;        // 0: 4 * hidden
  int64_t kv_heads = 0;   // llama: key/value heads (grouped-query attention); 0: heads
  double rope_theta = 500000;  // llama: RoPE base (Llama 3: 500000)
  int64_t seq = 32;       // sequence length (static; the causal mask is a constant)
  int64_t vocab = 512;
  int64_t max_positions = 0;  // position-table rows; 0: seq (gpt), max(512, seq) (bert)

  // ResNet.
  int64_t width = 1;      // channel multiplier applied to every conv (RaNNC's widened ResNet-152 uses 8)
  int64_t classes = 1000;
  int64_t image = 224;

  Loss loss = Loss::kCrossEntropy;
  int64_t batch = 0;      // 0: symbolic dim "batch"
  FloatType dtype = FloatType::kFp32;
  WeightsMode weights = WeightsMode::kRandom;
  uint64_t seed = 0;
  LayerNormStyle layernorm = LayerNormStyle::kDecomposed;
  // Random weights above this many bytes go to an external-data file; 0: 1.75 GiB (protobuf caps a message at
  // 2 GiB). Tests lower it to exercise the streamed path on small models. Not recorded in the model.
  int64_t inline_limit_bytes = 0;

  int64_t resolved_ffn() const { return ffn > 0 ? ffn : 4 * hidden; }
  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : (heads > 0 ? hidden / heads : 0); }
  int64_t resolved_kv_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t resolved_max_positions() const;

  // Throws InvalidArgument naming the offending flag (--layers, --heads, ...).
  void validate() const;
};

struct Preset {
  std::string name;
  std::string description;
  ZooOptions options;  // weights/loss already set to the preset's defaults
};

// All presets, in the order `apart zoo --list` prints them.
const std::vector<Preset>& zoo_presets();

// Options for a preset name ("gpt3-175b") or a family name ("gpt": small defaults of that family).
// Throws InvalidArgument listing the known names when `name` is neither.
ZooOptions options_for(std::string_view name);

// Default weights mode for a model of this size: random up to 1B params, none above.
WeightsMode default_weights_for(const ZooOptions& options);

// Parameter count from each family's closed form (no graph is built). Parameters are exactly the
// model's initializers; non-trainable constants (masks, BN running statistics, shapes) are Constant nodes.
int64_t closed_form_params(const ZooOptions& options);

// Progress of a long generation: what is being done and the fraction done in [0, 1].
using ZooProgress = std::function<void(std::string_view what, double fraction)>;

struct ZooResult {
  int64_t params = 0;
  int64_t nodes = 0;
  int64_t initializers = 0;
  int64_t model_bytes = 0;        // size of the .onnx file
  int64_t weight_bytes = 0;       // bytes of parameter data (written or only declared)
  std::string weights_location;   // external-data file name relative to the model; empty when inline
  bool weights_written = false;   // false for --weights none (declared, never written)
};

// Builds the model graph in memory. Weights are inline for --weights random (only allowed below 2 GiB)
// and declared as external data for --weights none. Used by tests; the CLI uses write_zoo_model.
onnx::ModelProto build_zoo_model(const ZooOptions& options, std::string_view weights_location = "model.weights");

// Whether `path` is an ONNX model apart zoo wrote (its producer_name, stored before the graph, is the zoo's).
// Reads the first KiB only, so a multi-GB model costs nothing; false for anything else or an unreadable file.
bool written_by_zoo(const std::filesystem::path& path);

// Writes the model to `path` through a temporary file and rename; random weights above 2 GiB are streamed
// into `<stem>.weights` beside it (offsets aligned to 4096). Throws InvalidArgument / SystemError.
ZooResult write_zoo_model(const ZooOptions& options, const std::string& path, const ZooProgress& progress = {});

// "174.6B", "335.1M", "12.3K".
std::string format_count(int64_t n);

}  // namespace apart::models
