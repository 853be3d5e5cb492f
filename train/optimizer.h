// Optimizers (SGD, momentum, Adam, AdamW with PyTorch semantics), global-norm clipping and learning-rate
// schedules, applied as a runtime step to param tensors in place (docs/training.md says why not in-graph).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "plan/training.h"
#include "runtime/backend.h"
#include "runtime/tensor.h"

namespace apart {

struct OptimizerOptions {
  Optimizer kind = Optimizer::kAdamW;  // the training vocabulary (plan/training.h)
  double lr = 3e-4;            // the peak rate; the schedule scales it per step
  double weight_decay = 0.0;   // SGD/momentum/Adam: L2 added to the gradient; AdamW: decoupled (p *= 1 − lr·wd)
  double momentum = 0.9;       // kMomentum (torch.optim.SGD momentum, dampening 0)
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // Adam/AdamW
  double clip_grad_norm = 0;   // > 0: scale all gradients so their global L2 norm is at most this
  void validate() const;       // InvalidArgument naming the flag
};

enum class LrScheduleKind { kConstant, kCosine };
LrScheduleKind parse_lr_schedule(std::string_view text);  // "constant" | "cosine"

// constant: lr. cosine: linear warmup from lr/warmup to lr over `warmup_steps`, then cosine decay to
// min_lr_ratio·lr at `total_steps` (nanoGPT / Chinchilla); steps past the end stay at the minimum.
struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  double min_lr_ratio = 0.1;
  // The rate for 0-based step `step` given the peak rate.
  double lr_at(int64_t step, double peak_lr) const;
};

// Global L2 norm of `grads`, and scales them in place (torch.nn.utils.clip_grad_norm_: coefficient
// max_norm / (norm + 1e-6), applied only when below 1). Returns the norm before clipping. The gradients are
// `backend`'s tensors; it does the arithmetic (Backend::sum_of_squares, Backend::scale).
double clip_grad_norm(std::vector<Tensor*>& grads, double max_norm, Backend& backend = cpu_backend());
// The two halves of it, for gradients spread over ranks: the sum of squares of some gradients (in double, in
// order), and the scaling by the global norm of all of them.
double grad_sum_of_squares(const std::vector<Tensor*>& grads, Backend& backend = cpu_backend());
void scale_to_max_norm(std::vector<Tensor*>& grads, double norm, double max_norm, Backend& backend = cpu_backend());

// The optimizer run on the params: state per param (exp_avg/exp_avg_sq or momentum_buffer), created zero on first
// use in `backend`'s memory, where the params and gradients live too; the backend does the arithmetic
// (Backend::optimizer_step: one multi-tensor launch on a GPU). Not `Optimizer`: in namespace apart that is the
// vocabulary's enum of which optimizer (plan/training.h).
class ParamOptimizer {
 public:
  ParamOptimizer(OptimizerOptions options, std::vector<std::string> param_names, Backend& backend = cpu_backend());

  // One update of params[i] by grads[i] (float32 tensors of equal shapes, in param_names order) at
  // rate `lr`. Clips first when options.clip_grad_norm > 0 (grads are scaled in place), by `global_norm` when
  // given (the norm over every rank's gradients), else by the norm of `grads`.
  // Returns the gradients' global norm before clipping.
  double step(const std::vector<Tensor*>& params, std::vector<Tensor*>& grads, double lr,
              std::optional<double> global_norm = std::nullopt);

  // Creates the state of params that have none yet (zero, in the backend's memory); step() does it on first use.
  // Called before the first step, so that the state takes no block the step's own copies left in the backend's pool.
  void prepare(const std::vector<Tensor*>& params);

  const OptimizerOptions& options() const { return options_; }
  int64_t steps_taken() const { return step_; }
  // State tensors named "<param>/<slot>" (slots: momentum_buffer; exp_avg, exp_avg_sq) for checkpoints: the
  // backend's tensors (write_checkpoint copies them to the host).
  std::vector<std::pair<std::string, Tensor*>> state();
  // Restores after construction: the step count and the state tensors by name (host or the backend's; host ones are
  // copied to the backend; shapes checked by the caller).
  void restore(int64_t steps_taken, std::vector<std::pair<std::string, Tensor>> state);
  // Bytes of optimizer state per param byte (0, 1 or 2).
  static int slots(Optimizer kind);

 private:
  OptimizerOptions options_;
  Backend* backend_;
  std::vector<std::string> names_;
  std::vector<std::vector<Tensor>> state_;  // by param, by slot
  int64_t step_ = 0;
};

}  // namespace apart
