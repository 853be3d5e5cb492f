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
  // Per stage, replicas × tp devices, replica by replica: replica j's tensor-parallel group is devices
  // [j·tp, (j+1)·tp), consecutive devices of one node.
  std::vector<std::vector<int>> devices;
  std::vector<int> tp;  // per stage, the tensor-parallel degree (1: one device per replica)
};

// Stage-major: stages in order on consecutive devices; a stage that fits in a node starts a new node rather than
// straddle two, and a larger one starts on a node boundary, as long as the remaining stages still fit. A stage of
// degree tp > 1 starts on a multiple of tp (tp divides the node's devices, so no group straddles a node); when that
// padding would not leave room for every stage, stages are laid out by falling degree instead (each then starts
// aligned with no padding at all).
// Pipeline-major (all replica counts equal and every degree 1, else stage-major): pipeline replica j holds device
// d_j + s for stage s, with as many whole pipelines per node as fit, so boundary transfers stay inside a node.
// `tp`: per stage (empty: all 1).
Placement place_stages(std::span<const int> replicas, const Cluster& cluster, Layout layout,
                       std::span<const int> tp = {});

// Per stage: the link to the previous and next stage (Cluster::link_between_groups), the all-reduce ring's link
// (Cluster::link_among over one device of each replica's group: inside a node only if all of those are) and the
// tensor-parallel group's (inside its node).
std::vector<StageLinks> placed_links(const Placement& placement, const Cluster& cluster);

}  // namespace apart
