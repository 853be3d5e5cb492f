// Tied params: who holds them, and their gradients summed over the holders (see tied_params.h).
#include "train/tied_params.h"

#include <algorithm>
#include <span>

#include "graph/error.h"
#include "graph/text.h"

namespace apart {

namespace {

// Whether the stages holding a tied param differ in TP degree: their tie then sums whole-size gradients over every
// holder instead of each TP rank's slices over its own group.
bool mixed_tp_degrees(const PlanDocument& plan, const std::set<int>& stages) {
  std::set<int> degrees;
  for (int s : stages) degrees.insert(std::max(1, plan.stages[static_cast<size_t>(s)].tp));
  return degrees.size() > 1;
}

}  // namespace

std::map<std::string, std::set<int>> param_holders(const PlanDocument& plan, const TaskGraph& model,
                                                   const std::filesystem::path& plan_dir) {
  std::map<std::string, std::set<int>> holders;
  for (const PlanStageRecord& stage : plan.stages)
    for (const std::string& task : stage.tasks) {
      const auto t = model.find_task(task);
      if (!t)
        throw InvalidModel(plan_dir.string() + ": stage " + std::to_string(stage.id) + " names task " + quote(task) +
                           ", which the model does not have (another model?)");
      for (ValueId in : model.task(*t).inputs)
        if (in.valid() && model.value(in).kind == ValueKind::kParam) holders[model.value(in).name].insert(stage.id);
    }
  return holders;
}

StageTies::StageTies(const std::map<std::string, std::set<int>>& holders, int stage, const StageParams& params,
                     const std::map<std::string, TpShardedParam>& tp_sharded, const TaskGraph& model, RankRole role,
                     int tp, Backend& backend)
    : params_(params), tp_sharded_(tp_sharded), model_(model), role_(role), tp_(tp), backend_(backend) {
  std::map<std::set<int>, std::vector<std::string>> tied;
  for (const auto& [param, stages] : holders)
    if (stages.size() > 1) tied[stages].push_back(param);
  for (const auto& [stages, names] : tied) {
    plan_sets_.push_back(stages);
    if (stages.count(stage) == 0) continue;
    Tie tie;
    tie.stages = stages;
    for (const std::string& n : names)
      if (auto it = params_.index.find(n); it != params_.index.end()) tie.params.push_back(it->second);
    ties_.push_back(std::move(tie));
  }
}

std::vector<bool> StageTies::tied() const {
  std::vector<bool> flags(params_.size(), false);
  for (const Tie& tie : ties_)
    for (size_t i : tie.params) flags[i] = true;
  return flags;
}

int StageTies::layout(const std::set<int>& stages) const {
  for (const Tie& tie : ties_)
    if (tie.stages == stages)
      return std::any_of(tie.params.begin(), tie.params.end(),
                         [&](size_t i) { return tp_sharded_.count(params_.names[i]) > 0; });
  return -1;
}

std::vector<Tensor*> StageTies::gradients(const std::set<int>& stages) {
  std::vector<Tensor*> grads;
  for (const Tie& tie : ties_)
    if (tie.stages == stages)
      for (size_t i : tie.params) grads.push_back(&reducer_->grad(i));
  return grads;
}

void StageTies::add_into_whole(const std::set<int>& stages, std::vector<Tensor>& whole, bool on_device) {
  Backend& buffers = on_device ? backend_ : cpu_backend();  // where `whole` lives and is summed
  for (const Tie& tie : ties_) {
    if (tie.stages != stages) continue;
    whole.resize(tie.params.size());
    for (size_t k = 0; k < tie.params.size(); ++k) {
      const size_t i = tie.params[k];
      const std::string& name = params_.names[i];
      const auto id = model_.find_value(name);
      APART_CHECK(id.has_value(), "tied param " + name + " is not in the model");
      if (!whole[k].defined()) whole[k] = buffers.empty(DType::kFloat32, {model_.value(*id).elements});
      const auto cut = tp_sharded_.find(name);
      if (role_.replica != 0 || (cut == tp_sharded_.end() && role_.tp_rank != 0)) continue;
      const Tensor part = on_device ? reducer_->grad(i) : backend_.to_host(reducer_->grad(i));
      if (cut == tp_sharded_.end()) {
        APART_CHECK(part.elements() == whole[k].elements(), "tied param " + name + " is not whole");
        buffers.add_into(whole[k], part);
        continue;
      }
      for_each_tp_run(cut->second, tp_, role_.tp_rank, [&](int64_t whole_at, int64_t part_at, int64_t count) {
        Tensor to = whole[k].flat_range(whole_at, whole_at + count);
        buffers.add_into(to, part.flat_range(part_at, part_at + count));
      });
    }
  }
}

void StageTies::take_from_whole(const std::set<int>& stages, const std::vector<Tensor>& whole) {
  for (const Tie& tie : ties_) {
    if (tie.stages != stages) continue;
    for (size_t k = 0; k < tie.params.size(); ++k) {
      const size_t i = tie.params[k];
      Tensor& grad = reducer_->grad(i);
      const auto cut = tp_sharded_.find(params_.names[i]);
      if (cut == tp_sharded_.end()) {
        backend_.copy(whole[k], grad);
        continue;
      }
      for_each_tp_run(cut->second, tp_, role_.tp_rank, [&](int64_t whole_at, int64_t part_at, int64_t count) {
        Tensor to = grad.flat_range(part_at, part_at + count);
        backend_.copy(whole[k].flat_range(whole_at, whole_at + count), to);
      });
    }
  }
}

void RankTies::split(const std::vector<StageTies*>& stages, const RunSetup& setup, Communicator& world,
                     Communicator* device_world) {
  const std::vector<std::set<int>>& sets = stages.front()->plan_sets();
  std::vector<float> layouts(2 * sets.size(), 0.0f);  // per tie: [stages holding it cut, stages holding it whole]
  for (size_t k = 0; k < sets.size(); ++k)
    for (const StageTies* stage : stages)
      if (const int layout = stage->layout(sets[k]); layout >= 0) layouts[2 * k + (layout == 1 ? 0 : 1)] += 1;
  if (!sets.empty() && setup.tp > 1) world.allreduce_sum(std::span<float>(layouts))->wait();  // small counts: exact
  for (size_t k = 0; k < sets.size(); ++k) {
    const bool held =
        std::any_of(stages.begin(), stages.end(), [&](const StageTies* stage) { return stage->layout(sets[k]) >= 0; });
    const bool whole = mixed_tp_degrees(setup.full_plan, sets[k]) || (layouts[2 * k] > 0 && layouts[2 * k + 1] > 0);
    const int color = !held ? -1 : whole ? 0 : setup.role.tp_rank;
    std::unique_ptr<Communicator> comm = world.split(color, world.rank());
    std::unique_ptr<Communicator> device_comm = device_world ? device_world->split(color, world.rank()) : nullptr;
    if (!held) continue;
    ties_[sets[k]] = std::move(comm);
    if (device_comm) device_ties_[sets[k]] = std::move(device_comm);
    if (whole) whole_.insert(sets[k]);
  }
}

void RankTies::sum(const std::vector<StageTies*>& stages, Backend& backend, int replica) {
  for (const auto& [tie, host_comm] : ties_) {
    // Over the device world the sums are the backend's tensors; on the host path host tensors.
    const auto device_comm = device_ties_.find(tie);
    const bool on_device = device_comm != device_ties_.end();
    Communicator& comm = on_device ? *device_comm->second : *host_comm;
    Backend& buffers = on_device ? backend : cpu_backend();
    if (whole_.count(tie)) {
      std::vector<Tensor> whole;
      for (StageTies* stage : stages) stage->add_into_whole(tie, whole, on_device);
      for (Tensor& w : whole) comm.allreduce_sum(w.span<float>())->wait();
      for (StageTies* stage : stages) stage->take_from_whole(tie, whole);
      continue;
    }
    std::vector<std::vector<Tensor*>> held;  // per stage of this rank holding them
    for (StageTies* stage : stages)
      if (std::vector<Tensor*> grads = stage->gradients(tie); !grads.empty()) held.push_back(std::move(grads));
    for (size_t i = 0; !held.empty() && i < held.front().size(); ++i) {
      Tensor contribution = buffers.empty(DType::kFloat32, held.front()[i]->shape());
      for (const auto& grads : held)
        if (replica == 0) buffers.add_into(contribution, on_device ? *grads[i] : backend.to_host(*grads[i]));
      comm.allreduce_sum(contribution.span<float>())->wait();
      for (const auto& grads : held) backend.copy(contribution, *grads[i]);
    }
  }
}

}  // namespace apart
