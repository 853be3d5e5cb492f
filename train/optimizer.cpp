// The optimizer's state, step count and clipping; the update itself is the backend's (Backend::optimizer_step: on the
// CPU torch.optim's single-tensor ("foreach=False") loops, in float32).
#include "train/optimizer.h"

#include <cmath>
#include <map>
#include <numbers>

#include "graph/error.h"

namespace apart {

LrScheduleKind parse_lr_schedule(std::string_view text) {
  if (text == "constant") return LrScheduleKind::kConstant;
  if (text == "cosine") return LrScheduleKind::kCosine;
  throw InvalidArgument("--lr-schedule: unknown schedule '" + std::string(text) + "' (use constant or cosine)");
}

void OptimizerOptions::validate() const {
  auto finite_nonneg = [](double v) { return std::isfinite(v) && v >= 0; };
  if (!std::isfinite(lr) || lr <= 0) throw InvalidArgument("--lr must be a positive number");
  if (!finite_nonneg(weight_decay)) throw InvalidArgument("--weight-decay must be >= 0");
  if (!std::isfinite(momentum) || momentum < 0 || momentum >= 1) throw InvalidArgument("--momentum must be in [0, 1)");
  if (!std::isfinite(beta1) || beta1 < 0 || beta1 >= 1 || !std::isfinite(beta2) || beta2 < 0 || beta2 >= 1)
    throw InvalidArgument("--betas must both be in [0, 1), e.g. --betas 0.9,0.999");
  if (!std::isfinite(eps) || eps <= 0) throw InvalidArgument("--eps must be positive");
  if (!finite_nonneg(clip_grad_norm)) throw InvalidArgument("--clip-grad-norm must be >= 0 (0 = off)");
}

double LrSchedule::lr_at(int64_t step, double peak_lr) const {
  if (kind == LrScheduleKind::kConstant) return peak_lr;
  if (step < warmup_steps) return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const double min_lr = min_lr_ratio * peak_lr;
  const int64_t decay_steps = total_steps - warmup_steps;
  if (decay_steps <= 0 || step >= total_steps) return decay_steps <= 0 ? peak_lr : min_lr;
  const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps);
  return min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) * (peak_lr - min_lr);
}

double grad_sum_of_squares(const std::vector<Tensor*>& grads, Backend& backend) {
  std::vector<const Tensor*> xs(grads.begin(), grads.end());
  return backend.sum_of_squares(xs);
}

void scale_to_max_norm(std::vector<Tensor*>& grads, double norm, double max_norm, Backend& backend) {
  if (max_norm <= 0) return;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return;
  for (Tensor* g : grads) backend.scale(*g, coef);
}

double clip_grad_norm(std::vector<Tensor*>& grads, double max_norm, Backend& backend) {
  const double norm = std::sqrt(grad_sum_of_squares(grads, backend));
  scale_to_max_norm(grads, norm, max_norm, backend);
  return norm;
}

int ParamOptimizer::slots(Optimizer kind) {
  switch (kind) {
    case Optimizer::kSgd: return 0;
    case Optimizer::kMomentum: return 1;
    case Optimizer::kAdam:
    case Optimizer::kAdamW: return 2;
  }
  return 0;
}

namespace {
const char* slot_name(Optimizer kind, int slot) {
  if (kind == Optimizer::kMomentum) return "momentum_buffer";
  return slot == 0 ? "exp_avg" : "exp_avg_sq";
}
}  // namespace

ParamOptimizer::ParamOptimizer(OptimizerOptions options, std::vector<std::string> param_names, Backend& backend)
    : options_(options), backend_(&backend), names_(std::move(param_names)), state_(names_.size()) {
  options_.validate();
}

double ParamOptimizer::step(const std::vector<Tensor*>& params, std::vector<Tensor*>& grads, double lr,
                           std::optional<double> global_norm) {
  APART_CHECK(params.size() == names_.size() && grads.size() == names_.size(), "optimizer: param/grad count");
  for (size_t i = 0; i < params.size(); ++i) {
    APART_CHECK(params[i]->dtype() == DType::kFloat32 && grads[i]->dtype() == DType::kFloat32,
                "optimizer: float32 params only: " + names_[i]);
    APART_CHECK(params[i]->elements() == grads[i]->elements(), "optimizer: grad size differs for " + names_[i]);
  }
  double norm = 0;
  if (global_norm) {
    norm = *global_norm;
    scale_to_max_norm(grads, norm, options_.clip_grad_norm, *backend_);
  } else {
    norm = clip_grad_norm(grads, options_.clip_grad_norm, *backend_);
  }
  ++step_;
  prepare(params);
  std::vector<Tensor*> states;
  for (auto& st : state_)
    for (Tensor& t : st) states.push_back(&t);
  OptimizerUpdate update;
  update.kind = options_.kind;
  update.lr = lr;
  update.weight_decay = options_.weight_decay;
  update.momentum = options_.momentum;
  update.beta1 = options_.beta1;
  update.beta2 = options_.beta2;
  update.eps = options_.eps;
  update.nesterov = options_.nesterov;
  update.step = step_;
  backend_->optimizer_step(update, params, grads, states);
  return norm;
}

void ParamOptimizer::prepare(const std::vector<Tensor*>& params) {
  APART_CHECK(params.size() == names_.size(), "optimizer: param count");
  const int n_slots = slots(options_.kind);
  for (size_t i = 0; i < params.size(); ++i) {
    auto& st = state_[i];
    if (static_cast<int>(st.size()) == n_slots) continue;
    st.clear();
    for (int s = 0; s < n_slots; ++s) st.push_back(backend_->empty(DType::kFloat32, params[i]->shape()));
  }
}

std::vector<std::pair<std::string, Tensor*>> ParamOptimizer::state() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (size_t i = 0; i < names_.size(); ++i)
    for (size_t s = 0; s < state_[i].size(); ++s)
      out.emplace_back(names_[i] + "/" + slot_name(options_.kind, static_cast<int>(s)), &state_[i][s]);
  return out;
}

void ParamOptimizer::restore(int64_t steps_taken, std::vector<std::pair<std::string, Tensor>> state) {
  std::map<std::string, Tensor> by_name(std::make_move_iterator(state.begin()), std::make_move_iterator(state.end()));
  const int n_slots = slots(options_.kind);
  step_ = steps_taken;
  for (size_t i = 0; i < names_.size(); ++i) {
    state_[i].clear();
    if (steps_taken == 0) continue;
    for (int s = 0; s < n_slots; ++s) {
      const std::string key = names_[i] + "/" + slot_name(options_.kind, s);
      auto it = by_name.find(key);
      if (it == by_name.end())
        throw InvalidArgument("checkpoint has no optimizer state '" + key + "' (saved with another --optimizer?)");
      state_[i].push_back(it->second.on_host() ? backend_->to_device(it->second) : std::move(it->second));
    }
  }
}

}  // namespace apart
