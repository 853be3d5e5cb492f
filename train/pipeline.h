// One rank's share of a plan, carried out: the stage's forward and backward per micro-batch in the schedule's
// order, activations and gradients to and from the neighbouring stages, the replicas' bucketed gradient
// all-reduce overlapped with the last backward, and one optimizer step across all ranks (`apart run`).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "train/trainer.h"
#include "schedule/schedule.h"

namespace apart {

// The training loop's options (train/trainer.h TrainingLoopOptions), read as apart run reads them: `model` is the
// model the plan was made for ("" = plan.json's model.path; its sha256 must match); `optimizer.kind` is the plan's
// unless optimizer_from_plan is false; checkpoints: every rank writes DIR/step_N/rank_R.apart (its params, optimizer
// state, BatchNorm statistics; the data cursor and random state are the step and the seed), then rank 0 writes
// DIR/manifest.json through a temporary, fsync and rename (docs/runtime.md, "Checkpoints"): a crash mid-save leaves
// the previous one usable; each complete step folder is resumable alone. `backend`: this rank's backend, its
// executors, accumulated gradients and optimizer run there; without device_world messages and all-reduces stay on
// the host. `loss_scale` (--precision fp16): the loss stage seeds its backward with the scale, every rank unscales,
// and a step with an inf/NaN gradient on any rank is skipped on every rank (the flag rides the step's world
// all-reduce). on_note / on_warning: told on world rank 0, from the rank's thread.
struct RunOptions : TrainingLoopOptions {
  std::string plan;  // the plan folder `apart partition` wrote (plan.json, stage_K.onnx, weights/)
  // --loss cross_entropy --labels NAME: must be the loss the plan appended (plan.json model.added_loss), which the run
  // appends anyway; given, it only checks that the plan has it.
  AddedLoss added_loss;
  bool optimizer_from_plan = true;  // else the flags' optimizer.kind
  std::string trace;              // world rank 0 writes the measured timeline here (plan/trace.h's Chrome trace)
  bool trace_all_steps = false;   // every step in the trace, not only the last
  // A communicator over the same world that moves `backend`'s memory (NCCL, made with make_nccl_communicator; not
  // owned; nullptr: none). With it the stage boundaries' messages are packed on the backend and sent over it (each
  // send grouped with the next receive: train/message_transport.h), and without ZeRO the buckets' all-reduce runs
  // over its split of the replicas on device buffers; everything else (ZeRO's collectives, tied params, the step's
  // world all-reduce, checkpoints, --save-model, TP) stays on `world`. Not used for interleaved plans' messages.
  Communicator* device_world = nullptr;
  void validate() const;          // InvalidArgument naming the flag
};

struct RunResult {
  RankRole role;
  int world = 1;
  bool reports = false;            // this rank is the loss stage's first replica (the one that prints)
  std::vector<StepRecord> steps;   // the steps this run did; every rank knows each step's loss and gradient norm
  int64_t first_step = 0;          // 0, or the checkpoint's step when resumed
  // A stop request ended the run after steps.back() (train/preemption.h), that step checkpointed where there is a
  // checkpoint_dir: the signal this process received, -1 when only another rank received one; 0: it ran to the end.
  int stopped_by_signal = 0;
  int64_t params = 0;              // parameter elements this rank trains
  int64_t param_tensors = 0;
  double seconds = 0;              // all steps
  double samples_per_s = 0;        // global batch × steps / seconds
  double setup_seconds = 0;        // reading the plan and the stage, autodiff, executors
  std::string data_description;
  int64_t arena_bytes = 0;         // the largest of the stage's passes' memory plans (they run without an arena)
  // What this rank keeps between steps: its trained params (whole, or under ZeRO-3 its pieces of the sharded ones:
  // 1/replicas, each gathered whole only for a task that reads it), the optimizer state it steps (1/replicas
  // of the stage's under ZeRO ≥ 1) and its gradient accumulators (whole, or 1/replicas of them under ZeRO-2/3).
  int64_t param_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  int64_t gradient_bytes = 0;
  int zero = 0;                    // the ZeRO stage this rank ran (the plan's, 0 for a stage without replicas)
  // The most tensor memory this process held during the steps (runtime/tensor.h tensor_memory: params, state,
  // gradients, arenas, stash and messages' tensors; ranks run in-process share the count), and the plan's estimate
  // for one device of this rank's stage (plan.json memory_bytes; 0 when absent).
  int64_t peak_tensor_bytes = 0;
  int64_t planned_memory_bytes = 0;
  std::string backend;             // Backend::describe() of this rank's backend
  std::vector<std::string> fallback_ops;  // ops its executors run on the CPU kernel for want of a backend kernel
  // Tensor-parallel regions this rank's stage computes whole on every TP rank: a stage boundary cuts them
  // (codegen/tensor_parallel_shard.h TpShard::replicated); in an interleaved plan every chunk's, each "chunk C: …".
  std::vector<std::string> tp_whole_regions;
};

// Runs `options.steps` steps of the plan as rank world.rank() of world.size(). Every rank calls it with the same
// options. Throws InvalidArgument / InvalidModel before any communication when the plan, the model or the flags
// do not fit (the same error on every rank), Infeasible naming the step, stage and rank when the loss or a
// gradient is not finite (on every rank), CommError when another rank failed. An error raised on one rank alone
// aborts `world`, so that no rank waits for it.
// `run` is the result so far (role, world, reports and the steps done), `step` the step just done.
using RunStepCallback = std::function<void(const RunResult& run, const StepRecord& step)>;
RunResult run_plan(const RunOptions& options, Communicator& world, const RunStepCallback& on_step = {});

}  // namespace apart
