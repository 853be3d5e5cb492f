// Folds exporters' shape arithmetic (Shape → Gather → Unsqueeze → Concat → Reshape …) to constants.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "graph/task_graph.h"

namespace apart {

// Evaluates, in topological order, small integer ops whose inputs are known (Value::known_ints,
// or a static shape for Shape/Size) and records their outputs' values. Returns how many values
// became known. Needs a finalized graph with shapes applied.
size_t fold_shape_arithmetic(TaskGraph& graph);

// The warning for produced values whose shape stays unknown after inference and folding ("" when none): how many,
// the first few by name, and that apart train and apart run will refuse the model (autodiff needs every shape),
// naming the first one's node. The importer adds it to ImportedModel::warnings; partition and check say it again.
std::string unknown_shapes_warning(const TaskGraph& graph, const std::vector<std::string>& unknown);

}  // namespace apart
