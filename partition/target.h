// --target ENGINE: the search restricted to what a training engine expresses (plan/engine.h), so that apart export
// writes the plan exactly: one TP degree and one replica count on every stage, cuts between whole layers, the
// engine's schedules, ZeRO stages and recomputation (docs/partitioning.md "Planning for an engine").
#pragma once

#include <vector>

#include "graph/task_graph.h"
#include "partition/atomic.h"
#include "partition/phases.h"
#include "plan/engine.h"

namespace apart {

// Each component's place against the model's layers (graph/module_layers.h, read from its batch task's module
// path): the layer's index, kBeforeLayers (-1) before the stack, `layers` after it.
struct ComponentLayers {
  std::vector<int> layer_of;  // per component
  int layers = 0;
};
// Unsupported naming --target when the model's node names carry no layers.
ComponentLayers component_layers(const TaskGraph& graph, const AtomicGraph& atomic);

// One block per layer: the components before the stack join the first layer's block, those after it the last's.
BlockAssignment layer_blocks(const ComponentLayers& layers);

// Whether the engine runs `candidate` as it is: one TP degree and replica count on every stage, a micro-batch that
// splits evenly among the replicas, a schedule, ZeRO stages and one recomputation the engine offers, and (with
// `layers`) every layer whole in one stage, the modules before the stack in the first, those after it in the last.
bool target_admits(const Candidate& candidate, Engine engine, int64_t global_batch, const ComponentLayers* layers);

// The candidates --target searches: the stage DP over layer_blocks at every stage count, once for every TP degree
// and replica count (dividing the batch) the engine and the options allow, and every recomputation and ZeRO stage
// the engine offers where the options leave them to the search (auto), each pinned on every stage.
CandidateSet target_candidates(const TaskGraph& graph, const AtomicGraph& atomic, const PartitionOptions& options,
                               const SearchClock& clock);

}  // namespace apart
