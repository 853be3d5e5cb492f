// `apart check`: a plan folder verified (see check.h).
#include "driver/check.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "codegen/stage_graphs.h"
#include "codegen/tensor_parallel_shard.h"
#include "graph/atomic_file.h"
#include "graph/error.h"
#include "graph/output_path.h"
#include "graph/text.h"
#include "graph/units.h"
#include "importer/fold.h"
#include "importer/importer.h"
#include "importer/model_proto.h"
#include "plan/model_location.h"
#include "plan/plan.h"
#include "schedule/schedule.h"
#include "simulator/sim_plan.h"
#include "simulator/simulate.h"

namespace apart {
namespace fs = std::filesystem;

namespace {

// "a, b, c and 4 more".
std::string some(const std::vector<std::string>& names, size_t shown = 3) {
  std::string text;
  for (size_t i = 0; i < std::min(shown, names.size()); ++i) text += (i ? ", " : "") + quote(names[i]);
  if (names.size() > shown) text += " and " + std::to_string(names.size() - shown) + " more";
  return text;
}

class Checker {
 public:
  PlanCheck result;
  void pass(const std::string& check, const std::string& detail) { result.findings.push_back({true, check, detail}); }
  void fail(const std::string& check, const std::string& detail) { result.findings.push_back({false, check, detail}); }
};

// tasks and order: the plan's stages against the model's task graph.
void check_tasks(Checker& c, const PlanDocument& plan, const TaskGraph& graph) {
  std::vector<std::string> unknown;
  std::map<uint32_t, std::vector<int>> stages_of;  // batch task → the stages naming it
  for (const PlanStageRecord& stage : plan.stages)
    for (const std::string& name : stage.tasks) {
      const auto t = graph.find_task(name);
      if (!t) {
        unknown.push_back(name);
        continue;
      }
      if (!graph.task(*t).constant) stages_of[t->value()].push_back(stage.id);
    }
  std::vector<std::string> missing, repeated;
  for (uint32_t t = 0; t < graph.num_tasks(); ++t) {
    const Task& task = graph.task(TaskId(t));
    if (task.constant) continue;
    auto it = stages_of.find(t);
    if (it == stages_of.end()) missing.push_back(task.name);
    else if (it->second.size() > 1) repeated.push_back(task.name + " (stages " + std::to_string(it->second[0]) + " and " +
                                                       std::to_string(it->second[1]) + ")");
  }
  if (unknown.empty() && missing.empty() && repeated.empty()) {
    c.pass("tasks", std::to_string(graph.num_batch_tasks()) + " batch tasks, each in exactly one of " +
                        std::to_string(plan.stages.size()) + " stages");
  } else {
    std::string detail;
    if (!unknown.empty()) detail += std::to_string(unknown.size()) + " task(s) the model does not have: " + some(unknown) + "; ";
    if (!missing.empty()) detail += std::to_string(missing.size()) + " batch task(s) in no stage: " + some(missing) + "; ";
    if (!repeated.empty()) detail += std::to_string(repeated.size()) + " batch task(s) in two stages: " + some(repeated) + "; ";
    detail += "the plan is not a partition of this model (another model, or an edited plan.json): re-run apart partition";
    c.fail("tasks", detail);
  }
  // order: a batch task reads batch values from its own stage or earlier ones.
  std::vector<std::string> backward;
  for (const auto& [t, stages] : stages_of)
    for (ValueId in : graph.task(TaskId(t)).inputs) {
      if (!in.valid() || !graph.value(in).producer.valid()) continue;
      auto producer = stages_of.find(graph.value(in).producer.value());
      if (producer != stages_of.end() && producer->second.front() > stages.front())
        backward.push_back(graph.task(TaskId(t)).name + " (stage " + std::to_string(stages.front()) + ") reads " +
                           graph.value(in).name + " from stage " + std::to_string(producer->second.front()));
    }
  if (backward.empty()) c.pass("order", "every stage reads only what it or an earlier stage computes");
  else c.fail("order", std::to_string(backward.size()) + " value(s) flow backward: " + some(backward, 2));
}

void check_stage_files(Checker& c, const PlanDocument& plan, const fs::path& dir) {
  std::vector<std::string> absent, wrong;
  // The stages' files and, in an interleaved plan that lists its chunks, the chunks' (what apart run runs).
  const PlanDocument chunks = plan.virtual_stages.empty() ? PlanDocument{} : virtual_stage_view(plan);
  std::vector<std::pair<const PlanStageRecord*, fs::path>> files;
  for (const PlanDocument* d : {&plan, &chunks})
    for (const PlanStageRecord& stage : d->stages) files.emplace_back(&stage, dir / stage_file_name(*d, stage.id));
  for (const auto& [record, file] : files) {
    const PlanStageRecord& stage = *record;
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) {
      absent.push_back(file.filename().string());
      continue;
    }
    std::vector<std::string> inputs, outputs;
    for (const PlanInput& in : stage.inputs) inputs.push_back(in.value);
    for (const PlanOutput& out : stage.outputs) outputs.push_back(out.value);
    try {
      const MissingInterface missing = missing_interface(load_model_proto(file), inputs, outputs);
      if (!missing.inputs.empty())
        wrong.push_back(file.filename().string() + " does not take " + some(missing.inputs, 2));
      else if (!missing.outputs.empty())
        wrong.push_back(file.filename().string() + " does not output " + some(missing.outputs, 2));
    } catch (const Error& e) {
      wrong.push_back(e.what());
    }
  }
  if (absent.size() == files.size()) {
    c.pass("stage files", "none (planned with --no-stage-models); apart run needs them");
  } else if (absent.empty() && wrong.empty()) {
    c.pass("stage files", std::to_string(plan.stages.size()) + " stage_K.onnx" +
                              (chunks.stages.empty() ? "" : " and " + std::to_string(chunks.stages.size()) + " chunk_C.onnx") +
                              ", each with its stage's inputs and outputs");
  } else {
    std::string detail;
    if (!absent.empty()) detail += std::to_string(absent.size()) + " missing: " + some(absent) + "; ";
    for (const std::string& w : wrong) detail += w + "; ";
    c.fail("stage files", detail + "re-run apart partition to rewrite the plan folder");
  }
}

// The files apart run runs, with their records: the stages', or an interleaved plan's chunks'.
std::vector<std::pair<PlanStageRecord, fs::path>> run_files(const PlanDocument& plan, const fs::path& dir) {
  const PlanDocument& view = plan.virtual_stages.empty() ? plan : virtual_stage_view(plan);
  std::vector<std::pair<PlanStageRecord, fs::path>> files;
  for (const PlanStageRecord& stage : view.stages) files.emplace_back(stage, dir / stage_file_name(view, stage.id));
  return files;
}

}  // namespace

