// A plan document → plan.json (plan/'s writer), plan.dot, report.txt, stage_K.onnx, written as one directory or
// not at all.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "codegen/stage_shapes.h"
#include "graph/atomic_file.h"
#include "graph/output_path.h"
#include "graph/task_graph.h"
#include "plan/plan.h"

namespace apart {

// The model file as plan.json records it: path, sha256, task count, parameter elements and bytes.
PlanModel describe_model(const TaskGraph& graph, const std::filesystem::path& model_path);

// The plan's stage tasks, by name in the plan, as the graph's ids; InvalidModel for a name the graph lacks.
std::vector<TaskId> stage_task_ids(const PlanStageRecord& stage, const TaskGraph& graph);

// One cluster per stage; `detail` draws tasks and values, otherwise one node per stage and its transfers.
std::string plan_to_dot(const PlanDocument& plan, const TaskGraph& graph, bool detail);
// Who reads the report: report.txt lists every stage and the plan's warnings (plan/plan_summary.h); a terminal gets
// identical consecutive stages as one row ("1–15") and the warnings on stderr instead.
enum class ReportFor : uint8_t { kFile, kTerminal };
// The table a person reads first: the summary line in Megatron-LM's vocabulary, then per stage tasks, params,
// compute/comm/all-reduce time, memory, replicas, devices.
std::string plan_report(const PlanDocument& plan, const TaskGraph& graph, ReportFor reader = ReportFor::kFile);

// Writes stage_K.onnx for every stage (and chunk_C.onnx for every virtual stage of an interleaved plan, C its id,
// from virtual_stage_view): the stage's nodes, its boundary values as inputs/outputs, its
// initializers (inline ones copied; external-data ones point at weights/<location>, where the model's file is
// hard-linked, or copied when small: docs/runtime.md). A Constant node of kSharedConstantBytes or more that several
// stages compute holds its value as external data in weights/stage_constants.bin, written once. Boundary dims are
// declared as `shapes` says: static by default, or with the batch as a dim_param. The stage files are built and
// written on up to `threads` threads (the same bytes on any count). Throws InvalidModel/SystemError.
inline constexpr const char* kStageConstantsFile = "stage_constants.bin";  // in the plan's weights/ folder
inline constexpr size_t kSharedConstantBytes = size_t{1} << 20;
void write_stage_models(const PlanDocument& plan, const TaskGraph& graph, const std::filesystem::path& model_path,
                        const std::filesystem::path& directory, const StageShapes& shapes = {}, int threads = 1);

struct PlanOutputs {
  bool dot_detail = false;
  bool stage_models = true;
  StageShapes stage_shapes;  // how stage_K.onnx declares boundary dims; static by default
  // Called with the temporary directory to add more files (costs.json) before the directory is published.
  std::function<void(const std::filesystem::path& directory)> extra;
  std::vector<InputFile> inputs;  // the files this run reads: a folder holding one is never replaced
  bool force = false;             // --force: replace an existing folder apart did not write
  int threads = 1;                // the files are written on up to this many threads (the same bytes on any count)
};

// The names apart writes into a plan folder: partition's files, and what other commands write there by default or
// in the documented workflow (`apart report` writes report.html; the quickstart runs `apart simulate plan/ --trace
// plan/trace.json`). A folder holding only these (stage_K.onnx for any K) and a plan.json of schema apart.plan/…
// is one apart wrote. A new file in a plan folder must be added here.
inline constexpr const char* kPlanFolderFiles[] = {"plan.json",      "plan.dot",    "report.txt", "costs.json",
                                                   "baselines.json", "report.html", "trace.json"};
bool is_plan_folder_file(const std::string& name);  // one of the above, stage_K.onnx or chunk_C.onnx
// The folder of a plan where stage_K.onnx finds the model's external data (hard links; stage_onnx.cpp).
inline constexpr const char* kPlanWeightsFolder = "weights";

// Whether `directory` (the -o of `apart partition`) may be replaced, checked before the search and again before
// publishing. Refused, even with `force`: a symlink (named with its target), something that is not a folder, the
// working folder or a folder above it, a folder holding one of `inputs` (by file identity) — InvalidArgument;
// a read-only folder or parent — SystemError. Refused without `force`: a folder with anything but an apart plan
// in it (the message lists what is there) — InvalidArgument. A missing or empty folder is fine.
void check_plan_directory(const std::filesystem::path& directory, const std::vector<InputFile>& inputs, bool force);

// Writes everything into a temporary sibling directory, then renames it to `directory` (replacing an older plan
// there, as check_plan_directory allows), so a reader never sees a half-written plan, and no temporary is left
// behind on failure. Throws InvalidArgument/SystemError.
void write_plan_directory(const std::filesystem::path& directory, const PlanDocument& plan, const TaskGraph& graph,
                          const std::filesystem::path& model_path, const PlanOutputs& outputs);

}  // namespace apart
