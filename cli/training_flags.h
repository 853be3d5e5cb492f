// The training flags `apart train` and `apart run` share (optimizer, learning-rate schedule, data, init, seed), and the
// backend flags they share with `apart profile`: one declaration of each flag and one translation into the runtime's
// options.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "graph/output_path.h"
#include "runtime/backend.h"
#include "train/trainer.h"

namespace CLI {
class App;
}

namespace apart::cli {

struct TrainingFlags {
  std::string optimizer = "adamw";
  double lr = 3e-4;
  double weight_decay = 0.0;
  double momentum = 0.9;
  bool nesterov = false;
  std::string betas = "0.9,0.999";
  double eps = 1e-8;
  double clip_grad_norm = 0;
  std::string lr_schedule = "constant";
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1;
  int64_t lr_schedule_steps = 0;  // 0: --steps (a resume: the checkpoint's run's span)
  std::string data = "synthetic";
  std::string data_dtype = "uint16";
  std::string init = "model";
  uint64_t seed = 0;
  int threads = 0;  // 0: the default (apply_threads)
};

// Adds --optimizer … --seed to `cmd`. `optimizer_help` says what the default is (train: adamw; run: the plan's).
void add_training_flags(CLI::App& cmd, TrainingFlags& flags, const std::string& optimizer_help);

// Sets the kernels' thread count (runtime/cpu/threads.h set_compute_threads): `threads` when given (> 0), else
// APART_NUM_THREADS or OMP_NUM_THREADS when set, else the cores divided among `ranks_sharing_cores` (the ranks of
// this node; at least 1 thread each). Returns the count set. InvalidArgument naming --threads or the variable.
int apply_threads(int threads, int ranks_sharing_cores = 1);
// `--threads N` (0 = the default above) on `cmd`.
void add_threads_flag(CLI::App& cmd, int& threads);

// The flags as runtime options. Throws InvalidArgument naming the flag.
OptimizerOptions optimizer_options(const TrainingFlags& flags);
LrSchedule lr_schedule(const TrainingFlags& flags);
DataOptions data_options(const TrainingFlags& flags);

// --backend cpu|cuda, --precision fp32|tf32|mixed|bf16|fp16 (the GEMMs' operands: a GPU's tensor cores; the CPU
// rounds its operands alike under mixed/bf16/fp16 and computes fp32 and tf32 in fp32) and fp16's loss scaling.
struct BackendFlags {
  std::string backend = "cpu";
  std::string precision = "fp32";
  LossScaleOptions loss_scale;  // its numbers; `enabled` follows --precision fp16 (loss_scale_options)
};
// precision_from_plan: `apart run`, whose --precision defaults to the plan's (what the plan was priced at runs).
void add_backend_flags(CLI::App& cmd, BackendFlags& flags, bool precision_from_plan = false);
// fp16's dynamic loss scaling: on under --precision fp16, with the --loss-scale-* numbers (validated).
LossScaleOptions loss_scale_options(const BackendFlags& flags);
// The backend the flags name: nullptr for cpu at fp32/tf32 (the runtime's cpu_backend()), the CPU backend that rounds
// GEMM operands under mixed precision, else make_backend on GPU number
// LOCAL_RANK (or OMPI_COMM_WORLD_LOCAL_RANK) under a launcher, else `local_rank`, modulo the GPUs this process sees.
// Throws InvalidArgument for unknown names, Unsupported (exit 4) when apart has no CUDA or sees no GPU.
std::unique_ptr<Backend> make_backend(const BackendFlags& flags, int local_rank = 0);
// The per-step output `apart train` and `apart run` share: the step line (loss, throughput, step time, lr, gradient
// norm), with the elapsed training time and the ETA every --log-every steps and on the last, and --metrics
// FILE.jsonl: one JSON object per step, appended and flushed as each step ends (so a crashed or killed run keeps the
// steps it did).
struct StepLogFlags {
  int64_t log_every = 10;
  std::string metrics;
};
void add_step_log_flags(CLI::App& cmd, StepLogFlags& flags);

class StepLog {
 public:
  // `last_step`: the run's final step number (for the ETA). Checks --metrics before any work (never one of
  // `inputs`, a writable folder); the file is opened at the first step, by the one rank that logs.
  StepLog(const StepLogFlags& flags, const std::vector<InputFile>& inputs, int64_t last_step);
  ~StepLog();
  StepLog(const StepLog&) = delete;
  StepLog& operator=(const StepLog&) = delete;
  // "step=K loss=… samples/s=… tokens/s=… step_time=… lr=… grad_norm=…[ loss_scale=…][ elapsed=… eta=…]", and the
  // step's metrics object when --metrics is given. Throws SystemError when the metrics file cannot be written.
  std::string step(const StepRecord& s);

 private:
  StepLogFlags flags_;
  int64_t last_step_;
  double elapsed_s_ = 0;  // the steps' own seconds so far: training time, setup and checkpoints excluded
  int64_t steps_seen_ = 0;
  std::FILE* metrics_ = nullptr;
};

// What `apart train` and `apart run` both take for their training loop (each registers them with its own help).
struct LoopFlags {
  std::string model;
  LossFlags loss;
  int64_t steps = 100;
  TrainingFlags training;
  BackendFlags backend;
  std::string checkpoint_dir;
  int64_t save_every = 0;
  int64_t keep_last = 1;
  std::string resume;
  std::string save_model;
  bool quiet = false;
  StepLogFlags log;
};
// The training loop's options from those flags (all but the loss, whose added loss each command puts elsewhere),
// notes and warnings to stderr.
void fill_loop_options(const LoopFlags& flags, TrainingLoopOptions& options);

// " loss_scale=S" (and " skipped" for a step an inf/NaN gradient skipped) for a step line under loss scaling, else "".
std::string loss_scale_note(const StepRecord& step);
// Says on stderr, once per process, the backend in use and the ops that run on the CPU kernel for want of one of
// its own (nothing on the CPU backend).
void note_backend(const std::string& description, const std::vector<std::string>& fallback_ops);

}  // namespace apart::cli
