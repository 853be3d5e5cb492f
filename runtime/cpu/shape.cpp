// Data-movement and shape kernels (dtype-agnostic, by element bytes): Reshape, Flatten, Squeeze,
// Unsqueeze, Transpose, Concat, Split, Slice, Pad (and its gradient ai.apart.PadGrad), Gather, Expand, Shape, Size,
// Constant, ConstantOfShape, Range, Trilu.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/cpu/broadcast.h"
#include "runtime/cpu/families.h"
#include "runtime/cpu/threads.h"
#include "runtime/op_args.h"

namespace apart::cpu {
namespace {

void reshape_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  copy_bytes(x, ctx.output(0, x.dtype(), reshape_output_shape(ctx)));
}

void flatten_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  copy_bytes(x, ctx.output(0, x.dtype(), flatten_output_shape(ctx)));
}

void squeeze_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  copy_bytes(x, ctx.output(0, x.dtype(), squeeze_output_shape(ctx)));
}

void unsqueeze_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  copy_bytes(x, ctx.output(0, x.dtype(), unsqueeze_output_shape(ctx)));
}

// A view whose last two output dims read the input transposed (stride 1 on the second-to-last, stride ≥ 2 on the
// last: Transpose of the last two axes, of a 2-D matrix, a tied head's table): copied in 32 × 32 tiles, so that each
// input cache line is read once instead of once per output element. 4-byte elements; false: not such a view.
bool tiled_transpose_copy(const std::byte* src, const StridedView& view, int64_t es, std::byte* dst) {
  const size_t r = view.shape.size();
  if (es != 4 || r < 2 || view.strides[r - 2] != 1 || view.strides[r - 1] < 2) return false;
  const int64_t rows = view.shape[r - 2], cols = view.shape[r - 1], col_stride = view.strides[r - 1];
  if (rows * cols < 4096) return false;  // small: the plain copy is as fast
  int64_t outer = 1;
  for (size_t d = 0; d + 2 < r; ++d) outer *= view.shape[d];
  constexpr int64_t kTile = 32;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  const auto* in = reinterpret_cast<const uint32_t*>(src);
  auto* out = reinterpret_cast<uint32_t*>(dst);
  parallel_for(outer * row_tiles, kTile * cols, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      const int64_t o = w / row_tiles, i0 = (w % row_tiles) * kTile, i1 = std::min(rows, i0 + kTile);
      int64_t in_base = 0;  // the outer index o's offset: its digits times the outer strides
      for (int64_t rest = o, d = static_cast<int64_t>(r) - 3; d >= 0; --d) {
        in_base += (rest % view.shape[static_cast<size_t>(d)]) * view.strides[static_cast<size_t>(d)];
        rest /= view.shape[static_cast<size_t>(d)];
      }
      uint32_t* y = out + o * rows * cols;
      for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
        const int64_t j1 = std::min(cols, j0 + kTile);
        for (int64_t j = j0; j < j1; ++j)  // input row j (contiguous over i) into output column j
          for (int64_t i = i0; i < i1; ++i) y[i * cols + j] = in[in_base + j * col_stride + i];
      }
    }
  });
  return true;
}

