// apart run's tied params (internal to train/pipeline.cpp): params several stages hold (a GPT's tied embedding in
// its first and last stage), whose gradient is the sum over the holders' — each stage's view of its ties, and the
// rank's communicators that sum them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "codegen/tensor_parallel_shard.h"
#include "graph/task_graph.h"
#include "plan/plan.h"
#include "runtime/backend.h"
#include "runtime/communicator.h"
#include "train/gradient_reducer.h"
#include "train/run_setup.h"
#include "schedule/schedule.h"

namespace apart {

// Calls run(whole, part, count) for each contiguous run of elements rank `rank` of `degree` holds of the sliced
// param `p`: `whole` its offset in the whole param, `part` in the rank's slice.
template <class Run>
void for_each_tp_run(const TpShardedParam& p, int degree, int rank, const Run& run) {
  int64_t outer = 1, inner = 1;
  for (int a = 0; a < p.axis; ++a) outer *= p.shape[static_cast<size_t>(a)];
  for (size_t a = static_cast<size_t>(p.axis) + 1; a < p.shape.size(); ++a) inner *= p.shape[a];
  const int64_t length = p.shape[static_cast<size_t>(p.axis)];
  const auto ranges = tp_param_ranges(p, degree, rank);  // a vocabulary's last rank: fewer rows
  int64_t kept = 0;
  for (const auto& [b, e] : ranges) kept += e - b;
  for (int64_t o = 0; o < outer; ++o) {
    int64_t at = 0;
    for (const auto& [b, e] : ranges) {
      run((o * length + b) * inner, (o * kept + at) * inner, (e - b) * inner);
      at += e - b;
    }
  }
}

// Which stages read each param, from the plan's task lists on the whole model (InvalidModel naming `plan_dir` when
// a stage names a task the model lacks).
std::map<std::string, std::set<int>> param_holders(const PlanDocument& plan, const TaskGraph& model,
                                                   const std::filesystem::path& plan_dir);

// One stage's tied params: for each set of stages holding common params that includes this one, its params in the
// tie's order; their gradients summed with the other holders' (RankTies).
class StageTies {
 public:
  // `tp_sharded`: the params this rank holds a slice of (by name); `tp`: the stage's TP degree.
  StageTies(const std::map<std::string, std::set<int>>& holders, int stage, const StageParams& params,
            const std::map<std::string, TpShardedParam>& tp_sharded, const TaskGraph& model, RankRole role, int tp,
            Backend& backend);
  void bind(GradientReducer& reducer) { reducer_ = &reducer; }  // where the stage's gradients are

  const std::vector<std::set<int>>& plan_sets() const { return plan_sets_; }  // every tie of the plan, in one order
  std::vector<bool> tied() const;                                             // by param: in a tie
  // How this stage holds the tie `stages`' params: -1 not at all, 1 cut over its TP group (a vocabulary region), 0
  // whole.
  int layout(const std::set<int>& stages) const;
  // The gradients of the params this stage shares with `stages`, in the tie's order (none when it holds none).
  std::vector<Tensor*> gradients(const std::set<int>& stages);
  // A tie summed in whole-size buffers: adds this stage's gradients of its params into whole-size buffers (one per
  // param, created at the first stage holding them) when it contributes — replica 0, its slice at its rows, a param it
  // holds whole from TP rank 0 only —, and takes its own rows back from their sums. The buffers are host tensors, or
  // with `on_device` the backend's (summed over the device world).
  void add_into_whole(const std::set<int>& stages, std::vector<Tensor>& whole, bool on_device);
  void take_from_whole(const std::set<int>& stages, const std::vector<Tensor>& whole);

 private:
  struct Tie {
    std::set<int> stages;  // the stages holding them
    std::vector<size_t> params;
  };
  std::vector<std::set<int>> plan_sets_;
  std::vector<Tie> ties_;
  const StageParams& params_;
  const std::map<std::string, TpShardedParam>& tp_sharded_;
  const TaskGraph& model_;
  RankRole role_;
  int tp_ = 1;
  Backend& backend_;
  GradientReducer* reducer_ = nullptr;
};

// A rank's ties: one communicator per set of stages holding common params (however many of its chunks hold them),
// and the sums of their gradients.
class RankTies {
 public:
  // Each tie's communicator, tie by tie in one order on every rank (collective over the world and the device world):
  // per TP rank (each sums its slices with its counterparts'), or one over every holder summing whole-size buffers
  // when the holding stages differ in TP degree or some cut the params and others hold them whole (a last stage whose
  // LM head stays whole: its logits a stage output). Which holders cut them is known once every stage is sharded: one
  // world all-reduce of the counts (none without TP stages, where nothing is cut).
  void split(const std::vector<StageTies*>& stages, const RunSetup& setup, Communicator& world,
             Communicator* device_world);
  // A tied param's gradient is the sum over the stages holding it (replica 0 of each): this rank's stages' summed,
  // then all-reduced over the ranks holding it, into each of its stages; set by set in one order on every rank.
  void sum(const std::vector<StageTies*>& stages, Backend& backend, int replica);

 private:
  std::map<std::set<int>, std::unique_ptr<Communicator>> ties_;  // the sets this rank holds: their communicators
  // … the same over RunOptions::device_world (NCCL), where the tied gradients are summed on the device
  std::map<std::set<int>, std::unique_ptr<Communicator>> device_ties_;
  std::set<std::set<int>> whole_;  // … those summed in whole-size buffers
};

}  // namespace apart
