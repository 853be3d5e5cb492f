// Attention-23 (and ai.apart.Attention, the same op for models below opset 23, which codegen/attention_fusion.h
// writes for the MatMul·scale·mask·Softmax·MatMul pattern) and its gradient op ai.apart.AttentionGrad, on the CPU:
// blocked with an online softmax (FlashAttention-2, Dao 2023, Algorithms 1 and 2), so that no tensor of seq × seq
// exists in either direction; the tiles' products go through the GEMM of gemm.h.
#include "runtime/cpu/families.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "graph/flash_tiles.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/threads.h"
#include "runtime/kernel.h"

namespace apart::cpu {
namespace {

const Tensor* optional_input(const KernelContext& ctx, size_t i) { return ctx.has_input(i) ? &ctx.input(i) : nullptr; }

// --- Attention ----------------------------------------------------------------------------------------------

// Attention-23's operands as [B, heads, seq, head] through strides (3-D Q/K/V are [B, seq, heads · head] with
// q_num_heads / kv_num_heads), query head h reading KV head h / (Hq / Hkv) (GQA: np.repeat of the KV heads), and
// the mask broadcast to [B, Hq, S, L] (a last dim shorter than L masks the keys past it, as the reference pads).
struct AttentionGeometry {
  int64_t batch = 0, q_heads = 0, kv_heads = 0, q_seq = 0, kv_seq = 0, head = 0, v_head = 0;
  std::array<int64_t, 3> q_strides{}, k_strides{}, v_strides{}, y_strides{};  // per batch, head, position
  double scale = 1;
  double softcap = 0;
  bool causal = false;
  // The mask, as strides over [B, Hq, S, L] (0 where it broadcasts) and its own last dim.
  const Tensor* mask = nullptr;
  std::array<int64_t, 4> mask_strides{};
  int64_t mask_keys = 0;

