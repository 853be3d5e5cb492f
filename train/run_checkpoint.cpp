// apart run's checkpoint: the manifest, each stage's shard, saving and resuming (see run_checkpoint.h).
#include "train/run_checkpoint.h"

#include <algorithm>
#include <optional>
#include <system_error>

#include "graph/atomic_file.h"
#include "graph/json_reader.h"
#include "graph/sha256.h"
#include "train/checkpoint.h"
#include "train/run_checkpoint_files.h"

namespace apart {
namespace fs = std::filesystem;

namespace {

constexpr const char* kManifestFormat = "apart.run-checkpoint/1";

// What a checkpoint's state depends on: which tasks (so which params) each stage holds and its TP degree, and the
// global batch (the data continues by step). Not the replicas or the ZeRO stage: resuming reshards over those. An
// interleaved plan's "stages" are its P·v chunks, and "positions" is P (chunk c sits at stage c mod P); absent, the
// stages are the plan's (so a layout written before interleaved checkpoints reads the same).
nlohmann::json checkpoint_layout(const RunSetup& s) {
  nlohmann::json stages = nlohmann::json::array();
  for (const PlanStageRecord& stage : s.full_plan.stages) {
    std::string tasks;
    for (const std::string& t : stage.tasks) tasks += t + "\n";
    stages.push_back({{"tasks_sha256", sha256_hex(tasks)}, {"tp", stage.tp}});
  }
  nlohmann::json layout = {{"global_batch", s.global_batch}, {"stages", stages}};
  if (is_virtual_stage_view(s.full_plan)) layout["positions"] = s.positions;
  return layout;
}

// A layout as the refusals name it: "1 stage", "2 stages", or "4 chunks over 2 stages (interleaved, v = 2)".
std::string describe_layout(const nlohmann::json& layout) {
  const size_t stages = layout.value("stages", nlohmann::json::array()).size();
  if (!layout.contains("positions")) return std::to_string(stages) + (stages == 1 ? " stage" : " stages");
  const nlohmann::json& positions = layout["positions"];
  const int64_t p = positions.is_number_integer() ? positions.get<int64_t>() : 0;
  return std::to_string(stages) + " chunks over " + positions.dump() +
         " stages (interleaved, v = " + (p > 0 ? std::to_string(static_cast<int64_t>(stages) / p) : std::string("?")) +
         ")";
}

// A rank's shard of a checkpoint: rank_R.apart, or in an interleaved plan one file per chunk C it holds,
// rank_R.chunk_C.apart (each chunk has its own params, optimizer and ZeRO pieces).
std::string shard_name(int rank, int chunk = -1) {
  return "rank_" + std::to_string(rank) + (chunk >= 0 ? ".chunk_" + std::to_string(chunk) : "") + ".apart";
}

// A checkpoint of another world size or plan resumes when this plan has its layout (checkpoint_layout: the same
// stages, or chunks at the same positions, with the same tasks and TP degrees, and the global batch), at any replicas
// and ZeRO stage; otherwise InvalidArgument naming what differs (both layouts when those do).
void check_resharding(const Manifest& m, const RunSetup& setup, int world, const std::string& where) {
  if (m.layout.is_null())
    throw InvalidArgument(where + " was written by a run on " + std::to_string(m.world) + " ranks of " +
                          (m.plan_sha256 == setup.plan_sha256 ? "this plan" : "another plan") + " (this run has " +
                          std::to_string(world) +
                          ") before checkpoints recorded their layout: resume with the "
                          "plan and the rank count it was written with");
  const nlohmann::json mine = checkpoint_layout(setup);
  auto refuse = [&](const std::string& what) {
    throw InvalidArgument(where + " was written for a plan " + what +
                          "; a checkpoint resumes on a plan of the same "
                          "stages or chunks (tasks and TP degree) and global batch, at any replicas and ZeRO stage: "
                          "re-partition with the same --stages/--tp/--batch/--schedule/--virtual-stages, or resume "
                          "with the plan it was written with");
  };
  const nlohmann::json& theirs = m.layout.value("stages", nlohmann::json::array());
  if (m.layout.value("global_batch", nlohmann::json()) != mine["global_batch"])
    refuse("of global batch " + m.layout.value("global_batch", nlohmann::json()).dump() +
           " (this plan's: " + mine["global_batch"].dump() + ")");
  if (theirs.size() != mine["stages"].size() ||
      m.layout.value("positions", nlohmann::json()) != mine.value("positions", nlohmann::json()))
    refuse("of " + describe_layout(m.layout) + " (this plan has " + describe_layout(mine) + ")");
  const std::string part = mine.contains("positions") ? "chunk " : "stage ";
  auto degrees = [](const nlohmann::json& stages) {  // "[2, 1]": each stage's (or chunk's) TP degree
    std::string listed;
    for (const nlohmann::json& stage : stages)
      listed += (listed.empty() ? "" : ", ") + (stage.is_object() ? stage.value("tp", nlohmann::json()).dump() : "?");
    return "[" + listed + "]";
  };
  if (degrees(theirs) != degrees(mine["stages"]))
    refuse(std::string("whose ") + (mine.contains("positions") ? "chunks" : "stages") + " have TP degrees " +
           degrees(theirs) + " (this plan's: " + degrees(mine["stages"]) + ")");
  for (size_t k = 0; k < theirs.size(); ++k) {
    if (theirs[k].value("tasks_sha256", nlohmann::json()) != mine["stages"][k]["tasks_sha256"])
      refuse("whose " + part + std::to_string(k) + " holds other tasks (the model cut elsewhere)");
  }
}

}  // namespace

Manifest read_manifest(const fs::path& dir) {
  const fs::path file = dir / kManifestFile;
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    throw InvalidArgument("--resume " + dir.string() + ": no " + kManifestFile +
                          " (not a checkpoint folder apart run wrote, "
                          "or its first save did not finish)");
  const nlohmann::json j = read_sealed_manifest(file);  // its checksum verified
  const JsonReader r(file.string(), kManifestFormat, "docs/runtime.md", JsonReader::Null::kInvalid,
                     ErrorKind::kInvalidArgument, "resume from a checkpoint folder apart run wrote");
  if (!j.is_object() || r.string(j, "", "format") != kManifestFormat)
    r.fail("format", std::string("must be ") + kManifestFormat);
  Manifest m;
  m.step = r.integer(j, "", "step", 0, limits::kMaxSteps);
  m.world = static_cast<int>(r.integer(j, "", "world", 1, limits::kMaxDevices));
  m.plan_sha256 = r.string(j, "", "plan_sha256");
  m.model_sha256 = r.string(j, "", "model_sha256");
  m.optimizer = r.string(j, "", "optimizer");
  m.data = r.string(j, "", "data");
  m.seed = static_cast<uint64_t>(r.integer(j, "", "seed", 0, JsonReader::kMaxInteger));
  m.folder = r.string(j, "", "folder");
  if (m.folder != "step_" + std::to_string(m.step) && m.folder != ".")
    r.fail("folder", "must be step_" + std::to_string(m.step));
  if (j.contains("lr_schedule_steps"))
    m.lr_schedule_steps = r.integer(j, "", "lr_schedule_steps", 1, limits::kMaxSteps);
  if (j.contains("kept"))
    for (const auto& k : r.array(j, "", "kept"))
      if (k.is_string() && k.get<std::string>().rfind("step_", 0) == 0 &&
          k.get<std::string>().find('/') == std::string::npos)
        m.kept.push_back(k.get<std::string>());
  if (j.contains("layout") && j.contains("ranks")) {
    m.layout = j["layout"];
    if (!m.layout.is_object()) r.fail("layout", "must be an object");
    if (!j["ranks"].is_array() || static_cast<int>(j["ranks"].size()) != m.world)
      r.fail("ranks", "must list every rank");
    for (const auto& role : j["ranks"]) {
      if (!role.is_array() || role.size() != 3 || !role[0].is_number_integer() || !role[1].is_number_integer() ||
          !role[2].is_number_integer())
        r.fail("ranks", "each must be [stage, replica, tp_rank]");
      m.ranks.push_back({role[0].get<int>(), role[1].get<int>(), role[2].get<int>()});
    }
  }
  return m;
}

void RunCheckpoint::save(int64_t step_done, const std::vector<StageShard>& stage_shards, const std::string& optimizer,
                         int64_t lr_schedule_steps) {
  const fs::path dir(options_.checkpoint_dir);
  const std::string folder = "step_" + std::to_string(step_done);
  std::error_code ec;
  fs::create_directories(dir / folder, ec);
  if (ec) throw SystemError("cannot create " + (dir / folder).string() + ": " + ec.message());
  // A shard that cannot be written (a full disk, a quota, a file-size limit) fails the save on every rank alike: the
  // flag rides one world all-reduce, so no rank waits at the barrier for it and none is killed mid-write.
  std::string failed;
  try {
    for (const StageShard& shard : stage_shards) write_shard(dir / folder, step_done, shard);
  } catch (const SystemError& e) {
    failed = e.what();
  }
  double failures = failed.empty() ? 0.0 : 1.0;
  world_.allreduce_sum(std::span<double>(&failures, 1))->wait();  // also: every shard is on disk before the manifest
  std::optional<Manifest> previous;
  if (world_.rank() == 0 && fs::exists(dir / kManifestFile, ec)) previous = read_manifest(dir);
  if (failures > 0) {
    // The step's folder goes unless a manifest names it (a re-save of the latest): the previous stays the latest.
    const bool named =
        previous && (previous->folder == folder ||
                     std::find(previous->kept.begin(), previous->kept.end(), folder) != previous->kept.end());
    world_.barrier();
    if (world_.rank() == 0 && !named) fs::remove_all(dir / folder, ec);
    // The ranks whose shard was written report the failure as a consequence (CommError), so the in-process run
    // reports the rank that names the folder and the bytes.
    if (failed.empty())
      throw CommError("the checkpoint of step " + std::to_string(step_done) + " into " + (dir / folder).string() +
                      " failed on another rank (it names the folder and the bytes); the previous checkpoint is still "
                      "the latest");
    throw CheckpointWriteFailed(failed);
  }
  if (world_.rank() == 0) {
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < world_.size(); ++r) {
      const RankRole role = rank_role(setup_.full_plan, r);
      ranks.push_back({role.stage, role.replica, role.tp_rank});
    }
    int shards = 0;  // one per rank, or per rank and chunk
    for (const PlanStageRecord& stage : setup_.full_plan.stages) shards += static_cast<int>(stage.devices.size());
    // --keep-last N: the N - 1 newest earlier complete folders stay, the rest (only folders a manifest named) go.
    std::vector<std::string> kept = previous ? previous->kept : std::vector<std::string>{};
    if (previous && previous->folder != folder && previous->folder != ".") kept.push_back(previous->folder);
    std::erase(kept, folder);
    std::vector<std::string> dropped;
    while (!kept.empty() && static_cast<int64_t>(kept.size()) >= options_.keep_last) {
      dropped.push_back(kept.front());
      kept.erase(kept.begin());
    }
    nlohmann::ordered_json manifest = {{"format", kManifestFormat},
                                       {"step", step_done},
                                       {"world", world_.size()},
                                       {"folder", folder},
                                       {"plan_sha256", setup_.plan_sha256},
                                       {"model_sha256", setup_.model_sha256},
                                       {"optimizer", optimizer},
                                       {"seed", options_.seed},
                                       {"data", options_.data.spec},
                                       {"shards", shards},
                                       {"layout", checkpoint_layout(setup_)},
                                       {"ranks", ranks},
                                       {"lr_schedule_steps", lr_schedule_steps},
                                       {"kept", kept}};
    // A copy inside the step's folder makes it resumable on its own (--resume DIR/step_N), once the latest moved on.
    nlohmann::ordered_json own = manifest;
    own["folder"] = ".";
    own["kept"] = nlohmann::json::array();
    write_file_atomically(dir / folder / kManifestFile, sealed_manifest_text(own));
    write_file_atomically(dir / kManifestFile, sealed_manifest_text(manifest));
    if (options_.on_note)
      options_.on_note("checkpoint of step " + std::to_string(step_done) + " written: " + (dir / folder).string() +
                       " (" + std::to_string(shards) + " shard" + (shards == 1 ? "" : "s") + "; resume with --resume " +
                       dir.string() + ")");
    // The steps it replaced were ours (a manifest named them): removed now that they are no longer kept.
    for (const std::string& old : dropped) {
      fs::remove_all(dir / old, ec);
      if (options_.on_note)
        options_.on_note("checkpoint " + (dir / old).string() + " deleted (--keep-last " +
                         std::to_string(options_.keep_last) + ")");
    }
  }
  world_.barrier();
}

