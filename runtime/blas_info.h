// Which OpenBLAS kernel the CPU runtime's sgemm runs, and the one note apart prints when it is a slow fallback.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace apart {

// openblas_get_corename() of the BLAS this process loaded ("Zen", "Haswell", "SkylakeX", "Prescott", …), looked
// up with dlsym so that a build against another CBLAS still links; "" when the BLAS is not OpenBLAS.
// Sets OpenBLAS's thread count (openblas_set_num_threads, looked up with dlsym); false when the BLAS is not OpenBLAS.
bool set_blas_threads(int threads);
std::string blas_core_name();

// The `flags` line of /proc/cpuinfo (space-separated, e.g. "fpu … avx2 … avx512f …"); "" where there is none.
std::string cpu_flags();

// The note for a core name and a CPU's flags, or nothing. A pure function of its two arguments: it speaks when
// the CPU has AVX2 (or AVX-512) but the core is one of OpenBLAS's pre-AVX2 kernels (Debian's DYNAMIC_ARCH build
// falls back to Prescott, a generic SSE3 kernel, on a CPU model it does not know). It names the
// OPENBLAS_CORETYPE the flags allow: SKYLAKEX only with avx512f (elsewhere that kernel dies of an illegal
// instruction), else HASWELL. Setting it stays the user's choice: apart never sets it.
std::optional<std::string> blas_kernel_note(std::string_view core_name, std::string_view cpu_flags);

// blas_kernel_note(blas_core_name(), cpu_flags()).
std::optional<std::string> blas_kernel_note();

}  // namespace apart
