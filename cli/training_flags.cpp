// The training flags of `apart train` and `apart run` (training_flags.h).
#include "cli/training_flags.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>

#include "cli/cli_common.h"
#include "graph/checked.h"
#include "graph/error.h"
#include "graph/text.h"
#include "graph/threads.h"
#include "graph/units.h"
#include "runtime/cpu/threads.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace apart::cli {
namespace {

std::pair<double, double> parse_betas(const std::string& text) {
  std::istringstream in(text);
  double b1 = 0, b2 = 0;
  char comma = 0;
  if (!(in >> b1 >> comma >> b2) || comma != ',' || !in.eof())
    throw InvalidArgument("--betas: expected two numbers like 0.9,0.999, got '" + text + "'");
  return {b1, b2};
}

}  // namespace

int apply_threads(int threads, int ranks_sharing_cores) {
  int n = threads;
  if (n == 0) {
    const std::optional<int> from_environment = thread_count_from_environment();  // checks the variables
    n = from_environment.value_or(std::max(1, default_compute_threads() / std::max(1, ranks_sharing_cores)));
  }
  set_compute_threads(n);
  return n;
}

void add_threads_flag(CLI::App& cmd, int& threads) {
  cmd.add_option("--threads", threads,
                 "Kernel threads per process (kernels and OpenBLAS); default APART_NUM_THREADS or OMP_NUM_THREADS, "
                 "else the cores (apart run: shared among the ranks of a node)")
      ->check(CLI::Range(0, 4096));
}

void add_training_flags(CLI::App& cmd, TrainingFlags& f, const std::string& optimizer_help) {
  cmd.add_option("--optimizer", f.optimizer, optimizer_help);
  cmd.add_option("--lr", f.lr, "Peak learning rate")->capture_default_str();
  cmd.add_option("--weight-decay", f.weight_decay, "L2 for sgd/momentum/adam, decoupled for adamw")->capture_default_str();
  cmd.add_option("--momentum", f.momentum, "Momentum for --optimizer momentum")->capture_default_str();
  cmd.add_flag("--nesterov", f.nesterov, "Nesterov momentum");
  cmd.add_option("--betas", f.betas, "Adam betas B1,B2")->capture_default_str();
  cmd.add_option("--eps", f.eps, "Adam epsilon")->capture_default_str();
  cmd.add_option("--clip-grad-norm", f.clip_grad_norm, "Clip gradients to this global L2 norm (0: off)")->capture_default_str();
  cmd.add_option("--lr-schedule", f.lr_schedule, "constant, or cosine (linear warmup, cosine decay)")->capture_default_str();
  cmd.add_option("--warmup-steps", f.warmup_steps, "Linear warmup steps for --lr-schedule cosine")->capture_default_str();
  cmd.add_option("--min-lr-ratio", f.min_lr_ratio, "Cosine decays to this fraction of --lr")->capture_default_str();
  cmd.add_option("--lr-schedule-steps", f.lr_schedule_steps,
                 "The steps the schedule decays over (default: --steps; with --resume, the checkpoint's run's, so a "
                 "longer --steps does not re-stretch it)");
  cmd.add_option("--data", f.data, "synthetic, TOKENS.bin, or NAME=FILE.npy,NAME=FILE.npy")->capture_default_str();
  cmd.add_option("--data-dtype", f.data_dtype, "Token width of a .bin file: uint16 or uint32")->capture_default_str();
  cmd.add_option("--init", f.init, "model (the file's weights) or random (seeded re-initialization)")->capture_default_str();
  cmd.add_option("--seed", f.seed, "Seed for --init random and the data order")->capture_default_str();
  add_threads_flag(cmd, f.threads);
}

OptimizerOptions optimizer_options(const TrainingFlags& f) {
  OptimizerOptions o;
  o.kind = parse_optimizer(f.optimizer);
  o.lr = f.lr;
  o.weight_decay = f.weight_decay;
  o.momentum = f.momentum;
  o.nesterov = f.nesterov;
  std::tie(o.beta1, o.beta2) = parse_betas(f.betas);
  o.eps = f.eps;
  o.clip_grad_norm = f.clip_grad_norm;
  return o;
}

LrSchedule lr_schedule(const TrainingFlags& f) {
  LrSchedule s;
  s.kind = parse_lr_schedule(f.lr_schedule);
  s.warmup_steps = f.warmup_steps;
  s.min_lr_ratio = f.min_lr_ratio;
  s.total_steps = f.lr_schedule_steps;
  return s;
}

