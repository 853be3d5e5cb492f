// Batch-dependent dims of a model's values, by comparing two imports bound at different batch sizes.
#include "codegen/stage_shapes.h"

#include "graph/error.h"

namespace apart {

const std::string& StageShapes::dim_param(ValueId v, size_t axis) const {
  static const std::string kStatic;
  if (!v.valid() || v.value() >= dim_params.size()) return kStatic;
  const auto& dims = dim_params[v.value()];
  return axis < dims.size() ? dims[axis] : kStatic;
}

StageShapes symbolic_batch_shapes(const TaskGraph& graph, int64_t batch, const TaskGraph& probe, int64_t probe_batch,
                                  const std::string& symbol) {
  if (symbol.empty()) throw InvalidArgument("symbolic stage shapes need the batch dim's name");
  if (batch < 1 || probe_batch < 1 || batch == probe_batch)
    throw InvalidArgument("symbolic stage shapes need two different positive batch sizes, got " + std::to_string(batch) +
                          " and " + std::to_string(probe_batch));
  StageShapes out;
  out.batch_symbol = symbol;
  out.dim_params.resize(graph.num_values());
  int fresh = 0;
  for (uint32_t i = 0; i < graph.num_values(); ++i) {
    const Value& value = graph.value(ValueId(i));
    if (!value.shape_known) continue;  // written without a shape anyway
    const auto other = probe.find_value(value.name);
    if (!other || !probe.value(*other).shape_known || probe.value(*other).shape.size() != value.shape.size()) {
      out.notes.push_back("value " + value.name + ": its shape at " + symbol + "=" + std::to_string(probe_batch) +
                          " is unknown or of another rank, so stage files declare it static, as at " + symbol + "=" +
                          std::to_string(batch));
      continue;
    }
    const std::vector<int64_t>& probed = probe.value(*other).shape;
    std::vector<std::string> dims(value.shape.size());
    bool any = false;
    for (size_t axis = 0; axis < dims.size(); ++axis) {
      const int64_t d = value.shape[axis], dp = probed[axis];
      if (d == dp) continue;
      any = true;
      // d = a·batch at both sizes: a multiple of the symbol.
      if (d % batch == 0 && dp == d / batch * probe_batch) {
        const int64_t a = d / batch;
        dims[axis] = a == 1 ? symbol : std::to_string(a) + "*" + symbol;
        continue;
      }
      dims[axis] = "unk__" + std::to_string(fresh++);
      out.notes.push_back("value " + value.name + " dim " + std::to_string(axis) + " is " + std::to_string(d) + " at " +
                          symbol + "=" + std::to_string(batch) + " and " + std::to_string(dp) + " at " + symbol + "=" +
                          std::to_string(probe_batch) + ", not in proportion: stage files declare it as " + dims[axis]);
    }
    if (any) out.dim_params[i] = std::move(dims);
  }
  return out;
}

}  // namespace apart