std::vector<TpRankShard> tensor_parallel_shards(const PlanDocument& plan, const fs::path& dir, TpWeights weights) {
  const std::vector<TpShardRegion> regions = tp_shard_regions(plan);
  std::vector<TpRankShard> shards;
  for (const auto& [stage, file] : run_files(plan, dir)) {
    if (stage.tp <= 1) continue;
    // As apart run cuts it (StageRunner::build): values read only for their shape folded at the stage's
    // micro-batch, then each rank's shard.
    onnx::ModelProto whole = load_model_proto(file);
    ImportOptions import;
    import.batch = stage.microbatch_size.value_or(1);
    import.batch_explicit = true;
    import.require_external_data = false;
    import.constants_as_params = false;
    std::set<std::string> sent;
    for (const PlanInput& in : stage.inputs) sent.insert(in.value);
    fold_shape_only_inputs(whole, sent, import);
    for (int rank = 0; rank < stage.tp; ++rank) {
      TpRankShard& shard = shards.emplace_back();
      shard.stage = stage.id;
      shard.rank = rank;
      shard.file = file;
      shard.shard = shard_stage_for_tensor_parallel(whole, regions, stage.tp, rank, weights,
                                                    stage.sequence_parallel ? TpSequence::kSharded : TpSequence::kWhole);
    }
  }
  return shards;
}

std::vector<fs::path> write_tensor_parallel_shards(const fs::path& plan_path, const fs::path& out) {
  const fs::path json = plan_json_path(plan_path);
  const fs::path dir = json.parent_path();
  if (contains_path(out, json))
    throw InvalidArgument("--write-shards " + out.string() + " is the plan folder (or one above it): write the shards elsewhere");
  check_output_directory_writable(out, "--write-shards");
  const PlanDocument plan = read_plan(plan_path);
  const std::vector<TpRankShard> shards = tensor_parallel_shards(plan, dir, TpWeights::kShapesOnly);
  fs::create_directories(out);
  std::vector<fs::path> written;
  for (const TpRankShard& s : shards) {
    const fs::path file = out / (s.file.stem().string() + ".tp_" + std::to_string(s.rank) + ".onnx");
    onnx::ModelProto model = s.shard.model;
    int dims_only = 0;  // external data would name the plan folder's files at offsets of the whole weights: dropped
    for (onnx::TensorProto& t : *model.mutable_graph()->mutable_initializer()) {
      if (t.data_location() != onnx::TensorProto::EXTERNAL) continue;
      t.clear_external_data();
      t.clear_data_location();
      ++dims_only;
    }
    model.set_doc_string("TP rank " + std::to_string(s.rank) + " of " + s.file.filename().string() +
                         " as apart run cuts it (apart check --write-shards)" +
                         (dims_only ? "; " + std::to_string(dims_only) + " weight(s) the stage file keeps as external "
                                      "data are written with their shard's dims and no data" : std::string()));
    check_output_file(file, {{"the plan", json}, {"the stage file", s.file}}, "--write-shards");
    write_file_atomically(file, model.SerializeAsString());
    written.push_back(file);
  }
  return written;
}

