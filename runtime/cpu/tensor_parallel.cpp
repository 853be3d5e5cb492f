// The tensor-parallel collectives of a shard (codegen/tensor_parallel_shard.h) over the executor's TP group, and the
// vocabulary-parallel loss.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/backend.h"
#include "runtime/communicator.h"
#include "runtime/cpu/families.h"
#include "runtime/kernel.h"
#include "plan/training.h"  // tp_sequence_part

namespace apart::cpu {
namespace {

// The shard pass's attribute (codegen/tensor_parallel_shard.h kTpLengthAttr): the whole length of uneven parts.
constexpr const char* kTpLengthAttr = "length";

// The five collectives below are backend-generic: they move bytes only through their backend's copies
// (KernelContext::backend(): the CPU's memcpy, or a device's copies) and the group's collectives, never reading an
// element, so the executor runs them on any backend whose memory the group moves (NCCL under --backend cuda:
// ExecutorOptions::tensor_parallel_on_backend) and on host copies otherwise.

void copy_on_backend(const KernelContext& ctx, const std::byte* from, std::byte* to, int64_t bytes) {
  ctx.backend().copy_on_device(from, to, bytes);
}

// ai.apart.TpCopy (Megatron's f): the input, unchanged; its gradient is all-reduced (by TpAllReduce in the backward).
void tp_copy_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  ctx.backend().copy(x, ctx.output(0, x.dtype(), x.shape()));
}

// ai.apart.TpAllReduce (Megatron's g): the sum of every TP rank's input, the same on each (float32 or float64). Without
// a group (a degree-1 run of a shard) it is the identity.
void tp_allreduce_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  ctx.backend().copy(x, y);
  Communicator* group = ctx.tensor_parallel_group();
  if (group == nullptr || group->size() == 1) return;
  if (x.dtype() == DType::kFloat32) group->allreduce_sum(y.span<float>())->wait();
  else if (x.dtype() == DType::kFloat64) group->allreduce_sum(y.span<double>())->wait();
  else ctx.unsupported("an all-reduce of " + std::string(dtype_name(x.dtype())));
}

// --- Sequence parallelism: a tensor cut along `axis` into one part per TP rank ------------------------------------
// Rank r holds tp_sequence_part(length, degree, r): equal parts when the degree divides the length, else the first
// length mod degree ranks one position more; the shard pass then writes the whole length as the `length` attribute
// (kTpLengthAttr), which an all-gather cannot read off its own part. The communicator's reduce_scatter_sum and
// allgather cut a buffer into size() equal shards: each rank's part goes into a chunk of the largest part's length,
// rank after rank (rank r's [outer, chunk, inner] at r·outer·chunk·inner), its padding zeroed and dropped after.

// A tensor of `whole` shape seen as [outer, length, inner] around `axis`, cut into `degree` parts.
struct AxisCut {
  int64_t outer = 1, length = 1, inner = 1;
  int degree = 1;
  int64_t chunk = 1;  // the largest part's length: each rank's part in the communicator's buffer
  bool even() const { return length % degree == 0; }
  std::pair<int64_t, int64_t> part(int rank) const { return tp_sequence_part(length, degree, rank); }
  int64_t part_length(int rank) const { return part(rank).second - part(rank).first; }
  int64_t chunk_elements() const { return outer * chunk * inner; }
};

int64_t cut_axis(const KernelContext& ctx, size_t rank) {
  if (!ctx.has_attr("axis")) ctx.invalid("no axis attribute");
  return normalize_axis(ctx, ctx.attr_int("axis", 0), static_cast<int64_t>(rank));
}

AxisCut axis_cut(const KernelContext& ctx, const std::vector<int64_t>& whole, int degree) {
  const size_t axis = static_cast<size_t>(cut_axis(ctx, whole.size()));
  AxisCut c;
  c.outer = product(whole, 0, axis);
  c.length = whole[axis];
  c.inner = product(whole, axis + 1);
  c.degree = degree;
  if (c.length < degree)
    ctx.invalid("axis " + std::to_string(axis) + " of length " + std::to_string(c.length) + " leaves some of " +
                std::to_string(degree) + " TP ranks no position (the sequence must be at least the TP degree)");
  if (ctx.has_attr(kTpLengthAttr) && ctx.attr_int(kTpLengthAttr, 0) != c.length)
    ctx.invalid("axis " + std::to_string(axis) + " of length " + std::to_string(c.length) +
                " where the shard pass cut " + std::to_string(ctx.attr_int(kTpLengthAttr, 0)));
  c.chunk = (c.length + degree - 1) / degree;
  return c;
}

