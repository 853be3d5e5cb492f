// The task graph: tasks (one per ONNX node) and values (tensors), bipartite, as in Tanaka et al. §III.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "graph/dtype.h"
#include "graph/ids.h"

namespace apart {

enum class ValueKind : uint8_t {
  kInput,       // a graph input fed per step (batch data)
  kParam,       // an initializer: a trained weight
  kConstant,    // known at import: Constant nodes, folded shape arithmetic, outputs of constant tasks
  kActivation,  // produced by a batch task
  kOutput,      // a graph output
};
std::string_view value_kind_name(ValueKind k);

// One node attribute, decoupled from ONNX's protobuf so partition/ never sees ONNX headers.
struct Attribute {
  enum class Type : uint8_t { kInt, kFloat, kString, kInts, kFloats, kStrings, kTensor, kGraph, kOther };
  std::string name;
  Type type = Type::kOther;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> floats;
};

struct Value {
  std::string name;
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;  // static dims, valid when shape_known
  bool shape_known = false;
  ValueKind kind = ValueKind::kActivation;
  TaskId producer;           // invalid for graph inputs and initializers
  int64_t elements = 0;      // product of shape; 0 when unknown
  int64_t bytes = 0;         // elements × dtype size; 0 when unknown
  bool external_data = false;  // a param whose bytes live in an external-data file
  // Integer contents known at import (shape arithmetic, small int initializers); used by folding.
  std::optional<std::vector<int64_t>> known_ints;
};

struct Task {
  std::string name;     // ONNX node name, or <OpType>_<node index>; repeats get #2, #3…
  std::string op_type;
  std::string domain;   // "" is the default ONNX domain
  int32_t onnx_node_index = -1;
  std::vector<ValueId> inputs;   // invalid id where ONNX leaves an optional input empty
  std::vector<ValueId> outputs;  // invalid id where ONNX leaves an optional output empty
  std::vector<Attribute> attributes;
  bool constant = false;  // depends on no batch data (paper: constant task)
  bool opaque = false;    // op or domain unknown to apart/ONNX: cost unknown
  // The module path ("/model/layers.0/self_attn/q_proj") the dynamo exporter keeps in node metadata
  // (pkg.torch.onnx.name_scopes, else namespace) when the node's name carries none ("node_MatMul_12"); "" otherwise.
  std::string scope;

  const Attribute* attr(std::string_view attr_name) const;
  int64_t attr_int(std::string_view attr_name, int64_t fallback) const;
  double attr_float(std::string_view attr_name, double fallback) const;
  std::string attr_string(std::string_view attr_name, std::string fallback) const;
  std::vector<int64_t> attr_ints(std::string_view attr_name, std::vector<int64_t> fallback = {}) const;
};

// The task's name with its module path, as torch.onnx.export (TorchScript) names nodes: the name when it carries a
// path ("/model/layers.0/mlp/MatMul"), else scope + "/" + name ("/model/layers.0/mlp/node_MatMul_12"), else the
// name. Layer names (report, TP regions) are read from it.
std::string module_path(const Task& task);
// The module path of a node from the dynamo exporter's metadata: pkg.torch.onnx.name_scopes (the cumulative dotted
// module names, "['', 'model', 'model.layers.0', 'model.layers.0.mlp', 'linear_3']", the last the node's own) gives
// "/model/layers.0/mlp"; else namespace ("model: LlamaModel/layers.0: LlamaDecoderLayer/…/aten.linear: …", the last
// the op) gives the names before ':'. "" when neither holds a module.
std::string scope_from_metadata(std::string_view name_scopes, std::string_view namespace_value);

// Hashes std::string and std::string_view alike, so lookups by view allocate nothing.
struct NameHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

// Tasks and values in vectors indexed by strong ids. After finalize() tasks are numbered in a
// topological order (TaskId 0 is first) and adjacency is CSR.
class TaskGraph {
 public:
  ValueId add_value(Value v);
  TaskId add_task(Task t);
  void mark_graph_input(ValueId v) { graph_inputs_.push_back(v); }
  void mark_graph_output(ValueId v) { graph_outputs_.push_back(v); }

  // Sorts tasks topologically (stable: ONNX node order where it is already valid), renumbers
  // them, sets producers and builds CSR adjacency. Throws InvalidModel on a cycle, a value with
  // two producers or an input nothing produces.
  void finalize();

  // Marks constant tasks (paper, atomic level): all inputs params/constants, or all outputs folded
  // to known integers. Their outputs become kConstant values. Needs finalize().
  void classify_constants();

  size_t num_tasks() const { return tasks_.size(); }
  size_t num_values() const { return values_.size(); }
  const Task& task(TaskId id) const { return tasks_[id.value()]; }
  Task& task(TaskId id) { return tasks_[id.value()]; }
  const Value& value(ValueId id) const { return values_[id.value()]; }
  Value& value(ValueId id) { return values_[id.value()]; }
  std::span<const Task> tasks() const { return tasks_; }
  std::span<const Value> values() const { return values_; }
  std::optional<ValueId> find_value(std::string_view name) const;
  std::optional<TaskId> find_task(std::string_view name) const;

  std::span<const ValueId> graph_inputs() const { return graph_inputs_; }
  std::span<const ValueId> graph_outputs() const { return graph_outputs_; }

  // CSR adjacency (after finalize()).
  std::span<const TaskId> consumers(ValueId v) const;
  std::span<const TaskId> successors(TaskId t) const;    // distinct tasks reading t's outputs
  std::span<const TaskId> predecessors(TaskId t) const;  // distinct tasks producing t's inputs
  bool finalized() const { return finalized_; }

  size_t num_constant_tasks() const;
  size_t num_batch_tasks() const { return num_tasks() - num_constant_tasks(); }

 private:
  std::vector<Task> tasks_;
  std::vector<Value> values_;
  std::vector<ValueId> graph_inputs_;
  std::vector<ValueId> graph_outputs_;
  std::unordered_map<std::string, ValueId, NameHash, std::equal_to<>> value_by_name_;
  std::unordered_map<std::string, TaskId, NameHash, std::equal_to<>> task_by_name_;
  bool finalized_ = false;

  std::vector<uint32_t> consumer_offsets_;
  std::vector<TaskId> consumer_list_;
  std::vector<uint32_t> succ_offsets_;
  std::vector<TaskId> succ_list_;
  std::vector<uint32_t> pred_offsets_;
  std::vector<TaskId> pred_list_;
};

// Multiplies dims with overflow checks; nullopt when a dim is negative or the product overflows int64.
std::optional<int64_t> checked_element_count(std::span<const int64_t> dims);
std::string shape_string(std::span<const int64_t> dims);  // "8x3x224x224", "scalar" for rank 0

}  // namespace apart
