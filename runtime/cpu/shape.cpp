// Data-movement and shape kernels (dtype-agnostic, by element bytes): Reshape, Flatten, Squeeze,
// Unsqueeze, Transpose, Concat, Split, Slice, Gather, Expand, Shape, Size, Constant,
// ConstantOfShape, Range, Trilu.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/cpu/broadcast.h"
#include "runtime/cpu/families.h"

namespace apart::cpu {
namespace {

void reshape_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> shape = ctx.opset() < 5 ? ctx.attr_ints("shape") : ctx.host_input(1).to_int64s();
  const bool allowzero = ctx.attr_int("allowzero", 0) != 0;
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0 && !allowzero) {
      if (static_cast<int64_t>(i) >= x.rank()) ctx.invalid("shape dim 0 copies a dim the input lacks");
      shape[i] = x.dim(static_cast<int64_t>(i));
    }
    if (shape[i] == -1) {
      if (infer >= 0) ctx.invalid("more than one -1 in the target shape");
      infer = static_cast<int64_t>(i);
    } else if (shape[i] < 0) {
      ctx.invalid("negative dim in the target shape");
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || x.elements() % known != 0) ctx.invalid("cannot infer the -1 dim");
    shape[static_cast<size_t>(infer)] = x.elements() / known;
  }
  if (product(shape) != x.elements())
    ctx.invalid("cannot reshape " + shape_string(x.shape()) + " to " + shape_string(shape));
  copy_bytes(x, ctx.output(0, x.dtype(), shape));
}

void flatten_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  int64_t axis = ctx.attr_int("axis", 1);
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis > x.rank()) ctx.invalid("axis out of range");
  copy_bytes(x, ctx.output(0, x.dtype(), {product(x.shape(), 0, static_cast<size_t>(axis)), product(x.shape(), static_cast<size_t>(axis))}));
}

std::vector<int64_t> axes_arg(KernelContext& ctx, size_t input) {
  if (ctx.opset() >= 13) return ctx.has_input(input) ? ctx.host_input(input).to_int64s() : std::vector<int64_t>{};
  return ctx.attr_ints("axes");
}

void squeeze_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> axes = axes_arg(ctx, 1);
  std::vector<bool> drop(static_cast<size_t>(x.rank()), false);
  if (axes.empty())
    for (int64_t d = 0; d < x.rank(); ++d) drop[d] = x.dim(d) == 1;
  for (int64_t a : axes) {
    a = normalize_axis(ctx, a, x.rank());
    if (x.dim(a) != 1) ctx.invalid("cannot squeeze axis " + std::to_string(a) + " of size " + std::to_string(x.dim(a)));
    drop[static_cast<size_t>(a)] = true;
  }
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (!drop[d]) shape.push_back(x.dim(d));
  copy_bytes(x, ctx.output(0, x.dtype(), shape));
}

void unsqueeze_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> axes = axes_arg(ctx, 1);
  const int64_t r = x.rank() + static_cast<int64_t>(axes.size());
  std::vector<bool> inserted(static_cast<size_t>(r), false);
  for (int64_t a : axes) {
    a = normalize_axis(ctx, a, r);
    if (inserted[a]) ctx.invalid("repeated axis");
    inserted[static_cast<size_t>(a)] = true;
  }
  std::vector<int64_t> shape;
  size_t src = 0;
  for (int64_t d = 0; d < r; ++d) shape.push_back(inserted[d] ? 1 : x.shape()[src++]);
  copy_bytes(x, ctx.output(0, x.dtype(), shape));
}