int degree_of(const KernelContext& ctx) {
  const Communicator* group = ctx.tensor_parallel_group();
  return group == nullptr ? 1 : group->size();
}

// Part `rank` of `whole` ([outer, length, inner]) to a buffer holding it as [outer, stride, inner] (`to_part`), or
// back; byte offsets into tensors of `element` bytes, one backend copy per outer block.
void move_part(const KernelContext& ctx, const AxisCut& c, int rank, int64_t stride, int64_t element,
               const std::byte* from, std::byte* to, bool to_part) {
  const auto [begin, end] = c.part(rank);
  const int64_t block = (end - begin) * c.inner * element;
  if (block == 0) return;
  for (int64_t o = 0; o < c.outer; ++o) {
    const int64_t in_whole = (o * c.length + begin) * c.inner * element, in_part = o * stride * c.inner * element;
    copy_on_backend(ctx, from + (to_part ? in_whole : in_part), to + (to_part ? in_part : in_whole), block);
  }
}

// `rows` positions of each outer block from a [outer, from_stride, inner] buffer to a [outer, to_stride, inner] one.
void copy_blocks(const KernelContext& ctx, const AxisCut& c, int64_t rows, int64_t element, const std::byte* from,
                 int64_t from_stride, std::byte* to, int64_t to_stride) {
  const int64_t block = rows * c.inner * element;
  if (block == 0) return;
  for (int64_t o = 0; o < c.outer; ++o)
    copy_on_backend(ctx, from + o * from_stride * c.inner * element, to + o * to_stride * c.inner * element, block);
}

std::vector<int64_t> with_axis_length(const KernelContext& ctx, std::vector<int64_t> shape, int64_t length) {
  shape[static_cast<size_t>(cut_axis(ctx, shape.size()))] = length;
  return shape;
}

int rank_in(const KernelContext& ctx) {
  const Communicator* group = ctx.tensor_parallel_group();
  return group == nullptr ? 0 : group->rank();
}

// ai.apart.TpScatter (x replicated, any dtype): this rank's part along `axis`, no message. Gradient: TpAllGather.
void tp_scatter_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const AxisCut c = axis_cut(ctx, x.shape(), degree_of(ctx));
  const int rank = rank_in(ctx);
  Tensor& y = ctx.output(0, x.dtype(), with_axis_length(ctx, x.shape(), c.part_length(rank)));
  if (y.elements() == 0) return;
  move_part(ctx, c, rank, c.part_length(rank), dtype_size(x.dtype()), x.raw(), y.raw(), true);
}

