// Communication-time rules (docs/cost-model.md): transfers, ring all-reduce, overlapped buckets.
#include "profiler/collectives.h"

#include <algorithm>

namespace apart {

double transfer_time(const Link& link, double bytes) { return link.latency_s + bytes / link.bandwidth; }

double p2p_time(const Cluster& c, int a, int b, double bytes) {
  return a == b ? 0.0 : transfer_time(c.link_between(a, b), bytes);
}

double ring_reduce_scatter_time(int ranks, double bytes, const Link& link) {
  if (ranks <= 1) return 0;
  const double r = ranks;
  return (r - 1) / r * bytes / link.bandwidth + (r - 1) * link.latency_s;
}

double ring_allgather_time(int ranks, double bytes, const Link& link) {
  return ring_reduce_scatter_time(ranks, bytes, link);  // the same ring steps, data flowing the other way
}

double ring_allreduce_time(int ranks, double bytes, const Link& link) {
  return ring_reduce_scatter_time(ranks, bytes, link) + ring_allgather_time(ranks, bytes, link);
}

double allreduce_time(const Cluster& c, std::span<const int> devices, double bytes) {
  return ring_allreduce_time(static_cast<int>(devices.size()), bytes, c.link_among(devices));
}

double exposed_allreduce_time(double allreduce_s, double gradient_bytes, double backward_s) {
  const double last_bucket = allreduce_s * std::min(1.0, kAllreduceBucketBytes / gradient_bytes);
  return std::max(last_bucket, allreduce_s - backward_s);
}

}  // namespace apart
