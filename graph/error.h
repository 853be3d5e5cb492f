// Typed errors that cross apart's boundaries, and CHECK that stays on in release builds.
#pragma once

#include <stdexcept>
#include <string>

namespace apart {

// Each kind maps to one documented process exit code (README: "Exit codes").
enum class ErrorKind {
  kInvalidArgument,  // the user's flags or option values are wrong
  kInvalidModel,     // the model file is malformed or inconsistent
  kUnsupported,      // valid input apart cannot handle (yet)
  kInfeasible,       // the request cannot be satisfied (memory, devices, batch)
  kSystemError,      // I/O and OS failures
  kCorruptData,      // stored bytes that fail their checksum (a damaged checkpoint): never loaded
  kInternal,         // a broken invariant inside apart: a bug
};

// Process exit code for an error kind. 0 is success; 1 is left to crashes of the runtime.
int exit_code(ErrorKind kind);
// Not an error: a run stopped by SIGTERM, SIGINT or SIGUSR1 after finishing its step and writing its checkpoint
// (train/preemption.h). 75 is sysexits.h's EX_TEMPFAIL, "try again later": a job script resubmits on it, and tells it
// from 128 + signal (killed without a checkpoint) and from the errors above.
inline constexpr int kExitStoppedBySignal = 75;
const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

struct InvalidArgument : Error {
  explicit InvalidArgument(const std::string& m) : Error(ErrorKind::kInvalidArgument, m) {}
};
struct InvalidModel : Error {
  explicit InvalidModel(const std::string& m) : Error(ErrorKind::kInvalidModel, m) {}
};
struct Unsupported : Error {
  explicit Unsupported(const std::string& m) : Error(ErrorKind::kUnsupported, m) {}
};
struct Infeasible : Error {
  explicit Infeasible(const std::string& m) : Error(ErrorKind::kInfeasible, m) {}
};
struct SystemError : Error {
  explicit SystemError(const std::string& m) : Error(ErrorKind::kSystemError, m) {}
};
struct CorruptData : Error {
  explicit CorruptData(const std::string& m) : Error(ErrorKind::kCorruptData, m) {}
};

// Thrown by a command that stopped at a signal once its checkpoint is written and its resume command printed: main
// exits with kExitStoppedBySignal, printing nothing more.
struct StoppedBySignal : std::runtime_error {
  explicit StoppedBySignal(const std::string& m) : std::runtime_error(m) {}
};

// Throws the Error subclass of `kind` (InvalidArgument for kInvalidArgument, …), so callers can catch it by type.
[[noreturn]] void throw_error(ErrorKind kind, const std::string& message);

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& detail);

}  // namespace apart

// An internal invariant; on in every build type. Throws Error(kInternal) so the CLI can report it.
#define APART_CHECK(cond, ...)                                                        \
  do {                                                                                \
    if (!(cond)) ::apart::check_failed(#cond, __FILE__, __LINE__, std::string{__VA_ARGS__}); \
  } while (0)
