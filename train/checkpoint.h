// Training checkpoints (params + optimizer state + step, one binary file, temp + rename) and writing
// trained weights back into a standard ONNX model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "runtime/backend.h"
#include "runtime/tensor.h"

namespace apart {

// The file inside a checkpoint directory. Format (docs/training.md, "Checkpoints"): the 8 bytes
// "APARTCKP", u32 version (2), u32 CRC-32C of the header JSON, u64 header length H, H bytes of JSON
// {"format":"apart.checkpoint/1","step":N,"meta":{…},"tensors":[{"name","dtype","shape","offset","bytes","crc32c"}]},
// zero padding to a multiple of 64, then the tensors' raw little-endian bytes, each at its offset
// (relative to the data start, 64-aligned), zero padding after each to a multiple of 64. Version 1 (read, not
// written) is the same without checksums (a 0 in their place).
inline constexpr const char* kCheckpointFile = "checkpoint.apart";

struct Checkpoint {
  int64_t step = 0;
  nlohmann::json meta = nlohmann::json::object();      // optimizer, options, model: what wrote it
  std::vector<std::pair<std::string, Tensor>> tensors;  // "param/<name>", "optim/<name>/<slot>"
  std::string warning;  // non-empty: read without verifying (a version-1 file has no checksums); the caller says so
};

// Writes DIR/checkpoint.apart (creating DIR) through a temporary file and a rename, so a crash
// leaves the previous checkpoint intact. Tensors may be host tensors or `backend`'s (copied to the host one at a
// time as they are written). Throws SystemError for I/O; a full disk, a quota or a file-size limit (SIGXFSZ ignored:
// train/preemption.h) is a SystemError naming the folder and the bytes needed, and leaves no temporary file.
void write_checkpoint(const std::filesystem::path& dir, int64_t step, const nlohmann::json& meta,
                      const std::vector<std::pair<std::string, const Tensor*>>& tensors, Backend& backend = cpu_backend());
// The same format at any file path (apart run: one shard per rank, DIR/step_N/rank_R.apart).
void write_checkpoint_file(const std::filesystem::path& file, int64_t step, const nlohmann::json& meta,
                           const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                           Backend& backend = cpu_backend());
// Whether `file` starts with the checkpoint magic, i.e. apart wrote it (train replaces only such a file).
bool is_checkpoint_file(const std::filesystem::path& file);
// Reads DIR/checkpoint.apart (or a path to the file itself) into host tensors (Backend::copy puts them into device
// params), every checksum verified first. Throws InvalidArgument naming the file and what is wrong (missing,
// truncated, bad magic/version/header, tensors past the end), CorruptData naming the file and the tensor (or header,
// padding, length) whose bytes fail their checksum. A version-1 file (no checksums) loads with Checkpoint::warning.
Checkpoint read_checkpoint(const std::filesystem::path& dir_or_file);

// --- apart run's shards at another layout of the same plan (docs/runtime.md "Checkpoints") -----------------------
// A rank's shard names what it holds as the optimizer names it: "param/<name>", "optim/<name>/<slot>", and under ZeRO
// "<name>[begin:end]" for the elements [begin, end) of a param it owns.
struct CheckpointPiece {
  std::string param;
  int64_t begin = -1, end = -1;  // -1: the whole param
};
CheckpointPiece checkpoint_piece(const std::string& name);  // "w[0:10]" → {w, 0, 10}; "w" → {w, -1, -1}

// The tensors of several shards of one stage (its replicas at one TP rank) put together whole: "param/<name>" and
// "optim/<name>/<slot>" each whole, from a shard holding it whole or from the pieces the shards hold (every element
// exactly once, else InvalidArgument naming the tensor and `where`). `param_shapes`: the stage's params' whole shapes.
struct WholeCheckpoint {
  std::map<std::string, Tensor> tensors;
  int64_t optimizer_steps = -1;  // -1: no shard read
  // `key` ("param/<name>" or "optim/<name>/<slot>") as piece `piece` of it (whole when piece.begin < 0), a host tensor
  // of `shape`; InvalidArgument naming `what` when the checkpoint lacks it or its size differs.
  Tensor cut(const std::string& key, const CheckpointPiece& piece, const std::vector<int64_t>& shape,
             const std::string& what, const std::string& where) const;
};
WholeCheckpoint assemble_checkpoint_shards(const std::vector<std::filesystem::path>& shards,
                                           const std::map<std::string, std::vector<int64_t>>& param_shapes,
                                           const std::string& where);

// Writes `forward_model` (an ONNX file) with every initializer named in `values` replaced by the
// given tensor (a float32 value of a float16/bfloat16 initializer is rounded back to that dtype); other initializers
// keep their values (external data is read and rewritten). Below
// 2 GiB of initializers everything is inline; above, all initializers go to one external-data file
// "<output name>.data" beside the output, each at a 4096-aligned offset. Temp files + rename.
// `external_threshold_bytes` exists for tests. Throws InvalidArgument for a name that is not an
// initializer or a shape/dtype mismatch, SystemError for I/O.
void write_trained_model(const std::filesystem::path& forward_model, const std::filesystem::path& output,
                         const std::map<std::string, const Tensor*>& values,
                         int64_t external_threshold_bytes = int64_t{2} << 30);

}  // namespace apart
