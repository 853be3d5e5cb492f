// Node-aligned device placement of stages and replicas, and the links that follow from it.
#include "partition/placement.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "graph/error.h"

namespace apart {
namespace {

// In stage order, each stage at the cursor unless moving it to a node boundary (or, for a tensor-parallel stage, to a
// multiple of its degree) keeps it from straddling nodes; nullopt when that leaves no room for every stage.
std::optional<Placement> stage_major_in_order(std::span<const int> replicas, std::span<const int> tp,
                                              const Cluster& cluster) {
  const int per_node = cluster.devices_per_node;
  Placement p;
  p.layout = Layout::kStageMajor;
  int remaining = 0;
  for (size_t s = 0; s < replicas.size(); ++s) remaining += replicas[s] * tp[s];
  int cursor = 0;
  for (size_t s = 0; s < replicas.size(); ++s) {
    const int r = replicas[s] * tp[s];
    cursor += (tp[s] - cursor % tp[s]) % tp[s];  // a group never straddles a node
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
  if (cursor > cluster.devices) return std::nullopt;
  return p;
}

// Stages by falling degree (stable), packed: every count is a multiple of its degree and the degrees are powers of
// two, so each stage starts on a multiple of its own.
Placement stage_major_by_degree(std::span<const int> replicas, std::span<const int> tp, const Cluster& cluster) {
  Placement p;
  p.layout = Layout::kStageMajor;
  p.devices.resize(replicas.size());
  std::vector<size_t> order(replicas.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tp[a] > tp[b]; });
  int cursor = 0;
  for (size_t s : order) {
    const int r = replicas[s] * tp[s];
    p.devices[s].resize(static_cast<size_t>(r));
    std::iota(p.devices[s].begin(), p.devices[s].end(), cursor);
    cursor += r;
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

Placement place_stages(std::span<const int> replicas, const Cluster& cluster, Layout layout, std::span<const int> tp) {
  APART_CHECK(!replicas.empty() && cluster.devices_per_node > 0, "placement needs stages and a node size");
  APART_CHECK(tp.empty() || tp.size() == replicas.size(), "placement: one tensor-parallel degree per stage");
  std::vector<int> degrees(replicas.size(), 1);
  if (!tp.empty()) degrees.assign(tp.begin(), tp.end());
  for (int t : degrees)
    APART_CHECK(t >= 1 && cluster.devices_per_node % t == 0, "a tensor-parallel degree must divide the node's devices");
  const bool equal = std::all_of(replicas.begin(), replicas.end(), [&](int r) { return r == replicas.front(); });
  const bool untensored = std::all_of(degrees.begin(), degrees.end(), [](int t) { return t == 1; });
  Placement p;
  if (layout == Layout::kPipelineMajor && equal && untensored && replicas.size() > 1)
    p = pipeline_major(static_cast<int>(replicas.size()), replicas.front(), cluster);
  else if (std::optional<Placement> in_order = stage_major_in_order(replicas, degrees, cluster))
    p = std::move(*in_order);
  else
    p = stage_major_by_degree(replicas, degrees, cluster);
  p.tp = std::move(degrees);
  return p;
}

std::vector<StageLinks> placed_links(const Placement& placement, const Cluster& cluster) {
  const size_t stages = placement.devices.size();
  std::vector<StageLinks> links(stages);
  for (size_t s = 0; s < stages; ++s) {
    const std::vector<int>& d = placement.devices[s];
    const size_t tp = placement.tp.empty() ? 1 : static_cast<size_t>(placement.tp[s]);
    // Each member of a group all-reduces its shard with the same member of every other group: the ring of each
    // group's first device.
    for (size_t i = 0; tp > 1 && i < d.size(); i += tp)
      APART_CHECK(cluster.same_node(d[i], d[i + tp - 1]), "a tensor-parallel group straddles a node");
    links[s].replicas = cluster.link_among(d, tp);
    links[s].memory_bandwidth = cluster.device.memory_bandwidth;
    links[s].tensor = cluster.intra_node;  // a TP group is devices of one node
    // The first and last stage have no neighbour on one side; the link there carries nothing.
    links[s].previous = cluster.link_between_groups(placement.devices[s > 0 ? s - 1 : s], d);
    links[s].next = cluster.link_between_groups(d, placement.devices[s + 1 < stages ? s + 1 : s]);
  }
  return links;
}

}  // namespace apart
