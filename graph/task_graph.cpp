// TaskGraph construction, topological numbering, CSR adjacency and constant classification.
#include "graph/task_graph.h"

#include <algorithm>
#include <queue>

#include "graph/error.h"

namespace apart {

std::string module_path(const Task& task) {
  if (task.scope.empty() || task.name.find('/') != std::string::npos) return task.name;
  return task.scope + "/" + task.name;
}

namespace {

// The quoted strings of a Python list's repr: "['', 'a.b', \"it's\"]" -> {"", "a.b", "it's"}.
std::vector<std::string> python_strings(std::string_view list) {
  std::vector<std::string> out;
  for (size_t k = 0; k < list.size(); ++k) {
    const char q = list[k];
    if (q != '\'' && q != '"') continue;
    std::string s;
    for (++k; k < list.size() && list[k] != q; ++k) {
      if (list[k] == '\\' && k + 1 < list.size()) ++k;
      s += list[k];
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

std::string scope_from_metadata(std::string_view name_scopes, std::string_view namespace_value) {
  std::string path;
  const std::vector<std::string> scopes = python_strings(name_scopes);
  // Entries 1 .. n-2 are modules, each the previous one plus ".local_name"; the first is the root, the last the node.
  for (size_t i = 1; i + 1 < scopes.size(); ++i) {
    const std::string& prev = scopes[i - 1];
    const std::string& cur = scopes[i];
    const bool extends = !prev.empty() && cur.size() > prev.size() + 1 && cur.compare(0, prev.size(), prev) == 0 &&
                         cur[prev.size()] == '.';
    const std::string local = extends ? cur.substr(prev.size() + 1) : cur;
    if (!local.empty()) path += "/" + local;
  }
  if (!path.empty() || namespace_value.empty()) return path;
  // namespace: "name: Class/name: Class/…/op: target", the last segment the op.
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= namespace_value.size()) {
    size_t slash = namespace_value.find('/', start);
    if (slash == std::string_view::npos) slash = namespace_value.size();
    const std::string_view seg = namespace_value.substr(start, slash - start);
    names.emplace_back(seg.substr(0, std::min(seg.find(':'), seg.size())));
    start = slash + 1;
  }
  for (size_t i = 0; i + 1 < names.size(); ++i)
    if (!names[i].empty()) path += "/" + names[i];
  return path;
}

std::string_view value_kind_name(ValueKind k) {
  switch (k) {
    case ValueKind::kInput: return "input";
    case ValueKind::kParam: return "param";
    case ValueKind::kConstant: return "constant";
    case ValueKind::kActivation: return "activation";
    case ValueKind::kOutput: return "output";
  }
  return "activation";
}

const Attribute* Task::attr(std::string_view attr_name) const {
  for (const auto& a : attributes)
    if (a.name == attr_name) return &a;
  return nullptr;
}
int64_t Task::attr_int(std::string_view n, int64_t fallback) const {
  const Attribute* a = attr(n);
  return a && a->type == Attribute::Type::kInt ? a->i : fallback;
}
double Task::attr_float(std::string_view n, double fallback) const {
  const Attribute* a = attr(n);
  return a && a->type == Attribute::Type::kFloat ? a->f : fallback;
}
std::string Task::attr_string(std::string_view n, std::string fallback) const {
  const Attribute* a = attr(n);
  return a && a->type == Attribute::Type::kString ? a->s : fallback;
}
std::vector<int64_t> Task::attr_ints(std::string_view n, std::vector<int64_t> fallback) const {
  const Attribute* a = attr(n);
  return a && a->type == Attribute::Type::kInts ? a->ints : fallback;
}

ValueId TaskGraph::add_value(Value v) {
  APART_CHECK(!finalized_, "add_value after finalize");
  ValueId id(static_cast<uint32_t>(values_.size()));
  auto [it, inserted] = value_by_name_.emplace(v.name, id);
  APART_CHECK(inserted, "duplicate value name " + v.name);
  values_.push_back(std::move(v));
  return id;
}

TaskId TaskGraph::add_task(Task t) {
  APART_CHECK(!finalized_, "add_task after finalize");
  TaskId id(static_cast<uint32_t>(tasks_.size()));
  // Unique names: a repeat of a name gets "#2", "#3"… (DESIGN.md).
  std::string base = t.name;
  for (int k = 2; task_by_name_.count(t.name); ++k) t.name = base + "#" + std::to_string(k);
  task_by_name_.emplace(t.name, id);
  tasks_.push_back(std::move(t));
  return id;
}

std::optional<ValueId> TaskGraph::find_value(std::string_view name) const {
  auto it = value_by_name_.find(name);
  if (it == value_by_name_.end()) return std::nullopt;
  return it->second;
}

std::optional<TaskId> TaskGraph::find_task(std::string_view name) const {
  auto it = task_by_name_.find(name);
  if (it == task_by_name_.end()) return std::nullopt;
  return it->second;
}

namespace {

// Builds CSR rows from (row, entry) pairs; entries of a row keep insertion order, duplicates dropped.
void build_csr(size_t rows, const std::vector<std::pair<uint32_t, TaskId>>& pairs, std::vector<uint32_t>& offsets,
               std::vector<TaskId>& list, bool dedupe) {
  offsets.assign(rows + 1, 0);
  for (const auto& [r, _] : pairs) ++offsets[r + 1];
  for (size_t r = 0; r < rows; ++r) offsets[r + 1] += offsets[r];
  list.assign(pairs.size(), TaskId::invalid());
  std::vector<uint32_t> fill(offsets.begin(), offsets.end() - 1);
  for (const auto& [r, t] : pairs) list[fill[r]++] = t;
  if (!dedupe) return;
  std::vector<uint32_t> new_offsets(rows + 1, 0);
  std::vector<TaskId> new_list;
  new_list.reserve(list.size());
  for (size_t r = 0; r < rows; ++r) {
    auto begin = list.begin() + offsets[r], end = list.begin() + offsets[r + 1];
    std::sort(begin, end);
    auto last = std::unique(begin, end);
    new_list.insert(new_list.end(), begin, last);
    new_offsets[r + 1] = static_cast<uint32_t>(new_list.size());
  }
  offsets = std::move(new_offsets);
  list = std::move(new_list);
}

}  // namespace

void TaskGraph::finalize() {
  APART_CHECK(!finalized_, "finalize twice");
  const size_t n = tasks_.size();

  // Producers, in the original numbering; two producers of one value is malformed.
  std::vector<uint32_t> producer(values_.size(), TaskId::kInvalidValue);
  for (uint32_t t = 0; t < n; ++t) {
    for (ValueId out : tasks_[t].outputs) {
      if (!out.valid()) continue;
      if (producer[out.value()] != TaskId::kInvalidValue)
        throw InvalidModel("value '" + values_[out.value()].name + "' is written by two nodes: '" +
                           tasks_[producer[out.value()]].name + "' and '" + tasks_[t].name +
                           "'; every ONNX value must have exactly one producer (SSA)");
      const ValueKind k = values_[out.value()].kind;
      if (k == ValueKind::kInput || k == ValueKind::kParam)
        throw InvalidModel("node '" + tasks_[t].name + "' writes '" + values_[out.value()].name +
                           "', which is already a graph " + std::string(value_kind_name(k)) +
                           (k == ValueKind::kParam ? " (an initializer)" : "") + "; rename one of them");
      producer[out.value()] = t;
    }
  }
  for (uint32_t t = 0; t < n; ++t) {
    for (ValueId in : tasks_[t].inputs) {
      if (!in.valid()) continue;
      const Value& v = values_[in.value()];
      const bool sourced = v.kind == ValueKind::kInput || v.kind == ValueKind::kParam ||
                           (v.kind == ValueKind::kConstant && producer[in.value()] == TaskId::kInvalidValue);
      if (producer[in.value()] == TaskId::kInvalidValue && !sourced)
        throw InvalidModel("node '" + tasks_[t].name + "' (" + tasks_[t].op_type + ") reads '" + v.name +
                           "', which no node produces and which is neither a graph input nor an initializer");
    }
  }

  // Kahn's algorithm, always taking the lowest original index that is ready: the result is
  // deterministic and equals the ONNX node order whenever that order is already topological.
  std::vector<std::pair<uint32_t, TaskId>> edges;  // (from task, to task) in original numbering
  for (uint32_t t = 0; t < n; ++t)
    for (ValueId in : tasks_[t].inputs)
      if (in.valid() && producer[in.value()] != TaskId::kInvalidValue) edges.emplace_back(producer[in.value()], TaskId(t));
  std::vector<uint32_t> off;
  std::vector<TaskId> succ;
  build_csr(n, edges, off, succ, /*dedupe=*/true);
  std::vector<uint32_t> indegree(n, 0);
  for (TaskId s : succ) ++indegree[s.value()];
  std::priority_queue<uint32_t, std::vector<uint32_t>, std::greater<>> ready;
  for (uint32_t t = 0; t < n; ++t)
    if (indegree[t] == 0) ready.push(t);
  std::vector<uint32_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    uint32_t t = ready.top();
    ready.pop();
    order.push_back(t);
    for (uint32_t e = off[t]; e < off[t + 1]; ++e)
      if (--indegree[succ[e].value()] == 0) ready.push(succ[e].value());
  }
  if (order.size() != n) {
    std::string in_cycle;
    for (uint32_t t = 0; t < n && in_cycle.empty(); ++t)
      if (indegree[t] > 0) in_cycle = tasks_[t].name + " (" + tasks_[t].op_type + ")";
    throw InvalidModel("the graph has a cycle through node '" + in_cycle + "' (" + std::to_string(n - order.size()) +
                       " nodes cannot be ordered); ONNX graphs must be acyclic");
  }

  // Renumber tasks so TaskId order is the topological order.
  std::vector<Task> sorted;
  sorted.reserve(n);
  for (uint32_t old : order) sorted.push_back(std::move(tasks_[old]));
  tasks_ = std::move(sorted);
  task_by_name_.clear();
  for (uint32_t t = 0; t < n; ++t) task_by_name_.emplace(tasks_[t].name, TaskId(t));

  std::vector<std::pair<uint32_t, TaskId>> consumer_pairs, succ_pairs, pred_pairs;
  for (auto& v : values_) v.producer = TaskId::invalid();
  for (uint32_t t = 0; t < n; ++t)
    for (ValueId out : tasks_[t].outputs)
      if (out.valid()) values_[out.value()].producer = TaskId(t);
  for (uint32_t t = 0; t < n; ++t) {
    for (ValueId in : tasks_[t].inputs) {
      if (!in.valid()) continue;
      consumer_pairs.emplace_back(in.value(), TaskId(t));
      TaskId p = values_[in.value()].producer;
      if (p.valid()) {
        succ_pairs.emplace_back(p.value(), TaskId(t));
        pred_pairs.emplace_back(t, p);
      }
    }
  }
  build_csr(values_.size(), consumer_pairs, consumer_offsets_, consumer_list_, /*dedupe=*/true);
  build_csr(n, succ_pairs, succ_offsets_, succ_list_, /*dedupe=*/true);
  build_csr(n, pred_pairs, pred_offsets_, pred_list_, /*dedupe=*/true);
  finalized_ = true;
}

std::span<const TaskId> TaskGraph::consumers(ValueId v) const {
  APART_CHECK(finalized_);
  return {consumer_list_.data() + consumer_offsets_[v.value()], consumer_list_.data() + consumer_offsets_[v.value() + 1]};
}
std::span<const TaskId> TaskGraph::successors(TaskId t) const {
  APART_CHECK(finalized_);
  return {succ_list_.data() + succ_offsets_[t.value()], succ_list_.data() + succ_offsets_[t.value() + 1]};
}
std::span<const TaskId> TaskGraph::predecessors(TaskId t) const {
  APART_CHECK(finalized_);
  return {pred_list_.data() + pred_offsets_[t.value()], pred_list_.data() + pred_offsets_[t.value() + 1]};
}

void TaskGraph::classify_constants() {
  APART_CHECK(finalized_, "classify_constants needs finalize()");
  for (Task& t : tasks_) {  // topological order: inputs are classified before their consumers
    bool all_inputs_constant = true;
    for (ValueId in : t.inputs) {
      if (!in.valid()) continue;
      const ValueKind k = values_[in.value()].kind;
      if (k != ValueKind::kParam && k != ValueKind::kConstant) all_inputs_constant = false;
    }
    bool all_outputs_folded = !t.outputs.empty();
    for (ValueId out : t.outputs)
      if (out.valid() && !values_[out.value()].known_ints) all_outputs_folded = false;
    // Random generators have no inputs but differ each step; they are not constant.
    const bool random = t.op_type.rfind("Random", 0) == 0;
    t.constant = !random && (all_inputs_constant || all_outputs_folded);
    if (!t.constant) continue;
    for (ValueId out : t.outputs)
      if (out.valid() && values_[out.value()].kind == ValueKind::kActivation) values_[out.value()].kind = ValueKind::kConstant;
  }
}

size_t TaskGraph::num_constant_tasks() const {
  return static_cast<size_t>(std::count_if(tasks_.begin(), tasks_.end(), [](const Task& t) { return t.constant; }));
}

std::optional<int64_t> checked_element_count(std::span<const int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

std::string shape_string(std::span<const int64_t> dims) {
  if (dims.empty()) return "scalar";
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += 'x';
    s += std::to_string(dims[i]);
  }
  return s;
}

}  // namespace apart
