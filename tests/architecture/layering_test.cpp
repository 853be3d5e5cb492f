// The layering rule: docs/architecture.md's table, parsed, and every `#include "..."` of the source tree checked
// against it (the table is the one home of the rule and its documentation).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace apart::architecture {
namespace {

namespace fs = std::filesystem;

// One row of the table: a part of the tree, the path prefixes its files start with, the parts it may use.
struct Part {
  std::string name;
  std::vector<std::string> prefixes;  // relative to the source root, '/'-separated
  std::set<std::string> may_use;      // part names, "all of the above" expanded; never itself
};

struct LayeringTable {
  std::vector<Part> parts;  // in table order

  // The part a path belongs to: the row with the longest prefix the path starts with; nullptr if none.
  const Part* part_of(std::string_view path) const {
    const Part* best = nullptr;
    size_t best_length = 0;
    for (const Part& part : parts)
      for (const std::string& prefix : part.prefixes)
        if (path.substr(0, prefix.size()) == prefix && prefix.size() > best_length) {
          best = &part;
          best_length = prefix.size();
        }
    return best;
  }
  const Part* find(std::string_view name) const {
    for (const Part& part : parts)
      if (part.name == name) return &part;
    return nullptr;
  }
};

std::string trim(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return "";
  const size_t end = text.find_last_not_of(" \t\r");
  return std::string(text.substr(begin, end - begin + 1));
}

std::vector<std::string> cells_of(std::string_view row) {
  std::vector<std::string> cells;
  std::string_view rest = row.substr(row.find('|') + 1);
  for (size_t bar; (bar = rest.find('|')) != std::string_view::npos; rest = rest.substr(bar + 1))
    cells.push_back(trim(rest.substr(0, bar)));
  return cells;
}

// Text in parentheses is a comment (why an edge is kept); the backticked words outside it are the names.
std::vector<std::string> backticked_names(std::string_view cell) {
  std::string outside;
  int depth = 0;
  for (char c : cell) {
    if (c == '(') ++depth;
    else if (c == ')') depth = std::max(0, depth - 1);
    else if (depth == 0) outside += c;
  }
  std::vector<std::string> names;
  const std::regex name_pattern("`([^`]+)`");
  for (auto it = std::sregex_iterator(outside.begin(), outside.end(), name_pattern); it != std::sregex_iterator();
       ++it)
    names.push_back((*it)[1]);
  return names;
}

// Parses the table whose header row is `| part | files | library | holds | may use |` (docs/architecture.md
// says what the cells mean). Throws std::runtime_error naming the line it cannot read.
LayeringTable parse_table(std::string_view markdown) {
  const std::vector<std::string> header = {"part", "files", "library", "holds", "may use"};
  LayeringTable table;
  std::istringstream lines{std::string(markdown)};
  std::string line;
  int line_number = 0;
  bool in_table = false;
  while (std::getline(lines, line)) {
    ++line_number;
    const std::string row = trim(line);
    if (!in_table) {
      if (!row.empty() && row[0] == '|' && cells_of(row) == header) {
        in_table = true;
        std::getline(lines, line);  // the |---| separator
        ++line_number;
      }
      continue;
    }
    if (row.empty() || row[0] != '|') break;
    const std::vector<std::string> cells = cells_of(row);
    const std::vector<std::string> names = backticked_names(cells.empty() ? "" : cells[0]);
    if (cells.size() != header.size() || names.size() != 1)
      throw std::runtime_error("docs/architecture.md:" + std::to_string(line_number) +
                               ": a row needs 5 cells and one backticked part name");
    Part part{names[0], backticked_names(cells[1]), {}};
    if (part.prefixes.empty())
      throw std::runtime_error("docs/architecture.md:" + std::to_string(line_number) + ": part `" + part.name +
                               "` names no files");
    if (cells[4].find("all of the above") != std::string::npos)
      for (const Part& above : table.parts) part.may_use.insert(above.name);
    for (const std::string& used : backticked_names(cells[4]))
      if (used != part.name) part.may_use.insert(used);
    table.parts.push_back(std::move(part));
  }
  if (table.parts.empty()) throw std::runtime_error("docs/architecture.md: no `| part | files | ...` table");
  return table;
}

// A part on a cycle of "may use" arrows, or "" when they form a DAG (Kahn's algorithm).
std::string part_on_a_cycle(const LayeringTable& table) {
  std::map<std::string, int> unmet;  // uses not yet placed
  for (const Part& part : table.parts) unmet[part.name] = static_cast<int>(part.may_use.size());
  std::vector<std::string> ready;
  for (const auto& [name, count] : unmet)
    if (count == 0) ready.push_back(name);
  size_t placed = 0;
  while (!ready.empty()) {
    const std::string done = ready.back();
    ready.pop_back();
    ++placed;
    for (const Part& part : table.parts)
      if (part.may_use.count(done) && --unmet[part.name] == 0) ready.push_back(part.name);
  }
  if (placed == table.parts.size()) return "";
  for (const auto& [name, count] : unmet)
    if (count > 0) return name;
  return "";
}

struct SourceFile {
  std::string path;  // relative to the source root, '/'-separated
  std::string text;
};

struct Violation {
  std::string where;    // file:line
  std::string include;  // the included path
  std::string from;     // the including part ("" if the file belongs to none)
  std::string to;
};

std::vector<Violation> check_includes(const LayeringTable& table, const std::vector<SourceFile>& files) {
  static const std::regex include_pattern(R"re(^\s*#\s*include\s*"([^"]+)")re");
  std::vector<Violation> violations;
  for (const SourceFile& file : files) {
    const Part* from = table.part_of(file.path);
    std::istringstream lines(file.text);
    std::string line;
    for (int number = 1; std::getline(lines, line); ++number) {
      std::smatch match;
      if (!std::regex_search(line, match, include_pattern)) continue;
      const Part* to = table.part_of(match[1].str());
      if (to == nullptr) continue;  // not one of ours (apart_version.h is generated)
      if (from != nullptr && (from == to || from->may_use.count(to->name))) continue;
      violations.push_back({file.path + ":" + std::to_string(number), match[1].str(), from ? from->name : "", to->name});
    }
  }
  return violations;
}

std::string describe(const std::vector<Violation>& violations) {
  std::string text;
  for (const Violation& v : violations)
    text += v.where + " includes \"" + v.include + "\": " + (v.from.empty() ? "a file of no part" : v.from) +
            " may not use " + v.to + " (docs/architecture.md)\n";
  return text;
}

const fs::path kSourceRoot = APART_SOURCE_DIR;

bool is_source(const fs::path& path) {
  const std::string extension = path.extension().string();
  return extension == ".h" || extension == ".cpp" || extension == ".cu" || extension == ".cuh";
}

// Every C++/CUDA file of the tree, build outputs and hidden folders skipped.
std::vector<SourceFile> source_files() {
  std::vector<SourceFile> files;
  for (auto it = fs::recursive_directory_iterator(kSourceRoot); it != fs::recursive_directory_iterator(); ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory() && (name.rfind('.', 0) == 0 || name == "build" || name == "out")) {
      it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file() || !is_source(it->path())) continue;
    std::ifstream in(it->path(), std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    files.push_back({fs::relative(it->path(), kSourceRoot).generic_string(), text.str()});
  }
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  return files;
}

LayeringTable docs_table() {
  std::ifstream in(kSourceRoot / "docs" / "architecture.md");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_table(text.str());
}

TEST(TheSourceTree, IncludesOnlyWhatDocsArchitectureAllowsEachFolder) {
  const std::vector<SourceFile> files = source_files();
  ASSERT_GT(files.size(), 100u) << "scanned " << kSourceRoot;
  const std::vector<Violation> violations = check_includes(docs_table(), files);
  EXPECT_TRUE(violations.empty()) << describe(violations);
}

TEST(TheSourceTree, HasEveryFolderNamedInTheTable) {
  const LayeringTable table = docs_table();
  std::set<std::string> unnamed;
  for (const SourceFile& file : source_files())
    if (table.part_of(file.path) == nullptr) unnamed.insert(file.path.substr(0, file.path.find('/')) + "/");
  EXPECT_TRUE(unnamed.empty()) << "add a row to docs/architecture.md for: "
                               << [&] { std::string s; for (const auto& f : unnamed) s += f + " "; return s; }();
}

TEST(TheLayeringTable, IsADirectedAcyclicGraph) {
  EXPECT_EQ(part_on_a_cycle(docs_table()), "");
}

TEST(TheLayeringTable, UsesOnlyPartsItDefines) {
  const LayeringTable table = docs_table();
  for (const Part& part : table.parts)
    for (const std::string& used : part.may_use) EXPECT_NE(table.find(used), nullptr) << part.name << " uses " << used;
}

TEST(TheLayeringTable, KeepsTheRuntimeAwayFromThePlanner) {
  const LayeringTable table = docs_table();
  const Part* runtime = table.find("runtime");
  ASSERT_NE(runtime, nullptr);
  EXPECT_EQ(runtime->may_use.count("partition"), 0u);
  EXPECT_EQ(runtime->may_use.count("codegen"), 0u);
  EXPECT_EQ(runtime->may_use.count("autodiff"), 1u);  // the kernel program its executor runs (codegen/kernel_program.h)
  const Part* train = table.find("train");  // apart train, apart run: training graphs from autodiff, never codegen
  ASSERT_NE(train, nullptr);
  EXPECT_EQ(train->may_use.count("partition"), 0u);
  EXPECT_EQ(train->may_use.count("codegen"), 0u);
  EXPECT_EQ(train->may_use.count("autodiff"), 1u);
  EXPECT_EQ(train->may_use.count("runtime"), 1u);
  EXPECT_EQ(runtime->may_use.count("train"), 0u);
  EXPECT_EQ(table.part_of("codegen/autodiff.h")->name, "autodiff");
  EXPECT_EQ(table.part_of("codegen/gradients/gradient.h")->name, "autodiff");
  EXPECT_EQ(table.part_of("codegen/plan_writer.h")->name, "codegen");
}

TEST(TheIncludeChecker, CatchesARuntimeFileIncludingThePartitioner) {
  const std::vector<Violation> violations = check_includes(
      docs_table(), {{"runtime/pipelined.cpp", "// x\n#include \"runtime/executor.h\"\n#include \"partition/partition.h\"\n"},
                     {"runtime/cpu/gemm.cpp", "  #  include \"codegen/plan_writer.h\"  // codegen is not autodiff\n"}});
  ASSERT_EQ(violations.size(), 2u) << describe(violations);
  EXPECT_EQ(violations[0].where, "runtime/pipelined.cpp:3");
  EXPECT_EQ(violations[0].to, "partition");
  EXPECT_EQ(violations[1].where, "runtime/cpu/gemm.cpp:1");
  EXPECT_EQ(violations[1].to, "codegen");
  EXPECT_NE(describe(violations).find("runtime may not use partition"), std::string::npos);
}

constexpr std::string_view kSmallTable = R"(
| part | files | library | holds | may use |
|---|---|---|---|---|
| `base` | `base/` | `lib_base` | the bottom | nothing of ours |
| `mid` | `mid/` | `lib_mid` | uses the bottom | `base` (a comment with `top` in it is no edge) |
| `top` | `top/`, `extra/top_` | `app` | the top | all of the above |

Text after the table.
)";

TEST(TheIncludeChecker, AllowsWhatIsAboveAndRefusesWhatIsBelow) {
  const LayeringTable table = parse_table(kSmallTable);
  ASSERT_EQ(table.parts.size(), 3u);
  EXPECT_EQ(table.parts[1].may_use, std::set<std::string>{"base"});
  EXPECT_EQ(table.parts[2].may_use, (std::set<std::string>{"base", "mid"}));
  const std::vector<Violation> violations =
      check_includes(table, {{"top/a.cpp", "#include \"mid/m.h\"\n#include \"base/b.h\"\n"},
                             {"extra/top_b.cpp", "#include \"top/a.h\"\n"},
                             {"base/b.cpp", "#include \"base/b.h\"\n#include \"apart_version.h\"\n#include \"mid/m.h\"\n"},
                             {"other/x.cpp", "#include \"base/b.h\"\n"}});
  ASSERT_EQ(violations.size(), 2u) << describe(violations);
  EXPECT_EQ(violations[0].where, "base/b.cpp:3");
  EXPECT_EQ(violations[1].from, "");  // a file of no part may include nothing of ours
}

TEST(TheLayeringTable, WithACycleIsRefused) {
  std::string cyclic(kSmallTable);
  cyclic.replace(cyclic.find("nothing of ours"), std::string_view("nothing of ours").size(), "`top`");
  EXPECT_NE(part_on_a_cycle(parse_table(cyclic)), "");
  EXPECT_EQ(part_on_a_cycle(parse_table(kSmallTable)), "");
}

TEST(TheLayeringTable, WithAMalformedRowNamesItsLine) {
  std::string broken(kSmallTable);
  broken.replace(broken.find("| `lib_mid` "), std::string_view("| `lib_mid` ").size(), "");
  try {
    parse_table(broken);
    FAIL() << "a 4-cell row was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("docs/architecture.md:5"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace apart::architecture
