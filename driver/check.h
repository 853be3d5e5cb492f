// `apart check PLAN [MODEL]`: a plan folder verified before anyone spends device hours on it — plan.json's schema,
// the model's bytes, every partition invariant, the stage files and the prediction (docs/plan.md, "Checking a plan").
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace apart {

struct PlanFinding {
  bool ok = true;
  std::string check;   // "schema", "model", "tasks", "order", "devices", "memory", "stage files", "prediction", "runtime"
  std::string detail;  // what was found, in words
};

struct PlanCheck {
  std::vector<PlanFinding> findings;  // in the order above, one per check
  bool ok() const;
};

// Reads `plan` (a plan folder or its plan.json) and the model (`model`, else the one plan.json names) and checks:
//   schema       plan.json parses as apart.plan/1 (read_plan's field and consistency checks);
//   model        the model is there and its SHA-256 is plan.json's model.sha256;
//   tasks        every task a stage names is a task of the model, every batch task is in exactly one stage and
//                constant tasks only repeat;
//   order        no stage reads a batch value a later stage produces (the stages follow the data);
//   devices      every device index is below cluster.devices and the stages use at most that many;
//   memory       no stage's memory_bytes is above cluster.memory_bytes (what a device may fill);
//   stage files  each stage_K.onnx is ONNX and takes the stage's inputs and produces its outputs (skipped, as a
//                note, for a plan written with --no-stage-models);
//   prediction   apart simulate's replay of the plan gives predicted.iteration_s (to 1e-9 relative);
//   runtime      whether `apart run` executes the plan (a note; a plan it cannot run is still a valid plan).
// A check that cannot run for want of an earlier one (no model: no tasks, order) is reported failed with why.
// Throws only for I/O errors outside the plan (SystemError) and InvalidArgument when `plan` is no plan folder.
PlanCheck check_plan_folder(const std::filesystem::path& plan, const std::filesystem::path& model = {});

}  // namespace apart
