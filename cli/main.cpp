// The apart executable: builds the subcommands from the registry and maps errors to exit codes.
#include <CLI/CLI.hpp>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "apart_version.h"
#include "cli/cli_common.h"
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

#if defined(__SANITIZE_ADDRESS__)  // GCC
#define APART_ASAN 1
#elif defined(__has_feature)  // clang
#if __has_feature(address_sanitizer)
#define APART_ASAN 1
#endif
#endif

namespace {

// `apart partition` builds and frees its DP tables thousands of times: by default glibc hands every block over
// 128 KiB back to the kernel and faults it in again, on 4 KiB pages, and grows each thread's heap a little at a
// time. It runs itself again, once, with glibc's malloc tunables keeping freed memory, growing a heap 64 MiB at a
// time (top_pad) and backing it with transparent huge pages (GPT-3 175B × 1,024 A100s, the default command:
// 1.05 → 0.62 s wall, minor page faults 56 K → 1 K; bench/RESULTS.md). Not where the user set
// GLIBC_TUNABLES or APART_MALLOC_TUNING (0 turns it off; the re-run sets it to 1), nor under the sanitizers (their
// allocator ignores the tunables). If the re-run cannot start, the thresholds are set in this process instead.
void tune_allocator_for_planning(int argc, char** argv) {
#if defined(APART_ASAN)
  (void)argc;
  (void)argv;
#else
  if (argc < 2 || std::string_view(argv[1]) != "partition") return;
  if (std::getenv("APART_MALLOC_TUNING") || std::getenv("GLIBC_TUNABLES")) return;
  ::setenv("APART_MALLOC_TUNING", "1", 1);
  ::setenv("GLIBC_TUNABLES",
           "glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=536870912:"
           "glibc.malloc.top_pad=67108864:glibc.malloc.hugetlb=1", 1);
  ::execv("/proc/self/exe", argv);
  ::unsetenv("GLIBC_TUNABLES");
  ::mallopt(M_MMAP_THRESHOLD, 256 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 512 << 20);
  ::mallopt(M_TOP_PAD, 64 << 20);
#endif
}

// What is wrong when argv[1] names no command (nullopt when it names one, or is a flag such as --help): the word, the
// nearest command, and the list.
std::optional<std::string> unknown_command(const CLI::App& app, std::string_view word) {
  if (word.empty() || word[0] == '-') return std::nullopt;
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name() == word) return std::nullopt;
    names.push_back(sub->get_name());
  }
  std::string message = "unknown command " + apart::quote(word) + "; ";
  if (const auto near = apart::closest_match(word, names)) message += "did you mean '" + *near + "'? ";
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  return message + "the commands are " + list + " (`apart --help` says what each does)";
}

// CLI11's message, made complete where it stops at the first problem: every missing required flag and argument of
// the command in one message, and for a flag the command does not have, the one it most likely meant.
std::string flag_error_message(const CLI::App& command, const CLI::ParseError& e,
                               const std::vector<std::string>& args) {
  if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
    std::string missing;
    size_t count = 0;
    for (const CLI::Option* o : command.get_options())
      if (o->get_required() && o->count() == 0) {
        missing += (missing.empty() ? "" : ", ") + o->get_name();
        ++count;
      }
    if (count > 0) return (count == 1 ? missing + " is required" : "these are required: " + missing);
  }
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    std::vector<std::string> flags;
    for (const CLI::Option* o : command.get_options())
      for (const std::string& long_name : o->get_lnames()) flags.push_back("--" + long_name);
    std::string hints;
    for (const std::string& word : args) {
      const std::string flag = word.substr(0, word.find('='));
      if (flag.rfind("--", 0) != 0 || flag == "--" || std::find(flags.begin(), flags.end(), flag) != flags.end())
        continue;
      if (const auto near = apart::closest_match(flag, flags))
        hints += (hints.empty() ? "" : "; ") + std::string("did you mean ") + *near + " for " + flag + "?";
    }
    if (!hints.empty()) return std::string(e.what()) + " (" + hints + ")";
  }
  return e.what();
}

}  // namespace

int main(int argc, char** argv) {
  tune_allocator_for_planning(argc, argv);
  CLI::App app{"apart: automatic partitioning of ONNX models into pipeline stages with data-parallel replicas\n"
               "for very large-scale training (Tanaka et al., IPDPS 2021), and a runtime that carries the plan out."};
  app.name("apart");
  app.set_version_flag("-V,--version", std::string("apart ") + APART_VERSION);
  app.require_subcommand(1);
  app.fallthrough();
  app.footer("Exit codes: 0 ok, 2 invalid argument, 3 invalid model, 4 unsupported, 5 infeasible, 6 system error,\n"
             "7 corrupt data (a checkpoint failing its checksums), 70 internal error, 75 stopped by a signal after\n"
             "checkpointing (resume it). Run `apart <command> --help` for a command's options.");

  auto& registry = apart::cli::command_registry();
  std::sort(registry.begin(), registry.end(), [](const auto& a, const auto& b) {
    return a.order != b.order ? a.order < b.order : a.name < b.name;
  });
  for (const auto& spec : registry) spec.setup(app);

  // `apart` alone: the usage and the commands, then the error in its documented form (exit 2): nothing was asked for.
  if (argc < 2) {
    std::fprintf(stderr,
                 "%s\napart: error [InvalidArgument]: a command is required; run `apart <command> --help` for "
                 "its options\n",
                 app.help().c_str());
    return apart::exit_code(apart::ErrorKind::kInvalidArgument);
  }
  apart::cli::set_command_line(argc, argv);
  try {
    if (const auto unknown = unknown_command(app, argv[1])) {
      std::fprintf(stderr, "apart: error [InvalidArgument]: %s\n", unknown->c_str());
      return apart::exit_code(apart::ErrorKind::kInvalidArgument);
    }
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" that succeed: CLI11 prints them as it documents.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    // Flag errors take the documented form and exit code, with the command whose --help lists the flags.
    const CLI::App* command = &app;
    std::string command_line = "apart";
    while (!command->get_subcommands().empty()) {
      command = command->get_subcommands().front();
      command_line += " " + command->get_name();
    }
    std::fflush(stdout);
    std::fprintf(
        stderr, "apart: error [InvalidArgument]: %s; run `%s --help` for the options\n",
        apart::printable(flag_error_message(*command, e, std::vector<std::string>(argv + 1, argv + argc))).c_str(),
        command_line.c_str());
    return apart::exit_code(apart::ErrorKind::kInvalidArgument);
  } catch (const apart::StoppedBySignal&) {
    std::fflush(stdout);
    return apart::kExitStoppedBySignal;  // what to do next is printed already
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
