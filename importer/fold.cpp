// Constant folding of integer shape arithmetic, the pattern every PyTorch/TF exporter emits.
#include "importer/fold.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <string_view>

#include "graph/text.h"

namespace apart {

namespace {

constexpr size_t kMaxFoldElements = 4096;

struct Folded {
  std::vector<int64_t> ints;
  std::vector<int64_t> dims;  // output shape
};

const std::vector<int64_t>* ints_of(const TaskGraph& g, const Task& t, size_t i) {
  if (i >= t.inputs.size() || !t.inputs[i].valid()) return nullptr;
  const auto& k = g.value(t.inputs[i]).known_ints;
  return k ? &*k : nullptr;
}

const std::vector<int64_t>* dims_of(const TaskGraph& g, const Task& t, size_t i) {
  if (i >= t.inputs.size() || !t.inputs[i].valid() || !g.value(t.inputs[i]).shape_known) return nullptr;
  return &g.value(t.inputs[i]).shape;
}

int64_t wrap_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

// Elementwise binary op over known ints with scalar/equal-length broadcasting.
std::optional<Folded> binary(const TaskGraph& g, const Task& t, const std::function<std::optional<int64_t>(int64_t, int64_t)>& f) {
  const auto* a = ints_of(g, t, 0);
  const auto* b = ints_of(g, t, 1);
  const auto* da = dims_of(g, t, 0);
  const auto* db = dims_of(g, t, 1);
  if (!a || !b || !da || !db) return std::nullopt;
  if (a->size() != b->size() && a->size() != 1 && b->size() != 1) return std::nullopt;
  if (da->size() > 1 || db->size() > 1) return std::nullopt;
  Folded out;
  const size_t n = std::max(a->size(), b->size());
  for (size_t i = 0; i < n; ++i) {
    auto r = f((*a)[a->size() == 1 ? 0 : i], (*b)[b->size() == 1 ? 0 : i]);
    if (!r) return std::nullopt;
    out.ints.push_back(*r);
  }
  out.dims = da->size() >= db->size() ? *da : *db;
  if (!out.dims.empty()) out.dims = {static_cast<int64_t>(n)};
  return out;
}

std::optional<Folded> fold_task(const TaskGraph& g, const Task& t) {
  const std::string_view op = t.op_type;
  if (!t.domain.empty()) return std::nullopt;
  if (op == "Shape") {
    const auto* d = dims_of(g, t, 0);
    if (!d) return std::nullopt;
    const auto rank = static_cast<int64_t>(d->size());
    int64_t start = std::clamp(wrap_index(t.attr_int("start", 0), rank), int64_t{0}, rank);
    int64_t end = std::clamp(wrap_index(t.attr_int("end", rank), rank), int64_t{0}, rank);
    Folded out;
    for (int64_t i = start; i < end; ++i) out.ints.push_back((*d)[i]);
    out.dims = {static_cast<int64_t>(out.ints.size())};
    return out;
  }
  if (op == "Size") {
    const auto* d = dims_of(g, t, 0);
    if (!d) return std::nullopt;
    auto n = checked_element_count(*d);
    if (!n) return std::nullopt;
    return Folded{{*n}, {}};
  }
  if (op == "Identity" || op == "Squeeze" || op == "Unsqueeze" || op == "Reshape" || op == "Flatten" || op == "Cast") {
    const auto* a = ints_of(g, t, 0);
    if (!a || t.outputs.empty() || !t.outputs[0].valid()) return std::nullopt;
    if (op == "Cast") {
      const int64_t to = t.attr_int("to", 0);
      if (to != 6 && to != 7 && to != 9) return std::nullopt;  // int32, int64, bool
    }
    const Value& out_value = g.value(t.outputs[0]);
    Folded out{*a, {}};
    if (out_value.shape_known) {
      out.dims = out_value.shape;
    } else if (op == "Identity" || op == "Cast") {
      const auto* d = dims_of(g, t, 0);
      if (!d) return std::nullopt;
      out.dims = *d;
    } else {
      return std::nullopt;
    }
    if (op == "Cast" && t.attr_int("to", 0) == 9)
      for (auto& x : out.ints) x = x != 0;
    return out;
  }
  if (op == "Gather") {
    const auto* data = ints_of(g, t, 0);
    const auto* idx = ints_of(g, t, 1);
    const auto* data_dims = dims_of(g, t, 0);
    const auto* idx_dims = dims_of(g, t, 1);
    if (!data || !idx || !data_dims || !idx_dims || data_dims->size() != 1 || idx_dims->size() > 1) return std::nullopt;
    Folded out;
    const auto n = static_cast<int64_t>(data->size());
    for (int64_t i : *idx) {
      const int64_t j = wrap_index(i, n);
      if (j < 0 || j >= n) return std::nullopt;
      out.ints.push_back((*data)[j]);
    }
    out.dims = *idx_dims;
    return out;
  }
  if (op == "Concat") {
    Folded out;
    for (size_t i = 0; i < t.inputs.size(); ++i) {
      const auto* a = ints_of(g, t, i);
      const auto* d = dims_of(g, t, i);
      if (!a || !d || d->size() != 1) return std::nullopt;
      out.ints.insert(out.ints.end(), a->begin(), a->end());
    }
    out.dims = {static_cast<int64_t>(out.ints.size())};
    return out;
  }
  if (op == "Slice") {
    const auto* data = ints_of(g, t, 0);
    const auto* d = dims_of(g, t, 0);
    if (!data || !d || d->size() != 1) return std::nullopt;
    int64_t start = 0, end = 0, step = 1;
    if (t.inputs.size() >= 3) {  // opset ≥ 10: starts, ends, axes, steps are inputs
      const auto* s = ints_of(g, t, 1);
      const auto* e = ints_of(g, t, 2);
      const auto* st = t.inputs.size() >= 5 ? ints_of(g, t, 4) : nullptr;
      if (!s || !e || s->size() != 1 || e->size() != 1) return std::nullopt;
      if (t.inputs.size() >= 5 && t.inputs[4].valid() && (!st || st->size() != 1)) return std::nullopt;
      start = (*s)[0];
      end = (*e)[0];
      step = st ? (*st)[0] : 1;
    } else {
      auto s = t.attr_ints("starts");
      auto e = t.attr_ints("ends");
      if (s.size() != 1 || e.size() != 1) return std::nullopt;
      start = s[0];
      end = e[0];
    }
    if (step == 0) return std::nullopt;
    const auto n = static_cast<int64_t>(data->size());
    Folded out;
    if (step > 0) {
      start = std::clamp(wrap_index(start, n), int64_t{0}, n);
      end = std::clamp(end < -n ? 0 : wrap_index(end, n), int64_t{0}, n);
      for (int64_t i = start; i < end; i += step) out.ints.push_back((*data)[i]);
    } else {
      start = std::clamp(wrap_index(start, n), int64_t{-1}, n - 1);
      end = std::clamp(end < -n ? -1 : wrap_index(end, n), int64_t{-1}, n - 1);
      for (int64_t i = start; i > end; i += step) out.ints.push_back((*data)[i]);
    }
    out.dims = {static_cast<int64_t>(out.ints.size())};
    return out;
  }
  if (op == "Range") {
    const auto* s = ints_of(g, t, 0);
    const auto* l = ints_of(g, t, 1);
    const auto* d = ints_of(g, t, 2);
    if (!s || !l || !d || s->size() != 1 || l->size() != 1 || d->size() != 1 || (*d)[0] == 0) return std::nullopt;
    Folded out;
    for (int64_t v = (*s)[0]; (*d)[0] > 0 ? v < (*l)[0] : v > (*l)[0]; v += (*d)[0]) {
      out.ints.push_back(v);
      if (out.ints.size() > kMaxFoldElements) return std::nullopt;
    }
    out.dims = {static_cast<int64_t>(out.ints.size())};
    return out;
  }
  if (op == "ConstantOfShape") {
    // An integer fill (the importer keeps the value's one element in the attribute's ints; absent: float 0, not
    // shape arithmetic) of a folded shape: torch's expand(-1 …) writes Where(Equal(shape, −1), ConstantOfShape(…)).
    const auto* shape = ints_of(g, t, 0);
    const Attribute* value = t.attr("value");
    if (!shape || !value || value->ints.size() != 1) return std::nullopt;
    Folded out;
    out.dims = *shape;
    const auto n = checked_element_count(out.dims);
    if (!n || *n > static_cast<int64_t>(kMaxFoldElements)) return std::nullopt;
    out.ints.assign(static_cast<size_t>(*n), value->ints[0]);
    return out;
  }
  if (op == "Expand") {
    // A known integer tensor broadcast to a folded shape (numpy rules, the output's shape from inference).
    const auto* data = ints_of(g, t, 0);
    const auto* data_dims = dims_of(g, t, 0);
    if (!data || !data_dims || t.outputs.empty() || !t.outputs[0].valid()) return std::nullopt;
    const Value& out_value = g.value(t.outputs[0]);
    if (!out_value.shape_known || out_value.shape.size() < data_dims->size()) return std::nullopt;
    Folded out;
    out.dims = out_value.shape;
    const auto n = checked_element_count(out.dims);
    if (!n || *n > static_cast<int64_t>(kMaxFoldElements)) return std::nullopt;
    const size_t rank = out.dims.size(), offset = rank - data_dims->size();
    for (int64_t i = 0; i < *n; ++i) {
      int64_t rest = i, source = 0, stride = 1;
      for (size_t a = rank; a-- > offset;) {
        const int64_t d = out.dims[a], sd = (*data_dims)[a - offset];
        if (sd != 1 && sd != d) return std::nullopt;
        source += (sd == 1 ? 0 : rest % d) * stride;
        stride *= sd;
        rest /= d;
      }
      out.ints.push_back((*data)[static_cast<size_t>(source)]);
    }
    return out;
  }
  using R = std::optional<int64_t>;
  if (op == "Add") return binary(g, t, [](int64_t a, int64_t b) -> R { int64_t r; return __builtin_add_overflow(a, b, &r) ? R{} : r; });
  if (op == "Sub") return binary(g, t, [](int64_t a, int64_t b) -> R { int64_t r; return __builtin_sub_overflow(a, b, &r) ? R{} : r; });
  if (op == "Mul") return binary(g, t, [](int64_t a, int64_t b) -> R { int64_t r; return __builtin_mul_overflow(a, b, &r) ? R{} : r; });
  if (op == "Div") return binary(g, t, [](int64_t a, int64_t b) -> R { return b == 0 || (a == INT64_MIN && b == -1) ? R{} : a / b; });
  if (op == "Equal") return binary(g, t, [](int64_t a, int64_t b) -> R { return a == b; });
  if (op == "Less") return binary(g, t, [](int64_t a, int64_t b) -> R { return a < b; });
  if (op == "Greater") return binary(g, t, [](int64_t a, int64_t b) -> R { return a > b; });
  if (op == "Max") return binary(g, t, [](int64_t a, int64_t b) -> R { return std::max(a, b); });
  if (op == "Min") return binary(g, t, [](int64_t a, int64_t b) -> R { return std::min(a, b); });
  if (op == "Where") {
    const auto* c = ints_of(g, t, 0);
    const auto* a = ints_of(g, t, 1);
    const auto* b = ints_of(g, t, 2);
    if (!c || !a || !b || t.outputs.empty() || !t.outputs[0].valid()) return std::nullopt;
    const size_t n = std::max({c->size(), a->size(), b->size()});
    for (const auto* v : {c, a, b})
      if (v->size() != 1 && v->size() != n) return std::nullopt;
    const Value& out_value = g.value(t.outputs[0]);
    if (!out_value.shape_known || out_value.elements != static_cast<int64_t>(n)) return std::nullopt;
    Folded out;
    auto at = [](const std::vector<int64_t>& v, size_t i) { return v[v.size() == 1 ? 0 : i]; };
    for (size_t i = 0; i < n; ++i) out.ints.push_back(at(*c, i) ? at(*a, i) : at(*b, i));
    out.dims = out_value.shape;
    return out;
  }
  return std::nullopt;
}

}  // namespace

size_t fold_shape_arithmetic(TaskGraph& g) {
  size_t folded = 0;
  for (size_t i = 0; i < g.num_tasks(); ++i) {
    const Task& t = g.task(TaskId(static_cast<uint32_t>(i)));
    if (t.outputs.size() != 1 || !t.outputs[0].valid() || g.value(t.outputs[0]).known_ints) continue;
    auto result = fold_task(g, t);
    if (!result || result->ints.size() > kMaxFoldElements) continue;
    Value& out = g.value(t.outputs[0]);
    const auto n = checked_element_count(result->dims);
    if (!n || *n != static_cast<int64_t>(result->ints.size())) continue;
    if (out.shape_known && out.shape != result->dims) continue;  // disagrees with inference: leave it
    out.known_ints = std::move(result->ints);
    if (!out.shape_known) {
      out.shape = result->dims;
      out.shape_known = true;
      out.elements = *n;
      if (out.dtype == DType::kUndefined) out.dtype = DType::kInt64;
      out.bytes = *n * dtype_size(out.dtype);
    }
    ++folded;
  }
  return folded;
}

std::string unknown_shapes_warning(const TaskGraph& graph, const std::vector<std::string>& unknown) {
  if (unknown.empty()) return "";
  std::string list;
  for (size_t i = 0; i < unknown.size() && i < 8; ++i) list += (i ? ", " : "") + quote(unknown[i]);
  if (unknown.size() > 8) list += ", … (" + std::to_string(unknown.size() - 8) + " more)";
  // Training graphs are built for static shapes: say so when the model is read, naming the node, not at autodiff time.
  const auto first = graph.find_value(unknown.front());
  const Task* producer = first && graph.value(*first).producer.valid() ? &graph.task(graph.value(*first).producer) : nullptr;
  return std::to_string(unknown.size()) + " value(s) have shapes that cannot be known statically: " + list +
         "; apart train and apart run will refuse the model (autodiff needs every shape)" +
         (producer ? ", first at node " + quote(producer->name) + " (" + producer->op_type + ")" : std::string()) +
         " — bind the model's symbolic dims with --dim/--batch; if they are bound, that node's shape depends on data "
         "or on an op apart does not fold";
}

}  // namespace apart
