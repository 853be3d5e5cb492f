// Folds exporters' shape arithmetic (Shape → Gather → Unsqueeze → Concat → Reshape …) to constants.
#pragma once

#include <cstddef>

#include "graph/task_graph.h"

namespace apart {

// Evaluates, in topological order, small integer ops whose inputs are known (Value::known_ints,
// or a static shape for Shape/Size) and records their outputs' values. Returns how many values
// became known. Needs a finalized graph with shapes applied.
size_t fold_shape_arithmetic(TaskGraph& graph);

}  // namespace apart