  int64_t group() const { return q_heads / kv_heads; }
  static int64_t at(const std::array<int64_t, 3>& st, int64_t b, int64_t h, int64_t s) {
    return b * st[0] + h * st[1] + s * st[2];
  }
};

// Strides of a [B, heads, seq, head] view of `t` (4-D as it is, 3-D as [B, seq, heads · head]).
std::array<int64_t, 3> head_strides(const Tensor& t, int64_t heads, int64_t head) {
  if (t.rank() == 4) return {t.dim(1) * t.dim(2) * t.dim(3), t.dim(2) * t.dim(3), t.dim(3)};
  return {t.dim(1) * heads * head, head, heads * head};
}

AttentionGeometry attention_geometry(const KernelContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor* mask) {
  if (q.rank() != k.rank() || q.rank() != v.rank() || (q.rank() != 3 && q.rank() != 4))
    ctx.invalid("Q, K and V must all be 3-D or all be 4-D");
  AttentionGeometry g;
  g.batch = q.dim(0);
  if (q.rank() == 4) {
    g.q_heads = q.dim(1), g.kv_heads = k.dim(1), g.q_seq = q.dim(2), g.kv_seq = k.dim(2), g.head = q.dim(3);
    g.v_head = v.dim(3);
    if (v.dim(1) != g.kv_heads || v.dim(2) != g.kv_seq || k.dim(3) != g.head) ctx.invalid("K and V do not match Q");
  } else {
    g.q_heads = ctx.attr_int("q_num_heads", 0), g.kv_heads = ctx.attr_int("kv_num_heads", 0);
    if (g.q_heads <= 0 || g.kv_heads <= 0 || q.dim(2) % g.q_heads != 0 || k.dim(2) % g.kv_heads != 0 ||
        v.dim(2) % g.kv_heads != 0)
      ctx.invalid("3-D Q, K, V need q_num_heads and kv_num_heads dividing their hidden sizes");
    g.q_seq = q.dim(1), g.kv_seq = k.dim(1), g.head = q.dim(2) / g.q_heads, g.v_head = v.dim(2) / g.kv_heads;
    if (k.dim(2) / g.kv_heads != g.head || v.dim(1) != g.kv_seq) ctx.invalid("K and V do not match Q");
  }
  if (k.dim(0) != g.batch || v.dim(0) != g.batch) ctx.invalid("Q, K and V have different batch sizes");
  if (g.q_heads % g.kv_heads != 0)
    ctx.invalid(std::to_string(g.q_heads) + " query heads are not a multiple of " + std::to_string(g.kv_heads) +
                " KV heads");
  g.q_strides = head_strides(q, g.q_heads, g.head);
  g.k_strides = head_strides(k, g.kv_heads, g.head);
  g.v_strides = head_strides(v, g.kv_heads, g.v_head);
  g.y_strides = q.rank() == 4 ? std::array<int64_t, 3>{g.q_heads * g.q_seq * g.v_head, g.q_seq * g.v_head, g.v_head}
                              : std::array<int64_t, 3>{g.q_seq * g.q_heads * g.v_head, g.v_head, g.q_heads * g.v_head};
  g.scale = ctx.has_attr("scale") ? ctx.attr_float("scale", 1.0) : 1.0 / std::sqrt(static_cast<double>(g.head));
  g.softcap = ctx.attr_float("softcap", 0.0);
  g.causal = ctx.attr_int("is_causal", 0) != 0;
  if (mask) {
    if (mask->rank() < 2 || mask->rank() > 4 || mask->dim(-1) > g.kv_seq)
      ctx.invalid("attn_mask " + shape_string(mask->shape()) + " does not broadcast to [batch, heads, " +
                  std::to_string(g.q_seq) + ", " + std::to_string(g.kv_seq) + "]");
    if (mask->dtype() != DType::kBool && mask->dtype() != q.dtype())
      ctx.invalid("attn_mask is neither bool nor Q's dtype");
    std::vector<int64_t> padded(4 - static_cast<size_t>(mask->rank()), 1);
    padded.insert(padded.end(), mask->shape().begin(), mask->shape().end());
    const std::array<int64_t, 4> full{g.batch, g.q_heads, g.q_seq, padded[3]};
    const std::vector<int64_t> own = contiguous_strides(padded);
    for (size_t i = 0; i < 4; ++i) {
      if (padded[i] != 1 && padded[i] != full[i])
        ctx.invalid("attn_mask " + shape_string(mask->shape()) + " does not broadcast");
      g.mask_strides[i] = padded[i] == 1 ? 0 : own[i];
    }
    g.mask_keys = padded[3];
    g.mask = mask;
  }
  return g;
}

// --- Tiles -----------------------------------------------------------------------------------------------

// A tile is `rows` query rows against `cols` keys (graph/flash_tiles.h: the sizes the cost model prices too).
using Tiles = FlashTiles;
Tiles tiles_for(const AttentionGeometry& g) { return flash_tiles(std::max(g.head, g.v_head)); }

// The logits of query rows [i0, i0 + br) against keys [j0, j0 + bc), in place over s = scale·Q·Kᵀ (row stride
// `cols`): softcapped, then masked as the reference orders it (a −∞ mask stays −∞); −∞ where causal hides a key,
// past the mask's keys, or where a bool mask is false. `slope` (softcap only; may be null) gets d logit / d(q·k).
template <class T>
void tile_logits(const AttentionGeometry& g, int64_t b, int64_t h, int64_t i0, int64_t br, int64_t j0, int64_t bc,
                 int64_t cols, T* s, T* slope) {
  constexpr T kMasked = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < br; ++r) {
    const int64_t i = i0 + r;
    T* row = s + r * cols;
    const int64_t mask_row = g.mask ? b * g.mask_strides[0] + h * g.mask_strides[1] + i * g.mask_strides[2] : 0;
    for (int64_t c = 0; c < bc; ++c) {
      const int64_t j = j0 + c;
      if ((g.causal && j > i) || (g.mask && j >= g.mask_keys)) {
        row[c] = kMasked;
        continue;
      }
      if (g.softcap > 0) {
        const double t = std::tanh(static_cast<double>(row[c]) / g.softcap);
        row[c] = static_cast<T>(g.softcap * t);
        if (slope) slope[r * cols + c] = static_cast<T>(g.scale * (1 - t * t));
      }
      if (!g.mask) continue;
      const int64_t m = mask_row + j * g.mask_strides[3];
      if (g.mask->dtype() == DType::kBool) {
        if (!g.mask->data<bool>()[m]) row[c] = kMasked;
      } else {
        row[c] += g.mask->data<T>()[m];
      }
    }
  }
}

// One block of query rows of one head: where its operands are, and its softmax state across the key tiles.
template <class T>
struct QueryBlock {
  const AttentionGeometry& g;
  Tiles tiles;
  int64_t b = 0, h = 0, i0 = 0, br = 0;
  std::vector<T> s, acc, max, sum;  // a tile's logits; Σ P·V; each row's running max and Σ exp(logit − max)

