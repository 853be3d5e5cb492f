// The chunk table of the CUDA step kernels (runtime/cuda/multi_tensor.h) on the CPU: every element of every tensor in
// exactly one chunk, slot pointers advanced together, empty tensors and unused slots skipped.
#include "runtime/cuda/multi_tensor.h"

#include <gtest/gtest.h>

#include <vector>

#include "graph/error.h"

namespace apart::cuda {
namespace {

TEST(BuildChunkTable, CoversEveryElementOnceWithTheSlotsAdvancedTogether) {
  const std::vector<int64_t> sizes = {0, 5, 7, 23, 1};
  std::vector<std::vector<float>> params, grads;
  std::vector<std::array<float*, kChunkSlots>> slots;
  for (int64_t n : sizes) {
    params.emplace_back(static_cast<size_t>(n), 0.0f);
    grads.emplace_back(static_cast<size_t>(n), 0.0f);
  }
  for (size_t i = 0; i < sizes.size(); ++i) slots.push_back({params[i].data(), grads[i].data(), nullptr, nullptr});
  const auto table = build_chunk_table(slots, sizes, 7);
  EXPECT_EQ(table.size(), 0u + 1 + 1 + 4 + 1);  // ceil(n / 7) each
  for (const MultiTensorChunk& chunk : table) {
    EXPECT_GT(chunk.count, 0);
    EXPECT_LE(chunk.count, 7);
    EXPECT_EQ(chunk.data[2], nullptr);
    EXPECT_EQ(chunk.data[3], nullptr);
    for (int64_t j = 0; j < chunk.count; ++j) {
      chunk.data[0][j] += 1.0f;
      chunk.data[1][j] += 2.0f;
    }
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(params[i], std::vector<float>(static_cast<size_t>(sizes[i]), 1.0f)) << "tensor " << i;
    EXPECT_EQ(grads[i], std::vector<float>(static_cast<size_t>(sizes[i]), 2.0f)) << "tensor " << i;
  }
}

TEST(BuildChunkTable, CutsAtTheDefaultChunkSizeAndKeepsTheTensorsInOrder) {
  std::vector<float> a(static_cast<size_t>(2 * kChunkElements + 3)), b(3);
  const std::vector<std::array<float*, kChunkSlots>> slots = {{a.data(), nullptr, nullptr, nullptr},
                                                               {b.data(), nullptr, nullptr, nullptr}};
  const std::vector<int64_t> sizes = {static_cast<int64_t>(a.size()), 3};
  const auto table = build_chunk_table(slots, sizes);
  ASSERT_EQ(table.size(), 4u);
  EXPECT_EQ(table[0].data[0], a.data());
  EXPECT_EQ(table[1].data[0], a.data() + kChunkElements);
  EXPECT_EQ(table[2].data[0], a.data() + 2 * kChunkElements);
  EXPECT_EQ(table[2].count, 3);
  EXPECT_EQ(table[3].data[0], b.data());
  EXPECT_EQ(table[3].count, 3);
}

TEST(BuildChunkTable, RefusesListsOfDifferentLengths) {
  std::vector<float> a(4);
  const std::vector<std::array<float*, kChunkSlots>> slots = {{a.data(), nullptr, nullptr, nullptr}};
  const std::vector<int64_t> sizes = {4, 4};
  EXPECT_THROW(build_chunk_table(slots, sizes), Error);
}

}  // namespace
}  // namespace apart::cuda
