// cuda/index_map.h's host side (no GPU needed): merged maps address exactly the elements the unmerged shape does.
#include <gtest/gtest.h>

#include <random>

#include "runtime/cuda/index_map.h"
#include "runtime/kernel.h"

namespace apart::cuda {
namespace {

// The offset of operand k for output element `linear`, straight from the shape and strides (the oracle).
int64_t brute_offset(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, int64_t linear) {
  int64_t offset = 0;
  for (size_t d = shape.size(); d-- > 0;) {
    offset += (linear % shape[d]) * strides[d];
    linear /= shape[d];
  }
  return offset;
}

void expect_same_offsets(const std::vector<int64_t>& shape, const std::array<std::vector<int64_t>, 2>& strides) {
  IndexMap<2> map;
  ASSERT_TRUE(make_index_map<2>(shape, strides, map)) << shape_string(shape);
  for (int64_t i = 0; i < product(shape); ++i) {
    int64_t off[2];
    map.offsets(i, off);
    ASSERT_EQ(off[0], brute_offset(shape, strides[0], i)) << shape_string(shape) << " element " << i;
    ASSERT_EQ(off[1], brute_offset(shape, strides[1], i)) << shape_string(shape) << " element " << i;
  }
}

TEST(AnIndexMap, AddressesTheElementsOfEveryBroadcastExactlyAsTheUnmergedShapeDoes) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t rank = rng() % 6;
    std::vector<int64_t> out, a, b;
    for (size_t d = 0; d < rank; ++d) {
      const int64_t dim = 1 + static_cast<int64_t>(rng() % 4);
      out.push_back(dim);
      a.push_back(rng() % 3 == 0 ? 1 : dim);
      b.push_back(rng() % 3 == 0 ? 1 : dim);
    }
    expect_same_offsets(out, {broadcast_strides(a, out), broadcast_strides(b, out)});
  }
}

TEST(AnIndexMap, AddressesPermutedAndSteppedStridesExactly) {
  // A transpose [3, 4, 5] -> perm [2, 0, 1] and a slice with steps 2 and -1 of a [6, 7] input.
  expect_same_offsets({5, 3, 4}, {std::vector<int64_t>{1, 20, 5}, std::vector<int64_t>{12, 4, 1}});
  expect_same_offsets({3, 7}, {std::vector<int64_t>{14, -1}, std::vector<int64_t>{7, 1}});
}

TEST(AnIndexMap, MergesABiasAddToTwoDimsAndSameShapesToOne) {
  IndexMap<2> map;
  ASSERT_TRUE(make_index_map<2>({4, 8, 16}, {contiguous_strides({4, 8, 16}), broadcast_strides({16}, {4, 8, 16})}, map));
  EXPECT_EQ(map.rank, 2);
  ASSERT_TRUE(make_index_map<2>({4, 8, 16}, {contiguous_strides({4, 8, 16}), contiguous_strides({4, 8, 16})}, map));
  EXPECT_EQ(map.rank, 1);
  ASSERT_TRUE(make_index_map<2>({1, 1}, {std::vector<int64_t>{0, 0}, std::vector<int64_t>{1, 1}}, map));
  EXPECT_EQ(map.rank, 0);
}

TEST(AnIndexMap, RefusesMoreDimsThanItHoldsWhenTheyDoNotMerge) {
  // Ten dims of 2 where the second operand broadcasts every other one: nothing merges.
  std::vector<int64_t> out(10, 2), other;
  for (int d = 0; d < 10; ++d) other.push_back(d % 2 == 0 ? 2 : 1);
  IndexMap<2> map;
  EXPECT_FALSE(make_index_map<2>(out, {contiguous_strides(out), broadcast_strides(other, out)}, map));
}

}  // namespace
}  // namespace apart::cuda
