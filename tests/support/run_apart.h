// Runs the apart executable (or any shell command) from a test and captures its output and exit code.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace apart::testing {

struct CommandRun {
  int code = -1;    // exit status; 128 + signal when killed by one
  std::string out;  // stdout, and stderr too when asked for
};

inline CommandRun run_command(const std::string& command) {
  CommandRun r;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// `apart <args>`; stderr joins stdout unless with_stderr is false (then it is dropped).
inline CommandRun run_apart(const std::string& args, bool with_stderr = true) {
  return run_command(std::string(APART_BINARY) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

// `apart <args>` with stderr joined and stdin from /dev/null, under `timeout 120`, so a regression that hangs fails
// (exit 124) instead of stalling the suite. `shell` runs first in the same shell (limits such as `ulimit -f`).
inline CommandRun run_apart_bounded(const std::string& args, const std::string& shell = "") {
  return run_command(shell + "timeout 120 " + std::string(APART_BINARY) + " " + args + " 2>&1 </dev/null");
}

}  // namespace apart::testing
