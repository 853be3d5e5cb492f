// SHA-256 of a file, hex: identifies the model a plan was made for.
#pragma once

#include <filesystem>
#include <string>

namespace apart {
// `sha_extensions`: use the CPU's SHA instructions when it has them (false: the portable code; tests compare both).
std::string sha256_hex(const std::string& bytes, bool sha_extensions = true);
bool cpu_has_sha_extensions();
std::string sha256_file_hex(const std::filesystem::path& path);  // throws SystemError
}  // namespace apart
