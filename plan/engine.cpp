// The engines' capability table and the check of a plan against it (plan/engine.h).
#include "plan/engine.h"

#include <algorithm>
#include <set>

#include "graph/error.h"

namespace apart {
namespace {

template <typename T>
bool offers(const std::vector<T>& list, T value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

template <typename T, typename Name>
std::string listed(const std::vector<T>& values, Name name) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i)
    out += (i == 0 ? "" : i + 1 == values.size() ? " or " : ", ") + std::string(name(values[i]));
  return out;
}

std::string zero_name(int z) { return "ZeRO-" + std::to_string(z); }
std::string number(int n) { return std::to_string(n); }

std::string product(Engine e) {
  switch (e) {
    case Engine::kMegatron:
      return "Megatron-LM";
    case Engine::kTorchtitan:
      return "torchtitan";
    case Engine::kTorchPipelining:
      return "torch.distributed.pipelining";
    case Engine::kDeepSpeed:
      return "DeepSpeed's PipelineModule";
  }
  return "";
}

}  // namespace

std::string_view engine_name(Engine e) {
  switch (e) {
    case Engine::kMegatron:
      return "megatron";
    case Engine::kTorchtitan:
      return "torchtitan";
    case Engine::kTorchPipelining:
      return "torch-pipelining";
    case Engine::kDeepSpeed:
      return "deepspeed";
  }
  return "?";
}

std::string engine_names() {
  return listed(std::vector<Engine>(std::begin(kEngines), std::end(kEngines)), engine_name);
}

Engine parse_engine(std::string_view name, std::string_view flag) {
  for (Engine e : kEngines)
    if (engine_name(e) == name) return e;
  throw InvalidArgument(std::string(flag) + " " + std::string(name) + ": expected " + engine_names());
}

const EngineCapabilities& engine_capabilities(Engine e) {
  using S = Schedule;
  using R = RecomputeScope;
  // Megatron-LM core_v0.19.0: 1F1B, and interleaved with virtual pipeline stages; --use-distributed-optimizer shards
  // the optimizer state (ZeRO-1); --recompute-granularity full|selective applies to every stage.
  static const EngineCapabilities megatron{"Megatron-LM core_v0.19.0",
                                           {S::k1F1B, S::kInterleaved},
                                           {0, 1},
                                           {1, 2, 4, 8},
                                           {R::kNone, R::kSelective, R::kFull}};
  // torchtitan v0.2.2 (torch.distributed.pipelining's schedules): FSDP2 shards weights too (ZeRO-3; ZeRO-2 with
  // fsdp_reshard_after_forward "never"), replication is DDP (ZeRO-0); activation checkpointing full or selective.
  static const EngineCapabilities torchtitan{"torchtitan v0.2.2",
                                             {S::kGPipe, S::k1F1B, S::kInterleaved},
                                             {0, 2, 3},
                                             {1, 2, 4, 8},
                                             {R::kNone, R::kSelective, R::kFull}};
  // torch.distributed.pipelining: the pipeline only (no TP, sharding or checkpointing of its own).
  static const EngineCapabilities pipelining{
      "PyTorch 2.9 torch.distributed.pipelining", {S::kGPipe, S::k1F1B, S::kInterleaved}, {0}, {1}, {R::kNone}};
  // DeepSpeed 0.16.5: PipelineEngine runs its own 1F1B TrainSchedule, asserts ZeRO < 2, has no TP of its own and
  // checkpoints whole layers (activation_checkpoint_interval).
  static const EngineCapabilities deepspeed{"DeepSpeed 0.16.5", {S::k1F1B}, {0, 1}, {1}, {R::kNone, R::kFull}};
  switch (e) {
    case Engine::kMegatron:
      return megatron;
    case Engine::kTorchtitan:
      return torchtitan;
    case Engine::kTorchPipelining:
      return pipelining;
    case Engine::kDeepSpeed:
      return deepspeed;
  }
  return megatron;
}

std::vector<Inexpressible> inexpressible_fields(const PlanDocument& plan, Engine engine) {
  const EngineCapabilities& can = engine_capabilities(engine);
  const std::string who = product(engine);
  std::vector<Inexpressible> out;
  std::set<int> tps, replicas, zeros;
  std::set<int64_t> microbatch_sizes;
  std::set<RecomputeScope> recomputes;
  for (const PlanStageRecord& s : plan.stages) {
    tps.insert(s.tp);
    replicas.insert(s.replicas);
    zeros.insert(s.zero);
    recomputes.insert(s.recompute
                          ? s.recompute_scope == RecomputeScope::kNone ? RecomputeScope::kFull : s.recompute_scope
                          : RecomputeScope::kNone);
    if (s.microbatch_size) microbatch_sizes.insert(*s.microbatch_size);
  }
  auto set_text = [](const auto& set, auto name) {
    return listed(std::vector<typename std::decay_t<decltype(set)>::value_type>(set.begin(), set.end()), name);
  };
  if (tps.size() > 1)
    out.push_back({"stages[].tp", who + " runs one tensor-parallel degree on every stage; the plan's stages have " +
                                      set_text(tps, number)});
  else if (!tps.empty() && !offers(can.tp_degrees, *tps.begin()))
    out.push_back({"stages[].tp", who + " has no tensor parallelism of its own: it runs TP " +
                                      listed(can.tp_degrees, number) + ", the plan " + number(*tps.begin())});
  if (replicas.size() > 1)
    out.push_back({"stages[].replicas", who + " runs one data-parallel degree on every stage; the plan's stages have " +
                                            set_text(replicas, number) + " replicas"});
  if (microbatch_sizes.size() > 1)
    out.push_back(
        {"stages[].microbatch_size", who + " gives every device the same micro-batch; the plan's stages have " +
                                         set_text(microbatch_sizes, [](int64_t v) { return std::to_string(v); })});
  if (plan.training.global_batch && !replicas.empty() && !microbatch_sizes.empty() &&
      *microbatch_sizes.begin() * *replicas.begin() * plan.training.microbatches != *plan.training.global_batch)
    out.push_back({"training.global_batch",
                   who + " needs global batch = micro-batch × data-parallel degree × "
                         "accumulation steps; the plan's batch does not split evenly among its replicas"});
  if (plan.stages.size() > 1 && !offers(can.schedules, plan.training.schedule))
    out.push_back({"training.schedule", who + " runs " + listed(can.schedules, schedule_name) + ", not " +
                                            std::string(schedule_name(plan.training.schedule))});
  for (int z : zeros)
    if (!offers(can.zero_stages, z))
      out.push_back({"stages[].zero", who + " runs " + listed(can.zero_stages, zero_name) +
                                          " with pipeline parallelism, not " + zero_name(z)});
  if (recomputes.size() > 1)
    out.push_back({"stages[].recompute",
                   who + " recomputes the same way on every stage; the plan recomputes " + recompute_summary(plan)});
  else if (!recomputes.empty() && !offers(can.recompute, *recomputes.begin()))
    out.push_back({"stages[].recompute_scope", who + " offers " + listed(can.recompute, recompute_scope_name) +
                                                   " recomputation, not " +
                                                   std::string(recompute_scope_name(*recomputes.begin()))});
  return out;
}

}  // namespace apart
