// ZeRO's shard layout against an element-by-element oracle on random bucket layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "runtime/zero_shards.h"

namespace apart {
namespace {

struct Layout {
  std::vector<std::vector<size_t>> buckets;
  std::vector<int64_t> elements;
};

Layout random_layout(std::mt19937& rng) {
  Layout l;
  const int params = std::uniform_int_distribution<int>(1, 9)(rng);
  for (int p = 0; p < params; ++p) l.elements.push_back(std::uniform_int_distribution<int64_t>(1, 23)(rng));
  std::vector<size_t> order(static_cast<size_t>(params));
  for (size_t p = 0; p < order.size(); ++p) order[p] = p;
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t p : order) {
    if (l.buckets.empty() || std::uniform_int_distribution<int>(0, 2)(rng) == 0) l.buckets.emplace_back();
    l.buckets.back().push_back(p);
  }
  return l;
}

TEST(OwnedPieces, GiveEveryElementToTheReplicaWhoseShardOfItsBucketHoldsIt) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const Layout l = random_layout(rng);
    const int replicas = std::uniform_int_distribution<int>(1, 6)(rng);
    // The oracle: each element's owner from its position in its bucket's padded flat buffer.
    std::vector<std::vector<int>> owner(l.elements.size());
    for (const auto& bucket : l.buckets) {
      int64_t total = 0;
      for (size_t p : bucket) total += l.elements[p];
      const int64_t shard = (total + replicas - 1) / replicas;
      int64_t at = 0;
      for (size_t p : bucket)
        for (int64_t e = 0; e < l.elements[p]; ++e) owner[p].push_back(static_cast<int>(at++ / shard));
      EXPECT_EQ(sharded_bucket_length(total, replicas), shard * replicas);
    }
    std::vector<std::vector<int>> seen(l.elements.size());
    for (size_t p = 0; p < l.elements.size(); ++p) seen[p].assign(static_cast<size_t>(l.elements[p]), -1);
    for (int j = 0; j < replicas; ++j) {
      const std::vector<ShardPiece> pieces = owned_pieces(l.buckets, l.elements, replicas, j);
      EXPECT_EQ(pieces, owned_pieces(l.buckets, l.elements, replicas, j)) << "not deterministic";
      for (const ShardPiece& piece : pieces) {
        ASSERT_LT(piece.begin, piece.end);
        int64_t at = 0;  // where the param starts in its bucket
        for (size_t p : l.buckets[piece.bucket]) {
          if (p == piece.param) break;
          at += l.elements[p];
        }
        EXPECT_EQ(piece.at, at + piece.begin);
        for (int64_t e = piece.begin; e < piece.end; ++e) {
          EXPECT_EQ(seen[piece.param][static_cast<size_t>(e)], -1) << "element owned twice";
          seen[piece.param][static_cast<size_t>(e)] = j;
        }
      }
    }
    EXPECT_EQ(seen, owner) << "trial " << trial << ", " << replicas << " replicas";
  }
}

}  // namespace
}  // namespace apart
