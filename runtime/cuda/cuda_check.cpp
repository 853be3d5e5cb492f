// The one place a failed CUDA-library call becomes a CudaError (cuda_check.h's macros call it).
#include "runtime/cuda/cuda_check.h"

#include <string_view>

namespace apart::cuda {

void throw_cuda_error(const char* library, const char* statement, const char* file, int line,
                      const std::string& status) {
  // The path from the source root ("runtime/cuda/gemm.cu"), whichever way the compiler spelled it: absolute
  // (APART_SOURCE_ROOT: runtime/CMakeLists.txt), relative to the build folder (ccache's base_dir), or through a
  // library's include root (build/<preset>/include/<target>/runtime/...).
  std::string_view path(file);
  if (const std::string_view root(APART_SOURCE_ROOT); path.starts_with(root)) path.remove_prefix(root.size());
  while (path.starts_with("../") || path.starts_with("./")) path.remove_prefix(path.find('/') + 1);
  if (const size_t at = path.find("include/apart_"); at != std::string_view::npos) {
    if (const size_t slash = path.find('/', at + 8); slash != std::string_view::npos) path.remove_prefix(slash + 1);
  }
  throw CudaError(std::string(library) + " call failed: " + statement + " at " + std::string(path) + ":" +
                  std::to_string(line) + ": " + status);
}

}  // namespace apart::cuda
