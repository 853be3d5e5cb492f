// Row-wise iteration over numpy-broadcast operands: the inner (last) dim is a strided loop.
#pragma once

#include <array>
#include <cstring>
#include <vector>

#include "runtime/cpu/threads.h"
#include "runtime/kernel.h"

namespace apart::cpu {

// row(out_offset, offsets[K], inner_strides[K], inner_len) once per output row, rows in parallel.
template <size_t K, class Row>
void broadcast_rows(const std::vector<int64_t>& out_shape, const std::array<std::vector<int64_t>, K>& strides,
                    int64_t cost, Row row) {
  const size_t r = out_shape.size();
  std::array<int64_t, K> zero{};
  if (r == 0) {
    row(0, zero, zero, 1);
    return;
  }
  const int64_t inner = out_shape[r - 1];
  const int64_t outer = product(out_shape, 0, r - 1);
  if (inner == 0 || outer == 0) return;
  std::array<int64_t, K> inner_strides{};
  for (size_t k = 0; k < K; ++k) inner_strides[k] = strides[k][r - 1];
  parallel_for(outer, inner * cost, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      std::array<int64_t, K> offs{};
      int64_t rem = o;
      for (size_t d = r - 1; d-- > 0;) {
        const int64_t idx = rem % out_shape[d];
        rem /= out_shape[d];
        for (size_t k = 0; k < K; ++k) offs[k] += idx * strides[k][d];
      }
      row(o * inner, offs, inner_strides, inner);
    }
  });
}

// out[i] = op(a[ia], b[ib]) with broadcasting; out already allocated with the broadcast shape.
template <class TA, class TB, class TO, class Op>
void binary_broadcast(const Tensor& a, const Tensor& b, Tensor& out, Op op) {
  const TA* pa = a.data<TA>();
  const TB* pb = b.data<TB>();
  TO* po = out.data<TO>();
  const int64_t n = out.elements();
  if (a.elements() == n && b.elements() == n) {
    parallel_for(n, 1, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) po[i] = op(pa[i], pb[i]);
    });
    return;
  }
  if (a.elements() == n && b.elements() == 1) {
    const TB bv = pb[0];
    parallel_for(n, 1, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) po[i] = op(pa[i], bv);
    });
    return;
  }
  std::array<std::vector<int64_t>, 2> strides{broadcast_strides(a.shape(), out.shape()),
                                              broadcast_strides(b.shape(), out.shape())};
  broadcast_rows<2>(out.shape(), strides, 1, [&](int64_t o, auto offs, auto inner, int64_t len) {
    const TA* ra = pa + offs[0];
    const TB* rb = pb + offs[1];
    TO* ro = po + o;
    for (int64_t j = 0; j < len; ++j) ro[j] = op(ra[j * inner[0]], rb[j * inner[1]]);
  });
}

}  // namespace apart::cpu

namespace apart::cpu {

// A fresh tensor holding `t` broadcast to `shape` (any dtype; copies element bytes).
inline Tensor broadcast_to(const Tensor& t, const std::vector<int64_t>& shape) {
  Tensor out(t.dtype(), shape);
  const int64_t es = dtype_size(t.dtype());
  const std::byte* src = t.raw();
  std::byte* dst = out.raw();
  std::array<std::vector<int64_t>, 1> strides{broadcast_strides(t.shape(), shape)};
  broadcast_rows<1>(shape, strides, 1, [&](int64_t o, auto offs, auto inner, int64_t len) {
    for (int64_t j = 0; j < len; ++j)
      std::memcpy(dst + (o + j) * es, src + (offs[0] + j * inner[0]) * es, static_cast<size_t>(es));
  });
  return out;
}

}  // namespace apart::cpu
