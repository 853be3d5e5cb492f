// Writing a whole file or nothing.
#include "graph/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ext/stdio_filebuf.h>
#include <string>
#include <system_error>

#include "graph/error.h"

namespace apart {
namespace fs = std::filesystem;

namespace {

// Creates a fresh temporary beside `path`: ".NAME.tmp.PID.N", the first N whose name is free. Never opens an existing
// file or follows a link.
int create_temporary(const fs::path& path, fs::path& temp) {
  const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  const std::string stem = "." + path.filename().string() + ".tmp." + std::to_string(::getpid()) + ".";
  for (int n = 0; n < 1000; ++n) {
    temp = dir / (stem + std::to_string(n));
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0) return fd;
    if (errno != EEXIST)
      throw SystemError("cannot write '" + temp.string() + "': " + std::strerror(errno) +
                        " (does the folder exist and is it writable?)");
  }
  throw SystemError("cannot write '" + path.string() + "': 1000 temporaries named '" + stem +
                    "N' already exist beside it; remove them");
}

// The temporaries alive now, for remove_temporaries_from_signal_handler: fixed slots (a handler may not allocate or
// lock), each free (0), being filled (1) or naming a temporary (2). A file beyond the slots (64 written at once) is
// not listed; it is still removed by its destructor.
struct TemporarySlot {
  std::atomic<int> state{0};
  std::array<char, 4096> path{};
};
std::array<TemporarySlot, 64> g_temporaries;

int list_temporary(const fs::path& temp) {
  const std::string& name = temp.native();
  if (name.size() >= std::tuple_size_v<decltype(TemporarySlot::path)>) return -1;
  for (size_t i = 0; i < g_temporaries.size(); ++i) {
    int expected = 0;
    if (!g_temporaries[i].state.compare_exchange_strong(expected, 1)) continue;
    std::memcpy(g_temporaries[i].path.data(), name.c_str(), name.size() + 1);
    g_temporaries[i].state.store(2);
    return static_cast<int>(i);
  }
  return -1;
}

void unlist_temporary(int slot) {
  if (slot >= 0) g_temporaries[static_cast<size_t>(slot)].state.store(0);
}

}  // namespace

void remove_temporaries_from_signal_handler() {
  for (TemporarySlot& slot : g_temporaries)
    if (slot.state.load() == 2) ::unlink(slot.path.data());
}

AtomicFile::AtomicFile(fs::path path) : path_(std::move(path)) {
  fd_ = create_temporary(path_, temp_);
  slot_ = list_temporary(temp_);
  buffer_ = std::make_unique<__gnu_cxx::stdio_filebuf<char>>(fd_, std::ios::out | std::ios::binary, size_t{1} << 16);
  out_.rdbuf(buffer_.get());
}

AtomicFile::~AtomicFile() {
  if (!committed_) {
    buffer_.reset();  // closes the descriptor
    std::error_code ec;
    fs::remove(temp_, ec);
  }
  unlist_temporary(slot_);  // after the removal: a signal in between finds it gone, never a live one unlisted
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
  if (!out_)
    throw SystemError("failed writing '" + temp_.string() + "': " + std::strerror(errno) +
                      " (is the disk full or the file too large?); nothing was written to '" + path_.string() + "'");
}

void AtomicFile::commit() {
  out_.flush();
  check_stream();
  // The bytes reach the disk before the name does: after a crash the file is either the old one or the whole new one.
  if (::fsync(fd_) != 0 && errno != EINVAL && errno != EROFS)
    throw SystemError("cannot sync '" + temp_.string() + "': " + std::strerror(errno));
  if (static_cast<__gnu_cxx::stdio_filebuf<char>*>(buffer_.get())->close() == nullptr)
    throw SystemError("cannot close '" + temp_.string() + "': " + std::strerror(errno));
  std::error_code ec;
  fs::rename(temp_, path_, ec);
  if (ec) throw SystemError("cannot rename '" + temp_.string() + "' to '" + path_.string() + "': " + ec.message());
  committed_ = true;
  unlist_temporary(slot_);
  slot_ = -1;
  sync_path(path_.parent_path().empty() ? fs::path(".") : path_.parent_path());  // the rename itself
}

void write_file_atomically(const fs::path& path, std::string_view contents) {
  AtomicFile file(path);
  file.write(contents.data(), static_cast<int64_t>(contents.size()));
  file.commit();
}

}  // namespace apart