// ai.apart.TpAllGather: every rank's part concatenated along `axis` in rank order, the same on each rank (the whole
// length is `length` when the parts are uneven). Gradient: TpReduceScatter (attribute backward = "reduce_scatter",
// the output feeds a TP region) or TpScatter ("scatter", the output feeds replicated computation).
void tp_allgather_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int degree = degree_of(ctx);
  const int64_t mine = x.shape()[static_cast<size_t>(cut_axis(ctx, x.shape().size()))];
  const std::vector<int64_t> shape = with_axis_length(ctx, x.shape(), ctx.attr_int(kTpLengthAttr, mine * degree));
  if (degree == 1) {
    if (shape != x.shape()) ctx.invalid("an all-gather of one rank whose part is not the whole");
    return ctx.backend().copy(x, ctx.output(0, x.dtype(), shape));
  }
  const AxisCut c = axis_cut(ctx, shape, degree);
  const int rank = rank_in(ctx);
  if (c.part_length(rank) != mine)
    ctx.invalid("rank " + std::to_string(rank) + "'s part holds " + std::to_string(mine) + " positions of " +
                std::to_string(c.length) + ", not " + std::to_string(c.part_length(rank)));
  Tensor& y = ctx.output(0, x.dtype(), shape);
  if (y.elements() == 0) return;
  Communicator& group = *ctx.tensor_parallel_group();
  const int64_t element = dtype_size(x.dtype());
  if (x.dtype() == DType::kFloat32) {
    // With one outer block and equal parts the output is the parts in rank order: gathered in place; else through a
    // buffer of the backend's, rearranged after.
    const bool in_place = c.outer == 1 && c.even();
    Tensor ranks = in_place ? y : ctx.backend().empty(DType::kFloat32, {degree * c.chunk_elements()});
    if (!in_place && !c.even()) ctx.backend().fill_zero_bytes(ranks);
    copy_blocks(ctx, c, mine, element, x.raw(), mine, ranks.raw() + rank * c.chunk_elements() * element, c.chunk);
    group.allgather(ranks.span<float>())->wait();
    if (in_place) return;
    for (int r = 0; r < degree; ++r)
      move_part(ctx, c, r, c.chunk, element, ranks.raw() + r * c.chunk_elements() * element, y.raw(), false);
  } else if (x.dtype() == DType::kFloat64) {  // no float64 all-gather: the sum over zeroed other parts, exact
    ctx.backend().fill_zero_bytes(y);
    move_part(ctx, c, rank, mine, element, x.raw(), y.raw(), false);
    group.allreduce_sum(y.span<double>())->wait();
  } else {
    ctx.unsupported("an all-gather of " + std::string(dtype_name(x.dtype())));
  }
}

// ai.apart.TpReduceScatter: this rank's part along `axis` of the sum of every rank's x. Gradient: TpAllGather.
void tp_reduce_scatter_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int degree = degree_of(ctx);
  const AxisCut c = axis_cut(ctx, x.shape(), degree);
  const int rank = rank_in(ctx);
  const int64_t mine = c.part_length(rank);
  Tensor& y = ctx.output(0, x.dtype(), with_axis_length(ctx, x.shape(), mine));
  if (degree == 1 || y.elements() == 0) return ctx.backend().copy(x, y);
  Communicator& group = *ctx.tensor_parallel_group();
  const int64_t element = dtype_size(x.dtype());
  if (x.dtype() == DType::kFloat32) {
    Tensor buffer = ctx.backend().empty(x.dtype(), {degree * c.chunk_elements()});  // x's parts in rank order
    if (!c.even()) ctx.backend().fill_zero_bytes(buffer);
    for (int r = 0; r < degree; ++r)
      move_part(ctx, c, r, c.chunk, element, x.raw(), buffer.raw() + r * c.chunk_elements() * element, true);
    group.reduce_scatter_sum(buffer.span<float>())->wait();
    // This rank's chunk, [outer, chunk, inner], without its padding.
    copy_blocks(ctx, c, mine, element, buffer.raw() + rank * c.chunk_elements() * element, c.chunk, y.raw(), mine);
  } else if (x.dtype() == DType::kFloat64) {  // no float64 reduce-scatter: the whole sum, then this rank's part
    Tensor buffer = ctx.backend().empty(x.dtype(), {x.elements()});
    ctx.backend().copy(x, buffer);
    group.allreduce_sum(buffer.span<double>())->wait();
    move_part(ctx, c, rank, mine, element, buffer.raw(), y.raw(), true);
  } else {
    ctx.unsupported("a reduce-scatter of " + std::string(dtype_name(x.dtype())));
  }
}

// --- The vocabulary-parallel loss (Megatron's parallel cross-entropy) ---------------------------------------------

// The shard pass's attribute (codegen/tensor_parallel_shard.h kVocabStartAttr): this rank's first vocabulary row.
constexpr const char* kVocabStartAttrName = "vocab_start";

