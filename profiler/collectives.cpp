// Communication-time rules (docs/cost-model.md): transfers, ring all-reduce, overlapped buckets.
#include "profiler/collectives.h"

namespace apart {

double p2p_time(const Cluster& c, int a, int b, double bytes) {
  return a == b ? 0.0 : transfer_time(c.link_between(a, b), bytes);
}

double allreduce_time(const Cluster& c, std::span<const int> devices, double bytes) {
  return ring_allreduce_time(static_cast<int>(devices.size()), bytes, c.link_among(devices));
}

}  // namespace apart
