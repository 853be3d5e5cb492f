// Megatron-style tensor-parallel regions found in the task graph (detection only; Shoeybi et al. 2019, §3).
//
// What is matched. A forward pass over the tasks in topological order gives every value one of three states:
// replicated (every rank of a TP group holds all of it), split (each rank holds 1/t of one axis) or partial (each
// rank holds a summand; an all-reduce makes it replicated again, and a consumer always sees it replicated). The
// seeds of split state are:
//   - a *linear*: MatMul(x, W) with W [in, out] a param (directly, or through constant Transpose/Identity/Cast
//     tasks of one param, as tied heads write it), or Gemm(x, W[, C]) with transA = 0. With x replicated it is a
//     *column* split: each rank holds W[:, its columns], and its output is split along the last axis.
//   - an *embedding*: Gather(T, ids) with T a [V, h] param, axis 0 and batch ids. Each rank holds V/t rows and looks
//     up only the ids in its range (zeros elsewhere): the output is partial, one all-reduce (vocabulary split).
// Split state then flows through the ops below, each listed with why it is safe along the split axis a:
//   - pointwise ops (Relu, Gelu, Tanh, Erf, Sigmoid, Exp, Sqrt, Cast, Dropout, …; Add, Sub, Mul, Div, Pow, Where,
//     Min, Max, Clip): output element i reads input element i only. Operands that are split must be split along
//     the same (broadcast-aligned) axis with the full size. A replicated operand is either broadcast along a (size
//     1 there, or of lower rank) — allowed only when it needs no gradient (a mask, a scalar), since its gradient
//     would be a partial sum on every rank — or full-size along a, when each rank reads its slice: allowed for
//     constants, for params read by this task alone (a column linear's bias, sliced with the weight's columns) and
//     for anything that needs no gradient. These operands are listed as the region's `sliced_inputs`.
//   - Transpose: moves a by the permutation. Reshape, Flatten, Squeeze, Unsqueeze (element order kept): a maps to
//     the output axis j where the elements before a and before j agree in count (size-1 axes skipped) and either
//     out[j] divides in[a] (splitting a into (out[j], …): the split stays on the outer factor, [B,S,h] →
//     [B,S,heads,hd] splits heads) or in[a] divides out[j] (merging a with the axes after it). A contiguous chunk
//     of a is then a contiguous chunk of j. Any other reshape mixes a with the axes around it and is refused.
//   - Softmax/LogSoftmax whose axis (and every axis after it, the opset < 13 reading; absent axis read as 1) is not
//     a, Reduce* over axes not including a: each rank reduces over axes it holds whole. Softmax over the key axis
//     with heads split is safe; ReduceMean over the hidden axis with hidden split is not.
//   - MatMul of two split operands along the same batch (leading, not the last two) axis: each rank multiplies its
//     own heads. With the split on a contraction axis it would be a partial sum of activations: refused.
//   - Split along a of a value still *free* — fresh out of a column linear through pointwise ops only, each with
//     one consumer, read by one Split. Such a value's column order is ours to choose (the weight's columns can be
//     permuted), so each piece is split evenly: a fused [h, 3h] QKV weight gives every rank its heads of q, of k
//     and of v, as Megatron lays it out. A value out of a reshape is not free: splitting it would give the pieces to
//     different ranks unevenly. Slices along a are refused (the shard pass cuts Split sizes, not Slice ranges);
//     Split/Slice along another axis pass the split through (rotate_half's halves of the head dim).
//   - Concat along another axis of operands all split alike along a (rotate_half); Expand that keeps a's size
//     (repeat_kv over split kv heads; its folded target's entry is divided by the degree); opset 23's
//     RotaryEmbedding and Attention over [B, heads, S, d] split along the heads (Attention: q, k, v all split, a
//     mask broadcast over the heads, no KV cache).
//   - a linear whose x is split along its last (contraction) axis: a *row* split (each rank holds W[its rows, :]);
//     the output is partial and ends the region with one all-reduce. A Gemm's C is added after the all-reduce
//     (Megatron's RowParallelLinear).
//   - SoftmaxCrossEntropyLoss of scores split along the class axis: Megatron's vocabulary-parallel cross-entropy
//     (per-token max, sum of exponentials and target logit all-reduced; its log_prob output must be unused).
// Anything else reading a split value (LayerNorm, a reduction over a, a Concat along a, Gather, a graph output that is
// not an LM head's logits, …) fails the whole region: its seeds become replicated and the pass reruns until no region
// fails. So a pattern that does not match exactly is left replicated, never split wrongly.
//
// A region is the union of the seeds whose split values meet (q, k and v at the score MatMul). It is kept as:
//   - attention: ≥ 1 column linears, one row linear, a MatMul over split heads; heads bound the TP degree;
//   - MLP: ≥ 1 column linears, one row linear, no such MatMul;
//   - embedding: one vocabulary-split Gather;
//   - LM head: one column linear with no row linear whose split logits leave as a graph output (all-gathered) or
//     feed the vocabulary-parallel loss, where out = the largest V of the embeddings' tables or W is an embedding's
//     table (tied).
// Params of attention and MLP linears must be read by that linear alone. Every other batch task is replicated.
//
// What a runtime splitting a region must also do (not checked here): shape operands were folded at import to the
// full sizes ([0, 0, 12, 64]), so each rank's Reshape targets take the split dim divided by t; dropout inside a
// region draws from a per-rank stream (Megatron's model-parallel RNG).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "graph/task_graph.h"
#include "plan/training.h"  // TpRegionKind, TpRole, kTpDegrees: the vocabulary plan.json shares

