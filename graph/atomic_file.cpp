// Writing a whole file or nothing.
#include "graph/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

#include "graph/error.h"

namespace apart {
namespace fs = std::filesystem;

namespace {

fs::path temp_path_for(const fs::path& path) {
  const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  return dir / ("." + path.filename().string() + ".tmp." + std::to_string(::getpid()));
}

}  // namespace

AtomicFile::AtomicFile(fs::path path) : path_(std::move(path)), temp_(temp_path_for(path_)) {
  out_.open(temp_, std::ios::binary | std::ios::trunc);
  if (!out_)
    throw SystemError("cannot write '" + temp_.string() + "': " + std::strerror(errno) +
                      " (does the folder exist and is it writable?)");
}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  out_.close();
  std::error_code ec;
  fs::remove(temp_, ec);
}

void AtomicFile::write(const void* data, int64_t bytes) {
  out_.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  check_stream();
}

void AtomicFile::check_stream() const {
  if (!out_) throw SystemError("failed writing '" + temp_.string() + "' (disk full?)");
}

void AtomicFile::commit() {
  out_.flush();
  check_stream();
  out_.close();
  check_stream();
  std::error_code ec;
  fs::rename(temp_, path_, ec);
  if (ec) throw SystemError("cannot rename '" + temp_.string() + "' to '" + path_.string() + "': " + ec.message());
  committed_ = true;
}

void write_file_atomically(const fs::path& path, std::string_view contents) {
  AtomicFile file(path);
  file.write(contents.data(), static_cast<int64_t>(contents.size()));
  file.commit();
}

}  // namespace apart