namespace {

// tp shards: every TP rank's shard of each TP stage (or chunk) cut from its file as apart run cuts it, without the
// weights (their dims only), its shapes inferred by the pass.
void check_tp_shards(Checker& c, const PlanDocument& plan, const fs::path& dir) {
  int stages = 0;
  for (const auto& [stage, file] : run_files(plan, dir)) {
    std::error_code ec;
    if (stage.tp > 1 && !fs::is_regular_file(file, ec)) {
      c.pass("tp shards", "not checked: no stage files (planned with --no-stage-models)");
      return;
    }
    stages += stage.tp > 1;
  }
  if (stages == 0) {
    c.pass("tp shards", "no tensor-parallel stage");
    return;
  }
  try {
    const std::vector<TpRankShard> shards = tensor_parallel_shards(plan, dir, TpWeights::kShapesOnly);
    int regions = 0;
    std::vector<std::string> whole;
    for (const TpRankShard& s : shards) {
      if (s.rank != 0) continue;
      regions += s.shard.regions;
      for (const std::string& r : s.shard.replicated) whole.push_back(s.file.filename().string() + ": " + r);
    }
    c.pass("tp shards", std::to_string(shards.size()) + " rank shards of " + std::to_string(stages) + " stage file(s) cut, " +
                            std::to_string(regions) + " region(s) split" +
                            (whole.empty() ? "" : "; computed whole on every TP rank: " + some(whole, 3)));
  } catch (const Error& e) {
    c.fail("tp shards", std::string("apart run cannot cut this plan's TP shards: ") + e.what());
  }
}

// What apart run needs of the model beyond the plan: a loss to minimise (run refuses a model without one) and, for
// --init model, the weights' external-data files.
void check_loss_and_weights(Checker& c, const ImportedModel& model) {
  std::vector<LossCandidate> outputs;
  for (ValueId v : model.graph.graph_outputs()) {
    const Value& value = model.graph.value(v);
    outputs.push_back({value.name, is_floating(value.dtype) && value.shape_known && value.elements == 1});
  }
  try {
    c.pass("loss", quote(choose_loss(outputs, "", "the model")) + ", the scalar apart run minimises");
  } catch (const InvalidArgument& e) {
    c.fail("loss", std::string("apart run will refuse this plan: ") + e.what() +
                       " (apart partition --loss: the plan records it, and run appends it too)");
  }
  if (model.missing_external_files.empty()) {
    c.pass("weights", model.external_data_files.empty() ? "inline in the model"
                                                        : std::to_string(model.external_data_files.size()) +
                                                              " external-data file(s), all present");
  } else {
    c.pass("weights", "apart run --init model will refuse: the external-data file " +
                          quote(model.missing_external_files.front()) +
                          (model.missing_external_files.size() > 1
                               ? " (and " + std::to_string(model.missing_external_files.size() - 1) + " more)"
                               : std::string()) +
                          " is not beside the model; apart run --init random trains from fresh values");
  }
}

void check_prediction(Checker& c, const PlanDocument& plan) {
  if (!plan.predicted || !plan.predicted->iteration_s) {
    c.pass("prediction", "plan.json predicts no iteration time to reproduce");
    return;
  }
  try {
    const double replayed = sim::simulate(sim::sim_plan(plan)).iteration_s;
    const double predicted = *plan.predicted->iteration_s;
    const bool simulated = plan.predicted->source.value_or("") == "simulated";
    const double tolerance = (simulated ? 1e-9 : 0.5) * std::max(std::abs(predicted), 1e-12);
    const std::string figures = "predicted " + format_seconds(predicted) + ", apart simulate replays " +
                                format_seconds(replayed);
    if (std::abs(replayed - predicted) <= tolerance)
      c.pass("prediction", figures + (simulated ? "" : " (an analytic estimate: within 50 %)"));
    else
      c.fail("prediction", figures + ": the stages' times or the cluster's links in plan.json do not give its "
                                     "prediction (an edited plan.json?); re-run apart partition");
  } catch (const Error& e) {
    c.fail("prediction", std::string("apart simulate cannot replay it: ") + e.what());
  }
}

}  // namespace

