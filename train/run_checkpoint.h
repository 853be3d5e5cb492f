// apart run's checkpoint (internal to train/pipeline.cpp and its parts): the folder's manifest, each stage's shard,
// saving every rank's shards together, and resuming, at the layout it was written with or resharded onto another
// (docs/runtime.md, "Checkpoints").
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "graph/error.h"
#include "runtime/backend.h"
#include "runtime/communicator.h"
#include "train/loss_scale.h"
#include "train/optimizer.h"
#include "train/pipeline.h"
#include "train/run_setup.h"

namespace apart {

// DIR/manifest.json: which step the folder holds, for which plan, model and world.
inline constexpr const char* kManifestFile = "manifest.json";

struct Manifest {
  int64_t step = 0;
  int world = 0;
  std::string plan_sha256, model_sha256, optimizer, data;
  uint64_t seed = 0;
  std::string folder;             // "step_N", relative to the manifest; "." in the copy inside step_N
  int64_t lr_schedule_steps = 0;  // the span of the writing run's schedule (0: not recorded, an older manifest)
  std::vector<std::string> kept;  // earlier complete step folders still kept (--keep-last), oldest first
  // For a resume at another layout of the same plan (absent in manifests before it): checkpoint_layout of the plan
  // and each rank's role.
  nlohmann::json layout;
  std::vector<RankRole> ranks;
};

// DIR/manifest.json, its checksum verified; InvalidArgument naming --resume DIR when it is not one apart run wrote.
Manifest read_manifest(const std::filesystem::path& dir);

// A checkpoint that some rank could not write (RunCheckpoint::save): every rank throws it together.
struct CheckpointWriteFailed : SystemError {
  using SystemError::SystemError;
};

// One stage's part of a rank's checkpoint, as the stage holds it (in an interleaved plan one per chunk).
struct StageShard {
  int stage = 0;  // the stage, or in an interleaved plan the chunk
  // "param/<name>" (trained params and BatchNorm statistics; "param/<name>[begin:end]" for a ZeRO-3 piece) and
  // "optim/<name>/<slot>": what the shard file holds.
  std::vector<std::pair<std::string, Tensor*>> tensors;
  std::map<std::string, std::vector<int64_t>> param_shapes;  // the stage's params' whole shapes (resharding)
  std::vector<std::string> step_names;  // what the optimizer steps (param names, "name[begin:end]" for a piece)
  std::vector<const Tensor*> step_params;
  ParamOptimizer* optimizer = nullptr;
  LossScaler* scaler = nullptr;
  Backend* backend = nullptr;  // where the stage's tensors live
};

// The checkpoints of one rank's run: every rank calls save and restore together, with its stages' shards in order.
class RunCheckpoint {
 public:
  RunCheckpoint(const RunOptions& options, const RunSetup& setup, Communicator& world)
      : options_(options), setup_(setup), world_(world) {}

  // DIR/step_N: each stage's shard, then (every shard on disk) rank 0 the manifest, keeping the newest --keep-last
  // folders. A shard that cannot be written fails the save on every rank alike (CheckpointWriteFailed on the rank that
  // failed, CommError on the others); the previous checkpoint stays the latest.
  void save(int64_t step_done, const std::vector<StageShard>& shards, const std::string& optimizer,
            int64_t lr_schedule_steps);
  // --resume DIR: the manifest checked against this run, then each stage restored (as written, or resharded from a
  // run of another world size or plan of the same layout). Returns the step it is at; `lr_schedule_steps` becomes the
  // span the resumed schedule keeps.
  int64_t restore(std::vector<StageShard>& shards, const std::string& optimizer, int64_t& lr_schedule_steps);

 private:
  void write_shard(const std::filesystem::path& folder, int64_t step_done, const StageShard& shard) const;
  void restore_shard(const std::filesystem::path& folder, const std::string& where, StageShard& shard) const;
  void restore_resharded(const std::filesystem::path& folder, const Manifest& m, const std::string& where,
                         StageShard& shard) const;
  int chunk_of(const StageShard& shard) const;  // -1 unless the plan is interleaved

  const RunOptions& options_;
  const RunSetup& setup_;
  Communicator& world_;
};

}  // namespace apart
