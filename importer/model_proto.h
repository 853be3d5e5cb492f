// Reading an .onnx file into its ModelProto with the importer's checks and limits, for code that edits or
// re-serializes the model itself (stage files, training graphs, profiling) rather than planning on it.
#pragma once

#include <onnx/onnx_pb.h>

#include <filesystem>
#include <string>
#include <vector>

#include "importer/importer.h"

namespace apart {

// Throws SystemError (missing or unreadable file), InvalidArgument (a directory, not a regular file),
// Unsupported (over protobuf's 2 GiB) or InvalidModel (empty, truncated or not an ONNX protobuf), as
// import_model does. External data is not read.
onnx::ModelProto load_model_proto(const std::filesystem::path& path);
// The same model as import_model(path, options) reads it: with options.constants_as_params, the Constant nodes
// that feed weight slots are initializers (importer/constant_params.h), and options.loss is appended
// (importer/added_loss.h), so node indices agree with its task graph.
onnx::ModelProto load_model_proto(const std::filesystem::path& path, const ImportOptions& options);

// The names of `inputs` a model does not take as graph inputs and of `outputs` it does not output (a plan's stage
// file against its plan record: train/pipeline.cpp before a run, `apart check`).
struct MissingInterface {
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  bool empty() const { return inputs.empty() && outputs.empty(); }
};
MissingInterface missing_interface(const onnx::ModelProto& model, const std::vector<std::string>& inputs,
                                   const std::vector<std::string>& outputs);

}  // namespace apart