namespace apart {

// How the region's end value becomes whole again.
enum class TpClosing : uint8_t {
  kAllReduce,          // partial sums (row linear, embedding): one all-reduce forward
  kAllGather,          // split logits that leave the model (an LM head without a loss)
  kVocabParallelLoss,  // split scores into cross-entropy: three per-token all-reduces
};
std::string_view tp_closing_name(TpClosing c);  // "all-reduce", "all-gather", "vocab-parallel-loss"

struct TpRegion {
  TpRegionKind kind = TpRegionKind::kMlp;
  std::string name;                   // the tasks' common node-name scope ("/blocks.3/attn"), else the first task's name
  std::vector<TaskId> tasks;          // topological order
  std::vector<TaskId> column_tasks;   // column-split linears (the LM head's linear too)
  std::vector<TaskId> row_tasks;      // the row-split linear (attention, MLP)
  // The replicated values the column linears read. Backward, the gradient of each is a partial sum: one all-reduce
  // per value (q, k, v of one input: one; T5 cross-attention: two). Empty for an embedding (its ids need none).
  std::vector<ValueId> inputs;
  ValueId end_value;                  // the value whose all-reduce (or all-gather, or loss) ends the region
  TpClosing closing = TpClosing::kAllReduce;
  // Bytes the closing collective carries per sample (the end value's bytes in the graph's dtype, per sample; for
  // the vocabulary-parallel loss 3 floats per token).
  double end_bytes_per_sample = 0;
  int64_t split_units = 0;            // gcd of every split axis's size in the region: what a degree must divide
  std::string bounded_by;             // what split_units counts: "12 heads", "3072 ffn features", "50257 vocabulary rows"
  std::vector<int> degrees;           // the kTpDegrees dividing split_units (1 always; a vocabulary: all, padded)
  int64_t heads = 0;                  // attention: the heads the score MatMul runs over
  // Attention: the core selective recomputation re-runs (Korthikanti et al. 2023 §4.2), the score MatMul through the
  // context MatMul (scale, mask, softmax, dropout between): topological; empty for the other kinds.
  std::vector<TaskId> core_tasks;
  // Params and constants read sliced along the split axis (a column linear's bias, T5's position bias).
  std::vector<ValueId> sliced_inputs;
  // Every value of the region each rank holds a slice of, with the axis split (what codegen shards by), by value id.
  std::vector<std::pair<ValueId, int>> split_values;
  // Other regions reading the same weight param (a tied LM head and its embeddings), by index into regions.
  std::vector<size_t> shares_weight_with;
  bool tied() const { return !shares_weight_with.empty(); }
};

struct TensorParallelRegions {
  std::vector<TpRegion> regions;     // by first task, topological
  std::vector<TpRole> roles;         // per task (TaskId)
  std::vector<int32_t> region_of;    // per task: index into regions, -1 outside every region
  // Replicated batch tasks fed (through replicated tasks) by a region's end and feeding a region's input: the
  // norms, residual adds and dropouts that sequence parallelism would shard along the sequence. Topological.
  std::vector<TaskId> between_regions;
  // The sequence length sequence parallelism cuts (0 when unknown): the first axis before the last of the attention
  // and MLP regions' end values longer than 1 at batch 1, as the shard pass reads it (the largest over regions).
  int64_t sequence = 0;

  size_t count(TpRegionKind kind) const;
  // "12 attention, 12 MLP, embedding, LM head (tied)"; "none" when no region was found.
  std::string summary() const;
};

// Finds the regions. `graph_batch`: the samples the graph's shapes are bound at (bytes per sample divide by it);
// the graph must be finalized with constants classified (as the importer leaves it). Deterministic.
// `banned_seeds`: tasks that start no region (their region's other tasks stay replicated too), as for regions apart
// run cannot cut (AtomicOptions::tp_banned_seeds).
TensorParallelRegions find_tensor_parallel_regions(const TaskGraph& graph, int64_t graph_batch = 1,
                                                   const std::vector<TaskId>& banned_seeds = {});
// The seeds of `region` (its column linears, an embedding's Gather): what banning it bans.
std::vector<TaskId> tp_region_seeds(const TpRegion& region);

}  // namespace apart
