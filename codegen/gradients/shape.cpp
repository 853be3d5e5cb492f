// Gradient rules of data-movement ops: reshapes, Transpose, Expand, Concat/Split, Slice, Gather, Trilu,
// ScatterND.
#include <numeric>

#include "codegen/gradients/gradient.h"

namespace apart::autodiff {
namespace {

void reshape_like_rule(GradNode& n) {  // Reshape, Flatten, Squeeze, Unsqueeze: back to the input's shape
  n.give(0, n.out(0).shape == n.in(0).shape ? n.gy() : n.e.reshape(n.gy(), n.in(0).shape));
}

void transpose_rule(GradNode& n) {
  const size_t r = n.in(0).shape.size();
  std::vector<int64_t> perm(r);
  std::iota(perm.rbegin(), perm.rend(), 0);
  if (auto p = n.attr_ints("perm")) perm = *p;
  std::vector<int64_t> inverse(r);
  for (size_t i = 0; i < r; ++i) inverse[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
  n.give(0, n.e.transpose(n.gy(), inverse));
}

void expand_rule(GradNode& n) { n.give(0, n.e.unbroadcast(n.gy(), n.out(0).shape, n.in(0).shape)); }

void concat_rule(GradNode& n) {  // each input gets its slice of g along the axis
  auto& e = n.e;
  const int64_t axis = norm_axis(n.attr_int("axis", 0), n.out(0).shape.size());
  int64_t offset = 0;
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    const int64_t len = n.in(i).shape[static_cast<size_t>(axis)];
    if (n.wants(i)) n.give(i, e.op("Slice", {n.gy(), e.ints({offset}), e.ints({offset + len}), e.ints({axis})}));
    offset += len;
  }
}

void split_rule(GradNode& n) {  // the outputs' gradients (zeros where none) concatenated
  auto& e = n.e;
  std::vector<std::string> parts;
  for (size_t i = 0; i < n.num_outputs(); ++i) parts.push_back(n.gy_or_zeros(i));
  std::string g = e.op("Concat", parts);
  set_attr(e.last(), "axis", norm_axis(n.attr_int("axis", 0), n.in(0).shape.size()));
  n.give(0, g);
}

// Slice with unit steps: g padded back with zeros (Concat along each sliced axis; the runtime has no Pad).
void slice_rule(GradNode& n) {
  auto& e = n.e;
  const auto& xs = n.in(0).shape;
  const auto& ys = n.out(0).shape;
  const std::vector<int64_t>& starts = n.known_ints(1);
  std::vector<int64_t> axes(starts.size());
  std::iota(axes.begin(), axes.end(), 0);
  if (n.has_input(3)) axes = n.known_ints(3);
  if (n.has_input(4))
    for (int64_t s : n.known_ints(4))
      if (s != 1) n.unsupported("Slice with step " + std::to_string(s) + " (only unit steps have a gradient rule)");
  std::string g = n.gy();
  std::vector<int64_t> shape = ys;
  const DType dt = n.out(0).dtype;
  for (size_t k = 0; k < axes.size(); ++k) {
    const size_t axis = static_cast<size_t>(norm_axis(axes[k], xs.size()));
    const int64_t dim = xs[axis];
    int64_t start = starts[k] < 0 ? starts[k] + dim : starts[k];
    start = std::clamp<int64_t>(start, 0, dim);
    const int64_t before = std::min(start, dim - ys[axis]), after = dim - before - ys[axis];
    if (before == 0 && after == 0) continue;
    std::vector<std::string> parts;
    auto zeros = [&](int64_t len) {
      std::vector<int64_t> zs = shape;
      zs[axis] = len;
      return e.filled(0, dt, zs);
    };
    if (before > 0) parts.push_back(zeros(before));
    parts.push_back(g);
    if (after > 0) parts.push_back(zeros(after));
    g = e.op("Concat", parts);
    set_attr(e.last(), "axis", static_cast<int64_t>(axis));
    shape[axis] = dim;
  }
  n.give(0, g);
}

// Gather: ScatterND(reduction=add) of g into zeros, the gathered axis moved to the front. ScatterND has its
// reduction attribute from opset 16; below, the same op in the ai.apart domain (docs/autodiff.md), so an
// embedding trains at any opset.
void gather_rule(GradNode& n) {
  if (!n.wants(0)) return;
  auto& e = n.e;
  const auto& ds = n.in(0).shape;
  const auto& is = n.in(1).shape;
  const size_t axis = static_cast<size_t>(norm_axis(n.attr_int("axis", 0), ds.size()));
  const size_t q = is.size();
  std::string g = n.gy();  // shape ds[:axis] + is + ds[axis+1:]
  std::vector<int64_t> data_front{ds[axis]};  // the data with the gathered axis first
  std::vector<int64_t> to_front, from_front;
  if (axis != 0) {
    std::vector<int64_t> perm;
    for (size_t i = 0; i < q; ++i) perm.push_back(static_cast<int64_t>(axis + i));
    for (size_t i = 0; i < axis; ++i) perm.push_back(static_cast<int64_t>(i));
    for (size_t i = axis + q; i < axis + q + ds.size() - axis - 1; ++i) perm.push_back(static_cast<int64_t>(i));
    g = e.transpose(g, perm);
  }
  for (size_t i = 0; i < ds.size(); ++i)
    if (i != axis) data_front.push_back(ds[i]);
  std::vector<int64_t> index_shape = is;
  index_shape.push_back(1);
  std::string indices = n.x(1);
  if (n.in(1).dtype != DType::kInt64) {
    indices = e.op("Cast", {indices});
    set_attr(e.last(), "to", static_cast<int64_t>(DType::kInt64));
  }
  indices = e.reshape(indices, index_shape);
  const std::string zeros = e.filled(0, n.in(0).dtype, data_front);
  std::string scattered = e.fresh("ScatterND");
  e.node("ScatterND", {zeros, indices, g}, {scattered}, e.opset() >= 16 ? "" : kApartDomain);
  set_attr(e.last(), "reduction", std::string("add"));
  if (axis != 0) {  // [ds[axis], ds[:axis], ds[axis+1:]] → ds
    std::vector<int64_t> perm;
    for (size_t i = 1; i <= axis; ++i) perm.push_back(static_cast<int64_t>(i));
    perm.insert(perm.begin() + static_cast<int64_t>(axis), 0);
    for (size_t i = axis + 1; i < ds.size(); ++i) perm.push_back(static_cast<int64_t>(i));
    scattered = e.transpose(scattered, perm);
  }
  n.give(0, scattered);
}

// Trilu: the same triangle of g (same `upper`, same k).
void trilu_rule(GradNode& n) {
  std::vector<std::string> inputs{n.gy()};
  if (n.has_input(1)) inputs.push_back(n.x(1));
  std::string g = n.e.op("Trilu", inputs);
  n.copy_attrs(n.e.last(), {"upper"});
  n.give(0, g);
}

// GatherND(g, indices) (batch_dims 0) without a GatherND kernel: g's first k dims flattened, each index
// tuple turned into a row of that (negatives wrapped), one Gather on axis 0.
std::string gather_nd(GradNode& n, const std::string& g, const std::vector<int64_t>& gs, const std::string& index,
                      const std::vector<int64_t>& is) {
  auto& e = n.e;
  const size_t k = static_cast<size_t>(is.back());
  std::vector<int64_t> dims(gs.begin(), gs.begin() + static_cast<int64_t>(k)), strides(k, 1), flat{1};
  for (size_t i = k; i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  for (int64_t d : dims) flat[0] *= d;
  flat.insert(flat.end(), gs.begin() + static_cast<int64_t>(k), gs.end());
  std::string indices = index;
  if (n.meta(index).dtype != DType::kInt64) {
    indices = e.op("Cast", {indices});
    set_attr(e.last(), "to", static_cast<int64_t>(DType::kInt64));
  }
  const std::string dims_c = e.ints(dims);
  indices = e.op("Where", {e.op("Less", {indices, e.filled(0, DType::kInt64, {})}), e.add(indices, dims_c), indices});
  const std::string rows = e.reduce_sum(e.mul(indices, e.ints(strides)), {static_cast<int64_t>(is.size()) - 1}, false);
  std::string out = e.op("Gather", {e.reshape(g, flat), rows});
  set_attr(e.last(), "axis", int64_t{0});
  return out;
}

// ScatterND (reduction none or add): data gets g with the scattered positions zeroed (none) or all of g (add);
// updates get GatherND(g, indices). With duplicate indices under none (the result is then unspecified),
// every duplicate's update gets the gradient of the position.
void scatter_nd_rule(GradNode& n) {
  auto& e = n.e;
  const std::string reduction = n.attr_string("reduction", "none");
  if (reduction != "none" && reduction != "add") n.unsupported("reduction '" + reduction + "' (none and add have a gradient rule)");
  if (n.wants(0)) {
    if (reduction == "add") {
      n.give(0, n.gy());
    } else {
      n.give(0, e.op("ScatterND", {n.gy(), n.x(1), e.filled(0, n.out(0).dtype, n.in(2).shape)}));
    }
  }
  if (n.wants(2)) n.give(2, gather_nd(n, n.gy(), n.out(0).shape, n.x(1), n.in(1).shape));
}

}  // namespace

void register_shape_rules() {
  auto& r = rules();
  for (const char* op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}) r[op] = reshape_like_rule;
  r["Transpose"] = transpose_rule;
  r["Expand"] = expand_rule;
  r["Concat"] = concat_rule;
  r["Split"] = split_rule;
  r["Slice"] = slice_rule;
  r["Gather"] = gather_rule;
  r["Trilu"] = trilu_rule;
  r["ScatterND"] = scatter_nd_rule;
}

}  // namespace apart::autodiff
