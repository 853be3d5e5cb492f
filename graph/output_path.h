// Checks on the paths a command is about to write: never one of its own inputs, never a directory, symlink or
// device, and a folder that exists and can be written. Every command runs them before its work starts.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace apart {

// A file (or folder) a command reads, with what it is for the message: {"the model", "m.onnx"}.
struct InputFile {
  std::string role;
  std::filesystem::path path;
};

// Whether `a` and `b` are the same file or folder (same st_dev and st_ino, following symlinks), so hard links,
// `./x` and symlinks to it are caught. False when either does not exist.
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b);

// Whether `dir` is `path` itself or one of the folders above it, by identity: through the path as given and through
// its canonical form, so `..`, symlinked folders and bind mounts of the same folder all count.
bool contains_path(const std::filesystem::path& dir, const std::filesystem::path& path);

// Whether `dir` has write permission for apart: access(W_OK), and at least one write bit in its mode (root passes
// access() on everything; a folder made read-only with chmod 555 is still meant to stay as it is).
bool writable_directory(const std::filesystem::path& dir);

// Throws InvalidArgument when `output` is one of `inputs` (by same_file): "<flag> m.onnx is the model this command
// reads (m.onnx); write the output elsewhere".
void check_output_not_input(const std::filesystem::path& output, const std::vector<InputFile>& inputs,
                            std::string_view flag);

// Checks a file output before the work: InvalidArgument when it is a directory, a symlink (naming its target), or
// exists but is not a regular file (a device, a FIFO: apart writes through a temporary and a rename, which would
// replace it); SystemError when its folder does not exist or cannot be written. The message names `flag`.
void check_output_writable(const std::filesystem::path& output, std::string_view flag);

// Both checks above, the input check first: what every command runs on each file it will write, before its work.
void check_output_file(const std::filesystem::path& output, const std::vector<InputFile>& inputs,
                       std::string_view flag);

// Checks a folder output (created if missing, files written inside): InvalidArgument when it exists and is not a
// folder, or is a symlink; SystemError when it (or, when missing, the nearest existing folder above it) cannot be
// written.
void check_output_directory_writable(const std::filesystem::path& dir, std::string_view flag);

}  // namespace apart
