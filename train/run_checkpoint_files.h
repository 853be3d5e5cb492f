// The manifest of an `apart run` checkpoint folder, sealed by its own checksum (docs/runtime.md "Checkpoints").
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace apart {

// `manifest` as the text written to manifest.json (2-space indent, a final newline) with a last field "crc32c": the
// CRC-32C of the same text without it.
std::string sealed_manifest_text(nlohmann::ordered_json manifest);
// The manifest at `file`, its "crc32c" checked against its other fields as written (CorruptData naming the file when
// they differ; a manifest written before checksums has none and is read as it is). InvalidArgument when it cannot
// be read or is not JSON.
nlohmann::json read_sealed_manifest(const std::filesystem::path& file);

// Every checksum of a checkpoint, without training (`apart check --checkpoint`): apart train's folder (or its
// checkpoint.apart), or apart run's folder (its manifest, then every shard of the step folder it names, as many as it
// says). One line per file verified; throws what a resume would (CorruptData naming the file and the tensor).
std::vector<std::string> verify_checkpoint(const std::filesystem::path& path);

}  // namespace apart
