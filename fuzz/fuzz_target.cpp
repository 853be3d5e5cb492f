#include "fuzz_target.h"

#include <unistd.h>

#include <fstream>
#include <system_error>

namespace apart::fuzz {

namespace {
std::filesystem::path make_scratch_dir() {
  std::filesystem::path base = "/dev/shm";
  if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr && *tmp != '\0') base = tmp;
  std::error_code ec;
  if (!std::filesystem::is_directory(base, ec)) base = std::filesystem::temp_directory_path();
  std::string pattern = (base / "apart-fuzz-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) bug("scratch directory", ("cannot create " + pattern).c_str());
  return pattern;
}
}  // namespace

const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path made = make_scratch_dir();
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return made;
  }();
  return dir;
}

std::filesystem::path write_scratch(const std::string& name, const uint8_t* data, size_t size) {
  const std::filesystem::path path = scratch_dir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) throw SystemError("cannot write the fuzz input to " + path.string());
  return path;
}

}  // namespace apart::fuzz
