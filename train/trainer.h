// Single-process training: import the model at the batch size, build its training graph
// (codegen/autodiff.h), run it on the executor of a backend (the CPU by default), and step the optimizer on the
// executor's params there.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "importer/importer.h"
#include "runtime/backend.h"
#include "train/data.h"
#include "runtime/half_precision.h"
#include "train/loss_scale.h"
#include "train/optimizer.h"

namespace onnx {
class ModelProto;
}

namespace apart {

enum class ParamInit { kModel, kRandom };
ParamInit parse_param_init(std::string_view text);  // "model" | "random"

// The training loop's options, one struct for `apart train` (TrainOptions) and `apart run` (RunOptions,
// train/pipeline.h): the steps, the optimizer and its schedule, the data, checkpoints and what is written at the end.
struct TrainingLoopOptions {
  std::string model;              // train: the forward ONNX file; run: the plan's model ("" = plan.json's model.path)
  std::string loss;               // --loss: the graph output to minimise; "" = the only scalar float output
  int64_t steps = 100;            // total steps (a resumed run continues to this count)
  OptimizerOptions optimizer;
  // total_steps (--lr-schedule-steps): the steps the schedule spans; 0: `steps`, or resumed, the checkpoint's run's
  // (resumed_lr_schedule_steps), so that a longer --steps does not re-stretch a schedule already under way.
  LrSchedule schedule;
  DataOptions data;               // data.seed is taken from `seed`
  ParamInit init = ParamInit::kModel;
  uint64_t seed = 0;
  // "" = no checkpoints; else written at the end, every save_every steps and at a stop request (train/preemption.h).
  std::string checkpoint_dir;
  int64_t save_every = 0;         // also every N steps (0: only at the end)
  // How many checkpoints stay: the latest and the keep_last - 1 before it this run wrote (train: DIR/checkpoint.apart
  // and DIR/checkpoint.step_K.apart; run: DIR/step_N folders); older ones this run wrote are deleted, announced.
  int64_t keep_last = 1;
  std::string resume;             // a checkpoint (folder) to continue from
  std::string save_model;         // write the trained weights into a copy of the model here
  // Where tensors live and kernels run (not owned; nullptr: the CPU backend). On a device backend params, gradients
  // and optimizer state stay there; the loss comes back each step, the weights only for checkpoints and --save-model.
  Backend* backend = nullptr;
  // Dynamic loss scaling (on under --precision fp16): the backward runs on the loss times the scale, gradients are
  // unscaled before the step, and a step with an inf/NaN gradient is skipped (train/loss_scale.h).
  LossScaleOptions loss_scale;
  // Told what the user should know: what import learnt (constant_params_note), each checkpoint written or deleted,
  // a resume's schedule decision (run: on world rank 0); on_warning: what the user should act on (a checkpoint
  // without checksums).
  std::function<void(const std::string&)> on_note;
  std::function<void(const std::string&)> on_warning;
  void validate() const;  // InvalidArgument naming the flag: the checks both commands share
};

struct TrainOptions : TrainingLoopOptions {
  ImportOptions import;  // --dim/--shape; the batch dim of every input is bound to `batch`
  int64_t batch = 8;
  void validate() const;          // InvalidArgument naming the flag
};

struct StepRecord {
  int64_t step = 0;         // 1-based: the number of updates done after this step
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;     // global L2 norm before clipping
  double seconds = 0;       // wall time of the step: data, forward + backward, optimizer
  double samples_per_s = 0;
  double tokens_per_s =
      0;  // samples/s × tokens_per_sample of the step's batch (train/data.h); 0: not a sequence model
  double loss_scale = 0;    // the scale this step's backward ran at (0: no loss scaling)
  bool skipped = false;     // an inf/NaN gradient under loss scaling: no update, the scale backed off
};

struct TrainResult {
  std::vector<StepRecord> steps;   // the steps this run did (not those before a resume)
  int64_t first_step = 0;          // 0, or the checkpoint's step when resumed
  int64_t params = 0;              // trained parameter values
  int64_t param_tensors = 0;
  double seconds = 0;              // all steps
  double samples_per_s = 0;        // batch × steps / seconds
  double setup_seconds = 0;        // import, autodiff, executor construction
  std::string data_description;
  int64_t arena_bytes = 0;         // the executor's activation arena
  std::string backend;             // Backend::describe()
  std::vector<std::string> fallback_ops;  // ops run on the CPU kernel for want of a backend kernel (Executor)
  ConstantParams constant_params;  // Constant nodes trained as params (ImportOptions::constants_as_params)
  HalfWidening half_widening;      // what a float16/bfloat16 model had widened to float32 (runtime/half_precision.h)
  // The signal that stopped the run after steps.back() (train/preemption.h stop_requested), its checkpoint written
  // when there is a checkpoint_dir; 0: it ran to options.steps.
  int stopped_by_signal = 0;
};

using StepCallback = std::function<void(const StepRecord&)>;

// The steps a resumed run's learning-rate schedule spans: `schedule.total_steps` when the user gave it
// (--lr-schedule-steps), else `checkpoint_steps` (the span the checkpoint's run had). `on_note` is told when the two
// differ, or when the kept span is not this run's `steps`, for a schedule whose rate depends on it (cosine).
int64_t resumed_lr_schedule_steps(const LrSchedule& schedule, int64_t steps, int64_t checkpoint_steps,
                                  const std::function<void(const std::string&)>& on_note);

// Trains; calls `on_step` after every step. A stop request (train/preemption.h) ends it after the step it came in,
// that step checkpointed (TrainResult::stopped_by_signal). Throws InvalidArgument (flags, data, checkpoint mismatch),
// InvalidModel, Unsupported (ops without gradient rules or kernels), Infeasible (loss became NaN/inf).
// Refuses (Infeasible, saying what it needs) before any weight is allocated when fp32 weights + gradients +
// optimizer state of `graph`'s float params and its activations exceed `available_bytes` (0: unknown, no check).
void check_training_memory(const TaskGraph& graph, const TrainOptions& options, int64_t available_bytes);
// MemAvailable from /proc/meminfo (else the free physical pages), in bytes; 0 when unknown.
int64_t available_memory_bytes();

TrainResult train(const TrainOptions& options, const StepCallback& on_step = {});

// --init random: normal(0, 0.02) for matrices, Kaiming normal (fan_in, ReLU gain) for 4-D conv weights, ones for 1-D
// scales (LayerNorm/BatchNorm weight), zeros for other 1-D params (biases). Seeded per name, so a param gets the
// same values in the whole model and in any stage file cut from it. Float16/bfloat16 initializers get float32 values
// (they are float32 master weights in training).
void randomize_params(onnx::ModelProto& proto, uint64_t seed);

}  // namespace apart