DataOptions data_options(const TrainingFlags& f) {
  DataOptions d;
  d.spec = f.data;
  if (f.data_dtype == "uint16") d.token_dtype = DType::kUInt16;
  else if (f.data_dtype == "uint32") d.token_dtype = DType::kUInt32;
  else throw InvalidArgument("--data-dtype must be uint16 or uint32");
  return d;
}

void add_backend_flags(CLI::App& cmd, BackendFlags& f, bool precision_from_plan) {
  cmd.add_option("--backend", f.backend, "Where kernels run: cpu, or cuda (one GPU per process: LOCAL_RANK under mpirun)")
      ->capture_default_str();
  const std::string precision_help =
      "GEMM operands: fp32, tf32 (GPU tensor cores; fp32 on the CPU), mixed or bf16 (bfloat16 operands, fp32 "
      "accumulation), fp16 (float16 operands, with dynamic loss scaling); the CPU rounds operands as a GPU does";
  CLI::Option* precision = cmd.add_option(
      "--precision", f.precision, precision_help + (precision_from_plan ? "; default: the plan's precision" : ""));
  if (!precision_from_plan) precision->capture_default_str();
  cmd.add_option("--loss-scale-init", f.loss_scale.init_scale, "fp16: the initial loss scale (2^-24 to 2^64)")
      ->capture_default_str();
  cmd.add_option("--loss-scale-growth", f.loss_scale.growth_factor,
                 "fp16: the scale's factor after --loss-scale-interval clean steps (above 1)")->capture_default_str();
  cmd.add_option("--loss-scale-backoff", f.loss_scale.backoff_factor,
                 "fp16: the scale's factor after a step with an inf/NaN gradient, which is skipped (between 0 and 1)")
      ->capture_default_str();
  cmd.add_option("--loss-scale-interval", f.loss_scale.growth_interval,
                 "fp16: clean steps in a row before the scale grows")->capture_default_str();
}

LossScaleOptions loss_scale_options(const BackendFlags& f) {
  LossScaleOptions o = f.loss_scale;
  o.enabled = parse_precision(f.precision) == Precision::kMixed && parse_half_format(f.precision) == HalfFormat::kFp16;
  o.validate();  // the numbers, even when fp16 is off: a bad flag is an error either way
  return o;
}

std::unique_ptr<Backend> make_backend(const BackendFlags& f, int local_rank) {
  const BackendKind kind = parse_backend(f.backend);
  BackendOptions options;
  options.precision = parse_precision(f.precision);
  options.half = parse_half_format(f.precision);
  if (kind == BackendKind::kCpu)  // the float32 CPU is cpu_backend(); mixed precision rounds its GEMM operands
    return options.precision == Precision::kMixed ? apart::make_backend(kind, options) : nullptr;
  // The launcher's node-local rank picks this process's GPU (torchrun: LOCAL_RANK; Open MPI: its own variable).
  int rank = local_rank;
  for (const char* name : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"}) {
    const char* v = std::getenv(name);
    if (!v) continue;
    try {
      rank = static_cast<int>(checked_integer(static_cast<int64_t>(std::stoll(v)), int64_t{0}, limits::kMaxDevices, name));
    } catch (const std::logic_error&) {
      throw InvalidArgument(std::string("environment variable ") + name + "='" + v + "' is not a number");
    }
    break;
  }
  const int devices = cuda_device_count();
  options.device = devices > 0 ? rank % devices : 0;  // no GPU: make_backend says so (Unsupported)
  return apart::make_backend(kind, options);
}

void add_step_log_flags(CLI::App& cmd, StepLogFlags& f) {
  cmd.add_option("--log-every", f.log_every,
                 "Add the elapsed training time and the ETA to every Nth step line (and the last; 0: only the last)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  cmd.add_option("--metrics", f.metrics,
                 "Append one JSON object per step to this file (JSON Lines: loss, lr, grad_norm, step_time_s, "
                 "samples_per_s, tokens_per_s, elapsed_s, eta_s, memory), flushed as each step ends");
}

namespace {

// "16.9ms": format_seconds without its space, for key=value lines.
std::string compact_seconds(double seconds) {
  std::string text = format_seconds(seconds);
  text.erase(std::remove(text.begin(), text.end(), ' '), text.end());
  return text;
}

// The process's peak resident memory (VmHWM), in bytes; 0 where /proc does not say.
int64_t peak_resident_bytes() {
  std::FILE* status = std::fopen("/proc/self/status", "r");
  if (!status) return 0;
  char line[256];
  long long kib = 0;
  while (std::fgets(line, sizeof line, status))
    if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1) break;
  std::fclose(status);
  return static_cast<int64_t>(kib) * 1024;
}

}  // namespace

