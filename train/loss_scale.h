// Dynamic loss scaling for float16 mixed precision (PyTorch's torch.cuda.amp.GradScaler, whose defaults these are):
// the loss's gradient seed is the scale S instead of 1, so that the backward's float16 values keep small gradients
// above float16's underflow; the gradients are divided by S before the step; a step whose gradients hold an inf or
// a NaN (S too large: a value past 65504) is skipped on every rank and S halves; after `growth_interval` clean steps
// in a row S doubles. The state (S and the clean-step count) goes into checkpoints, so a resumed run scales as an
// uninterrupted one.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

#include "runtime/tensor.h"

namespace apart {

// The graph input that carries the loss's gradient seed when loss scaling is on (TrainingGraphOptions::loss_seed_input).
inline constexpr const char* kLossScaleInput = "apart.loss_scale";

struct LossScaleOptions {
  bool enabled = false;            // on under --precision fp16 (bf16 has float32's range: no scaling)
  double init_scale = 65536.0;     // --loss-scale-init: 2^16
  double growth_factor = 2.0;      // --loss-scale-growth: S *= it after growth_interval clean steps
  double backoff_factor = 0.5;     // --loss-scale-backoff: S *= it on a step with an inf/NaN gradient
  int64_t growth_interval = 2000;  // --loss-scale-interval
  void validate() const;           // InvalidArgument naming the flag and its range
  // Enabled, with torch's factors and these two numbers.
  static LossScaleOptions on(double init_scale = 65536.0, int64_t growth_interval = 2000) {
    LossScaleOptions o;
    o.enabled = true;
    o.init_scale = init_scale;
    o.growth_interval = growth_interval;
    return o;
  }
};

// The scale's state machine (torch's _amp_update_scale_): pure, so that every rank holding the same global
// overflow flag makes the same decision.
class LossScaler {
 public:
  explicit LossScaler(const LossScaleOptions& options);
  double scale() const { return scale_; }          // what the loss seed is this step (1 when disabled)
  int64_t clean_steps() const { return clean_steps_; }
  bool enabled() const { return options_.enabled; }
  // After a step's gradients were checked over every rank: whether the step is taken (no inf/NaN). Backs the scale
  // off on an overflow (resetting the clean count), grows it after growth_interval clean steps in a row (unless that
  // would pass 2^64). An overflow at the least scale (2^-24) is Infeasible: the run diverged, whatever the scale.
  bool update(bool overflow);
  // A checkpoint's state; InvalidArgument unless scale is positive and finite and clean_steps in [0, interval).
  void restore(double scale, int64_t clean_steps);
  // The state in a checkpoint's meta ("loss_scale", "loss_scale_clean_steps"; nothing when disabled), and back: a
  // checkpoint without it (written without loss scaling) leaves the initial scale.
  void save(nlohmann::json& meta) const;
  void load(const nlohmann::json& meta);
  // The seed tensor fed as kLossScaleInput: the scale times `factor`, in the loss's shape (float32, host memory; the
  // executor copies it to a device backend as it does every input). apart run passes 1/(micro-batches × replicas),
  // so that a micro-batch's gradients have the whole batch's magnitudes and overflow where apart train's do.
  Tensor seed(const std::vector<int64_t>& loss_shape, double factor = 1) const;

 private:
  LossScaleOptions options_;
  double scale_ = 1;
  int64_t clean_steps_ = 0;
};

}  // namespace apart
