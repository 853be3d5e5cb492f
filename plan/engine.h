// The training engines a plan can be exported to (apart export, apart partition --target) and what each can
// express: one table, read by the export's refusals and by the search's restriction (docs/export.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "plan/plan.h"
#include "plan/training.h"

namespace apart {

enum class Engine : uint8_t { kMegatron, kTorchtitan, kTorchPipelining, kDeepSpeed };
inline constexpr Engine kEngines[] = {Engine::kMegatron, Engine::kTorchtitan, Engine::kTorchPipelining,
                                      Engine::kDeepSpeed};
std::string_view engine_name(Engine e);  // "megatron", "torchtitan", "torch-pipelining", "deepspeed"
Engine parse_engine(std::string_view name, std::string_view flag);  // InvalidArgument naming the flag and the names
std::string engine_names();  // "megatron, torchtitan, torch-pipelining or deepspeed"

// What an engine runs. Every engine runs one tensor-parallel degree and one data-parallel degree for all its
// pipeline stages, and cuts the pipeline between whole layers (modules); these are the rest.
struct EngineCapabilities {
  std::string_view release;               // the release the names apart writes were checked against
  std::vector<Schedule> schedules;        // pipeline schedules it offers (one stage: any)
  std::vector<int> zero_stages;           // ZeRO stages it runs together with pipeline parallelism
  std::vector<int> tp_degrees;            // tensor-parallel degrees it runs (kTpDegrees, or {1})
  std::vector<RecomputeScope> recompute;  // recomputation it offers, the same on every stage
};
const EngineCapabilities& engine_capabilities(Engine e);

// One field of a plan an engine cannot express, and why: what `apart export` refuses a plan for.
struct Inexpressible {
  std::string field;   // "stages[].tp", "training.schedule", …
  std::string reason;  // "Megatron-LM runs one tensor-parallel degree on every stage; the plan has 1 and 2"
};
// Every field of `plan` (stages' TP degrees and replicas, micro-batch split, schedule, ZeRO, recomputation) `engine`
// cannot express. Layer cuts are the export's (export/): they need the model's module names.
std::vector<Inexpressible> inexpressible_fields(const PlanDocument& plan, Engine engine);

}  // namespace apart
