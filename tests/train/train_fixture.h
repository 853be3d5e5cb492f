// What the apart train suites share: the zoo's mlp-tiny written to a folder, and the cosine AdamW run their resume
// tests make of it.
#pragma once

#include <cstdint>
#include <filesystem>

#include "models/zoo.h"
#include "train/trainer.h"

namespace apart::testing {

// dir/mlp.onnx: the zoo's mlp-tiny, with a symbolic batch.
inline std::filesystem::path write_mlp(const std::filesystem::path& dir) {
  models::write_zoo_model(models::options_for("mlp-tiny"), (dir / "mlp.onnx").string());
  return dir / "mlp.onnx";
}

// `steps` AdamW steps (lr 5e-3, weight decay 0.01) at batch 2 on a cosine schedule with 2 warm-up steps, from
// random weights: a schedule whose every step differs, so a resume that lost its place would show.
inline TrainOptions cosine_run(const std::filesystem::path& model, int64_t steps) {
  TrainOptions o;
  o.model = model.string();
  o.batch = 2;
  o.steps = steps;
  o.optimizer.kind = Optimizer::kAdamW;
  o.optimizer.weight_decay = 0.01;
  o.optimizer.lr = 5e-3;
  o.schedule.kind = LrScheduleKind::kCosine;
  o.schedule.warmup_steps = 2;
  o.init = ParamInit::kRandom;
  return o;
}

}  // namespace apart::testing
