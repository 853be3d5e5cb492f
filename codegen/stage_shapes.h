// Which dims of stage_K.onnx's boundary values scale with the batch, found by importing the model at two batch sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/task_graph.h"

namespace apart {

// How stage_K.onnx declares the shapes of its boundary values. The default declares every dim as the
// dim_value the plan's TaskGraph has (the model has no symbolic batch, or --shape/--dim pinned it).
struct StageShapes {
  std::string batch_symbol;  // the model's own batch dim_param ("batch", "N", …); empty = all static
  // By ValueId of the plan's graph: per dim the dim_param to write, or "" to keep the dim_value.
  // Missing or shorter entries keep the dim_value.
  std::vector<std::vector<std::string>> dim_params;
  // Dims that change with the batch but not in proportion to it, and values whose shape cannot be compared.
  std::vector<std::string> notes;

  bool symbolic() const { return !batch_symbol.empty(); }
  // The dim_param of dim `axis` of value `v`, or "" for a static dim.
  const std::string& dim_param(ValueId v, size_t axis) const;
};

// Compares two imports of one model: `graph` with `symbol` bound to `batch` (the graph the plan was made
// on) and `probe` with it bound to `probe_batch`. A dim that is a·batch in one and a·probe_batch in the
// other becomes "<symbol>" (a = 1) or "<a>*<symbol>" (onnxruntime's symbolic-shape style); one that
// changes otherwise becomes a fresh "unk__<n>" and gets a note; one that does not change stays static.
// Values are matched by name. Throws InvalidArgument if batch == probe_batch or either is below 1.
StageShapes symbolic_batch_shapes(const TaskGraph& graph, int64_t batch, const TaskGraph& probe, int64_t probe_batch,
                                  const std::string& symbol);

}  // namespace apart
