// Plan → plan.json (apart.plan/1), plan.dot, report.txt, stage_K.onnx, written as one directory or not at all.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "codegen/stage_shapes.h"
#include "graph/atomic_file.h"
#include "graph/task_graph.h"
#include "partition/partition.h"

namespace apart {

struct ModelInfo {
  std::string path;
  std::string sha256;
  int64_t params = 0;       // parameter elements
  int64_t param_bytes = 0;
};
ModelInfo describe_model(const TaskGraph& graph, const std::filesystem::path& model_path);

nlohmann::ordered_json plan_to_json(const Plan& plan, const TaskGraph& graph, const ModelInfo& model);
// One cluster per stage; `detail` draws tasks and values, otherwise one node per stage and its transfers.
std::string plan_to_dot(const Plan& plan, const TaskGraph& graph, bool detail);
// The table a person reads first: per stage tasks, params, compute/comm/all-reduce ms, memory, replicas, devices.
std::string plan_report(const Plan& plan, const TaskGraph& graph, const ModelInfo& model);

// Writes stage_K.onnx for every stage: the stage's nodes, its boundary values as inputs/outputs, its
// initializers (inline ones copied; external-data ones point at weights/<location>, where the model's file is
// hard-linked, or copied when small: docs/runtime.md). Boundary dims are declared as
// `shapes` says: static by default, or with the batch as a dim_param. Throws InvalidModel/SystemError.
void write_stage_models(const Plan& plan, const TaskGraph& graph, const std::filesystem::path& model_path,
                        const std::filesystem::path& directory, const StageShapes& shapes = {});

struct PlanOutputs {
  bool dot_detail = false;
  bool stage_models = true;
  StageShapes stage_shapes;  // how stage_K.onnx declares boundary dims; static by default
  // Called with the temporary directory to add more files (costs.json) before the directory is published.
  std::function<void(const std::filesystem::path& directory)> extra;
};
// Writes everything into a temporary sibling directory, then renames it to `directory` (replacing an older plan
// there), so a reader never sees a half-written plan. Throws SystemError.
void write_plan_directory(const std::filesystem::path& directory, const Plan& plan, const TaskGraph& graph,
                          const std::filesystem::path& model_path, const ModelInfo& model, const PlanOutputs& outputs);

}  // namespace apart
