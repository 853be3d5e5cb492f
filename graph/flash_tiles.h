// The tiles of the blocked (FlashAttention-2-style) attention kernels: the one home of the block sizes that the CPU
// kernel runs (runtime/cpu/attention.cpp) and the cost model prices (profiler/op_work.h, attention_pairs), so that the
// work priced under is_causal is the work done.
#pragma once

#include <algorithm>
#include <cstdint>

namespace apart {

struct FlashTiles {
  int64_t rows = 64;  // query rows per block
  int64_t cols = 64;  // keys per tile
};

// For heads of `width` (the larger of the Q/K and V head sizes): 64 keys per tile, and as many query rows (8 to 64)
// as keep one tile's GEMM at M·N·K ≤ 2^18, OpenBLAS's bound for running a GEMM on the calling thread alone (so the
// tiles of parallel_for's threads do not start BLAS threads of their own).
inline FlashTiles flash_tiles(int64_t width) {
  FlashTiles t;
  t.rows = std::clamp<int64_t>((int64_t{1} << 18) / (t.cols * std::max<int64_t>(width, 1)), 8, 64);
  return t;
}

// The (query, key) pairs one head's blocked kernel computes. Without is_causal: q_seq · kv_seq. Under is_causal
// (query i sees keys j ≤ i): each block of `rows` query rows reads the keys up to its last row, so a block's
// diagonal square is computed whole (masked inside) and every tile past it is skipped: Σ over blocks of
// rows_b · min(kv_seq, i0_b + rows_b), about S·L/2 + S·rows/2.
inline double flash_pairs(int64_t q_seq, int64_t kv_seq, int64_t width, bool causal) {
  if (!causal) return static_cast<double>(q_seq) * static_cast<double>(kv_seq);
  const int64_t rows = flash_tiles(width).rows;
  double pairs = 0;
  for (int64_t i0 = 0; i0 < q_seq; i0 += rows) {
    const int64_t br = std::min(rows, q_seq - i0);
    pairs += static_cast<double>(br) * static_cast<double>(std::min(kv_seq, i0 + br));
  }
  return pairs;
}

}  // namespace apart