StepLog::StepLog(const StepLogFlags& flags, const std::vector<InputFile>& inputs, int64_t last_step)
    : flags_(flags), last_step_(last_step) {
  if (!flags_.metrics.empty()) check_output_file(flags_.metrics, inputs, "--metrics");
}

StepLog::~StepLog() {
  if (metrics_) std::fclose(metrics_);
}

std::string StepLog::step(const StepRecord& s) {
  elapsed_s_ += s.seconds;
  ++steps_seen_;
  const double eta_s =
      elapsed_s_ / static_cast<double>(steps_seen_) * static_cast<double>(std::max<int64_t>(0, last_step_ - s.step));
  std::string line =
      fmt::format("step={} loss={:.6f} samples/s={}", s.step, s.loss, format_significant(s.samples_per_s));
  if (s.tokens_per_s > 0) line += " tokens/s=" + format_significant(s.tokens_per_s);
  line += fmt::format(" step_time={} lr={:.3g} grad_norm={:.4g}{}", compact_seconds(s.seconds), s.lr, s.grad_norm,
                      loss_scale_note(s));
  const bool timed = s.step >= last_step_ || (flags_.log_every > 0 && s.step % flags_.log_every == 0);
  if (timed) line += " elapsed=" + compact_seconds(elapsed_s_) + " eta=" + compact_seconds(eta_s);
  if (!flags_.metrics.empty()) {
    if (!metrics_ && !(metrics_ = std::fopen(flags_.metrics.c_str(), "w")))
      throw SystemError("--metrics " + flags_.metrics + ": cannot open it for writing");
    nlohmann::json j = {{"step", s.step},
                        {"loss", s.loss},
                        {"lr", s.lr},
                        {"grad_norm", s.grad_norm},
                        {"step_time_s", s.seconds},
                        {"samples_per_s", s.samples_per_s},
                        {"tokens_per_s", s.tokens_per_s},
                        {"elapsed_s", elapsed_s_},
                        {"eta_s", eta_s},
                        {"tensor_memory_peak_bytes", tensor_memory().peak},
                        {"resident_peak_bytes", peak_resident_bytes()}};
    if (s.loss_scale > 0) j["loss_scale"] = s.loss_scale, j["skipped"] = s.skipped;
    if (!std::isfinite(s.grad_norm)) j["grad_norm"] = nullptr;  // JSON has no inf
    const std::string text = j.dump() + "\n";
    if (std::fwrite(text.data(), 1, text.size(), metrics_) != text.size() || std::fflush(metrics_) != 0)
      throw SystemError("--metrics " + flags_.metrics + ": writing step " + std::to_string(s.step) +
                        " failed (disk full?)");
  }
  return line;
}

void fill_loop_options(const LoopFlags& a, TrainingLoopOptions& o) {
  o.model = a.model;
  o.steps = a.steps;
  o.optimizer = optimizer_options(a.training);
  o.schedule = lr_schedule(a.training);
  o.data = data_options(a.training);
  o.init = parse_param_init(a.training.init);
  o.seed = a.training.seed;
  o.checkpoint_dir = a.checkpoint_dir;
  o.save_every = a.save_every;
  o.keep_last = a.keep_last;
  o.resume = a.resume;
  o.save_model = a.save_model;
  o.loss_scale = loss_scale_options(a.backend);
  o.on_note = [](const std::string& note) { std::fprintf(stderr, "apart: note: %s\n", note.c_str()); };
  o.on_warning = [](const std::string& warning) { std::fprintf(stderr, "apart: warning: %s\n", warning.c_str()); };
}

std::string loss_scale_note(const StepRecord& step) {
  if (step.loss_scale <= 0) return "";
  char text[64];
  std::snprintf(text, sizeof text, " loss_scale=%.6g%s", step.loss_scale, step.skipped ? " skipped" : "");
  return text;
}

void note_backend(const std::string& description, const std::vector<std::string>& fallback_ops) {
  static std::once_flag once;  // one note per process, not one per rank thread
  std::call_once(once, [&] {
    std::fprintf(stderr, "apart: backend %s\n", printable(description).c_str());
    if (fallback_ops.empty()) return;
    std::string list;
    for (const std::string& op : fallback_ops) list += (list.empty() ? "" : ", ") + printable(op);
    std::fprintf(stderr, "apart: note: these ops run on the CPU kernel (the backend has none; their inputs are copied "
                         "to the host and back each step): %s\n", list.c_str());
  });
}

}  // namespace apart::cli
