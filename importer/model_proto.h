// Reading an .onnx file into its ModelProto with the importer's checks and limits, for code that edits or
// re-serializes the model itself (stage files, training graphs, profiling) rather than planning on it.
#pragma once

#include <onnx/onnx_pb.h>

#include <filesystem>

#include "importer/importer.h"

namespace apart {

// Throws SystemError (missing or unreadable file), InvalidArgument (a directory, not a regular file),
// Unsupported (over protobuf's 2 GiB) or InvalidModel (empty, truncated or not an ONNX protobuf), as
// import_model does. External data is not read.
onnx::ModelProto load_model_proto(const std::filesystem::path& path);
// The same model as import_model(path, options) reads it: with options.constants_as_params, the Constant nodes
// that feed weight slots are initializers (importer/constant_params.h), so node indices agree with its task graph.
onnx::ModelProto load_model_proto(const std::filesystem::path& path, const ImportOptions& options);

}  // namespace apart
