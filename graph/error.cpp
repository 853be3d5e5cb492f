// Exit codes and names of apart's error kinds.
#include "graph/error.h"

namespace apart {

int exit_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return 2;
    case ErrorKind::kInvalidModel: return 3;
    case ErrorKind::kUnsupported: return 4;
    case ErrorKind::kInfeasible: return 5;
    case ErrorKind::kSystemError: return 6;
    case ErrorKind::kCorruptData: return 7;
    case ErrorKind::kInternal: return 70;
  }
  return 70;
}

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "InvalidArgument";
    case ErrorKind::kInvalidModel: return "InvalidModel";
    case ErrorKind::kUnsupported: return "Unsupported";
    case ErrorKind::kInfeasible: return "Infeasible";
    case ErrorKind::kSystemError: return "SystemError";
    case ErrorKind::kCorruptData: return "CorruptData";
    case ErrorKind::kInternal: return "Internal";
  }
  return "Internal";
}

void throw_error(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: throw InvalidArgument(message);
    case ErrorKind::kInvalidModel: throw InvalidModel(message);
    case ErrorKind::kUnsupported: throw Unsupported(message);
    case ErrorKind::kInfeasible: throw Infeasible(message);
    case ErrorKind::kSystemError: throw SystemError(message);
    case ErrorKind::kCorruptData: throw CorruptData(message);
    case ErrorKind::kInternal: break;
  }
  throw Error(ErrorKind::kInternal, message);
}

void check_failed(const char* expr, const char* file, int line, const std::string& detail) {
  std::string msg = std::string("internal check failed: ") + expr + " at " + file + ":" + std::to_string(line);
  if (!detail.empty()) msg += ": " + detail;
  msg += " (this is a bug in apart; please report it with the command line)";
  throw Error(ErrorKind::kInternal, msg);
}

}  // namespace apart
