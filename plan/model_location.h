// Where the model of a plan is on this machine: the plan folder's relative path first, then the absolute path, then
// the path as given to apart partition, each checked against the plan's SHA-256. What check, run and export read.
#pragma once

#include <filesystem>
#include <string>

#include "plan/plan.h"

namespace apart {

struct PlanModelLocation {
  std::filesystem::path path;  // the file that holds the plan's model
  std::string sha256;          // its hash (the plan's, when the plan records one)
  std::string found_by;  // "--model", "the plan folder", "the absolute path" or "the path given to apart partition"
};

// `model_arg` (a --model flag) when not empty: that file, whose hash must be the plan's. Otherwise, in order:
// plan_dir / model.relative_path, model.absolute_path, model.path (relative to the working directory, as plans
// before relative_path record it); the first that exists and whose SHA-256 is model.sha256 (any, when the plan
// records none). InvalidArgument when none exists (naming each place tried and --model), or when every one that
// exists has other bytes (naming each path and both hashes).
PlanModelLocation locate_plan_model(const PlanDocument& plan, const std::filesystem::path& plan_dir,
                                    const std::filesystem::path& model_arg = {});

// What the plan records of its model's place, for a plan written to `plan_dir`: the model's path relative to it and
// its absolute path (both lexically normalised, symlinks resolved where they exist).
void record_model_location(PlanModel& model, const std::filesystem::path& model_path,
                           const std::filesystem::path& plan_dir);

}  // namespace apart