  QueryBlock(const AttentionGeometry& geometry, Tiles t)
      : g(geometry),
        tiles(t),
        s(static_cast<size_t>(t.rows * t.cols)),
        acc(static_cast<size_t>(t.rows * g.v_head)),
        max(static_cast<size_t>(t.rows)),
        sum(static_cast<size_t>(t.rows)) {}

  int64_t kv() const { return h / g.group(); }
  // Keys past the last row's position are all hidden under causal: tiles from there on are skipped.
  int64_t key_end() const { return g.causal ? std::min(g.kv_seq, i0 + br) : g.kv_seq; }

  // The tile's logits: s = scale·Q·Kᵀ, then tile_logits.
  void logits(const T* q, const T* k, int64_t j0, int64_t bc, T* slope) {
    gemm<T>(false, true, br, bc, g.head, static_cast<T>(g.scale), q + AttentionGeometry::at(g.q_strides, b, h, i0),
            g.q_strides[2], k + AttentionGeometry::at(g.k_strides, b, kv(), j0), g.k_strides[2], T(0), s.data(),
            tiles.cols);
    tile_logits<T>(g, b, h, i0, br, j0, bc, tiles.cols, s.data(), slope);
  }

  // The forward over every key tile (Algorithm 1): afterwards max, sum hold each row's softmax statistics and
  // acc = Σ_j exp(logit_j − max)·V_j (divide by sum for the output; a row with every key masked has sum 0).
  void forward(const T* q, const T* k, const T* v) {
    constexpr T kMasked = -std::numeric_limits<T>::infinity();
    std::fill(acc.begin(), acc.end(), T(0));
    std::fill(max.begin(), max.end(), kMasked);
    std::fill(sum.begin(), sum.end(), T(0));
    const int64_t cols = tiles.cols;
    for (int64_t j0 = 0; j0 < key_end(); j0 += cols) {
      const int64_t bc = std::min(cols, key_end() - j0);
      logits(q, k, j0, bc, nullptr);
      for (int64_t r = 0; r < br; ++r) {
        T* row = s.data() + r * cols;
        T top = max[r];
        for (int64_t c = 0; c < bc; ++c) top = std::max(top, row[c]);
        if (top == kMasked) {  // every key so far masked: nothing to add
          std::fill(row, row + bc, T(0));
          continue;
        }
        const T rescale = max[r] == kMasked ? T(0) : std::exp(max[r] - top);
        max[r] = top;
        T added = 0;
        for (int64_t c = 0; c < bc; ++c) {
          row[c] = row[c] == kMasked ? T(0) : std::exp(row[c] - top);
          added += row[c];
        }
        sum[r] = sum[r] * rescale + added;
        if (rescale != T(1))
          for (int64_t d = 0; d < g.v_head; ++d) acc[r * g.v_head + d] *= rescale;
      }
      gemm<T>(false, false, br, g.v_head, bc, T(1), s.data(), cols, v + AttentionGeometry::at(g.v_strides, b, kv(), j0),
              g.v_strides[2], T(1), acc.data(), g.v_head);
    }
  }
};

// The forms of Attention this kernel does not run: a KV cache (inputs past_key, past_value, nonpad_kv_seqlen; outputs
// present_key, present_value) and the qk_matmul_output.
void refuse_kv_cache(const KernelContext& ctx) {
  for (size_t i : {4, 5, 6})
    if (ctx.has_input(i)) ctx.unsupported("Attention with past_key/past_value or nonpad_kv_seqlen (a KV cache)");
  for (size_t i = 1; i < ctx.num_outputs(); ++i)
    if (ctx.wants_output(i)) ctx.unsupported("Attention's present_key, present_value or qk_matmul_output outputs");
}

// One task per block of query rows of one (batch, head); Y = acc / sum row by row (zeros for a fully masked row, as
// ONNX's reference gives).
void attention_k(KernelContext& ctx) {
  refuse_kv_cache(ctx);
  const Tensor& q = ctx.input(0);
  const Tensor& k = ctx.input(1);
  const Tensor& v = ctx.input(2);
  const AttentionGeometry g = attention_geometry(ctx, q, k, v, optional_input(ctx, 3));
  std::vector<int64_t> y_shape = q.shape();
  y_shape.back() = q.rank() == 4 ? g.v_head : g.q_heads * g.v_head;
  const Tiles tiles = tiles_for(g);
  const int64_t blocks = (g.q_seq + tiles.rows - 1) / tiles.rows;
  dispatch_float(ctx, q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *pq = q.data<T>(), *pk = k.data<T>(), *pv = v.data<T>();
    T* py = ctx.output(0, q.dtype(), y_shape).template data<T>();
    parallel_for(g.batch * g.q_heads * blocks, tiles.rows * g.kv_seq * (g.head + g.v_head),
                 [&](int64_t t0, int64_t t1) {
                   QueryBlock<T> block(g, tiles);
                   for (int64_t t = t0; t < t1; ++t) {
                     block.b = t / (g.q_heads * blocks), block.h = t / blocks % g.q_heads;
                     block.i0 = t % blocks * tiles.rows, block.br = std::min(tiles.rows, g.q_seq - block.i0);
                     block.forward(pq, pk, pv);
                     for (int64_t r = 0; r < block.br; ++r) {
                       T* yi = py + AttentionGeometry::at(g.y_strides, block.b, block.h, block.i0 + r);
                       const T inv = block.sum[r] > 0 ? T(1) / block.sum[r] : T(0);
                       for (int64_t d = 0; d < g.v_head; ++d) yi[d] = block.acc[r * g.v_head + d] * inv;
                     }
                   }
                 });
  });
}

