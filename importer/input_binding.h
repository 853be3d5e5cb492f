// Binding the model's dynamic input dims (the importer's second step): --dim, --shape and --batch (by the batch rule,
// importer.h kBatchDimNames) written into the graph inputs' dims in place, so shape inference sees static shapes.
// Internal to the importer (importer/importer.h is its interface; parse_shape_flag/parse_dim_flag are defined here).
#pragma once

#include <onnx/onnx_pb.h>

#include "importer/importer.h"

namespace apart {

// Adds the graph inputs (not initializers, which are already in result.graph) to result.graph with their bound
// shapes; records every binding, the batch dim and its size in `result`; binds the same dim_params in the graph's
// outputs and value_info. InvalidArgument naming the flag or dim on a conflict or an unbound dim.
void bind_graph_inputs(onnx::GraphProto& g, const ImportOptions& options, ImportedModel& result);

}  // namespace apart
