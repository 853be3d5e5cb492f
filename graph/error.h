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
  kInternal,         // a broken invariant inside apart: a bug
};

// Process exit code for an error kind. 0 is success; 1 is left to crashes of the runtime.
int exit_code(ErrorKind kind);
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

// Throws the Error subclass of `kind` (InvalidArgument for kInvalidArgument, …), so callers can catch it by type.
[[noreturn]] void throw_error(ErrorKind kind, const std::string& message);

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& detail);

}  // namespace apart

// An internal invariant; on in every build type. Throws Error(kInternal) so the CLI can report it.
#define APART_CHECK(cond, ...)                                                        \
  do {                                                                                \
    if (!(cond)) ::apart::check_failed(#cond, __FILE__, __LINE__, std::string{__VA_ARGS__}); \
  } while (0)
