// Device placement: which devices run each stage's replicas, aligned to nodes (DESIGN.md "Partitioning"), and the
// links each placed stage then uses. The profiler's Cluster decides what is inside a node, for partition's estimate
// and `apart simulate` alike, so both agree on every link.
#pragma once

#include <span>
#include <vector>

#include "partition/options.h"
#include "partition/stage_cost.h"

namespace apart {

struct Placement {
  Layout layout = Layout::kStageMajor;  // the layout actually used (pipeline-major needs equal replica counts)
  std::vector<std::vector<int>> devices;  // per stage, one device per replica
};

// Stage-major: stages in order on consecutive devices; a stage that fits in a node starts a new node rather than
// straddle two, and a larger one starts on a node boundary, as long as the remaining stages still fit.
// Pipeline-major (all replica counts equal, else stage-major): pipeline replica j holds device d_j + s for stage s,
// with as many whole pipelines per node as fit, so boundary transfers stay inside a node.
Placement place_stages(std::span<const int> replicas, const Cluster& cluster, Layout layout);

// Per stage: the link to the previous and next stage (Cluster::link_between_groups) and the all-reduce ring's link
// (Cluster::link_among: inside a node only if all the stage's devices are).
std::vector<StageLinks> placed_links(const Placement& placement, const Cluster& cluster);

}  // namespace apart
