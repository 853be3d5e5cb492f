// Subcommands register themselves here; main() builds the CLI11 app from the registry.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace apart::cli {

struct CommandSpec {
  std::string name;
  int order = 100;  // position in `apart --help`
  std::function<void(CLI::App& app)> setup;  // adds the subcommand, its options and its callback
};

std::vector<CommandSpec>& command_registry();

// Use at namespace scope in a cmd_*.cpp file:  static const bool kRegistered = register_command({...});
bool register_command(CommandSpec spec);

}  // namespace apart::cli
