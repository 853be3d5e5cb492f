// Writing a whole file or nothing: a temporary name in the same folder, then a rename.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <ostream>
#include <streambuf>
#include <string_view>

namespace apart {

// A file written through a hidden temporary beside it (".NAME.tmp.PID.N") and renamed into place by commit(), so
// readers never see a half-written file. The temporary is created exclusively and never through a symlink
// (O_CREAT | O_EXCL | O_NOFOLLOW): a link planted under its name cannot redirect the write, and its bytes are synced
// before the rename. Destroyed without commit() (an exception on the way), it removes the
// temporary. Streams: a multi-GB file never has to be held in memory. Every failure throws SystemError naming the
// file.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path);  // opens the temporary
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // For writers that take a stream (protobuf, JSON); commit() checks that every write went through.
  std::ostream& stream() { return out_; }
  const std::filesystem::path& temp_path() const { return temp_; }

  void write(const void* data, int64_t bytes);  // throws when the stream has failed (disk full)
  void commit();                                // flush, close, check, rename

 private:
  void check_stream() const;

  std::filesystem::path path_;
  std::filesystem::path temp_;
  int fd_ = -1;
  std::unique_ptr<std::streambuf> buffer_;  // owns fd_ and closes it
  std::ostream out_{nullptr};
  bool committed_ = false;
  int slot_ = -1;  // its entry in the list remove_temporaries_from_signal_handler reads; -1: none
};

// Removes the temporary of every AtomicFile neither committed nor destroyed yet. Async-signal-safe (unlink(2) only):
// for a signal handler about to end the process (train/preemption.h), so that no temporary outlives it.
void remove_temporaries_from_signal_handler();

// Writes `contents` to `path` through an AtomicFile. Throws SystemError naming the file.
void write_file_atomically(const std::filesystem::path& path, std::string_view contents);

}  // namespace apart