// out[i] = in[base + Σ idx_d · strides_d]; rows of the output's last dim are a strided gather.
void strided_copy(const Tensor& x, const StridedView& view, Tensor& y) {
  if (y.elements() == 0) return;
  const int64_t es = dtype_size(x.dtype());
  const std::byte* src = x.raw() + view.base * es;
  std::byte* dst = y.raw();
  if (tiled_transpose_copy(src, view, es, dst)) return;
  std::array<std::vector<int64_t>, 1> s{view.strides};
  broadcast_rows<1>(view.shape, s, 1, [&](int64_t o, auto offs, auto inner, int64_t len) {
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

void transpose_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const StridedView view = transpose_view(ctx);
  strided_copy(x, view, ctx.output(0, x.dtype(), view.shape));
}

void concat_k(KernelContext& ctx) {
  int64_t axis = 0;
  const std::vector<int64_t> shape = concat_output_shape(ctx, axis);
  const Tensor& first = ctx.input(0);
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
  int64_t axis = 0;
  const std::vector<int64_t> sizes = split_sizes(ctx, axis);
  const int64_t outputs = static_cast<int64_t>(ctx.num_outputs());
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
  const StridedView view = slice_view(ctx);
  strided_copy(x, view, ctx.output(0, x.dtype(), view.shape));
}

// Calls f(out_offset, in_offset) for each output element of a Pad from `in` (in_offset −1: the constant).
template <class F>
void for_each_pad_source(const PadArgs& a, const std::vector<int64_t>& in, F&& f) {
  const size_t r = in.size();
  std::vector<std::vector<int64_t>> source(r);  // per axis: the input index each output index reads
  for (size_t d = 0; d < r; ++d)
    for (int64_t o = 0; o < a.out_shape[d]; ++o) source[d].push_back(pad_source(o, in[d], a.begin[d], a.mode));
  const std::vector<int64_t> strides = contiguous_strides(in);
  const int64_t total = product(a.out_shape);
  std::vector<int64_t> at(r, 0);
  for (int64_t o = 0; o < total; ++o) {
    int64_t offset = 0;
    for (size_t d = 0; d < r && offset >= 0; ++d) {
      const int64_t i = source[d][static_cast<size_t>(at[d])];
      offset = i < 0 ? -1 : offset + i * strides[d];
    }
    f(o, offset);
    for (size_t d = r; d-- > 0;) {
      if (++at[d] < a.out_shape[d]) break;
      at[d] = 0;
    }
  }
}

// Pad (constant, reflect, edge, wrap; negative pads crop), any dtype.
void pad_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const PadArgs a = pad_args(ctx, x.shape());
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T value = static_cast<T>(a.value);
    const T* px = x.data<T>();
    T* py = ctx.output(0, x.dtype(), a.out_shape).template data<T>();
    for_each_pad_source(a, x.shape(), [&](int64_t o, int64_t i) { py[o] = i < 0 ? value : px[i]; });
  }, true);
}

// ai.apart.PadGrad(dY) → dX, attributes `pads` (begin…, end… for every axis) and `mode` of the forward Pad: each
// output's gradient added into the element it copied (the constant gets none).
void pad_grad_k(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  PadArgs a;
  a.mode = pad_mode(ctx, ctx.attr_string("mode", "constant"));
  const std::vector<int64_t> pads = ctx.attr_ints("pads");
  const size_t r = static_cast<size_t>(dy.rank());
  if (pads.size() != 2 * r) ctx.invalid("pads must hold a begin and an end per axis");
  a.begin.assign(pads.begin(), pads.begin() + static_cast<int64_t>(r));
  a.end.assign(pads.begin() + static_cast<int64_t>(r), pads.end());
  a.out_shape = dy.shape();
  std::vector<int64_t> in(r);
  for (size_t d = 0; d < r; ++d) {
    in[d] = a.out_shape[d] - a.begin[d] - a.end[d];
    if (in[d] < 0) ctx.invalid("pads exceed dY");
  }
  dispatch_float(ctx, dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = dy.data<T>();
    T* pdx = ctx.output(0, dy.dtype(), in).template data<T>();
    std::fill(pdx, pdx + product(in), T{0});
    for_each_pad_source(a, in, [&](int64_t o, int64_t i) {
      if (i >= 0) pdx[i] += pdy[o];
    });
  });
}

void gather_k(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  int64_t axis = 0;
  const std::vector<int64_t> shape = gather_output_shape(ctx, axis);
  const std::vector<int64_t> idx = indices.to_int64s();
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
  register_kernel("Pad", pad_k);
  register_kernel("ai.apart.PadGrad", pad_grad_k);
}

}  // namespace apart::cpu
