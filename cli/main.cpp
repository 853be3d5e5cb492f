// The apart executable: builds the subcommands from the registry and maps errors to exit codes.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <exception>

#include "apart_version.h"
#include "cli/command_registry.h"
#include "graph/error.h"

namespace apart::cli {
std::vector<CommandSpec>& command_registry() {
  static std::vector<CommandSpec> registry;
  return registry;
}
bool register_command(CommandSpec spec) {
  command_registry().push_back(std::move(spec));
  return true;
}
}  // namespace apart::cli

int main(int argc, char** argv) {
  CLI::App app{"apart: automatic partitioning of ONNX models into pipeline stages with data-parallel replicas\n"
               "for very large-scale training (Tanaka et al., IPDPS 2021), and a runtime that carries the plan out."};
  app.set_version_flag("-V,--version", std::string("apart ") + APART_VERSION);
  app.require_subcommand(1);
  app.fallthrough();
  app.footer("Exit codes: 0 ok, 2 invalid argument, 3 invalid model, 4 unsupported, 5 infeasible, 6 system error,\n"
             "70 internal error. Run `apart <command> --help` for a command's options.");

  auto& registry = apart::cli::command_registry();
  std::sort(registry.begin(), registry.end(), [](const auto& a, const auto& b) {
    return a.order != b.order ? a.order < b.order : a.name < b.name;
  });
  for (const auto& spec : registry) spec.setup(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : apart::exit_code(apart::ErrorKind::kInvalidArgument);
  } catch (const apart::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "apart: error [%s]: %s\n", apart::error_kind_name(e.kind()), e.what());
    return apart::exit_code(e.kind());
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "apart: error [SystemError]: out of memory\n");
    return apart::exit_code(apart::ErrorKind::kSystemError);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "apart: error [Internal]: %s (this is a bug in apart; please report it)\n", e.what());
    return apart::exit_code(apart::ErrorKind::kInternal);
  }
  return 0;
}
