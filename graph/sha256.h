// SHA-256 of a file, hex: identifies the model a plan was made for.
#pragma once

#include <filesystem>
#include <string>

namespace apart {
std::string sha256_hex(const std::string& bytes);
std::string sha256_file_hex(const std::filesystem::path& path);  // throws SystemError
}  // namespace apart
