// `apart check PLAN [MODEL]`: a plan folder verified before anyone spends device hours on it — plan.json's schema,
// the model's bytes, every partition invariant, the stage files and the prediction (docs/plan.md, "Checking a plan").
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "codegen/tensor_parallel_shard.h"
#include "plan/plan.h"

namespace apart {

struct PlanFinding {
  bool ok = true;
  std::string check;   // "schema", "model", "tasks", "order", "loss", "weights", "devices", "memory", "stage files", "tp shards",
                       // "prediction", "runtime"
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
//   loss         the model (with the loss plan.json says partition appended) has the scalar loss apart run
//                minimises (choose_loss); failed, naming --loss cross_entropy, when it has none;
//   weights      a note: whether the weights' external-data files are beside the model (apart run --init model
//                refuses a plan whose weights are missing; --init random does not read them);
//   devices      every device index is below cluster.devices and the stages use at most that many;
//   memory       no stage's memory_bytes is above cluster.memory_bytes (what a device may fill);
//   stage files  each stage_K.onnx is ONNX and takes the stage's inputs and produces its outputs (skipped, as a
//                note, for a plan written with --no-stage-models);
//   tp shards    every TP rank's shard of each tensor-parallel stage cuts from its file as apart run cuts it
//                (tensor_parallel_shards, weights' dims only) and its shapes infer;
//   prediction   apart simulate's replay of the plan gives predicted.iteration_s (to 1e-9 relative);
//   runtime      whether `apart run` executes the plan (a note; a plan it cannot run is still a valid plan).
// A check that cannot run for want of an earlier one (no model: no tasks, order) is reported failed with why.
// Throws only for I/O errors outside the plan (SystemError) and InvalidArgument when `plan` is no plan folder.
PlanCheck check_plan_folder(const std::filesystem::path& plan, const std::filesystem::path& model = {});

// One TP rank's shard of a stage file (of a chunk's in an interleaved plan), cut as apart run cuts it.
struct TpRankShard {
  int stage = 0;  // the stage (chunk) id
  int rank = 0;   // the TP rank
  std::filesystem::path file;  // the stage file it is cut from
  TpShard shard;
};
// Every TP rank's shard of every stage of `plan` (read from folder `dir`) with a TP degree above 1, in stage then rank
// order: values the stage reads only for their shape folded at its micro-batch, then shard_stage_for_tensor_parallel
// with the plan's regions and the stage's sequence parallelism. `weights` kCut needs the sliced weights inline or
// their external data under `dir`. Throws the pass's errors (Unsupported, InvalidModel naming the node or value).
std::vector<TpRankShard> tensor_parallel_shards(const PlanDocument& plan, const std::filesystem::path& dir,
                                                TpWeights weights);

// `apart check --write-shards OUT`: each TP rank's shard of each TP stage of the plan folder `plan`, as
// OUT/stage_K.tp_R.onnx (chunk_C.tp_R.onnx in an interleaved plan), to open in Netron: the graph a rank runs, with its
// ai.apart collectives and every shape. Weights the stage file holds inline are the rank's slices; those it keeps as
// external data (a graph-only model's) are written with their shard's dims and no data (TpWeights::kShapesOnly; apart
// run reads and cuts them at load). OUT is created if missing; each file is written through a temporary and a rename. Returns the files written; throws as tensor_parallel_shards, InvalidArgument when `out` is
// the plan folder, SystemError when it cannot be written.
std::vector<std::filesystem::path> write_tensor_parallel_shards(const std::filesystem::path& plan,
                                                                const std::filesystem::path& out);

}  // namespace apart
