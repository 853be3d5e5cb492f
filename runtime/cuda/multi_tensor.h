// The chunk table of the CUDA step kernels' multi-tensor launches (step_kernels.cu), without a CUDA header so the dev
// preset unit-tests it: every tensor of a list cut into chunks of at most kChunkElements; block b of the one launch
// works on chunk b, so a step over a thousand params is one kernel, and a block's work does not depend on timing.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "graph/error.h"

namespace apart::cuda {

inline constexpr int kChunkSlots = 4;  // param, grad, two state slots (Adam's m and v)
inline constexpr int64_t kChunkElements = int64_t{1} << 16;

// One block's work: `count` elements from each slot's pointer (advanced to the chunk; nullptr for unused slots).
struct MultiTensorChunk {
  float* data[kChunkSlots];
  int64_t count;
};

// The chunks of `tensors` (the slots' base pointers of tensor i; equal element counts `sizes[i]`), in order, empty
// tensors skipped.
inline std::vector<MultiTensorChunk> build_chunk_table(std::span<const std::array<float*, kChunkSlots>> tensors,
                                                       std::span<const int64_t> sizes,
                                                       int64_t chunk_elements = kChunkElements) {
  APART_CHECK(tensors.size() == sizes.size() && chunk_elements > 0, "build_chunk_table: mismatched lists");
  std::vector<MultiTensorChunk> table;
  for (size_t i = 0; i < tensors.size(); ++i) {
    APART_CHECK(sizes[i] >= 0, "build_chunk_table: negative size");
    for (int64_t offset = 0; offset < sizes[i]; offset += chunk_elements) {
      MultiTensorChunk chunk{};
      for (int s = 0; s < kChunkSlots; ++s) chunk.data[s] = tensors[i][s] ? tensors[i][s] + offset : nullptr;
      chunk.count = std::min(chunk_elements, sizes[i] - offset);
      table.push_back(chunk);
    }
  }
  return table;
}

}  // namespace apart::cuda
