// ZeRO's shard layout (see zero_shards.h).
#include "runtime/zero_shards.h"

#include <algorithm>

#include "graph/error.h"

namespace apart {

int64_t sharded_bucket_length(int64_t elements, int replicas) {
  APART_CHECK(replicas >= 1 && elements >= 0, "sharded_bucket_length: bad arguments");
  return (elements + replicas - 1) / replicas * replicas;
}

std::vector<ShardPiece> owned_pieces(const std::vector<std::vector<size_t>>& bucket_params,
                                     const std::vector<int64_t>& param_elements, int replicas, int replica) {
  APART_CHECK(replica >= 0 && replica < replicas, "owned_pieces: replica out of range");
  std::vector<ShardPiece> pieces;
  for (size_t b = 0; b < bucket_params.size(); ++b) {
    int64_t total = 0;
    for (size_t p : bucket_params[b]) total += param_elements.at(p);
    const int64_t shard = sharded_bucket_length(total, replicas) / replicas;
    const int64_t lo = shard * replica, hi = lo + shard;
    int64_t at = 0;
    for (size_t p : bucket_params[b]) {
      const int64_t n = param_elements[p];
      const int64_t first = std::max(lo, at), last = std::min(hi, at + n);
      if (first < last) pieces.push_back({p, first - at, last - at, b, first});
      at += n;
    }
  }
  return pieces;
}

}  // namespace apart