int64_t RunCheckpoint::restore(std::vector<StageShard>& shards, const std::string& optimizer,
                               int64_t& lr_schedule_steps) {
  const fs::path dir(options_.resume);
  const Manifest m = read_manifest(dir);
  const std::string where = "--resume " + dir.string();
  const bool same_plan = m.world == world_.size() && m.plan_sha256 == setup_.plan_sha256;
  if (!same_plan) check_resharding(m, setup_, world_.size(), where);
  if (m.model_sha256 != setup_.model_sha256)
    throw InvalidArgument(where + " was written for another model (sha256 differs)");
  if (m.optimizer != optimizer)
    throw InvalidArgument(where + " was written with --optimizer " + m.optimizer + "; resume with the same optimizer");
  if (m.seed != options_.seed || m.data != options_.data.spec)
    throw InvalidArgument(where + " was written with --seed " + std::to_string(m.seed) + " --data " + m.data +
                          "; resume with the same seed and data, so that the batches continue where they stopped");
  if (m.step > options_.steps)
    throw InvalidArgument(where + " is at step " + std::to_string(m.step) + ", past --steps " +
                          std::to_string(options_.steps));
  lr_schedule_steps = resumed_lr_schedule_steps(options_.schedule, options_.steps,
                                                m.lr_schedule_steps > 0 ? m.lr_schedule_steps : options_.steps,
                                                world_.rank() == 0 ? options_.on_note : nullptr);
  for (StageShard& shard : shards) {
    if (same_plan)
      restore_shard(dir / m.folder, where, shard);
    else
      restore_resharded(dir / m.folder, m, where, shard);
  }
  return m.step;
}

