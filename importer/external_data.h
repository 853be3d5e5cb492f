// An ONNX tensor's external data (location, offset, length), resolved safely: the one reader of those entries,
// used by the importer (metadata, file checks) and the runtime (reading the weights).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace onnx {
class TensorProto;
}

namespace apart {

struct ExternalData {
  std::string location;        // as the model names it
  std::filesystem::path file;  // resolved inside the model's folder
  int64_t offset = 0;
  int64_t length = -1;         // -1: not given (the tensor's shape says)
};

// Parses `tensor`'s external_data entries and resolves its location under `base_dir` (empty: the working folder).
// Throws InvalidModel naming the initializer when the location is missing, absolute, contains '..' or resolves
// outside the folder (through a symlink), or an offset/length is not a non-negative integer; SystemError when the
// location cannot be resolved.
ExternalData external_data(const onnx::TensorProto& tensor, const std::filesystem::path& base_dir);

// Whether the file exists, by stat only (a FIFO or device is never opened). Throws InvalidModel naming the
// initializer when it exists but is not a regular file.
bool external_file_exists(const ExternalData& data, const std::string& tensor);

}  // namespace apart
