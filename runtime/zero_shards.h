// ZeRO-1/2's layout over a stage's replicas (Rajbhandari et al., SC20; docs/runtime.md "ZeRO"): each gradient
// bucket's flat buffer, padded to a multiple of the replica count r, is cut into r equal shards, and replica j owns
// shard j of every bucket: it receives that shard's reduce-scattered gradient, keeps that part's optimizer state,
// updates that part of the params and all-gathers it back to the others.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace apart {

// The part of one param a replica owns.
struct ShardPiece {
  size_t param = 0;    // index into the stage's params
  int64_t begin = 0;   // elements [begin, end) of the param
  int64_t end = 0;
  size_t bucket = 0;
  int64_t at = 0;      // where element `begin` sits in the bucket's flat buffer
  bool operator==(const ShardPiece&) const = default;
};

// A bucket's flat length: `elements` rounded up to a multiple of `replicas` (the padding reduces zeros).
int64_t sharded_bucket_length(int64_t elements, int replicas);

// The pieces replica `replica` of `replicas` owns, bucket by bucket and in each bucket's order. bucket_params[b]:
// the params of bucket b in the order they lie in its flat buffer; param_elements[p]: param p's element count.
// Every element of every bucketed param belongs to exactly one replica's pieces.
std::vector<ShardPiece> owned_pieces(const std::vector<std::vector<size_t>>& bucket_params,
                                     const std::vector<int64_t>& param_elements, int replicas, int replica);

}  // namespace apart
