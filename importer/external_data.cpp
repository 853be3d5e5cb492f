// An ONNX tensor's external data, resolved safely (see external_data.h).
#include "importer/external_data.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/text.h"

namespace apart {

namespace fs = std::filesystem;

namespace {

int64_t parse_count(const std::string& tensor, const std::string& key, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || v < 0)
    throw InvalidModel("initializer " + quote(tensor) + " has external_data " + key + "=" + quote(text) +
                       ", which is not a non-negative integer");
  return v;
}

// Refuses locations that could read outside the model's folder (absolute, '..', symlink escape).
fs::path resolve_location(const fs::path& base_dir, const std::string& tensor, const std::string& location) {
  const fs::path loc(location);
  if (loc.is_absolute() || location[0] == '/' || location[0] == '\\')
    throw InvalidModel("initializer " + quote(tensor) + ": external-data location " + quote(location) +
                       " is an absolute path; locations must be relative to the model's folder");
  for (const auto& part : loc)
    if (part == "..")
      throw InvalidModel("initializer " + quote(tensor) + ": external-data location " + quote(location) +
                         " contains '..'; locations must stay inside the model's folder");
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(base_dir.empty() ? fs::current_path() : base_dir, ec);
  const fs::path full = fs::weakly_canonical(root / loc, ec);
  if (ec) throw SystemError("cannot resolve external-data location " + quote(location) + ": " + ec.message());
  auto [root_end, full_it] = std::mismatch(root.begin(), root.end(), full.begin(), full.end());
  if (root_end != root.end())
    throw InvalidModel("initializer " + quote(tensor) + ": external-data location " + quote(location) + " resolves to " +
                       full.string() + ", outside the model's folder " + root.string() + " (through a symlink?)");
  return full;
}

}  // namespace

ExternalData external_data(const onnx::TensorProto& tensor, const fs::path& base_dir) {
  ExternalData data;
  // The keys ONNX defines (onnx.proto, TensorProto.external_data), each at most once; "checksum" (a SHA-1 of the
  // bytes) is accepted and not checked.
  std::vector<std::string> seen;
  for (const auto& kv : tensor.external_data()) {
    if (std::find(seen.begin(), seen.end(), kv.key()) != seen.end())
      throw InvalidModel("initializer " + quote(tensor.name()) + " has external_data key " + quote(kv.key()) +
                         " twice; each of location, offset, length, checksum may appear once");
    seen.push_back(kv.key());
    if (kv.key() == "location") data.location = kv.value();
    else if (kv.key() == "offset") data.offset = parse_count(tensor.name(), kv.key(), kv.value());
    else if (kv.key() == "length") data.length = parse_count(tensor.name(), kv.key(), kv.value());
    else if (kv.key() != "checksum")
      throw InvalidModel("initializer " + quote(tensor.name()) + " has an unknown external_data key " +
                         quote(kv.key()) + "; ONNX defines location, offset, length and checksum");
  }
  if (data.location.empty())
    throw InvalidModel("initializer " + quote(tensor.name()) + " is marked as external data but has no 'location' entry");
  data.file = resolve_location(base_dir, tensor.name(), data.location);
  return data;
}

bool external_file_exists(const ExternalData& data, const std::string& tensor) {
  std::error_code ec;
  const fs::file_status status = fs::status(data.file, ec);  // stat only: a FIFO is never opened
  if (!fs::exists(status)) return false;
  if (!fs::is_regular_file(status))
    throw InvalidModel("initializer " + quote(tensor) + ": external-data location " + quote(data.location) +
                       " is not a regular file (a FIFO, device or directory); weights must be in a plain file");
  // Hard links are accepted: apart's own plans reach the model's weights through them (PLAN/weights/, see
  // codegen/stage_onnx.cpp), so every model it has planned has a second link. One to a file outside the folder
  // needs read-write access to that file (fs.protected_hardlinks), and archives cannot make one.
  return true;
}

}  // namespace apart
