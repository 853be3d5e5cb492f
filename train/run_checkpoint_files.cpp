// Sealing and verifying a run checkpoint's manifest (see run_checkpoint_files.h).
#include "train/run_checkpoint_files.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "graph/crc32c.h"
#include "graph/error.h"
#include "train/checkpoint.h"

namespace apart {

namespace {
std::string manifest_text(const nlohmann::ordered_json& manifest) { return manifest.dump(2) + "\n"; }
}  // namespace

std::string sealed_manifest_text(nlohmann::ordered_json manifest) {
  manifest.erase("crc32c");
  const std::string text = manifest_text(manifest);
  manifest["crc32c"] = crc32c_hex(crc32c(text.data(), text.size()));
  return manifest_text(manifest);
}

nlohmann::json read_sealed_manifest(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw InvalidArgument(file.string() + " cannot be opened: " + std::strerror(errno));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(file.string() + " is not JSON (" + e.what() + ")");
  }
  if (j.is_object() && j.contains("crc32c")) {
    const nlohmann::ordered_json stored = j["crc32c"];
    j.erase("crc32c");
    const std::string rest = manifest_text(j);
    const std::string actual = crc32c_hex(crc32c(rest.data(), rest.size()));
    // Its text must also be exactly what the writer wrote: a flip that keeps it JSON (a digit) changes the checksum,
    // one in the whitespace changes the text.
    j["crc32c"] = stored;
    if (!stored.is_string() || stored.get<std::string>() != actual || manifest_text(j) != text)
      throw CorruptData(file.string() + " is damaged: the manifest fails its checksum (CRC-32C " + stored.dump() +
                        " stored, its fields give " + actual + "); resume from another checkpoint folder");
  } else if (j.is_object() && j.contains("kept")) {  // written by an apart that seals every manifest: its seal is gone
    throw CorruptData(file.string() + " is damaged: its \"crc32c\" field is missing; resume from another checkpoint folder");
  }
  return nlohmann::json(j);
}

std::vector<std::string> verify_checkpoint(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> lines;
  auto verify_file = [&](const fs::path& file) {
    const Checkpoint ck = read_checkpoint(file);
    lines.push_back(file.string() + ": step " + std::to_string(ck.step) + ", " + std::to_string(ck.tensors.size()) +
                    " tensors" + (ck.warning.empty() ? ", every checksum verified" : " (" + ck.warning + ")"));
  };
  if (!fs::is_directory(path, ec) || fs::exists(path / kCheckpointFile, ec)) {
    verify_file(path);
    return lines;
  }
  const fs::path manifest_file = path / "manifest.json";
  if (!fs::is_regular_file(manifest_file, ec))
    throw InvalidArgument(path.string() + " holds neither " + kCheckpointFile + " (apart train) nor manifest.json (apart run)");
  const nlohmann::json manifest = read_sealed_manifest(manifest_file);
  if (!manifest.is_object() || !manifest.value("folder", nlohmann::json()).is_string())
    throw InvalidArgument(manifest_file.string() + " names no step folder");
  lines.push_back(manifest_file.string() + (manifest.contains("crc32c") ? ": checksum verified" : ": written before manifests had checksums"));
  const fs::path folder = path / manifest["folder"].get<std::string>();
  int64_t shards = 0;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(folder, ec))
    if (entry.path().extension() == ".apart" && entry.path().filename().string().rfind("rank_", 0) == 0) files.push_back(entry.path());
  if (ec) throw InvalidArgument("cannot list " + folder.string() + ": " + ec.message());
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    verify_file(file);
    ++shards;
  }
  const int64_t expected = manifest.value("shards", int64_t{-1});
  if (expected >= 0 && shards != expected)
    throw CorruptData(folder.string() + " holds " + std::to_string(shards) + " shards; its manifest names " +
                      std::to_string(expected) + ": resume from another checkpoint folder");
  return lines;
}

}  // namespace apart
