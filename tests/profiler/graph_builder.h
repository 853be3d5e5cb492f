// Builds small TaskGraphs by hand for the profiler's tests (no ONNX involved).
#pragma once

#include <string>
#include <vector>

#include "graph/dtype.h"
#include "graph/task_graph.h"

namespace apart::testing {

class GraphBuilder {
 public:
  // A value of the given shape; kind decides param/input/activation.
  ValueId value(const std::string& name, std::vector<int64_t> shape, ValueKind kind = ValueKind::kActivation,
                DType dtype = DType::kFloat32) {
    Value v;
    v.name = name;
    v.dtype = dtype;
    v.shape = shape;
    v.shape_known = true;
    v.kind = kind;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    v.elements = n;
    v.bytes = n * dtype_size(dtype);
    ValueId id = g.add_value(std::move(v));
    if (kind == ValueKind::kInput) g.mark_graph_input(id);
    return id;
  }
  ValueId input(const std::string& name, std::vector<int64_t> shape, DType dtype = DType::kFloat32) {
    return value(name, std::move(shape), ValueKind::kInput, dtype);
  }
  ValueId param(const std::string& name, std::vector<int64_t> shape) {
    return value(name, std::move(shape), ValueKind::kParam);
  }
  ValueId unshaped(const std::string& name, ValueKind kind = ValueKind::kActivation) {
    Value v;
    v.name = name;
    v.dtype = DType::kFloat32;
    v.kind = kind;
    ValueId id = g.add_value(std::move(v));
    if (kind == ValueKind::kInput) g.mark_graph_input(id);
    return id;
  }
  TaskId task(const std::string& op, std::vector<ValueId> inputs, std::vector<ValueId> outputs,
              std::vector<Attribute> attrs = {}) {
    Task t;
    t.name = op + "_" + std::to_string(g.num_tasks());
    t.op_type = op;
    t.onnx_node_index = static_cast<int32_t>(g.num_tasks());
    t.inputs = std::move(inputs);
    t.outputs = std::move(outputs);
    t.attributes = std::move(attrs);
    return g.add_task(std::move(t));
  }
  TaskGraph& finish() {
    g.finalize();
    g.classify_constants();
    return g;
  }
  TaskGraph g;
};

inline Attribute ints_attr(const std::string& name, std::vector<int64_t> v) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kInts;
  a.ints = std::move(v);
  return a;
}
inline Attribute int_attr(const std::string& name, int64_t v) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kInt;
  a.i = v;
  return a;
}
inline Attribute string_attr(const std::string& name, std::string v) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kString;
  a.s = std::move(v);
  return a;
}

}  // namespace apart::testing
