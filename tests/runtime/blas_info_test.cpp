// Which OpenBLAS kernel runs, and when apart tells the user a faster one is a flag away.
#include <gtest/gtest.h>

#include <string>

#include "runtime/blas_info.h"

namespace apart {
namespace {

constexpr const char* kAvx2Flags = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx fma avx2 bmi2";
constexpr const char* kAvx512Flags = "fpu sse sse2 avx fma avx2 avx512f avx512dq avx512bw avx512vl";

TEST(BlasCoreName, NamesTheKernelOfTheOpenBlasThisBinaryLoaded) {
  // The runtime links OpenBLAS (runtime/CMakeLists.txt, pkg-config openblas): its core name is never empty.
  EXPECT_FALSE(blas_core_name().empty());
}

TEST(BlasKernelNote, SaysNothingWhenTheCoreUsesTheCpusVectorUnits) {
  EXPECT_FALSE(blas_kernel_note("Zen", kAvx2Flags));
  EXPECT_FALSE(blas_kernel_note("Haswell", kAvx2Flags));
  EXPECT_FALSE(blas_kernel_note("SkylakeX", kAvx512Flags));
  EXPECT_FALSE(blas_kernel_note("Haswell", kAvx512Flags));  // an AVX2 kernel on AVX-512 is not a generic fallback
}

TEST(BlasKernelNote, SaysNothingOnACpuWithoutAvx2OrWithoutOpenBlas) {
  EXPECT_FALSE(blas_kernel_note("Prescott", "fpu sse sse2 sse3 avx"));  // the generic kernel is the right one here
  EXPECT_FALSE(blas_kernel_note("", kAvx512Flags));                     // not OpenBLAS: no core name
  EXPECT_FALSE(blas_kernel_note("Prescott", ""));                       // no /proc/cpuinfo: nothing known
}

TEST(BlasKernelNote, SuggestsSkylakexForTheGenericKernelOnAnAvx512Cpu) {
  const auto note = blas_kernel_note("Prescott", kAvx512Flags);
  ASSERT_TRUE(note);
  EXPECT_NE(note->find("'Prescott'"), std::string::npos) << *note;
  EXPECT_NE(note->find("OPENBLAS_CORETYPE=SKYLAKEX"), std::string::npos) << *note;
  EXPECT_NE(note->find("faster"), std::string::npos) << *note;
  EXPECT_NE(note->find("your choice"), std::string::npos) << *note;
  EXPECT_LE(note->size(), 160u) << *note;  // one short line, printed once per run
}

TEST(BlasKernelNote, SuggestsHaswellNotSkylakexWhereTheCpuHasNoAvx512) {
  // SKYLAKEX's kernels die of SIGILL without avx512f (measured: AMD EPYC with AVX2 only).
  for (const char* core : {"Prescott", "Core2", "Nehalem", "Sandybridge"}) {
    const auto note = blas_kernel_note(core, kAvx2Flags);
    ASSERT_TRUE(note) << core;
    EXPECT_NE(note->find("OPENBLAS_CORETYPE=HASWELL"), std::string::npos) << *note;
    EXPECT_EQ(note->find("SKYLAKEX"), std::string::npos) << *note;
  }
}

TEST(BlasKernelNote, MatchesFlagsAsWholeWordsAndCoreNamesInAnyCase) {
  EXPECT_FALSE(blas_kernel_note("Prescott", "fpu avx2x sse"));  // "avx2x" is not avx2
  EXPECT_FALSE(blas_kernel_note("ZEN", kAvx2Flags));
  const auto note = blas_kernel_note("PRESCOTT", "fpu avx2 avx512fx");  // "avx512fx" is not avx512f
  ASSERT_TRUE(note);
  EXPECT_NE(note->find("HASWELL"), std::string::npos) << *note;
}

TEST(CpuFlags, ReadsTheFlagsLineOfProcCpuinfo) {
  // Every x86-64 Linux CPU reports sse2; elsewhere (no /proc/cpuinfo flags line) the result is empty.
  const std::string flags = cpu_flags();
#if defined(__x86_64__) && defined(__linux__)
  EXPECT_NE((" " + flags + " ").find(" sse2 "), std::string::npos) << flags;
#else
  SUCCEED() << flags;
#endif
}

}  // namespace
}  // namespace apart
