// Scratch folders under the system temp dir that a test leaves nothing of: each is removed by the process that made it.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <system_error>

namespace apart::testing {

// A fresh empty folder under the system temp dir, apart_<tag>_<pid>_<n>, removed with what is in it when the object
// dies. Only by the process that made it: a forked child that runs destructors on its way out (exit() rather than
// _exit()) leaves the folder to its parent, which may still be using it. The processes a test starts under popen or
// mpirun are waited for before the test returns, so they are done with the folder by then.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test")
      : path_(std::filesystem::temp_directory_path() /
              ("apart_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++))),
        owner_(::getpid()) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    if (::getpid() != owner_) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  std::filesystem::path file(const std::string& name) const { return path_ / name; }

 private:
  static std::atomic<int>& counter() {
    static std::atomic<int> c{0};
    return c;
  }
  std::filesystem::path path_;
  pid_t owner_;
};

// This process's folder for `tag`: the same path on every call (made on the first), so what a suite writes once per
// process (a plan, the models OnnxBuilder::write saves) stays put across its tests; removed when the process exits.
// CTest runs each test in a process of its own, so a folder per test rather than per process would leak one each.
inline const std::filesystem::path& process_temp_dir(const std::string& tag) {
  static std::mutex mutex;
  static std::map<std::string, TempDir> dirs;  // destroyed at exit, in the process that made them
  const std::lock_guard<std::mutex> lock(mutex);
  return dirs.try_emplace(tag, tag).first->second.path();
}

}  // namespace apart::testing