// out[i] = in[permuted index]; rows of the output's last dim are a strided gather.
void transpose_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t r = x.rank();
  std::vector<int64_t> perm = ctx.attr_ints("perm");
  if (perm.empty())
    for (int64_t d = r - 1; d >= 0; --d) perm.push_back(d);
  if (static_cast<int64_t>(perm.size()) != r) ctx.invalid("perm has the wrong length");
  const auto in_strides = contiguous_strides(x.shape());
  std::vector<int64_t> shape(static_cast<size_t>(r)), strides(static_cast<size_t>(r));
  for (int64_t d = 0; d < r; ++d) {
    const int64_t p = normalize_axis(ctx, perm[d], r);
    shape[d] = x.dim(p);
    strides[d] = in_strides[static_cast<size_t>(p)];
  }
  Tensor& y = ctx.output(0, x.dtype(), shape);
  const int64_t es = dtype_size(x.dtype());
  const std::byte* src = x.raw();
  std::byte* dst = y.raw();
  std::array<std::vector<int64_t>, 1> s{strides};
  broadcast_rows<1>(shape, s, 1, [&](int64_t o, auto offs, auto inner, int64_t len) {
    if (es == 4) {
      auto* d4 = reinterpret_cast<uint32_t*>(dst) + o;
      const auto* s4 = reinterpret_cast<const uint32_t*>(src) + offs[0];
      for (int64_t j = 0; j < len; ++j) d4[j] = s4[j * inner[0]];
    } else {
      for (int64_t j = 0; j < len; ++j)
        std::memcpy(dst + (o + j) * es, src + (offs[0] + j * inner[0]) * es, static_cast<size_t>(es));
    }
  });
}

void concat_k(KernelContext& ctx) {
  const Tensor& first = ctx.input(0);
  const int64_t r = first.rank();
  const int64_t axis = normalize_axis(ctx, ctx.attr_int("axis", 0), r);
  std::vector<int64_t> shape = first.shape();
  shape[axis] = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor& t = ctx.input(i);
    if (t.rank() != r || t.dtype() != first.dtype()) ctx.invalid("inputs differ in rank or dtype");
    for (int64_t d = 0; d < r; ++d)
      if (d != axis && t.dim(d) != first.dim(d)) ctx.invalid("inputs differ off the concat axis");
    shape[axis] += t.dim(axis);
  }
  Tensor& y = ctx.output(0, first.dtype(), shape);
  const int64_t es = dtype_size(first.dtype());
  const int64_t outer = product(shape, 0, static_cast<size_t>(axis)), inner = product(shape, static_cast<size_t>(axis) + 1);
  const int64_t out_row = shape[axis] * inner * es;
  int64_t at = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor& t = ctx.input(i);
    const int64_t row = t.dim(axis) * inner * es;
    for (int64_t o = 0; o < outer && row > 0; ++o) std::memcpy(y.raw() + o * out_row + at, t.raw() + o * row, static_cast<size_t>(row));
    at += row;
  }
}

void split_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t axis = normalize_axis(ctx, ctx.attr_int("axis", 0), x.rank());
  const int64_t outputs = static_cast<int64_t>(ctx.num_outputs());
  std::vector<int64_t> sizes = ctx.has_input(1) ? ctx.host_input(1).to_int64s() : ctx.attr_ints("split");
  if (sizes.empty()) {
    // Equal parts (num_outputs, opset 18, allows a smaller last part).
    const int64_t parts = ctx.attr_int("num_outputs", outputs);
    const int64_t chunk = (x.dim(axis) + parts - 1) / parts;
    for (int64_t i = 0, left = x.dim(axis); i < parts; ++i, left -= chunk) sizes.push_back(std::max<int64_t>(0, std::min(chunk, left)));
  }
  if (static_cast<int64_t>(sizes.size()) != outputs) ctx.invalid("split sizes do not match the outputs");
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  if (total != x.dim(axis)) ctx.invalid("split sizes do not add up to the axis");
  const int64_t es = dtype_size(x.dtype());
  const int64_t outer = product(x.shape(), 0, static_cast<size_t>(axis)), inner = product(x.shape(), static_cast<size_t>(axis) + 1);
  const int64_t in_row = x.dim(axis) * inner * es;
  int64_t at = 0;
  for (int64_t i = 0; i < outputs; ++i) {
    std::vector<int64_t> shape = x.shape();
    shape[axis] = sizes[i];
    const int64_t row = sizes[i] * inner * es;
    if (ctx.wants_output(static_cast<size_t>(i))) {
      Tensor& y = ctx.output(static_cast<size_t>(i), x.dtype(), shape);
      for (int64_t o = 0; o < outer && row > 0; ++o) std::memcpy(y.raw() + o * row, x.raw() + o * in_row + at, static_cast<size_t>(row));
    }
    at += row;
  }
}

