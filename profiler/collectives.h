// Communication-time rules: one message over a link, ring all-reduce among ranks, and the part of a bucketed
// all-reduce that backward does not hide. Partition's stage costs and the simulator's replay both call these.
#pragma once

#include <algorithm>
#include <span>

#include "profiler/device.h"

namespace apart {

// One message of `bytes` over `link`: latency + bytes / bandwidth.
inline double transfer_time(const Link& link, double bytes) { return link.latency_s + bytes / link.bandwidth; }
// Between devices a and b of a cluster: transfer_time over the link they share; 0 when a == b.
double p2p_time(const Cluster& c, int a, int b, double bytes);

// Ring reduce-scatter of `bytes` among `ranks` over one link (each rank ends with the reduced 1/r of them): r − 1
// steps of bytes / r, (r−1)/r · bytes / bandwidth + (r−1) · latency; 0 for one rank.
inline double ring_reduce_scatter_time(int ranks, double bytes, const Link& link) {
  if (ranks <= 1) return 0;
  const double r = ranks;
  return (r - 1) / r * bytes / link.bandwidth + (r - 1) * link.latency_s;
}
// Ring all-gather of `bytes` in all (each rank contributes bytes / r): the same r − 1 steps, the same time.
inline double ring_allgather_time(int ranks, double bytes, const Link& link) {
  return ring_reduce_scatter_time(ranks, bytes, link);  // the same ring steps, data flowing the other way
}
// Ring all-reduce of `bytes` among `ranks` over one link (reduce-scatter then all-gather, each r − 1 steps of
// bytes / r): 2(r−1)/r · bytes / bandwidth + 2(r−1) · latency; 0 for one rank.
inline double ring_allreduce_time(int ranks, double bytes, const Link& link) {
  return ring_reduce_scatter_time(ranks, bytes, link) + ring_allgather_time(ranks, bytes, link);
}
// Ring all-reduce among the given devices of a cluster, over Cluster::link_among(devices).
double allreduce_time(const Cluster& c, std::span<const int> devices, double bytes);

// Gradient bucket of the overlapped all-reduce (PyTorch DDP's bucket_cap_mb default, 25 MB).
inline constexpr double kAllreduceBucketBytes = 25e6;
// Gradients all-reduce in buckets while the last micro-batch's backward still runs (PyTorch DDP, Megatron's
// --overlap-grad-reduce): the part of an all-reduce of `allreduce_s` over `gradient_bytes` that does not fit behind
// `backward_s` of that backward, and at least the last bucket's share (it can only start when backward ends).
// The same rule prices any bucketed collective run beside compute: ZeRO's gradient reduce-scatter behind backward,
// ZeRO-3's weight all-gathers prefetched behind forward and backward (partition/stage_cost.cpp).
inline double exposed_allreduce_time(double allreduce_s, double gradient_bytes, double backward_s) {
  const double last_bucket = allreduce_s * std::min(1.0, kAllreduceBucketBytes / gradient_bytes);
  return std::max(last_bucket, allreduce_s - backward_s);
}

}  // namespace apart
