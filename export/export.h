// apart export: a plan as the configuration of the engine its user already runs (Megatron-LM, torchtitan,
// torch.distributed.pipelining, DeepSpeed), with export.json: the layer map, each stage cut snapped to a layer
// boundary and what snapping costs (both plans simulated). A plan the engine cannot express is refused.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/module_layers.h"
#include "plan/engine.h"
#include "plan/plan.h"

namespace apart {

// The plan's pipeline parts (its stages, or an interleaved plan's P·v virtual stages) as runs of whole layers.
struct LayerCut {
  LayerStack stack;  // the model's layers (graph/module_layers.h), read from costs.json's task names and scopes
  // Per part, in pipeline order: the half-open range of stack layers it holds after snapping; the modules before
  // the stack go with part 0, those after it with the last part.
  std::vector<std::pair<int, int>> layers;
  int pipeline_stages = 1;          // P: part c runs on the devices of stage c mod P
  int moved_layers = 0;             // layers whose tasks the plan had split between parts, each given to one part whole
  int moved_tasks = 0;              // batch tasks that change part
  double moved_seconds = 0;         // their forward + backward seconds per micro-batch (costs.json)
  double original_iteration_s = 0;  // the plan, simulated
  double snapped_iteration_s = 0;   // the plan with the snapped stages' times (costs.json's task times), simulated
  // The modules (torch FQNs, "blocks.3") of part c, in order.
  std::vector<std::string> modules(int part) const;
  bool snapped() const { return moved_tasks > 0; }
};

// The layer cut of the plan in folder `plan_dir`: reads plan.json and costs.json. Unsupported when the model's
// node names carry no layers (no module list with two or more entries): module-based engines cannot cut it.
// InvalidArgument when costs.json is missing.
LayerCut layer_cut(const PlanDocument& plan, const std::filesystem::path& plan_dir);

// The files of one export (name → contents), export.json last.
struct ExportFiles {
  std::vector<std::pair<std::string, std::string>> files;
  nlohmann::ordered_json summary;  // export.json
};
// Unsupported (exit 4) when inexpressible_fields (plan/engine.h) or the layer cut finds anything the engine cannot
// express, naming every field and why, and `apart partition --target`.
ExportFiles export_plan(const std::filesystem::path& plan_path, Engine engine);

// Each engine's files (export/formats.cpp): the plan, its cut, and what export.json says of them.
std::vector<std::pair<std::string, std::string>> engine_files(const PlanDocument& plan, const LayerCut& cut,
                                                              Engine engine, nlohmann::ordered_json& notes);

}  // namespace apart