int RunCheckpoint::chunk_of(const StageShard& shard) const {
  return is_virtual_stage_view(setup_.full_plan) ? shard.stage : -1;
}

void RunCheckpoint::write_shard(const fs::path& folder, int64_t step_done, const StageShard& shard) const {
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const auto& [name, t] : shard.tensors) tensors.emplace_back(name, t);
  nlohmann::json meta = {{"stage", shard.stage},
                         {"replica", setup_.role.replica},
                         {"tp_rank", setup_.role.tp_rank},
                         {"rank", world_.rank()},
                         {"optimizer_steps", shard.optimizer->steps_taken()}};
  shard.scaler->save(meta);
  write_checkpoint_file(folder / shard_name(world_.rank(), chunk_of(shard)), step_done, meta, tensors, *shard.backend);
}

void RunCheckpoint::restore_shard(const fs::path& folder, const std::string& where, StageShard& shard) const {
  const int chunk = chunk_of(shard);
  Checkpoint ck = read_checkpoint(folder / shard_name(world_.rank(), chunk));  // its checksums verified
  if (!ck.warning.empty() && options_.on_warning && world_.rank() == 0) options_.on_warning(ck.warning);
  if (ck.meta.value("stage", -1) != shard.stage || ck.meta.value("replica", -1) != setup_.role.replica ||
      ck.meta.value("tp_rank", 0) != setup_.role.tp_rank)
    throw InvalidArgument(where + ": the shard of rank " + std::to_string(world_.rank()) + " holds another " +
                          (chunk >= 0 ? "chunk" : "stage") + " or replica");
  std::map<std::string, Tensor> saved;
  for (auto& [name, t] : ck.tensors) saved[name] = std::move(t);
  std::vector<std::pair<std::string, Tensor>> state;
  for (auto& [name, t] : saved)
    if (name.rfind("optim/", 0) == 0) state.emplace_back(name.substr(6), t);
  for (const auto& [name, t] : shard.tensors) {
    if (name.rfind("param/", 0) != 0) continue;
    auto it = saved.find(name);
    if (it == saved.end() || it->second.shape() != t->shape() || it->second.dtype() != t->dtype())
      throw InvalidArgument(where + ": rank " + std::to_string(world_.rank()) + "'s shard has no matching " + name);
    shard.backend->copy(it->second, *t);
  }
  shard.optimizer->restore(ck.meta.value("optimizer_steps", int64_t{0}), std::move(state));
  shard.scaler->load(ck.meta);
}

