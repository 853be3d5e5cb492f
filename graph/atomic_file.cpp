// Writing a whole file or nothing.
#include "graph/atomic_file.h"

#include <unistd.h>

#include <fstream>
#include <string>

#include "graph/error.h"

namespace apart {

void write_file_atomically(const std::filesystem::path& path, std::string_view contents) {
  namespace fs = std::filesystem;
  const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  const fs::path tmp = dir / ("." + path.filename().string() + ".tmp." + std::to_string(::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw SystemError("cannot write '" + tmp.string() + "' (does the folder exist and is it writable?)");
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw SystemError("failed writing '" + tmp.string() + "' (disk full?)");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw SystemError("cannot rename '" + tmp.string() + "' to '" + path.string() + "': " + ec.message());
  }
}

}  // namespace apart
