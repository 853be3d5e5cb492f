// The apart executable: builds the subcommands from the registry and maps errors to exit codes.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <exception>

#include "apart_version.h"
#include "cli/command_registry.h"
#include "graph/error.h"
#include "graph/text.h"

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
    // --help and --version are "errors" that succeed: CLI11 prints them as it documents.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    // Flag errors take the documented form and exit code, with the command whose --help lists the flags.
    std::string command = "apart";
    for (const CLI::App* sub = &app; !sub->get_subcommands().empty();) {
      sub = sub->get_subcommands().front();
      command += " " + sub->get_name();
    }
    std::fflush(stdout);
    std::fprintf(stderr, "apart: error [InvalidArgument]: %s; run `%s --help` for the options\n",
                 apart::printable(e.what()).c_str(), command.c_str());
    return apart::exit_code(apart::ErrorKind::kInvalidArgument);
  } catch (const apart::Error& e) {
    // Messages quote model-controlled names already; escaping here too keeps any that slipped through
    // from reaching the terminal raw (an ANSI escape, a newline that fakes a line).
    std::fflush(stdout);
    std::fprintf(stderr, "apart: error [%s]: %s\n", apart::error_kind_name(e.kind()), apart::printable(e.what()).c_str());
    return apart::exit_code(e.kind());
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "apart: error [SystemError]: out of memory\n");
    return apart::exit_code(apart::ErrorKind::kSystemError);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "apart: error [Internal]: %s (this is a bug in apart; please report it)\n",
                 apart::printable(e.what()).c_str());
    return apart::exit_code(apart::ErrorKind::kInternal);
  }
  return 0;
}
