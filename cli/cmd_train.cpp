// `apart train`: trains an ONNX model in one process (autodiff + executor + optimizer, on the CPU or a GPU), printing
// each step.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/cli_common.h"
#include "cli/command_registry.h"
#include "cli/training_flags.h"
#include "graph/error.h"
#include "train/preemption.h"
#include "train/trainer.h"

namespace apart::cli {
namespace {

struct TrainArgs : LoopFlags {
  ModelFlags model_flags;
  int64_t batch = 8;
};

void run_train(const TrainArgs& a) {
  TrainOptions o;
  fill_loop_options(a, o);
  o.import = import_options(a.model_flags);
  o.loss = apply_loss_flags(a.loss, LossFlagUse::kFormOrOutput, o.import.loss);
  o.batch = a.batch;

  apply_threads(a.training.threads);
  const std::unique_ptr<Backend> backend = make_backend(a.backend);
  o.backend = backend.get();
  if (!backend) note_blas_kernel();
  StepLog log(a.log, {{"the model", a.model}}, a.steps);
  const StopSignals stop_signals;  // SIGTERM/SIGINT/SIGUSR1: finish the step, checkpoint it, exit 75
  const TrainResult r = train(o, [&](const StepRecord& s) {
    const std::string line = log.step(s);
    if (!a.quiet) std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  });
  if (backend) note_backend(r.backend, r.fallback_ops);
  if (r.stopped_by_signal) {
    const long long at = static_cast<long long>(r.steps.empty() ? r.first_step : r.steps.back().step);
    if (a.checkpoint_dir.empty())
      std::fprintf(stderr, "apart train: stopped by %s after step %lld of %lld; no --checkpoint-dir was given, so "
                   "nothing was saved\n", stop_signal_name(r.stopped_by_signal), at, static_cast<long long>(a.steps));
    else
      std::fprintf(stderr, "apart train: stopped by %s after step %lld of %lld; checkpoint of step %lld: %s\n"
                   "resume with: %s\n", stop_signal_name(r.stopped_by_signal), at, static_cast<long long>(a.steps), at,
                   a.checkpoint_dir.c_str(), resume_command(a.checkpoint_dir).c_str());
    throw StoppedBySignal("stopped by a signal");
  }
  if (r.steps.empty()) {
    std::printf("apart train: nothing to do (the checkpoint is at step %lld of %lld)\n",
                static_cast<long long>(r.first_step), static_cast<long long>(a.steps));
    return;
  }
  double tail = 0;
  const size_t k = std::min<size_t>(5, r.steps.size());
  for (size_t i = r.steps.size() - k; i < r.steps.size(); ++i) tail += r.steps[i].loss;
  std::printf("trained %s params (%lld tensors) for steps %lld..%lld at batch %lld: loss %.4f -> %.4f (mean of last %zu: %.4f), "
              "%s samples/s, %.2f s (+%.2f s setup); data: %s\n",
              format_count(static_cast<double>(r.params)).c_str(), static_cast<long long>(r.param_tensors),
              static_cast<long long>(r.first_step + 1), static_cast<long long>(r.steps.back().step),
              static_cast<long long>(a.batch), r.steps.front().loss, r.steps.back().loss, k, tail / static_cast<double>(k),
              format_significant(r.samples_per_s).c_str(), r.seconds, r.setup_seconds, r.data_description.c_str());
  if (!a.checkpoint_dir.empty()) std::printf("checkpoint: %s\n", a.checkpoint_dir.c_str());
  if (!a.save_model.empty()) std::printf("trained model: %s\n", a.save_model.c_str());
}

const bool kRegistered = register_command({"train", 60, [](CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train an ONNX model with a scalar loss in one process (CPU or --backend cuda; docs/training.md)");
  cmd->add_option("model", args->model, "ONNX model with a scalar loss output")->required();
  add_model_flags(*cmd, args->model_flags);
  add_loss_flags(*cmd, args->loss, LossFlagUse::kFormOrOutput);
  cmd->add_option("--steps", args->steps, "Optimizer steps")->capture_default_str();
  cmd->add_option("--batch", args->batch, "Samples per step: binds the model's batch dim (a dim named batch, batch_size or N, else the first "
                  "input's leading dim; unnamed leading dims of other inputs too); a --dim/--shape of another size is an error")->capture_default_str();
  add_training_flags(*cmd, args->training, "sgd, momentum, adam or adamw (torch.optim semantics; default adamw)");
  add_backend_flags(*cmd, args->backend);
  cmd->add_option("--checkpoint-dir", args->checkpoint_dir, "Write params + optimizer state + step here (at the end, and --save-every)");
  cmd->add_option("--save-every", args->save_every, "Also checkpoint every N steps");
  cmd->add_option("--keep-last", args->keep_last,
                  "Keep the latest N checkpoints: checkpoint.apart and the N - 1 before it as checkpoint.step_K.apart; "
                  "older ones this run wrote are deleted, each announced")->capture_default_str();
  cmd->add_option("--resume", args->resume, "Continue from this checkpoint directory");
  cmd->add_option("--save-model", args->save_model, "Write the trained weights into a copy of the model (ONNX)");
  add_step_log_flags(*cmd, args->log);
  cmd->add_flag("-q,--quiet", args->quiet, "Print only the summary");
  cmd->callback([args] { run_train(*args); });
}});

}  // namespace
}  // namespace apart::cli
