// The training flags `apart train` and `apart run` share (optimizer, learning-rate schedule, data, init, seed):
// one declaration of each flag and one translation into the runtime's options.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/trainer.h"

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
  std::string data = "synthetic";
  std::string data_dtype = "uint16";
  std::string init = "model";
  uint64_t seed = 0;
  int threads = 0;  // 0: the default (apply_threads)
};

// Adds --optimizer … --seed to `cmd`. `optimizer_help` says what the default is (train: adamw; run: the plan's).
void add_training_flags(CLI::App& cmd, TrainingFlags& flags, const std::string& optimizer_help);

// Sets the kernels' thread count (runtime/kernel.h set_compute_threads): `threads` when given (> 0), else
// APART_NUM_THREADS or OMP_NUM_THREADS when set, else the cores divided among `ranks_sharing_cores` (the ranks of
// this node; at least 1 thread each). Returns the count set. InvalidArgument naming --threads or the variable.
int apply_threads(int threads, int ranks_sharing_cores = 1);
// `--threads N` (0 = the default above) on `cmd`.
void add_threads_flag(CLI::App& cmd, int& threads);

// The flags as runtime options. Throws InvalidArgument naming the flag.
OptimizerOptions optimizer_options(const TrainingFlags& flags);
LrSchedule lr_schedule(const TrainingFlags& flags);
DataOptions data_options(const TrainingFlags& flags);

}  // namespace apart::cli
