// What every fuzz target (fuzz/*.cpp) does with one input: run it through a reader and tell expected rejections from
// bugs. apart's typed errors (graph/error.h) are the right answer to bad bytes; an internal error (a broken
// APART_CHECK) or any other exception escaping the reader is a bug, reported as a crash so that libFuzzer keeps the
// input. Sanitizer reports, hangs (-timeout) and runaway memory (-rss_limit_mb) are libFuzzer's to catch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>

#include "graph/error.h"

namespace apart::fuzz {

[[noreturn]] inline void bug(const char* what, const char* message) {
  std::fprintf(stderr, "apart fuzz: %s: %s\n", what, message);
  std::abort();
}

// Runs fn(); returns 0 (libFuzzer's "input done") unless fn() shows a bug.
template <class Fn>
int run_one(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kInternal) bug("internal error", e.what());
  } catch (const std::exception& e) {
    bug("an exception that is not one of apart's typed errors", e.what());
  }
  return 0;
}

// A directory of this process's own for the files a target writes (the readers under test take paths), removed at
// exit. Under $TMPDIR (default /tmp); /dev/shm where it exists, so the per-input write costs no disk.
const std::filesystem::path& scratch_dir();

// Writes `size` bytes to scratch_dir()/name, replacing it, and returns the path. Throws SystemError.
std::filesystem::path write_scratch(const std::string& name, const uint8_t* data, size_t size);

}  // namespace apart::fuzz
