// How a CUDA kernel finds its operands' elements from an output element's index: the output's dims and each
// operand's element strides (0 where it broadcasts, permuted for Transpose, stepped for Slice), passed to the
// kernel by value. Plain C++ (no CUDA header), so its host side is unit-tested on machines without a GPU.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "runtime/host_device.h"

namespace apart::cuda {

inline constexpr int kMaxIndexRank = 8;

template <int K>
struct IndexMap {
  int rank = 0;
  int64_t dims[kMaxIndexRank] = {};
  int64_t strides[K][kMaxIndexRank] = {};

  // The element offset of each operand for output element `linear` (row-major over dims). Rank 1 (same-shape
  // operands and scalars, after merging) needs no division.
  APART_HOST_DEVICE void offsets(int64_t linear, int64_t (&off)[K]) const {
    for (int k = 0; k < K; ++k) off[k] = 0;
    if (rank == 1) {
      for (int k = 0; k < K; ++k) off[k] = linear * strides[k][0];
      return;
    }
#ifdef __CUDA_ARCH__  // device code: the rank loop unrolled (host compilers know no such pragma)
#pragma unroll
#endif
    for (int d = kMaxIndexRank - 1; d >= 0; --d) {
      if (d >= rank) continue;
      const int64_t idx = linear % dims[d];
      linear /= dims[d];
      for (int k = 0; k < K; ++k) off[k] += idx * strides[k][d];
    }
  }
};

// The map over `shape` (row-major) with operand k at element strides `strides[k]` (one per dim of `shape`). Dims of
// size 1 are dropped and adjacent dims merged where every operand is contiguous across them, so [B, S, H] + [H]
// walks two dims and same-shape operands one. False when more than kMaxIndexRank dims remain.
template <int K>
bool make_index_map(const std::vector<int64_t>& shape, const std::array<std::vector<int64_t>, K>& strides,
                    IndexMap<K>& map) {
  std::vector<int64_t> dims;
  std::array<std::vector<int64_t>, K> kept;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    const bool mergeable = [&] {
      if (dims.empty()) return false;
      for (int k = 0; k < K; ++k)
        if (kept[k].back() != strides[k][d] * shape[d]) return false;
      return true;
    }();
    if (mergeable) {
      dims.back() *= shape[d];
      for (int k = 0; k < K; ++k) kept[k].back() = strides[k][d];
    } else {
      dims.push_back(shape[d]);
      for (int k = 0; k < K; ++k) kept[k].push_back(strides[k][d]);
    }
  }
  if (dims.size() > static_cast<size_t>(kMaxIndexRank)) return false;
  map = IndexMap<K>{};
  map.rank = static_cast<int>(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    map.dims[d] = dims[d];
    for (int k = 0; k < K; ++k) map.strides[k][d] = kept[k][d];
  }
  return true;
}

}  // namespace apart::cuda
