// apart::compile: the whole compile path (import → bind batch → costs → partition → baselines → plan files).
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "codegen/plan_writer.h"
#include "importer/importer.h"
#include "partition/methods.h"
#include "partition/options.h"
#include "partition/partition.h"
#include "partition/plan_document.h"
#include "plan/plan.h"
#include "profiler/cost_model.h"
#include "profiler/cost_table.h"
#include "profiler/device.h"

namespace apart {

// The machines: a preset cluster (--device/--devices/--devices-per-node) or an apart.cluster/1 file.
struct ClusterChoice {
  std::string device = "a100-80gb";
  int devices = 1;
  int devices_per_node = 8;
  std::filesystem::path file;                   // apart.cluster/1; replaces the three above when set
  std::optional<MemoryReserve> memory_reserve;  // nullopt: the file's, else default_memory_reserve()
};

// What a --profile measured on another device than the cluster's gets.
enum class ProfileDeviceMismatch : uint8_t { kError, kWarn };

// The plan folder (-o) and which files go into it beside plan.json, plan.dot, report.txt and costs.json.
struct PlanFiles {
  std::filesystem::path directory;
  bool force = false;         // replace a folder apart did not write (codegen/plan_writer.h check_plan_directory)
  bool stage_models = true;   // stage_K.onnx
  bool dot_detail = false;    // plan.dot with every task instead of one node per stage
};

// What compile() tells its caller while it runs. A progress line belongs to a long phase and is superseded by the
// next message (a terminal rewrites it in place); warnings and notes are kept.
enum class CompileMessage : uint8_t { kProgress, kWarning, kNote };
using CompileMessageFn = std::function<void(CompileMessage kind, const std::string& text)>;

struct CompileOptions {
  std::filesystem::path model;
  // --dim/--shape. The model is read at batch 1 (ImportOptions::batch = 0 means 1) by the importer's batch rule:
  // the plan scales every cost with the micro-batch, and the global batch is partition.training.global_batch.
  ImportOptions import;
  ClusterChoice cluster;
  std::optional<Precision> precision;  // nullopt: the device's default (profiler/device.h default_precision)
  // Everything the search takes; compile() fills in cluster, training.precision and atomic.graph_batch from
  // `cluster`, `precision` and the import, so whatever those hold here is ignored.
  PartitionOptions partition;
  std::filesystem::path profile;  // apart.costs/1 measured costs instead of the analytic model; empty: analytic
  ProfileDeviceMismatch profile_device_mismatch = ProfileDeviceMismatch::kError;
  bool baselines = true;  // with method apart: every method on the same inputs (CompileResult::baselines)
  std::optional<PlanFiles> output;  // nullopt: nothing is written
  CompileMessageFn on_message;      // may be empty
};

// Seconds one phase took: wall clock, and the process's CPU time, which a busy machine does not inflate.
struct PhaseTime {
  double wall_s = 0;
  double cpu_s = 0;
};
struct CompileTimes {
  PhaseTime import, costs, partition, baselines, files;  // baselines: with --target, the unrestricted search
};

// The per-task costs the search runs on.
struct PlanCosts {
  CostTable table;                        // analytic at micro-batch max(1, B / devices), or the --profile file's
  std::optional<CostTable> at_other_size; // analytic only: at 4× that, so per-kernel overheads stay fixed (affine)
  CostOptions options;                    // precision and reference batch of the analytic tables
};

struct CompileResult {
  ImportedModel model;
  Cluster cluster;
  PlanCosts costs;
  Plan plan;
  std::vector<MethodResult> baselines;  // kAllMethods order; empty unless method apart and options.baselines
  PlanModel info;         // the model file as plan.json records it
  PlanDocument document;  // the plan as plan.json holds it (what was written, when options.output is set)
  CompileTimes times;
};

// import → costs → partition → baselines → plan files. Throws the typed errors of graph/error.h: InvalidArgument
// naming the bad option (or --profile from another device), InvalidModel, Unsupported, Infeasible with what would
// make the request fit, SystemError. Nothing is left in options.output's folder unless it returns.
CompileResult compile(const CompileOptions& options);

// The phases compile() runs, each a function of plain data.
Cluster resolve_cluster(const ClusterChoice& choice);  // validated
// options.partition with the cluster and precision filled in; validated.
PartitionOptions resolve_partition_options(const CompileOptions& options, const Cluster& cluster);
// Reads the model at the batch the plan needs (CompileOptions::import).
ImportedModel import_for_plan(const std::filesystem::path& model, const ImportOptions& import);
// Costs at micro-batch size max(1, B / devices) and 4× that (analytic, at the precision the options resolved
// to), or the profile's, refused (or warned about) when measured on another device than the cluster's.
PlanCosts plan_costs(const CompileOptions& options, const PartitionOptions& partition, const ImportedModel& model,
                     const Cluster& cluster);
// What MFU counts of the model (PlanModel::tokens_per_sample, flops_per_sample): the sequence length of its token
// input (its first integer graph input with more than one element per sample; none: not a sequence model) and the
// forward + backward FLOPs of one sample by `costs` (batch tasks only: constant ones run once per iteration).
void describe_work(const ImportedModel& model, const CostTable& costs, PlanModel& info);
// Per-task costs at the plan's micro-batch size, as its stages see them (the plan folder's costs.json).
CostTable costs_at_plan_size(const CompileResult& result);
// stage_K.onnx keeps the batch dim symbolic when the plan bound it itself (the batch rule, not --dim/--shape).
StageShapes stage_shapes(const CompileOptions& options, const ImportedModel& model);
// What a command that read this model must not overwrite: the model file and its external-data files.
std::vector<InputFile> model_files(const std::filesystem::path& path, const ImportedModel& model);
// The files compile() reads, which its plan folder must never replace: model_files, the profile, the cluster file.
std::vector<InputFile> compile_inputs(const CompileOptions& options, const ImportedModel& model);
// plan.json, plan.dot, report.txt, costs.json, stage_K.onnx and baselines.json into output.directory, at once, on
// the search's threads. `shapes`: stage_shapes(options, result.model) when the caller has it already.
void write_plan_files(const CompileResult& result, const CompileOptions& options, const PlanFiles& output,
                      std::optional<StageShapes> shapes = std::nullopt);

}  // namespace apart