void RunCheckpoint::restore_resharded(const fs::path& folder, const Manifest& m, const std::string& where,
                                      StageShard& shard) const {
  // The writing run's ranks of this stage at this TP rank: every replica's pieces. In an interleaved plan (the same
  // chunks at the same positions: check_resharding) the ranks at this chunk's position, each its file of the chunk.
  const bool chunks = is_virtual_stage_view(setup_.full_plan);
  const int position = shard.stage % setup_.positions;
  std::vector<fs::path> shards;
  for (int q = 0; q < m.world; ++q)
    if (m.ranks[static_cast<size_t>(q)].stage == position &&
        m.ranks[static_cast<size_t>(q)].tp_rank == setup_.role.tp_rank)
      shards.push_back(folder / shard_name(q, chunks ? shard.stage : -1));
  const WholeCheckpoint whole = assemble_checkpoint_shards(shards, shard.param_shapes, where);
  if (whole.optimizer_steps < 0)
    throw InvalidArgument(where + ": no shard holds " + (chunks ? "chunk " : "stage ") + std::to_string(shard.stage) +
                          " at TP rank " + std::to_string(setup_.role.tp_rank));
  for (const auto& [name, t] : shard.tensors) {
    if (name.rfind("param/", 0) != 0) continue;
    const CheckpointPiece piece = checkpoint_piece(name.substr(6));
    shard.backend->copy(whole.cut("param/" + piece.param, piece, t->shape(), name, where), *t);
  }
  std::vector<std::pair<std::string, Tensor>> state;  // each step name's slots, cut from the whole
  for (size_t i = 0; i < shard.step_names.size(); ++i) {
    const CheckpointPiece piece = checkpoint_piece(shard.step_names[i]);
    const std::string prefix = "optim/" + piece.param + "/";
    for (auto it = whole.tensors.lower_bound(prefix); it != whole.tensors.end() && it->first.rfind(prefix, 0) == 0;
         ++it)
      if (const std::string slot = it->first.substr(prefix.size()); slot.find('/') == std::string::npos)
        state.emplace_back(shard.step_names[i] + "/" + slot,
                           whole.cut(it->first, piece, shard.step_params[i]->shape(), it->first, where));
  }
  shard.optimizer->restore(whole.optimizer_steps, std::move(state));
}

}  // namespace apart
