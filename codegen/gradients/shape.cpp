// Gradient rules of data-movement ops: reshapes, Transpose, Expand, Concat/Split, Slice, Pad, Resize, Gather, Trilu,
// ScatterND.
#include <algorithm>
#include <cstdlib>
#include <limits>
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

// Slice (any steps): g put back where the slice read, zeros elsewhere, one sliced axis at a time. A negative step
// reverses g; a step k > 1 interleaves k − 1 zeros after each element (Concat on a new axis, Reshape, the trailing
// zeros cut); then zero blocks before and after (Concat).
void slice_rule(GradNode& n) {
  auto& e = n.e;
  const auto& xs = n.in(0).shape;
  const auto& ys = n.out(0).shape;
  const DType dt = n.out(0).dtype;
  const std::vector<int64_t>& starts = n.known_ints(1);
  std::vector<int64_t> axes(starts.size());
  std::iota(axes.begin(), axes.end(), 0);
  if (n.has_input(3)) axes = n.known_ints(3);
  std::vector<int64_t> steps(starts.size(), 1);
  if (n.has_input(4)) steps = n.known_ints(4);
  if (axes.size() != starts.size() || steps.size() != starts.size()) n.unsupported("starts, axes and steps of different lengths");
  if (std::find(ys.begin(), ys.end(), 0) != ys.end()) return n.give(0, e.filled(0, dt, xs));  // nothing was read
  std::string g = n.gy();
  std::vector<int64_t> shape = ys;
  auto zeros = [&](size_t axis, int64_t len) {
    std::vector<int64_t> zs = shape;
    zs[axis] = len;
    return e.filled(0, dt, zs);
  };
  auto concat = [&](std::vector<std::string> parts, size_t axis) {
    std::string out = e.op("Concat", parts);
    set_attr(e.last(), "axis", static_cast<int64_t>(axis));
    return out;
  };
  for (size_t k = 0; k < axes.size(); ++k) {
    const size_t axis = static_cast<size_t>(norm_axis(axes[k], xs.size()));
    const int64_t dim = xs[axis], step = steps[k], count = ys[axis], stride = std::abs(step);
    int64_t start = starts[k] < 0 ? starts[k] + dim : starts[k];
    start = step > 0 ? std::clamp<int64_t>(start, 0, dim) : std::clamp<int64_t>(start, 0, dim - 1);
    const int64_t first = step > 0 ? start : start - (count - 1) * stride;  // the lowest index read
    if (step < 0) {
      g = e.op("Slice", {g, e.ints({-1}), e.ints({std::numeric_limits<int64_t>::min()}), e.ints({static_cast<int64_t>(axis)}),
                         e.ints({-1})});
    }
    if (stride > 1) {
      std::vector<int64_t> split = shape;
      split.insert(split.begin() + static_cast<int64_t>(axis) + 1, 1);
      std::vector<int64_t> gaps = split;
      gaps[axis + 1] = stride - 1;
      g = e.reshape(g, split);
      g = concat({g, e.filled(0, dt, gaps)}, axis + 1);
      shape[axis] = count * stride;
      g = e.reshape(g, shape);
      shape[axis] = (count - 1) * stride + 1;
      g = e.op("Slice", {g, e.ints({0}), e.ints({shape[axis]}), e.ints({static_cast<int64_t>(axis)})});
    }
    const int64_t before = first, after = dim - first - shape[axis];
    if (before < 0 || after < 0) n.unsupported("a Slice reading outside its input");
    if (before == 0 && after == 0) continue;
    std::vector<std::string> parts;
    if (before > 0) parts.push_back(zeros(axis, before));
    parts.push_back(g);
    if (after > 0) parts.push_back(zeros(axis, after));
    g = concat(parts, axis);
    shape[axis] = dim;
  }
  n.give(0, g);
}

// Pad: in constant mode g cropped back (Pad by the negated pads, which also restores what the forward cropped, as
// zeros); in reflect, edge and wrap mode ai.apart.PadGrad adds each output's gradient into the element it copied.
// Nothing flows to the constant.
void pad_rule(GradNode& n) {
  if (!n.wants(0)) return;
  auto& e = n.e;
  const size_t r = n.in(0).shape.size();
  const std::vector<int64_t> given = e.opset() < 11 ? n.attr_ints("pads").value_or(std::vector<int64_t>{}) : n.known_ints(1);
  std::vector<int64_t> axes(r);
  std::iota(axes.begin(), axes.end(), 0);
  if (n.has_input(3)) axes = n.known_ints(3);
  if (given.size() != 2 * axes.size()) n.unsupported("pads that do not hold a begin and an end per axis");
  std::vector<int64_t> pads(2 * r, 0);
  for (size_t k = 0; k < axes.size(); ++k) {
    const size_t axis = static_cast<size_t>(norm_axis(axes[k], r));
    pads[axis] = given[k];
    pads[axis + r] = given[k + axes.size()];
  }
  const std::string mode = n.attr_string("mode", "constant");
  if (mode == "constant") {
    std::vector<int64_t> negated;
    for (int64_t p : pads) negated.push_back(-p);
    return n.give(0, e.op("Pad", {n.gy(), e.ints(negated)}));
  }
  const std::string gx = e.fresh("PadGrad");
  auto& node = e.node("PadGrad", {n.gy()}, {gx}, kApartDomain);
  set_attr(node, "pads", pads);
  set_attr(node, "mode", mode);
  n.give(0, gx);
}

// Resize: ai.apart.ResizeGrad(dY, roi, scales, x_shape) with the forward's attributes runs the forward's 1-D
// interpolations transposed (runtime/cpu/resize.cpp): nearest scatters each output's gradient to the element it
// copied, linear and cubic with the interpolation weights. Nothing flows to roi, scales or sizes.
void resize_rule(GradNode& n) {
  if (!n.wants(0)) return;
  auto& e = n.e;
  if (e.opset() < 11) n.unsupported("Resize below opset 11");  // training graphs are at 13 or later
  const std::string gx = e.fresh("ResizeGrad");
  auto& node = e.node("ResizeGrad", {n.gy(), n.has_input(1) ? n.x(1) : "", n.has_input(2) ? n.x(2) : "",
                                     e.ints(n.in(0).shape)}, {gx}, kApartDomain);
  n.copy_attrs(node);
  n.give(0, gx);
}

// Upsample (opset 7–9): Resize-10's sampling (asymmetric, nearest rounding down), so ResizeGrad with those
// attributes; its scales input from opset 9, else out/in (the attribute's scales wherever in · scale is whole).
// The autodiff converts opset 7–12 graphs to 13 first, where the converter has made it a Resize.
void upsample_rule(GradNode& n) {
  if (!n.wants(0)) return;
  auto& e = n.e;
  const std::string gx = e.fresh("ResizeGrad");
  auto& node = e.node("ResizeGrad", {n.gy(), "", e.opset() >= 9 && n.has_input(1) ? n.x(1) : "", e.ints(n.in(0).shape)},
                      {gx}, kApartDomain);
  n.copy_attrs(node, {"mode"});
  set_attr(node, "coordinate_transformation_mode", std::string("asymmetric"));
  set_attr(node, "nearest_mode", std::string("floor"));
  n.give(0, gx);
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
  r["Pad"] = pad_rule;
  r["Resize"] = resize_rule;
  r["Upsample"] = upsample_rule;
  r["Gather"] = gather_rule;
  r["Trilu"] = trilu_rule;
  r["ScatterND"] = scatter_nd_rule;
}

}  // namespace apart::autodiff
