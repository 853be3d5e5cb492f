// apart run's setup: the plan folder, its stage files, the model and the outputs, checked before any message.
#include "train/run_setup.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <system_error>
#include <vector>

#include "codegen/stage_graphs.h"
#include "graph/checked.h"
#include "graph/error.h"
#include "graph/output_path.h"
#include "graph/sha256.h"
#include "graph/text.h"
#include "importer/model_proto.h"
#include "plan/model_location.h"
#include "train/run_checkpoint.h"

namespace apart {
namespace fs = std::filesystem;

void RunOptions::validate() const {
  if (plan.empty()) throw InvalidArgument("no plan given: apart run PLAN_DIR (what apart partition wrote)");
  TrainingLoopOptions::validate();
  if (trace_all_steps && trace.empty()) throw InvalidArgument("--trace-all-steps needs --trace FILE");
}

std::string rank_label(int rank, int world, const RankRole& role) {
  return "rank " + std::to_string(rank) + "/" + std::to_string(world) + " stage " + std::to_string(role.stage) +
         " replica " + std::to_string(role.replica) +
         (role.tp_rank > 0 ? " tp rank " + std::to_string(role.tp_rank) : "");
}

namespace {

// The model's loss, by the rule build_training_graph applies (codegen/autodiff.h choose_loss).
std::string model_loss(const TaskGraph& graph, const std::string& requested, const std::string& model) {
  std::vector<LossCandidate> outputs;
  for (ValueId v : graph.graph_outputs()) {
    const Value& value = graph.value(v);
    outputs.push_back({value.name, is_floating(value.dtype) && value.shape_known && value.elements == 1});
  }
  return choose_loss(outputs, requested, model);
}

// A stage file that is ONNX and fits its plan record: a graph input for each of the stage's plan inputs, a graph
// output for each of its plan outputs. Every rank checks every stage's file (protobuf only; weights are read by
// the rank that trains them), so a truncated, foreign or swapped stage_K.onnx fails everywhere before any message.
// `init`: under --init model the stage's external-data files (PLAN/weights/…, linked there by apart partition) must
// exist, or every rank refuses here, naming the file and --init random, which never reads them.
void check_stage_file(const fs::path& file, const PlanStageRecord& stage, ParamInit init) {
  std::vector<std::string> inputs, outputs;
  for (const PlanInput& in : stage.inputs) inputs.push_back(in.value);
  for (const PlanOutput& out : stage.outputs) outputs.push_back(out.value);
  // InvalidModel naming the file when it is not ONNX.
  const onnx::ModelProto proto = load_model_proto(file);
  if (init == ParamInit::kModel)
    for (const auto& t : proto.graph().initializer()) {
      if (t.data_location() != onnx::TensorProto::EXTERNAL) continue;
      for (const auto& kv : t.external_data()) {
        std::error_code ec;
        if (kv.key() != "location" || fs::is_regular_file(file.parent_path() / kv.value(), ec)) continue;
        throw InvalidModel("the weights of " + file.string() + " are external data in " +
                           quote((file.parent_path() / kv.value()).string()) +
                           ", which is not present: link or copy the "
                           "model's weights file there to train from its weights, or pass --init random to train from "
                           "freshly initialized ones");
      }
    }
  const MissingInterface missing = missing_interface(proto, inputs, outputs);
  auto refuse = [&](const std::string& what, const std::string& value) {
    throw InvalidModel(
        file.string() + " is not stage " + std::to_string(stage.id) + " of this plan: plan.json's stages[" +
        std::to_string(stage.id) + "]." + what + " names " + quote(value) + ", which the file does not " +
        (what == "inputs" ? "take as an input" : "output") + "; re-run apart partition to rewrite the plan folder");
  };
  if (!missing.inputs.empty()) refuse("inputs", missing.inputs.front());
  if (!missing.outputs.empty()) refuse("outputs", missing.outputs.front());
}

RunSetup check_plan(const RunOptions& options, int rank, int world) {
  RunSetup s;
  s.plan = read_plan(options.plan);
  s.plan_dir = fs::is_directory(options.plan) ? fs::path(options.plan) : fs::path(options.plan).parent_path();
  const PlanDocument& plan = s.plan;
  check_executable(plan);  // before the stage files: a plan the runtime cannot run says so first
  const int devices = plan_devices(plan);
  if (devices != world)
    throw InvalidArgument("the plan " + options.plan + " runs on " + std::to_string(devices) + " processes (" +
                          std::to_string(plan.stages.size()) + " stages); this run has " + std::to_string(world) +
                          ": launch it with mpirun -np " + std::to_string(devices));
  // An interleaved plan runs as its chunks (plan/plan.h virtual_stage_view), each from its chunk_C.onnx.
  const bool interleaved = plan.training.schedule == Schedule::kInterleaved;
  const PlanDocument pipeline = interleaved ? virtual_stage_view(plan) : PlanDocument{};
  const PlanDocument& run = interleaved ? pipeline : plan;
  for (size_t k = 0; k < run.stages.size(); ++k) {
    const fs::path file = s.plan_dir / stage_file_name(run, static_cast<int>(k));
    std::error_code ec;
    if (!fs::is_regular_file(file, ec))
      throw InvalidArgument("the plan folder " + s.plan_dir.string() + " has no " + file.filename().string() +
                            " (stage " + std::to_string(k) + " of " + std::to_string(run.stages.size()) +
                            "): re-run apart partition to write it");
    check_stage_file(file, run.stages[k], options.init);
  }
  if (!plan.training.global_batch)
    throw InvalidModel(options.plan + ": training.global_batch is missing; apart run needs it to split the batch");
  s.global_batch = *plan.training.global_batch;
  s.microbatches = plan.training.microbatches;
  if (s.global_batch % s.microbatches != 0)
    throw InvalidModel(options.plan + ": training.global_batch " + std::to_string(s.global_batch) +
                       " does not divide into " + std::to_string(s.microbatches) + " micro-batches");
  s.microbatch_samples = s.global_batch / s.microbatches;
  for (const auto& stage : plan.stages)
    if (s.microbatch_samples < stage.replicas)
      throw InvalidModel(options.plan + ": stage " + std::to_string(stage.id) + " has " +
                         std::to_string(stage.replicas) + " replicas, more than the " +
                         std::to_string(s.microbatch_samples) +
                         " samples of a micro-batch: some replica would get none; re-run apart partition");

  // The model: --model, else the one the plan names, found from the plan folder first (plan/model_location.h), and
  // the same bytes (sha256).
  const PlanModelLocation model = locate_plan_model(plan, plan_json_path(options.plan).parent_path(), options.model);
  s.model_path = model.path;
  s.model_sha256 = model.sha256;
  s.plan_sha256 = sha256_file_hex(plan_json_path(options.plan));
  s.role = rank_role(plan, rank);
  s.tp = max_tp_degree(plan);
  if (s.tp > 1) {
    // Every region a TP stage splits needs its shard layout (plans before apart run executed TP stages lack it). A
    // plan with no region (none found, or every one left whole: apart run's shard pass refuses it) runs each TP
    // stage whole on every rank of its group.
    const bool laid_out =
        !plan.tensor_parallel.has_value() ||
        std::all_of(
            plan.tensor_parallel->regions.begin(), plan.tensor_parallel->regions.end(), [](const PlanTpRegion& r) {
              return (r.kind != TpRegionKind::kAttention && r.kind != TpRegionKind::kMlp) || r.has_shard_layout();
            });
    if (!laid_out)
      throw InvalidModel(options.plan + ": the stages are tensor-parallel (tp " + std::to_string(s.tp) +
                         ") but plan.json "
                         "lacks the regions' shard layout (tensor_parallel.regions[].column_tasks …); re-run apart "
                         "partition to rewrite the plan");
  }
  s.positions = static_cast<int>(plan.stages.size());
  if (interleaved) {  // the chunks are the stages; the rank's role is its first chunk's, d (the stage it sits at)
    s.plan = pipeline;
    s.role = rank_role(s.plan, rank);
  }
  s.full_plan = s.plan;
  s.plan = tensor_parallel_view(s.full_plan, s.role.tp_rank);
  return s;
}

}  // namespace

RunSetup set_up_run(const RunOptions& options, int rank, int world) {
  RunSetup setup = check_plan(options, rank, world);
  {
    ImportOptions whole = planned_import(setup.plan);  // with the loss the plan appended, if any
    if (options.added_loss.enabled() &&
        (options.added_loss.form != whole.loss.form || options.added_loss.labels != whole.loss.labels))
      throw InvalidArgument(
          "--loss " + std::string(added_loss_form_name(options.added_loss.form)) + " --labels " +
          options.added_loss.labels + ": the plan " + options.plan + " was made " +
          (whole.loss.enabled()
               ? "with --loss " + std::string(added_loss_form_name(whole.loss.form)) + " --labels " + whole.loss.labels
               : std::string("without a loss to append")) +
          ", and its stage files hold what it was made with: partition the model again with the "
          "--loss you mean, or leave --loss out");
    whole.batch = setup.global_batch;
    whole.batch_explicit = true;
    setup.model = std::make_shared<const ImportedModel>(import_model(setup.model_path.string(), whole));
    setup.loss = model_loss(setup.model->graph, options.loss, setup.model_path.string());
    for (const PlanStageRecord& stage : setup.plan.stages)
      for (const PlanOutput& out : stage.outputs)
        if (out.value == setup.loss) setup.loss_stage = stage.id;
    if (setup.loss_stage < 0)
      throw InvalidModel(options.plan + ": no stage outputs the loss " + quote(setup.loss) +
                         " (a plan for another model?)");
  }
  if (!options.save_model.empty()) {
    std::vector<InputFile> inputs{{"the model", setup.model_path}, {"the plan", plan_json_path(options.plan)}};
    for (const PlanStageRecord& stage : setup.plan.stages)  // the plan's stage files are inputs too
      inputs.push_back(
          {"stage " + std::to_string(stage.id) + "'s file", setup.plan_dir / stage_file_name(setup.plan, stage.id)});
    check_output_file(options.save_model, inputs, "--save-model");
    check_output_not_input(options.save_model + ".data", inputs, "--save-model (its external data)");
  }
  if (!options.checkpoint_dir.empty()) {
    check_output_directory_writable(options.checkpoint_dir, "--checkpoint-dir");
    const fs::path manifest = fs::path(options.checkpoint_dir) / kManifestFile;
    std::error_code ec;
    if (fs::exists(fs::symlink_status(manifest, ec))) read_manifest(options.checkpoint_dir);  // ours, or refused
  }
  if (!options.trace.empty())
    check_output_file(options.trace, {{"the model", setup.model_path}, {"the plan", plan_json_path(options.plan)}},
                      "--trace");
  return setup;
}

}  // namespace apart
