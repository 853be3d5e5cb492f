// Strong ids of partition's levels (graph/ids.h's template): an atomic component, a block of components, a
// pipeline stage. A BlockId cannot be passed where a ComponentId is meant.
#pragma once

#include "graph/ids.h"

namespace apart {

using ComponentId = StrongId<struct ComponentTag>;  // index into AtomicGraph::components
using BlockId = StrongId<struct BlockTag>;          // index into BlockSequence::blocks of one BlockAssignment
using StageId = StrongId<struct StageTag>;          // index into a split's stages (StageSolution, Plan::stages)

}  // namespace apart
