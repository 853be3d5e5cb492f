// Dynamic loss scaling: the options' ranges and the scale's state machine (loss_scale.h).
#include "train/loss_scale.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "graph/checked.h"
#include "graph/error.h"

namespace apart {

namespace {
// The range a scale may take: float16's least subnormal's reciprocal covers every useful scale; 2^64 is far past
// what a float16 gradient can stand (torch's default 2^16 is already near overflow for most models).
constexpr double kMinScale = 0x1p-24, kMaxScale = 0x1p64;
}  // namespace

void LossScaleOptions::validate() const {
  checked_number(init_scale, kMinScale, kMaxScale, "--loss-scale-init");
  if (!(growth_factor > 1) || !(growth_factor <= 65536))
    throw InvalidArgument("--loss-scale-growth must be above 1 and at most 65536 (torch's default: 2), got " +
                          std::to_string(growth_factor));
  if (!(backoff_factor > 0) || !(backoff_factor < 1))
    throw InvalidArgument("--loss-scale-backoff must be above 0 and below 1 (torch's default: 0.5), got " +
                          std::to_string(backoff_factor));
  checked_integer(growth_interval, 1, limits::kMaxSteps, "--loss-scale-interval");
}

LossScaler::LossScaler(const LossScaleOptions& options) : options_(options) {
  if (options_.enabled) {
    options_.validate();
    scale_ = options_.init_scale;
  }
}

bool LossScaler::update(bool overflow) {
  if (!options_.enabled) return !overflow;
  if (overflow) {
    if (scale_ <= kMinScale)  // not the scale's doing: the loss or a gradient is inf/NaN at any scale
      throw Infeasible("training diverged: a gradient is not finite even at the least loss scale 2^-24; lower --lr or "
                       "set --clip-grad-norm");
    scale_ = std::max(scale_ * options_.backoff_factor, kMinScale);
    clean_steps_ = 0;
    return false;
  }
  if (++clean_steps_ == options_.growth_interval) {
    clean_steps_ = 0;
    const double grown = scale_ * options_.growth_factor;
    if (std::isfinite(grown) && grown <= kMaxScale) scale_ = grown;
  }
  return true;
}

void LossScaler::restore(double scale, int64_t clean_steps) {
  if (!options_.enabled) return;
  if (!(scale >= kMinScale && scale <= kMaxScale))
    throw InvalidArgument("the checkpoint's loss scale " + std::to_string(scale) + " is not a scale (2^-24 … 2^64)");
  checked_integer(clean_steps, 0, options_.growth_interval - 1, "the checkpoint's loss_scale_clean_steps");
  scale_ = scale;
  clean_steps_ = clean_steps;
}

void LossScaler::save(nlohmann::json& meta) const {
  if (!options_.enabled) return;
  meta["loss_scale"] = scale_;
  meta["loss_scale_clean_steps"] = clean_steps_;
}

void LossScaler::load(const nlohmann::json& meta) {
  if (!options_.enabled || !meta.contains("loss_scale")) return;
  const auto& s = meta["loss_scale"];
  const auto& n = meta.value("loss_scale_clean_steps", nlohmann::json(0));
  if (!s.is_number() || !n.is_number_integer())
    throw InvalidArgument("the checkpoint's loss_scale / loss_scale_clean_steps are not numbers");
  restore(s.get<double>(), n.get<int64_t>());
}

Tensor LossScaler::seed(const std::vector<int64_t>& loss_shape, double factor) const {
  Tensor host(DType::kFloat32, loss_shape);
  for (float& v : host.span<float>()) v = static_cast<float>(scale_ * factor);
  return host;
}

}  // namespace apart