// What the loss reads: scores [N, C] (this rank's columns [start, start + C) of the vocabulary), labels [N].
struct VocabRows {
  int64_t n = 0, columns = 0, start = 0;
  std::vector<int64_t> labels;
  std::vector<bool> counted;  // not ignore_index
  double count = 0;           // rows counted
  std::string reduction;
};
VocabRows vocab_rows(const KernelContext& ctx, size_t scores_input, size_t labels_input) {
  const Tensor& scores = ctx.input(scores_input);
  const Tensor& labels = ctx.input(labels_input);
  if (scores.rank() != 2) ctx.invalid("scores must be [N, C]");
  VocabRows v;
  v.n = scores.dim(0);
  v.columns = scores.dim(1);
  v.start = ctx.attr_int(kVocabStartAttrName, 0);
  v.reduction = ctx.attr_string("reduction", "mean");
  if (v.reduction != "mean" && v.reduction != "sum" && v.reduction != "none") ctx.invalid("unknown reduction '" + v.reduction + "'");
  if (labels.elements() != v.n) ctx.invalid("labels do not match the scores' N");
  v.labels = labels.to_int64s();
  const bool has_ignore = ctx.has_attr("ignore_index");
  const int64_t ignore = ctx.attr_int("ignore_index", 0);
  v.counted.assign(static_cast<size_t>(v.n), true);
  for (int64_t i = 0; i < v.n; ++i) {
    if (has_ignore && v.labels[static_cast<size_t>(i)] == ignore) v.counted[static_cast<size_t>(i)] = false;
    else v.count += 1;
  }
  return v;
}

// ai.apart.VocabParallelCrossEntropy(scores, labels) → (loss, lse): each row's max all-gathered (a stabilizer: any
// common value gives the same lse), Σ exp(z − max) and the target's logit (from the rank whose columns hold it, 0
// elsewhere) summed over the group in one float64 all-reduce; lse = max + log Σ; loss_i = lse_i − z_target. Every rank
// gets the same loss. Labels are checked against the whole vocabulary (vocab_size; C · degree when absent).
void vocab_parallel_cross_entropy_k(KernelContext& ctx) {
  const Tensor& scores = ctx.input(0);
  const VocabRows v = vocab_rows(ctx, 0, 1);
  Communicator* group = ctx.tensor_parallel_group();
  const int degree = group == nullptr ? 1 : group->size();
  const int rank = group == nullptr ? 0 : group->rank();
  const int64_t vocab = ctx.attr_int("vocab_size", v.columns * degree);  // the whole vocabulary
  for (int64_t i = 0; i < v.n; ++i)
    if (v.counted[static_cast<size_t>(i)] && (v.labels[static_cast<size_t>(i)] < 0 || v.labels[static_cast<size_t>(i)] >= vocab))
      ctx.invalid("label " + std::to_string(v.labels[static_cast<size_t>(i)]) + " is out of range for " + std::to_string(vocab) + " classes");
  dispatch_float(ctx, scores.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* z = scores.data<T>();
    std::vector<float> maxes(static_cast<size_t>(v.n * degree), -std::numeric_limits<float>::infinity());
    float* mine = maxes.data() + rank * v.n;
    for (int64_t i = 0; i < v.n; ++i)
      for (int64_t c = 0; c < v.columns; ++c) mine[i] = std::max(mine[i], static_cast<float>(z[i * v.columns + c]));
    if (degree > 1) group->allgather(std::span<float>(maxes))->wait();
    std::vector<double> top(static_cast<size_t>(v.n), -std::numeric_limits<double>::infinity());
    for (int r = 0; r < degree; ++r)
      for (int64_t i = 0; i < v.n; ++i) top[static_cast<size_t>(i)] = std::max(top[static_cast<size_t>(i)], static_cast<double>(maxes[static_cast<size_t>(r * v.n + i)]));
    std::vector<double> sums(static_cast<size_t>(2 * v.n), 0.0);  // [Σ exp(z − max) | the target's logit]
    for (int64_t i = 0; i < v.n; ++i) {
      double sum = 0;
      for (int64_t c = 0; c < v.columns; ++c) sum += std::exp(static_cast<double>(z[i * v.columns + c]) - top[static_cast<size_t>(i)]);
      sums[static_cast<size_t>(i)] = sum;
      const int64_t local = v.labels[static_cast<size_t>(i)] - v.start;
      if (v.counted[static_cast<size_t>(i)] && local >= 0 && local < v.columns)
        sums[static_cast<size_t>(v.n + i)] = static_cast<double>(z[i * v.columns + local]);
    }
    if (degree > 1) group->allreduce_sum(std::span<double>(sums))->wait();
    Tensor& lse = ctx.output(1, scores.dtype(), {v.n});
    std::vector<double> loss(static_cast<size_t>(v.n), 0.0);
    double total = 0;
    for (int64_t i = 0; i < v.n; ++i) {
      const double l = top[static_cast<size_t>(i)] + std::log(sums[static_cast<size_t>(i)]);
      lse.data<T>()[i] = static_cast<T>(l);
      if (!v.counted[static_cast<size_t>(i)]) continue;
      loss[static_cast<size_t>(i)] = l - sums[static_cast<size_t>(v.n + i)];
      total += loss[static_cast<size_t>(i)];
    }
    if (v.reduction == "none") {
      Tensor& y = ctx.output(0, scores.dtype(), ctx.input(1).shape());
      for (int64_t i = 0; i < v.n; ++i) y.data<T>()[i] = static_cast<T>(loss[static_cast<size_t>(i)]);
    } else {
      const double value = v.reduction == "sum" ? total : v.count == 0 ? std::numeric_limits<double>::quiet_NaN() : total / v.count;
      ctx.output(0, scores.dtype(), {}).template data<T>()[0] = static_cast<T>(value);
    }
  });
}

