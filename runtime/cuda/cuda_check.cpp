// The one place a failed CUDA-library call becomes a CudaError (cuda_check.h's macros call it).
#include "runtime/cuda/cuda_check.h"

#include <string_view>

namespace apart::cuda {

void throw_cuda_error(const char* library, const char* statement, const char* file, int line,
                      const std::string& status) {
  // The path from the source root ("runtime/cuda/gemm.cu"), not the build machine's absolute one
  // (APART_SOURCE_ROOT: runtime/CMakeLists.txt).
  std::string_view path(file);
  if (const std::string_view root(APART_SOURCE_ROOT); path.starts_with(root)) path.remove_prefix(root.size());
  throw CudaError(std::string(library) + " call failed: " + statement + " at " + std::string(path) + ":" +
                  std::to_string(line) + ": " + status);
}

}  // namespace apart::cuda
