// Device placement: which devices run each stage's replicas, aligned to nodes (DESIGN.md "Partitioning"), and the
// links each placed stage then uses. The simulator's SimCluster decides what is inside a node, so partition's
// estimate and `apart simulate` agree on every link.
#pragma once

#include <span>
#include <vector>

#include "partition/options.h"
#include "partition/stage_cost.h"
#include "simulator/sim_plan.h"

namespace apart {

struct Placement {
  Layout layout = Layout::kStageMajor;  // the layout actually used (pipeline-major needs equal replica counts)
  std::vector<std::vector<int>> devices;  // per stage, one device per replica
};

// Stage-major: stages in order on consecutive devices; a stage that fits in a node starts a new node rather than
// straddle two, and a larger one starts on a node boundary, as long as the remaining stages still fit.
// Pipeline-major (all replica counts equal, else stage-major): pipeline replica j holds device d_j + s for stage s,
// with as many whole pipelines per node as fit, so boundary transfers stay inside a node.
Placement place_stages(std::span<const int> replicas, const ClusterSpec& cluster, Layout layout);

// The cluster as the simulator sees it (devices per node, intra/inter-node links).
sim::SimCluster sim_cluster(const ClusterSpec& cluster);

// Per stage: the link to the previous and next stage (the simulator's rule for two device groups) and the
// all-reduce ring's link (inside a node only if all the stage's devices are).
std::vector<StageLinks> placed_links(const Placement& placement, const ClusterSpec& cluster);

}  // namespace apart
