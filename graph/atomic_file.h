// Writing a whole file or nothing: a temporary name in the same folder, then a rename.
#pragma once

#include <filesystem>
#include <string_view>

namespace apart {

// Writes `contents` to `path` through a hidden temporary file beside it and a rename, so readers never see a
// half-written file and a failure leaves nothing behind. Throws SystemError naming the file.
void write_file_atomically(const std::filesystem::path& path, std::string_view contents);

}  // namespace apart
