// Flags and formatting shared by the subcommands that read a model.
#include "cli/cli_common.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "graph/error.h"
#include "plan/plan_file.h"
#include "profiler/device.h"
#include "runtime/blas_info.h"

namespace apart::cli {

void add_model_flags(CLI::App& cmd, ModelFlags& flags, int64_t default_batch) {
  cmd.add_option("--shape", flags.shapes,
                 "Static shape of a graph input, trtexec style: NAME:D0xD1x… (e.g. input:8x3x224x224); repeatable")
      ->take_last()
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd.add_option("--dim", flags.dims, "Bind a symbolic dim everywhere it appears: NAME=N (e.g. batch=8); repeatable")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  if (default_batch > 0) {
    flags.batch = default_batch;
    flags.batch_option = cmd.add_option("--batch", flags.batch,
                                        "Batch size the model is read at: binds its batch dim (a dim named batch, "
                                        "batch_size or N, else the first input's leading dim); --dim/--shape override")
                             ->capture_default_str();
  }
  cmd.add_option("--constants-as-params", flags.constants_as_params,
                 "on: Constant nodes that feed weight slots (Conv/MatMul/Gemm weights, norm scales and biases, "
                 "embedding tables; as paddle2onnx and tf2onnx export them) are trainable params; off: constants")
      ->capture_default_str();
}

ImportOptions import_options(const ModelFlags& flags) {
  ImportOptions o;
  for (const auto& s : flags.shapes) {
    auto parsed = parse_shape_flag(s);
    for (const auto& existing : o.input_shapes)
      if (existing.first == parsed.first) throw InvalidArgument("--shape is given twice for input '" + parsed.first + "'");
    o.input_shapes.push_back(std::move(parsed));
  }
  for (const auto& d : flags.dims) {
    auto [name, value] = parse_dim_flag(d);
    auto [it, inserted] = o.dims.emplace(name, value);
    if (!inserted && it->second != value) throw InvalidArgument("--dim " + name + " is given twice with different values");
  }
  if (flags.batch_option) {
    if (flags.batch < 1) throw InvalidArgument("--batch must be at least 1 (got " + std::to_string(flags.batch) + ")");
    o.batch = flags.batch;
    o.batch_explicit = flags.batch_option->count() > 0;
  }
  if (flags.constants_as_params != "on" && flags.constants_as_params != "off")
    throw InvalidArgument("--constants-as-params must be on or off, not '" + flags.constants_as_params + "'");
  o.constants_as_params = flags.constants_as_params == "on";
  return o;
}

void add_loss_flags(CLI::App& cmd, LossFlags& flags, LossFlagUse use) {
  const std::string forms = "cross_entropy (F.cross_entropy(logits.view(-1, V), labels.view(-1))) or "
                            "cross_entropy_shifted (the next-token form of causal LMs: logits[:, :-1] against "
                            "labels[:, 1:]) appends that loss to a logits-only model (docs/cli.md)";
  cmd.add_option("--loss", flags.loss,
                 use == LossFlagUse::kFormOnly
                     ? forms
                     : forms + "; any other name is the graph output to minimise, a scalar float (default: the "
                               "model's only scalar float output)");
  flags.labels_option = cmd.add_option("--labels", flags.labels,
                                       "The int64 labels input --loss cross_entropy adds to the model")
                            ->capture_default_str();
}

std::string apply_loss_flags(const LossFlags& flags, LossFlagUse use, AddedLoss& loss) {
  const auto form = parse_added_loss_form(flags.loss);
  if (form) {
    loss = AddedLoss{*form, flags.labels};
    if (loss.labels.empty()) throw InvalidArgument("--labels: name the labels input (e.g. --labels labels)");
    return "";
  }
  if (flags.labels_option && flags.labels_option->count() > 0)
    throw InvalidArgument("--labels names the labels input of the loss apart appends; give the loss too: --loss "
                          "cross_entropy --labels " + flags.labels);
  if (use == LossFlagUse::kFormOnly && !flags.loss.empty())
    throw InvalidArgument("--loss: '" + flags.loss + "' is not a loss apart appends (cross_entropy, "
                          "cross_entropy_shifted)");
  return flags.loss;
}

void note_constant_params(const ConstantParams& converted) {
  const std::string note = constant_params_note(converted);
  if (!note.empty()) std::fprintf(stderr, "apart: note: %s\n", note.c_str());
}

Progress::Progress(std::string command, double interval_s)
    : prefix_("apart " + std::move(command) + ": "), interval_s_(interval_s), tty_(::isatty(STDERR_FILENO) != 0) {}

void Progress::operator()(const std::string& line) {
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s%s", prefix_.c_str(), line.c_str());
    shown_ = true;
  } else if (now - last_ >= interval_s_) {
    std::fprintf(stderr, "%s%s\n", prefix_.c_str(), line.c_str());
    last_ = now;
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (tty_ && shown_) std::fprintf(stderr, "\r\033[K");
  shown_ = false;
}

namespace {
std::string scaled(double v, const char* const* units, int n, double step, const char* suffix) {
  int i = 0;
  while (std::fabs(v) >= step && i + 1 < n) {
    v /= step;
    ++i;
  }
  return i == 0 && std::floor(v) == v ? fmt::format("{:.0f}{}{}", v, units[i], suffix) : fmt::format("{:.2f}{}{}", v, units[i], suffix);
}
}  // namespace

std::vector<InputFile> plan_inputs(const std::string& plan) {
  std::error_code ec;
  const std::filesystem::path file =
      std::filesystem::is_directory(plan, ec) ? std::filesystem::path(plan) / kPlanFile : std::filesystem::path(plan);
  const std::filesystem::path dir = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  return {{"the plan", file}, {"the plan's costs", dir / "costs.json"}, {"the plan's baselines", dir / "baselines.json"}};
}

std::string human_flops(double flops) {
  static const char* const units[] = {" ", " K", " M", " G", " T", " P", " E"};
  return scaled(flops, units, 7, 1000.0, "FLOP");
}

std::string device_flag_help(const std::string& lead) {
  std::string list;
  for (const DevicePresetInfo& info : device_preset_infos()) {
    list += (list.empty() ? "" : ", ") + info.name;
    if (!info.aliases.empty()) list += " (or " + info.aliases.front() + ")";
  }
  return lead + ": " + list + "; the GPU presets are SXM parts, `apart devices` lists their figures";
}

void note_blas_kernel() {
  static bool noted = false;  // once per process, whichever command asks first
  if (noted) return;
  noted = true;
  if (const auto note = blas_kernel_note()) std::fprintf(stderr, "apart: note: %s\n", note->c_str());
}

}  // namespace apart::cli

namespace apart::cli {
namespace {
std::vector<std::string>& command_line_words() {
  static std::vector<std::string> words;
  return words;
}
// A word as a POSIX shell reads it back: bare when it is only safe characters, else in single quotes.
std::string shell_word(const std::string& word) {
  const bool safe = !word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                            "0123456789-_./=:,+@%") == std::string::npos;
  if (safe) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}
}  // namespace

void set_command_line(int argc, char** argv) { command_line_words().assign(argv, argv + argc); }

std::string resume_command(const std::string& checkpoint_dir, const std::string& launcher) {
  const std::vector<std::string>& words = command_line_words();
  std::string command = launcher;
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i] == "--resume") {
      ++i;  // and its value
      continue;
    }
    if (words[i].rfind("--resume=", 0) == 0) continue;
    command += (i == 0 ? "" : " ") + shell_word(words[i]);
  }
  return command + " --resume " + shell_word(checkpoint_dir);
}

}  // namespace apart::cli
