// Node-aligned device placement of stages and replicas, and the links that follow from it.
#include "partition/placement.h"

#include <algorithm>
#include <numeric>

#include "graph/error.h"

namespace apart {
namespace {

Placement stage_major(std::span<const int> replicas, const Cluster& cluster) {
  const int per_node = cluster.devices_per_node;
  Placement p;
  p.layout = Layout::kStageMajor;
  int remaining = std::accumulate(replicas.begin(), replicas.end(), 0);
  int cursor = 0;
  for (int r : replicas) {
    const int offset = cursor % per_node;
    // Skip to the next node when the stage would straddle one it could fit in, or (larger stages) to start whole
    // nodes, provided the devices left still hold every remaining stage.
    const bool straddles = r <= per_node ? offset + r > per_node : offset != 0;
    if (offset != 0 && straddles && cursor - offset + per_node + remaining <= cluster.devices)
      cursor += per_node - offset;
    std::vector<int> devices(static_cast<size_t>(r));
    std::iota(devices.begin(), devices.end(), cursor);
    cursor += r;
    remaining -= r;
    p.devices.push_back(std::move(devices));
  }
  APART_CHECK(cursor <= cluster.devices, "placement exceeds the cluster's devices");
  return p;
}

Placement pipeline_major(int stages, int replicas, const Cluster& cluster) {
  const int per_node = cluster.devices_per_node;
  Placement p;
  p.layout = Layout::kPipelineMajor;
  p.devices.assign(static_cast<size_t>(stages), {});
  // Whole pipelines per node when a pipeline fits in one and there is room for all of them that way.
  const int per_node_pipelines = stages <= per_node ? per_node / stages : 0;
  const int full_nodes = cluster.devices / per_node;
  const int tail = cluster.devices % per_node;
  const int aligned_capacity = per_node_pipelines * full_nodes + (stages <= tail ? tail / stages : 0);
  const bool aligned = per_node_pipelines > 0 && aligned_capacity >= replicas;
  for (int j = 0; j < replicas; ++j) {
    const int base = aligned ? (j / per_node_pipelines) * per_node + (j % per_node_pipelines) * stages : j * stages;
    for (int s = 0; s < stages; ++s) p.devices[static_cast<size_t>(s)].push_back(base + s);
  }
  return p;
}

}  // namespace

Placement place_stages(std::span<const int> replicas, const Cluster& cluster, Layout layout) {
  APART_CHECK(!replicas.empty() && cluster.devices_per_node > 0, "placement needs stages and a node size");
  const bool equal = std::all_of(replicas.begin(), replicas.end(), [&](int r) { return r == replicas.front(); });
  if (layout == Layout::kPipelineMajor && equal && replicas.size() > 1)
    return pipeline_major(static_cast<int>(replicas.size()), replicas.front(), cluster);
  return stage_major(replicas, cluster);
}

std::vector<StageLinks> placed_links(const Placement& placement, const Cluster& cluster) {
  const size_t stages = placement.devices.size();
  std::vector<StageLinks> links(stages);
  for (size_t s = 0; s < stages; ++s) {
    const std::vector<int>& d = placement.devices[s];
    links[s].replicas = cluster.link_among(d);
    links[s].memory_bandwidth = cluster.device.memory_bandwidth;
    links[s].tensor = cluster.intra_node;  // a TP group is devices of one node
    // The first and last stage have no neighbour on one side; the link there carries nothing.
    links[s].previous = cluster.link_between_groups(placement.devices[s > 0 ? s - 1 : s], d);
    links[s].next = cluster.link_between_groups(d, placement.devices[s + 1 < stages ? s + 1 : s]);
  }
  return links;
}

}  // namespace apart
