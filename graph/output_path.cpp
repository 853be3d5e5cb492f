// Checks on output paths before a command writes them (see output_path.h).
#include "graph/output_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <system_error>
#include <vector>

#include "graph/error.h"

namespace apart {
namespace fs = std::filesystem;

namespace {

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

bool stat_of(const fs::path& p, struct stat& st) { return ::stat(p.c_str(), &st) == 0; }

// The folder a file output lands in: its parent, or "." for a bare name.
fs::path folder_of(const fs::path& file) { return file.has_parent_path() ? file.parent_path() : fs::path("."); }

std::string symlink_target(const fs::path& p) {
  std::error_code ec;
  const fs::path target = fs::read_symlink(p, ec);
  return ec ? std::string("an unreadable target") : quoted(target);
}

}  // namespace

bool same_file(const fs::path& a, const fs::path& b) {
  struct stat sa {}, sb {};
  return stat_of(a, sa) && stat_of(b, sb) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

bool contains_path(const fs::path& dir, const fs::path& path) {
  struct stat sd {};
  if (!stat_of(dir, sd)) return false;
  std::error_code ec;
  // The path resolved, and the path with only its folder resolved (a symlink named as an input lives in its own
  // folder, whatever it points to). Canonical forms, so a lexical `..` never names a folder that is not above it.
  std::vector<fs::path> forms;
  if (fs::path c = fs::weakly_canonical(path, ec); !ec) forms.push_back(c);
  const fs::path name = path.filename();
  if (!name.empty() && name != "." && name != "..")
    if (fs::path c = fs::weakly_canonical(fs::absolute(path, ec).parent_path(), ec); !ec) forms.push_back(c / name);
  for (fs::path p : forms) {
    while (true) {
      struct stat sp {};
      if (stat_of(p, sp) && sp.st_dev == sd.st_dev && sp.st_ino == sd.st_ino) return true;
      if (!p.has_parent_path() || p.parent_path() == p) break;
      p = p.parent_path();
    }
  }
  return false;
}

bool writable_directory(const fs::path& dir) {
  struct stat st {};
  if (!stat_of(dir, st) || !S_ISDIR(st.st_mode)) return false;
  return ::access(dir.c_str(), W_OK | X_OK) == 0 && (st.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) != 0;
}

void check_output_not_input(const fs::path& output, const std::vector<InputFile>& inputs, std::string_view flag) {
  for (const InputFile& in : inputs)
    if (!in.path.empty() && same_file(output, in.path))
      throw InvalidArgument(std::string(flag) + " " + quoted(output) + " is " + in.role + " this command reads (" +
                            quoted(in.path) + "); writing it would destroy the input: write the output elsewhere");
}

void check_output_writable(const fs::path& output, std::string_view flag) {
  const std::string where = std::string(flag) + " " + quoted(output);
  if (output.empty()) throw InvalidArgument(std::string(flag) + ": empty path; give a file name");
  const fs::path name = output.filename();
  if (name.empty() || name == "." || name == "..")
    throw InvalidArgument(where + " names a folder; give a file name, e.g. " + (output / "out.json").string());
  std::error_code ec;
  const fs::file_status link = fs::symlink_status(output, ec);
  if (fs::is_symlink(link))
    throw InvalidArgument(where + " is a symlink to " + symlink_target(output) +
                          "; apart does not write through or replace symlinks: give the target itself or another path");
  if (fs::exists(link)) {
    if (fs::is_directory(link)) throw InvalidArgument(where + " is a folder; give a file name inside it");
    if (!fs::is_regular_file(link))
      throw InvalidArgument(where + " exists and is not a regular file (a device, FIFO or socket); apart writes a "
                            "temporary beside it and renames it into place, which would replace it: give a file path");
    struct stat st {};
    if (stat_of(output, st) && (st.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) == 0)
      throw SystemError(where + " is read-only; apart will not replace it: make it writable (chmod u+w) or write "
                        "elsewhere");
  }
  const fs::path folder = folder_of(output);
  if (!fs::exists(folder, ec)) throw SystemError(where + ": the folder " + quoted(folder) + " does not exist; create it first");
  if (!fs::is_directory(folder, ec)) throw SystemError(where + ": " + quoted(folder) + " is not a folder");
  if (!writable_directory(folder))
    throw SystemError(where + ": the folder " + quoted(folder) + " is not writable; write elsewhere");
}

void check_output_file(const fs::path& output, const std::vector<InputFile>& inputs, std::string_view flag) {
  check_output_not_input(output, inputs, flag);
  check_output_writable(output, flag);
}

void check_output_directory_writable(const fs::path& dir, std::string_view flag) {
  const std::string where = std::string(flag) + " " + quoted(dir);
  if (dir.empty()) throw InvalidArgument(std::string(flag) + ": empty path; give a folder");
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(dir, ec)) && !fs::exists(dir, ec))
    throw InvalidArgument(where + " is a symlink to " + symlink_target(dir) + ", which does not exist; give a folder");
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec))
      throw InvalidArgument(where + " exists and is not a folder; give a folder (it is created if missing)");
    if (!writable_directory(dir)) throw SystemError(where + " is not writable; make it writable or choose another folder");
    return;
  }
  // Missing: it is created, so the nearest folder above it that exists must be a writable folder.
  fs::path above = fs::absolute(dir, ec).parent_path();
  while (!above.empty() && !fs::exists(above, ec) && above.parent_path() != above) above = above.parent_path();
  if (!fs::is_directory(above, ec))
    throw InvalidArgument(where + " cannot be created: " + quoted(above) + " is not a folder");
  if (!writable_directory(above))
    throw SystemError(where + " cannot be created: " + quoted(above) + " is not writable");
}

}  // namespace apart
