// `apart zoo`: writes ONNX models of common architectures at any size (models/zoo.h), or lists the presets.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/cli_common.h"
#include "cli/command_registry.h"
#include "graph/error.h"
#include "models/zoo.h"

namespace apart::cli {
namespace {

struct ZooArgs {
  std::string model;
  std::string output;
  bool list = false;
  bool quiet = false;
  int64_t layers = 0, hidden = 0, heads = 0, head_dim = 0, ffn = 0, seq = 0, vocab = 0, max_positions = 0;
  int64_t width = 0, classes = 0, image = 0, batch = 0, kv_heads = 0;
  double rope_theta = 0;
  uint64_t seed = 0;
  std::string loss, dtype, weights, layernorm;
  bool force = false;
};

template <typename E>
E parse_choice(const std::string& flag, const std::string& value, std::initializer_list<std::pair<const char*, E>> choices) {
  std::string names;
  for (const auto& [name, e] : choices) {
    if (value == name) return e;
    names += names.empty() ? name : std::string(", ") + name;
  }
  throw InvalidArgument(flag + ": '" + value + "' is not one of " + names);
}

// -o and the weights file beside it: apart zoo replaces only files it wrote, unless --force; never a symlink,
// folder, device or read-only file (check_output_writable).
void check_zoo_outputs(const std::string& output, bool force) {
  namespace fs = std::filesystem;
  check_output_writable(output, "-o");
  std::error_code ec;
  const fs::path out(output);
  const bool model_exists = fs::exists(out, ec);
  const bool ours = model_exists && models::written_by_zoo(out);
  if (model_exists && !ours && !force)
    throw InvalidArgument("-o '" + output + "' exists and is not a model apart zoo wrote; apart will not replace it: "
                          "choose another -o, or add --force to replace it");
  const fs::path weights = (out.has_parent_path() ? out.parent_path() : fs::path(".")) / (out.stem().string() + ".weights");
  if (fs::exists(fs::symlink_status(weights, ec))) {
    check_output_writable(weights, "-o (its weights file)");
    if (!ours && !force)
      throw InvalidArgument("-o '" + output + "': the weights file beside it, '" + weights.string() +
                            "', exists and belongs to no model apart zoo wrote there; apart will not replace it: "
                            "choose another -o, or add --force to replace it");
  }
}

void print_list() {
  std::printf("%-14s %-7s %9s  %s\n", "preset", "family", "params", "description");
  for (const auto& p : models::zoo_presets()) {
    std::printf("%-14s %-7s %9s  %s\n", p.name.c_str(), std::string(models::family_name(p.options.family)).c_str(),
                models::format_count(models::closed_form_params(p.options)).c_str(), p.description.c_str());
  }
  std::printf("\nFamilies (small defaults, set the size with flags): gpt, bert, t5, llama, resnet, mlp.\n"
              "Presets over 1B params default to --weights none (shapes only).\n");
}

void run_zoo(const CLI::App& cmd, const ZooArgs& a) {
  if (a.list) {
    print_list();
    return;
  }
  if (a.model.empty()) throw InvalidArgument("apart zoo: name a preset or family (apart zoo --list shows them)");
  if (a.output.empty()) throw InvalidArgument("-o: missing; say where to write the model, e.g. -o model.onnx");

  models::ZooOptions o = models::options_for(a.model);
  const bool weights_given = cmd.count("--weights") > 0;
  auto set = [&](const char* flag, int64_t value, int64_t& field) {
    if (cmd.count(flag) > 0) field = value;
  };
  set("--layers", a.layers, o.layers);
  set("--hidden", a.hidden, o.hidden);
  set("--heads", a.heads, o.heads);
  set("--head-dim", a.head_dim, o.head_dim);
  set("--ffn", a.ffn, o.ffn);
  set("--seq", a.seq, o.seq);
  set("--vocab", a.vocab, o.vocab);
  set("--max-positions", a.max_positions, o.max_positions);
  set("--kv-heads", a.kv_heads, o.kv_heads);
  if (cmd.count("--rope-theta") > 0) o.rope_theta = a.rope_theta;
  set("--width", a.width, o.width);
  set("--classes", a.classes, o.classes);
  set("--image", a.image, o.image);
  if (cmd.count("--batch") > 0) {
    if (a.batch < 1) throw InvalidArgument("--batch: must be >= 1 (omit it for a symbolic batch dim)");
    o.batch = a.batch;
  }
  if (cmd.count("--seed") > 0) o.seed = a.seed;
  if (!a.loss.empty())
    o.loss = parse_choice<models::Loss>("--loss", a.loss, {{"cross_entropy", models::Loss::kCrossEntropy},
                                                           {"mse", models::Loss::kMse},
                                                           {"none", models::Loss::kNone}});
  if (!a.dtype.empty())
    o.dtype = parse_choice<models::FloatType>("--dtype", a.dtype, {{"fp32", models::FloatType::kFp32},
                                                                  {"fp16", models::FloatType::kFp16},
                                                                  {"bf16", models::FloatType::kBf16}});
  if (!a.layernorm.empty())
    o.layernorm = parse_choice<models::LayerNormStyle>(
        "--layernorm", a.layernorm,
        {{"decomposed", models::LayerNormStyle::kDecomposed}, {"fused", models::LayerNormStyle::kFused}});
  o.validate();
  if (weights_given) {
    o.weights = parse_choice<models::WeightsMode>("--weights", a.weights,
                                                  {{"none", models::WeightsMode::kNone},
                                                   {"random", models::WeightsMode::kRandom}});
  } else {
    o.weights = models::default_weights_for(o);  // the size may have changed with the flags above
  }

  // Progress on long generations: a line per 10% while drawing more than 256 MiB of weights.
  const bool big = o.weights == models::WeightsMode::kRandom &&
                   models::closed_form_params(o) * (o.dtype == models::FloatType::kFp32 ? 4 : 2) > (int64_t{256} << 20);
  auto next_report = std::make_shared<int>(10);
  models::ZooProgress progress;
  if (big && !a.quiet) {
    progress = [next_report](std::string_view what, double fraction) {
      if (fraction * 100 >= *next_report) {
        std::fprintf(stderr, "apart zoo: %.*s %d%%\n", static_cast<int>(what.size()), what.data(), *next_report);
        *next_report += 10;
      }
    };
  }
  check_zoo_outputs(a.output, a.force);
  const auto start = std::chrono::steady_clock::now();
  const models::ZooResult r = models::write_zoo_model(o, a.output, progress);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::string weights;
  if (r.weights_location.empty()) {
    weights = fmt::format("weights inline (random, seed {})", o.seed);
  } else if (r.weights_written) {
    weights = fmt::format("weights in {} ({}, random, seed {})", r.weights_location, format_bytes(r.weight_bytes), o.seed);
  } else {
    weights = fmt::format("weights none (shapes only; {} not written)", r.weights_location);
  }
  std::printf("apart zoo: wrote %s: %s (%s, %s), %s params, %lld nodes, %s; %s; %.2f s\n", a.output.c_str(),
              o.name.c_str(), std::string(models::family_name(o.family)).c_str(),
              std::string(models::float_type_name(o.dtype)).c_str(), models::format_count(r.params).c_str(),
              static_cast<long long>(r.nodes), format_bytes(static_cast<double>(r.model_bytes)).c_str(),
              weights.c_str(), seconds);
}

const bool kRegistered = register_command({"zoo", 20, [](CLI::App& app) {
  auto args = std::make_shared<ZooArgs>();
  CLI::App* cmd = app.add_subcommand("zoo", "Write an ONNX model of a common architecture (GPT, BERT, T5, Llama, "
                                            "ResNet, MLP) at any size, shaped like a PyTorch export");
  cmd->add_option("model", args->model, "preset (gpt2-small, gpt3-175b, bert-large, llama3-70b, resnet152x8, ...) or "
                                        "family (gpt, bert, t5, llama, resnet, mlp)");
  cmd->add_flag("--list", args->list, "list the presets with their parameter counts");
  cmd->add_option("-o,--output", args->output, "the .onnx file to write (written via a temporary file + rename)");
  cmd->add_option("--layers", args->layers, "transformer blocks per stack / MLP layers / ResNet depth (50|101|152)");
  cmd->add_option("--hidden", args->hidden, "hidden size (d_model; MLP width)");
  cmd->add_option("--heads", args->heads, "attention heads");
  cmd->add_option("--head-dim", args->head_dim, "per-head width (default hidden / heads)");
  cmd->add_option("--ffn", args->ffn, "feed-forward width (default 4 * hidden; llama: the SwiGLU width)");
  cmd->add_option("--kv-heads", args->kv_heads, "llama: key/value heads for grouped-query attention (default heads)");
  cmd->add_option("--rope-theta", args->rope_theta, "llama: rotary embedding base (default 500000)");
  cmd->add_option("--seq", args->seq, "sequence length (static)");
  cmd->add_option("--vocab", args->vocab, "vocabulary size");
  cmd->add_option("--max-positions", args->max_positions, "rows of the position table (default: seq; bert: 512)");
  cmd->add_option("--width", args->width, "ResNet channel multiplier");
  cmd->add_option("--classes", args->classes, "ResNet output classes");
  cmd->add_option("--image", args->image, "ResNet input height = width");
  cmd->add_option("--loss", args->loss, "cross_entropy | mse | none (default: mse for mlp, else cross_entropy)");
  cmd->add_option("--batch", args->batch, "static batch size (default: symbolic dim 'batch')");
  cmd->add_option("--dtype", args->dtype, "fp32 | fp16 | bf16 (parameters and activations)");
  cmd->add_option("--weights", args->weights, "none | random (default: random up to 1B params, none above)");
  cmd->add_option("--seed", args->seed, "seed for --weights random (same seed, same bytes)");
  cmd->add_option("--layernorm", args->layernorm, "decomposed (torch opset < 17) | fused (LayerNormalization)");
  cmd->add_flag("-q,--quiet", args->quiet, "no progress lines");
  cmd->add_flag("--force", args->force,
                "replace an existing -o (or its .weights file) that is not a model apart zoo wrote");
  cmd->callback([cmd, args] { run_zoo(*cmd, *args); });
}});

}  // namespace
}  // namespace apart::cli
