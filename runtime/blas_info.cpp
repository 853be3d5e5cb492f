// OpenBLAS's active kernel (dlsym of openblas_get_corename) and the note for a generic fallback.
#include "runtime/blas_info.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <fstream>
#include <sstream>

namespace apart {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

bool has_flag(std::string_view flags, std::string_view flag) {
  std::istringstream words{std::string(flags)};
  for (std::string w; words >> w;)
    if (w == flag) return true;
  return false;
}

// OpenBLAS's x86-64 cores whose sgemm kernels use AVX2/FMA or AVX-512 (driver/others/dynamic.c's names, lower
// case). Any other core on a CPU with AVX2 is a fallback: Prescott/Core2/Nehalem (SSE) or Sandybridge (AVX).
constexpr std::array<std::string_view, 6> kVectorCores = {"haswell", "zen", "skylakex", "cooperlake",
                                                          "sapphirerapids", "excavator"};

}  // namespace

bool set_blas_threads(int threads) {
  using SetThreads = void (*)(int);
  void* symbol = dlsym(RTLD_DEFAULT, "openblas_set_num_threads");
  if (!symbol) return false;
  reinterpret_cast<SetThreads>(symbol)(threads);
  return true;
}

std::string blas_core_name() {
  using CoreName = char* (*)();
  // RTLD_DEFAULT: the symbol of whichever libopenblas the executable loaded (none: a reference CBLAS).
  void* symbol = dlsym(RTLD_DEFAULT, "openblas_get_corename");
  if (!symbol) return "";
  const char* name = reinterpret_cast<CoreName>(symbol)();
  return name ? std::string(name) : std::string();
}

std::string cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    const size_t colon = line.find(':');
    return colon == std::string::npos ? std::string() : line.substr(colon + 1);
  }
  return "";
}

std::optional<std::string> blas_kernel_note(std::string_view core_name, std::string_view flags) {
  if (core_name.empty() || !has_flag(flags, "avx2")) return std::nullopt;
  const std::string core = lower(core_name);
  if (std::find(kVectorCores.begin(), kVectorCores.end(), core) != kVectorCores.end()) return std::nullopt;
  const bool avx512 = has_flag(flags, "avx512f");
  // Figures: docs/runtime.md ("Which OpenBLAS kernel runs"): single-precision GEMM on the machines measured. One short
  // line: the commands print it once per run.
  const std::string coretype = avx512 ? "SKYLAKEX" : "HASWELL";
  return "OpenBLAS runs its generic '" + std::string(core_name) + "' kernel on this " + (avx512 ? "AVX-512" : "AVX2") +
         " CPU; OPENBLAS_CORETYPE=" + coretype + " ran sgemm " + (avx512 ? "~7x" : "~4x") +
         " faster on such machines (your choice; docs/runtime.md)";
}

std::optional<std::string> blas_kernel_note() { return blas_kernel_note(blas_core_name(), cpu_flags()); }

}  // namespace apart
