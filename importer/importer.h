// ONNX → TaskGraph: safe loading, external-data metadata, dim binding, shape inference, folding.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "graph/task_graph.h"

namespace apart {

// A loss appended to a logits-only export (importer/added_loss.h): `--loss cross_entropy --labels NAME`.
enum class AddedLossForm : uint8_t {
  kNone,
  kCrossEntropy,         // F.cross_entropy(logits.view(-1, V), labels.view(-1))
  kCrossEntropyShifted,  // next-token: the same on logits[..., :-1, :] and labels[..., 1:] (HF causal LMs)
};
struct AddedLoss {
  AddedLossForm form = AddedLossForm::kNone;
  std::string labels = "labels";  // the int64 graph input the pass adds
  bool enabled() const { return form != AddedLossForm::kNone; }
};
// "cross_entropy", "cross_entropy_shifted" ("none" for kNone); parse_added_loss_form gives nullopt for other text.
std::string_view added_loss_form_name(AddedLossForm form);
std::optional<AddedLossForm> parse_added_loss_form(std::string_view name);

struct ImportOptions {
  // --shape name:8x3x224x224 (trtexec style): the full static shape of one graph input.
  std::vector<std::pair<std::string, std::vector<int64_t>>> input_shapes;
  // --dim batch=8: binds a dim_param everywhere it appears.
  std::map<std::string, int64_t> dims;
  // Fail when an external-data file is missing (run needs weights; inspect/partition do not).
  bool require_external_data = false;
  // --batch N: binds the model's batch dim (the kBatchDimNames rule below) when it is dynamic and
  // --dim/--shape leave it free; 0 binds nothing. With batch_explicit (the user typed --batch), a --dim,
  // --shape or static batch dim of another size is an error; without it (a command's default) they win.
  int64_t batch = 0;
  bool batch_explicit = false;
  // --constants-as-params on|off: Constant nodes that feed weight slots become initializers (trainable params)
  // before the rest of import (importer/constant_params.h); off imports them as constants.
  bool constants_as_params = true;
  // --loss cross_entropy[_shifted] --labels NAME: appended to the model's logits before the rest of import, after
  // constants_as_params (importer/added_loss.h); plan.json records it so that every later reader adds the same.
  AddedLoss loss;
};

// The one rule for "which dim is the batch", used by every command: a dim_param named batch,
// batch_size or N (in this order) on a graph input; else the leading dim of the first graph input
// (named, unnamed or static), as exporters write it. Unnamed leading dims of the other inputs follow it.
inline constexpr const char* kBatchDimNames[] = {"batch", "batch_size", "N"};

// The Constant nodes that ImportOptions::constants_as_params made params (importer/constant_params.h).
struct ConstantParams {
  int64_t count = 0;  // Constant nodes that became initializers
  int64_t bytes = 0;  // their bytes
};
// "5 Constant nodes feed weight slots (…) and are trained as parameters (944 B, 944 bytes); --constants-as-params
// off keeps them constants", or "" when none did.
std::string constant_params_note(const ConstantParams& converted);

// How one dynamic dim got its value.
struct DimBinding {
  std::string dim;     // the dim_param name, or "<input>[axis]" for an anonymous dynamic dim
  int64_t value = 0;
  std::string source;  // "--dim batch=8" or "--shape input:8x3x224x224"
};

struct ImportedModel {
  TaskGraph graph;
  std::string path;
  int64_t ir_version = 0;
  std::map<std::string, int64_t> opsets;  // domain ("" = ai.onnx) → version
  std::string producer;                   // producer_name and version
  std::vector<DimBinding> bindings;
  // The batch dim (kBatchDimNames rule) and the size the shapes are bound at; batch 0: the model has
  // no input with a leading dim. batch_dim is its dim_param, "<input>[0]" when unnamed, "" when static.
  int64_t batch = 0;
  std::string batch_dim;
  // The samples the shapes are bound at, as the cost model scales them (CostOptions::reference_batch): `batch`, or 1
  // when the model has no batch axis.
  int64_t bound_samples() const { return batch > 0 ? batch : 1; }
  bool batch_from_flag = false;  // bound by ImportOptions::batch, not by --dim/--shape or the model
  ConstantParams constant_params;  // Constant nodes that became params (ImportOptions::constants_as_params)
  std::vector<std::string> notes;     // informational, e.g. external-data file not present
  std::vector<std::string> warnings;  // e.g. opaque ops whose cost is unknown
  int64_t node_count = 0;             // nodes in the ONNX graph (= tasks)
  bool external_data_present = true;  // every referenced external-data file exists
  std::vector<std::string> missing_external_files;  // the locations that do not, as the model names them
  std::vector<std::filesystem::path> external_data_files;  // each referenced once, resolved (present or not)
  std::vector<std::string> unknown_shape_values;  // produced values whose shape stayed unknown
};

// Loads and imports an ONNX model file. Throws InvalidModel (malformed file or graph),
// InvalidArgument (bad --shape/--dim, unbound dims), Unsupported, SystemError (I/O).
ImportedModel import_model(const std::filesystem::path& path, const ImportOptions& options = {});

// Same, from serialized bytes; `base_dir` resolves external-data locations.
ImportedModel import_model_bytes(const std::string& bytes, const std::filesystem::path& base_dir,
                                 const std::string& display_name, const ImportOptions& options = {});

// Parses "name:8x3x224x224" (the name may itself contain ':'; the last one separates).
std::pair<std::string, std::vector<int64_t>> parse_shape_flag(const std::string& text);
// Parses "batch=8".
std::pair<std::string, int64_t> parse_dim_flag(const std::string& text);

}  // namespace apart