// ai.apart.VocabParallelCrossEntropyGrad(dloss, scores, labels, lse) → dscores = (exp(z − lse) − [c is the target])
// × dloss (÷ the rows counted under mean; per row under none), 0 on ignored rows. Local to this rank's columns.
void vocab_parallel_cross_entropy_grad_k(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& scores = ctx.input(1);
  const Tensor& lse = ctx.input(3);
  const VocabRows v = vocab_rows(ctx, 1, 2);
  if (lse.elements() != v.n) ctx.invalid("lse must hold one value per row of the scores");
  dispatch_float(ctx, scores.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* z = scores.data<T>();
    const T* l = lse.template data<T>();
    const T* g = dy.template data<T>();
    Tensor& dx = ctx.output(0, scores.dtype(), scores.shape());
    T* out = dx.data<T>();
    for (int64_t i = 0; i < v.n; ++i) {
      if (!v.counted[static_cast<size_t>(i)]) {  // an ignored row: no gradient
        std::fill(out + i * v.columns, out + (i + 1) * v.columns, T(0));
        continue;
      }
      const int64_t target = v.labels[static_cast<size_t>(i)] - v.start;
      const double coefficient = v.reduction == "none" ? static_cast<double>(g[i])
                                 : v.reduction == "sum" ? static_cast<double>(g[0])
                                                        : static_cast<double>(g[0]) / v.count;
      for (int64_t c = 0; c < v.columns; ++c) {
        const double p = std::exp(static_cast<double>(z[i * v.columns + c]) - static_cast<double>(l[i]));
        out[i * v.columns + c] = static_cast<T>((p - (c == target ? 1.0 : 0.0)) * coefficient);
      }
    }
  });
}

}  // namespace

void register_tensor_parallel_kernels() {
  register_kernel("ai.apart.TpCopy", tp_copy_k);
  register_kernel("ai.apart.TpAllReduce", tp_allreduce_k);
  register_kernel("ai.apart.TpScatter", tp_scatter_k);
  register_kernel("ai.apart.TpAllGather", tp_allgather_k);
  register_kernel("ai.apart.TpReduceScatter", tp_reduce_scatter_k);
  register_kernel("ai.apart.VocabParallelCrossEntropy", vocab_parallel_cross_entropy_k);
  register_kernel("ai.apart.VocabParallelCrossEntropyGrad", vocab_parallel_cross_entropy_grad_k);
}

}  // namespace apart::cpu

namespace apart {

bool is_tensor_parallel_collective(std::string_view op) {
  return op == "ai.apart.TpCopy" || op == "ai.apart.TpAllReduce" || op == "ai.apart.TpScatter" ||
         op == "ai.apart.TpAllGather" || op == "ai.apart.TpReduceScatter";
}

}  // namespace apart
