// Training data for `apart train`: a learnable synthetic task, a flat token file (.bin, nanoGPT/Megatron
// style) or one .npy array per model input. Every batch is a pure function of (seed, step), so a
// resumed run sees the batches it would have seen.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "graph/task_graph.h"
#include "runtime/tensor.h"

namespace apart {

// What a graph input is for, read off the graph (what consumes it).
enum class InputRole {
  kTokens,    // integer ids gathered from an embedding table; `range` = its rows (vocabulary)
  kLabels,    // integer class targets of SoftmaxCrossEntropyLoss / NegativeLogLikelihoodLoss; `range` = classes
  kFeatures,  // a float input
  kTargets,   // a float input named like a target ("target", "label", "y")
  kOther,     // an integer input with no recognised use
};

struct ModelInput {
  std::string name;
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;  // static, batch first
  InputRole role = InputRole::kOther;
  int64_t range = 0;           // vocabulary / classes for kTokens / kLabels
};

// The graph inputs that have no initializer, with their roles, but those the trainer feeds itself (`fed_otherwise`:
// the loss scale's seed). Throws InvalidArgument for an input whose shape is not static or has no batch axis.
std::vector<ModelInput> classify_inputs(const TaskGraph& graph, const std::set<std::string>& fed_otherwise = {});

class DataSource {
 public:
  virtual ~DataSource() = default;
  // The inputs of batch number `step` (0-based), by input name.
  virtual std::map<std::string, Tensor> batch(int64_t step) = 0;
  // One line for the log: "synthetic (next = perm(token), vocab 512)", "tokens.bin (uint16, 1.2M tokens)".
  virtual std::string describe() const = 0;
};

struct DataOptions {
  std::string spec = "synthetic";      // --data: synthetic | FILE.bin | name=FILE.npy,name=FILE.npy
  DType token_dtype = DType::kUInt16;  // --data-dtype for .bin files: kUInt16 or kUInt32
  uint64_t seed = 0;
};

// The files a --data spec names: {"", FILE.bin} or {NAME, FILE.npy}…; none for synthetic. Throws InvalidArgument
// for a malformed spec.
std::vector<std::pair<std::string, std::filesystem::path>> data_files(const std::string& spec);

// Tokens one sample of `batch` carries, for throughput in tokens/s: the elements per sample (every dim but the
// leading batch dim) of its integer tensors of rank ≥ 2 — token ids or labels [batch, sequence] — the largest when
// several; 0 when there is none (an image or feature model).
int64_t tokens_per_sample(const std::map<std::string, Tensor>& batch);

// Picks the source from options.spec. Throws InvalidArgument for a spec that does not fit the model
// (a .bin for a model without token inputs, a missing .npy for some input) and InvalidArgument /
// InvalidModel naming the file and what is wrong for bad files.
std::unique_ptr<DataSource> make_data_source(const DataOptions& options, const std::vector<ModelInput>& inputs);

// The synthetic task: token models learn next = perm(token) for a fixed seeded permutation (inputs =
// window[:-1], labels = window[1:]); float models fit a fixed seeded linear teacher (targets, or
// labels = argmax of the teacher's scores); features are N(0, 1).
std::unique_ptr<DataSource> make_synthetic_data(const std::vector<ModelInput>& inputs, uint64_t seed);
// A flat file of uint16/uint32 token ids: random windows of seq+1 tokens per row.
std::unique_ptr<DataSource> make_token_file_data(const std::filesystem::path& path, DType token_dtype,
                                                 const std::vector<ModelInput>& inputs, uint64_t seed);
// One .npy per input (`files`: input name → path); batches are consecutive rows, wrapping.
std::unique_ptr<DataSource> make_npy_data(const std::vector<std::pair<std::string, std::filesystem::path>>& files,
                                          const std::vector<ModelInput>& inputs);

// An .npy header (format v1, v2 or v3). Throws InvalidArgument naming the file and the problem.
struct NpyHeader {
  std::string descr;            // "<f4", "<i8", "<i4", "<u2"
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;
  int64_t data_offset = 0;      // bytes before the array data
};
NpyHeader read_npy_header(const std::filesystem::path& path);
// Writes a C-order little-endian .npy (v1) of `t` (float32, int64, int32 or uint16). For tests and tools.
void write_npy(const std::filesystem::path& path, const Tensor& t);

}  // namespace apart
