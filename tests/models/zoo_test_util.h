// Helpers shared by the zoo tests: counting initializers, temp dirs, running a command.
#pragma once

#include "tests/support/run_apart.h"
#include "tests/support/temp_dir.h"

#include <onnx/onnx_pb.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace apart::models::testing {

inline int64_t initializer_elements(const onnx::ModelProto& m) {
  int64_t n = 0;
  for (const auto& t : m.graph().initializer()) {
    int64_t e = 1;
    for (int64_t d : t.dims()) e *= d;
    n += e;
  }
  return n;
}

// A fresh directory under the system temp dir, removed at scope exit.
using apart::testing::TempDir;

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Runs a shell command; `code` is its exit status, `out` its stdout.
using apart::testing::run_command;

}  // namespace apart::models::testing
