// Writing a whole file or nothing.
#include "graph/atomic_file.h"

#include <fcntl.h>
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

namespace {
// fsync of a file or folder; a filesystem that cannot sync a folder (some network ones) is not an error.
void sync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}
}  // namespace

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
  // The bytes reach the disk before the name does: after a crash the file is either the old one or the whole new one.
  sync_path(temp_);
  std::error_code ec;
  fs::rename(temp_, path_, ec);
  if (ec) throw SystemError("cannot rename '" + temp_.string() + "' to '" + path_.string() + "': " + ec.message());
  committed_ = true;
  sync_path(path_.parent_path().empty() ? fs::path(".") : path_.parent_path());  // the rename itself
}

void write_file_atomically(const fs::path& path, std::string_view contents) {
  AtomicFile file(path);
  file.write(contents.data(), static_cast<int64_t>(contents.size()));
  file.commit();
}

}  // namespace apart