// ai.apart.AttentionGrad(dY, Q, K, V, attn_mask?) → (dQ, dK, dV), the forward's attributes; any output may be
// absent. FlashAttention-2's backward (Algorithm 2) for each block of query rows: the forward again for its softmax
// statistics and its output O (D = rowsum(dY∘O)), then per key tile P = exp(logit − max)/sum, dV_j += Pᵀ·dY,
// dP = dY·V_jᵀ, dS = P∘(dP − D)·slope, dQ += dS·K_j, dK_j += dSᵀ·Q. One task per (batch, KV head), so that a KV
// head's query group accumulates into its dK, dV without races.
void attention_grad_k(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& q = ctx.input(1);
  const Tensor& k = ctx.input(2);
  const Tensor& v = ctx.input(3);
  const AttentionGeometry g = attention_geometry(ctx, q, k, v, optional_input(ctx, 4));
  const Tiles tiles = tiles_for(g);
  dispatch_float(ctx, q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *pg = dy.data<T>(), *pq = q.data<T>(), *pk = k.data<T>(), *pv = v.data<T>();
    auto out = [&](size_t i, const Tensor& like, bool zeroed) -> T* {
      if (ctx.num_outputs() <= i || !ctx.wants_output(i)) return nullptr;
      Tensor& t = ctx.output(i, like.dtype(), like.shape());
      if (zeroed) std::fill(t.data<T>(), t.data<T>() + t.elements(), T(0));  // accumulated over query blocks
      return t.data<T>();
    };
    T *dq = out(0, q, false), *dk = out(1, k, true), *dv = out(2, v, true);
    const int64_t cols = tiles.cols;
    parallel_for(
        g.batch * g.kv_heads, g.group() * g.q_seq * g.kv_seq * (3 * g.head + 3 * g.v_head),
        [&](int64_t t0, int64_t t1) {
          QueryBlock<T> block(g, tiles);
          std::vector<T> dp(static_cast<size_t>(tiles.rows * cols)), dqb(static_cast<size_t>(tiles.rows * g.head));
          std::vector<T> slope(g.softcap > 0 ? dp.size() : 0), delta(static_cast<size_t>(tiles.rows));
          for (int64_t task = t0; task < t1; ++task) {
            block.b = task / g.kv_heads;
            const int64_t kv = task % g.kv_heads;
            for (block.h = kv * g.group(); block.h < (kv + 1) * g.group(); ++block.h)
              for (block.i0 = 0; block.i0 < g.q_seq; block.i0 += tiles.rows) {
                block.br = std::min(tiles.rows, g.q_seq - block.i0);
                block.forward(pq, pk, pv);
                const int64_t y_at = AttentionGeometry::at(g.y_strides, block.b, block.h, block.i0);
                const int64_t q_at = AttentionGeometry::at(g.q_strides, block.b, block.h, block.i0);
                for (int64_t r = 0; r < block.br; ++r) {  // D = rowsum(dY ∘ O), O = acc / sum
                  const T* gi = pg + y_at + r * g.y_strides[2];
                  T dot = 0;
                  for (int64_t d = 0; d < g.v_head; ++d) dot += gi[d] * block.acc[r * g.v_head + d];
                  delta[r] = block.sum[r] > 0 ? dot / block.sum[r] : T(0);
                }
                std::fill(dqb.begin(), dqb.end(), T(0));
                for (int64_t j0 = 0; j0 < block.key_end(); j0 += cols) {
                  const int64_t bc = std::min(cols, block.key_end() - j0);
                  block.logits(pq, pk, j0, bc, slope.empty() ? nullptr : slope.data());
                  T* p = block.s.data();
                  for (int64_t r = 0; r < block.br; ++r) {
                    const T inv = block.sum[r] > 0 ? T(1) / block.sum[r] : T(0);
                    for (int64_t c = 0; c < bc; ++c) {
                      T& x = p[r * cols + c];
                      x = inv == T(0) || x == -std::numeric_limits<T>::infinity() ? T(0)
                                                                                  : std::exp(x - block.max[r]) * inv;
                    }
                  }
                  const int64_t k_at = AttentionGeometry::at(g.k_strides, block.b, kv, j0);
                  const int64_t v_at = AttentionGeometry::at(g.v_strides, block.b, kv, j0);
                  if (dv)
                    gemm<T>(true, false, bc, g.v_head, block.br, T(1), p, cols, pg + y_at, g.y_strides[2], T(1),
                            dv + v_at, g.v_strides[2]);
                  gemm<T>(false, true, block.br, bc, g.v_head, T(1), pg + y_at, g.y_strides[2], pv + v_at,
                          g.v_strides[2], T(0), dp.data(), cols);
                  for (int64_t r = 0; r < block.br; ++r)
                    for (int64_t c = 0; c < bc; ++c) {
                      const int64_t at = r * cols + c;
                      dp[at] = p[at] * (dp[at] - delta[r]) * (slope.empty() ? static_cast<T>(g.scale) : slope[at]);
                    }
                  gemm<T>(false, false, block.br, g.head, bc, T(1), dp.data(), cols, pk + k_at, g.k_strides[2], T(1),
                          dqb.data(), g.head);
                  if (dk)
                    gemm<T>(true, false, bc, g.head, block.br, T(1), dp.data(), cols, pq + q_at, g.q_strides[2], T(1),
                            dk + k_at, g.k_strides[2]);
                }
                if (!dq) continue;
                for (int64_t r = 0; r < block.br; ++r)
                  std::copy_n(dqb.data() + r * g.head, g.head, dq + q_at + r * g.q_strides[2]);
              }
          }
        });
  });
}

}  // namespace

void register_attention_kernels() {
  // Every element: each row of Y (and of dQ) is written; dK and dV are zeroed by the kernel before accumulating.
  register_kernel("Attention", attention_k, OutputWrites::kEvery);
  register_kernel("ai.apart.Attention", attention_k, OutputWrites::kEvery);
  register_kernel("ai.apart.AttentionGrad", attention_grad_k, OutputWrites::kEvery);
}

}  // namespace apart::cpu