bool PlanCheck::ok() const {
  return std::all_of(findings.begin(), findings.end(), [](const PlanFinding& f) { return f.ok; });
}

PlanCheck check_plan_folder(const fs::path& plan_path, const fs::path& model_arg) {
  Checker c;
  const fs::path json = plan_json_path(plan_path);  // InvalidArgument when it is no plan folder
  const fs::path dir = json.parent_path();
  PlanDocument plan;
  try {
    plan = read_plan(plan_path);
    c.pass("schema", std::string(kPlanSchema) + ", " + std::to_string(plan.stages.size()) + " stages on " +
                         std::to_string(plan_devices(plan)) + " devices");
  } catch (const InvalidModel& e) {
    c.fail("schema", e.what());
    return c.result;
  }

  // model: from the plan folder first (plan/model_location.h), so a copied plan folder checks from anywhere
  std::optional<ImportedModel> imported;
  try {
    const PlanModelLocation model = locate_plan_model(plan, dir, model_arg);
    try {
      ImportOptions options = planned_import(plan);
      options.require_external_data = false;
      if (plan.training.global_batch) {
        options.batch = *plan.training.global_batch;
        options.batch_explicit = true;
      }
      imported = import_model(model.path.string(), options);
      c.pass("model", model.path.string() + " (" + model.found_by + ")" +
                          (plan.model && !plan.model->sha256.empty() ? ", sha256 as the plan's" : ""));
    } catch (const Error& e) {
      c.fail("model", std::string("the model does not import: ") + e.what());
    }
  } catch (const InvalidArgument& e) {
    c.fail("model", std::string(e.what()) + " (apart check PLAN MODEL)");
  }
  if (imported) {
    check_tasks(c, plan, imported->graph);
    check_loss_and_weights(c, *imported);
  } else {
    c.fail("tasks", "not checked: no model to check the stages' tasks against");
    c.fail("order", "not checked: no model");
  }

  // devices and memory
  int highest = -1;
  for (const PlanStageRecord& stage : plan.stages)
    for (int d : stage.devices) highest = std::max(highest, d);
  if (highest < plan.cluster.devices && plan_devices(plan) <= plan.cluster.devices)
    c.pass("devices", std::to_string(plan_devices(plan)) + " of the cluster's " + std::to_string(plan.cluster.devices) +
                          ", each in one stage");
  else
    c.fail("devices", "the stages use device " + std::to_string(highest) + " (" + std::to_string(plan_devices(plan)) +
                          " devices) but cluster.devices is " + std::to_string(plan.cluster.devices));
  if (!plan.cluster.memory_bytes) {
    c.pass("memory", "plan.json records no device capacity to check against");
  } else {
    std::vector<std::string> over;
    int64_t peak = 0;
    for (const PlanStageRecord& stage : plan.stages) {
      const int64_t m = stage.memory_bytes.value_or(0);
      peak = std::max(peak, m);
      if (m > *plan.cluster.memory_bytes)
        over.push_back("stage " + std::to_string(stage.id) + " " + format_bytes(static_cast<double>(m)));
    }
    const std::string usable = format_bytes(static_cast<double>(*plan.cluster.memory_bytes));
    if (over.empty()) c.pass("memory", "peak " + format_bytes(static_cast<double>(peak)) + " of " + usable + " usable");
    else c.fail("memory", some(over, 3) + " above the " + usable + " a device may fill");
  }

  check_stage_files(c, plan, dir);
  check_tp_shards(c, plan, dir);
  check_prediction(c, plan);
  // apart run builds each stage's training graph, which needs every shape: a value without one is refused there.
  if (imported && !imported->unknown_shape_values.empty()) {
    c.pass("runtime", "a valid plan apart run does not execute: " +
                          unknown_shapes_warning(imported->graph, imported->unknown_shape_values));
    return c.result;
  }
  try {
    check_executable(plan);
    c.pass("runtime", "apart run executes this plan (mpirun -np " + std::to_string(plan_devices(plan)) + ")");
  } catch (const Unsupported& e) {
    c.pass("runtime", std::string("a valid plan apart run does not execute yet: ") + e.what());
  } catch (const InvalidModel& e) {  // an interleaved plan written before plan.json listed its chunks
    c.pass("runtime", std::string("apart run does not execute this plan: ") + e.what());
  }
  return c.result;
}

}  // namespace apart