void slice_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t r = x.rank();
  std::vector<int64_t> starts, ends, axes, steps;
  if (ctx.opset() < 10) {
    starts = ctx.attr_ints("starts");
    ends = ctx.attr_ints("ends");
    axes = ctx.attr_ints("axes");
  } else {
    starts = ctx.host_input(1).to_int64s();
    ends = ctx.host_input(2).to_int64s();
    if (ctx.has_input(3)) axes = ctx.host_input(3).to_int64s();
    if (ctx.has_input(4)) steps = ctx.host_input(4).to_int64s();
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    ctx.invalid("starts/ends/axes/steps lengths differ");
  std::vector<int64_t> begin(static_cast<size_t>(r), 0), step(static_cast<size_t>(r), 1), shape = x.shape();
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t a = normalize_axis(ctx, axes[i], r), dim = x.dim(a), st = steps[i];
    if (st == 0) ctx.invalid("step 0");
    auto clamp = [&](int64_t v, int64_t lo, int64_t hi) { return std::max(lo, std::min(hi, v)); };
    int64_t s = starts[i], e = ends[i];
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    if (st > 0) {
      s = clamp(s, 0, dim);
      e = clamp(e, 0, dim);
      shape[a] = e > s ? (e - s + st - 1) / st : 0;
    } else {
      s = clamp(s, -1, dim - 1);
      e = clamp(e, -1, dim - 1);
      shape[a] = s > e ? (s - e - st - 1) / -st : 0;
    }
    begin[a] = s;
    step[a] = st;
  }
  Tensor& y = ctx.output(0, x.dtype(), shape);
  if (y.elements() == 0) return;
  const auto in_strides = contiguous_strides(x.shape());
  std::vector<int64_t> strides(static_cast<size_t>(r));
  int64_t base = 0;
  for (int64_t d = 0; d < r; ++d) {
    strides[d] = in_strides[d] * step[d];
    base += begin[d] * in_strides[d];
  }
  const int64_t es = dtype_size(x.dtype());
  std::array<std::vector<int64_t>, 1> s{strides};
  broadcast_rows<1>(shape, s, 1, [&](int64_t o, auto offs, auto inner, int64_t len) {
    for (int64_t j = 0; j < len; ++j)
      std::memcpy(y.raw() + (o + j) * es, x.raw() + (base + offs[0] + j * inner[0]) * es, static_cast<size_t>(es));
  });
}

void gather_k(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  const int64_t axis = normalize_axis(ctx, ctx.attr_int("axis", 0), data.rank());
  const std::vector<int64_t> idx = indices.to_int64s();
  std::vector<int64_t> shape(data.shape().begin(), data.shape().begin() + axis);
  shape.insert(shape.end(), indices.shape().begin(), indices.shape().end());
  shape.insert(shape.end(), data.shape().begin() + axis + 1, data.shape().end());
  Tensor& y = ctx.output(0, data.dtype(), shape);
  const int64_t es = dtype_size(data.dtype());
  const int64_t outer = product(data.shape(), 0, static_cast<size_t>(axis));
  const int64_t inner = product(data.shape(), static_cast<size_t>(axis) + 1) * es;
  const int64_t dim = data.dim(axis), n = static_cast<int64_t>(idx.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < n; ++i) {
      int64_t k = idx[static_cast<size_t>(i)];
      if (k < 0) k += dim;
      if (k < 0 || k >= dim) ctx.invalid("index " + std::to_string(idx[static_cast<size_t>(i)]) + " out of range for a dim of " + std::to_string(dim));
      std::memcpy(y.raw() + (o * n + i) * inner, data.raw() + (o * dim + k) * inner, static_cast<size_t>(inner));
    }
}

void expand_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const auto shape = broadcast_shapes(ctx, x.shape(), ctx.host_input(1).to_int64s());
  copy_bytes(broadcast_to(x, shape), ctx.output(0, x.dtype(), shape));
}

void shape_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t r = x.rank();
  int64_t start = ctx.attr_int("start", 0), end = ctx.attr_int("end", r);
  if (start < 0) start += r;
  if (end < 0) end += r;
  start = std::clamp<int64_t>(start, 0, r);
  end = std::clamp<int64_t>(end, 0, r);
  Tensor& y = ctx.output(0, DType::kInt64, {std::max<int64_t>(0, end - start)});
  for (int64_t d = start; d < end; ++d) y.data<int64_t>()[d - start] = x.dim(d);
}

void size_k(KernelContext& ctx) { ctx.output(0, DType::kInt64, {}).data<int64_t>()[0] = ctx.input(0).elements(); }

void constant_k(KernelContext& ctx) {
  if (const Tensor* t = ctx.tensor_attr("value")) {
    copy_bytes(*t, ctx.output(0, t->dtype(), t->shape()));
  } else if (ctx.has_attr("value_float")) {
    ctx.output(0, DType::kFloat32, {}).data<float>()[0] = static_cast<float>(ctx.attr_float("value_float", 0));
  } else if (ctx.has_attr("value_int")) {
    ctx.output(0, DType::kInt64, {}).data<int64_t>()[0] = ctx.attr_int("value_int", 0);
  } else if (ctx.has_attr("value_ints")) {
    const auto v = ctx.attr_ints("value_ints");
    Tensor& y = ctx.output(0, DType::kInt64, {static_cast<int64_t>(v.size())});
    std::copy(v.begin(), v.end(), y.data<int64_t>());
  } else if (const Attribute* a = ctx.task().attr("value_floats")) {
    Tensor& y = ctx.output(0, DType::kFloat32, {static_cast<int64_t>(a->floats.size())});
    for (size_t i = 0; i < a->floats.size(); ++i) y.data<float>()[i] = static_cast<float>(a->floats[i]);
  } else {
    ctx.unsupported("this form of Constant (sparse_value or string values)");
  }
}

void constant_of_shape_k(KernelContext& ctx) {
  const auto shape = ctx.host_input(0).to_int64s();
  const Tensor* value = ctx.tensor_attr("value");
  if (!value) {
    ctx.output(0, DType::kFloat32, shape);  // zero-filled
    return;
  }
  if (value->elements() != 1) ctx.invalid("value must hold one element");
  Tensor& y = ctx.output(0, value->dtype(), shape);
  const int64_t es = dtype_size(value->dtype());
  for (int64_t i = 0; i < y.elements(); ++i) std::memcpy(y.raw() + i * es, value->raw(), static_cast<size_t>(es));
}

void range_k(KernelContext& ctx) {
  const Tensor& start = ctx.input(0);
  dispatch(ctx, start.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T s = start.data<T>()[0], limit = ctx.input(1).template data<T>()[0], delta = ctx.input(2).template data<T>()[0];
    if (delta == T(0)) ctx.invalid("delta is 0");
    const int64_t n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil(static_cast<double>(limit - s) / static_cast<double>(delta))));
    Tensor& y = ctx.output(0, start.dtype(), {n});
    for (int64_t i = 0; i < n; ++i) y.data<T>()[i] = static_cast<T>(s + static_cast<T>(i) * delta);
  });
}

// Keeps the upper (j - i >= k) or lower (j - i <= k) triangle of the last two dims.
void trilu_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.rank() < 2) ctx.invalid("input must have rank >= 2");
  const bool upper = ctx.attr_int("upper", 1) != 0;
  const int64_t k = ctx.has_input(1) ? ctx.host_input(1).to_int64s().at(0) : 0;
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  const int64_t rows = x.dim(-2), cols = x.dim(-1), es = dtype_size(x.dtype());
  const int64_t mats = x.elements() / std::max<int64_t>(1, rows * cols);
  for (int64_t m = 0; m < mats; ++m)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        if (upper ? j - i >= k : j - i <= k) {
          const int64_t at = ((m * rows + i) * cols + j) * es;
          std::memcpy(y.raw() + at, x.raw() + at, static_cast<size_t>(es));
        }
}

}  // namespace

void register_shape_kernels() {
  register_kernel("Reshape", reshape_k);
  register_kernel("Flatten", flatten_k);
  register_kernel("Squeeze", squeeze_k);
  register_kernel("Unsqueeze", unsqueeze_k);
  register_kernel("Transpose", transpose_k);
  register_kernel("Concat", concat_k);
  register_kernel("Split", split_k);
  register_kernel("Slice", slice_k);
  register_kernel("Gather", gather_k);
  register_kernel("Expand", expand_k);
  register_kernel("Shape", shape_k);
  register_kernel("Size", size_k);
  register_kernel("Constant", constant_k);
  register_kernel("ConstantOfShape", constant_of_shape_k);
  register_kernel("Range", range_k);
  register_kernel("Trilu", trilu_k);
}

}  // namespace apart::cpu
