// One tensor-parallel rank's shard of a stage's forward graph (Megatron-LM, Shoeybi et al. 2019 §3): column-split
// first linears, row-split second linears, heads divided, and the two collectives as explicit ai.apart nodes.
//
// What the shard of rank r of t holds, region by region (partition/tensor_parallel.h finds the regions; plan.json
// carries their layout, plan/plan.h PlanTpRegion):
//   - a column linear's weight (and bias) keeps 1/t of its output columns. When the output is cut into p equal pieces
//     downstream (a fused QKV weight [h, 3h] read by one Split into q, k and v), each piece is cut alike, so rank r
//     holds its heads of q, of k and of v: columns [i·L/p + r·L/(p·t), i·L/p + (r+1)·L/(p·t)) for i < p
//     (tp_shard_ranges, the one formula the runtime also gathers by);
//   - a row linear's weight keeps its rows [r·L/t, (r+1)·L/t): its output is each rank's partial sum;
//   - a Reshape whose output is split along axis j takes the target shape's entry j divided by t (the folded head
//     count: [0, 0, 12, 64] → [0, 0, 6, 64] at t = 2; a target computed at run time, Shape → Gather → Concat as
//     torch exports write it, is divided by [1, …, t, …, 1] by an inserted Div, its entry j being the positive
//     count); so does an Expand's target (repeat_kv over split kv heads, folded or computed); a Split along the
//     split axis takes its sizes divided by t; a Slice along another axis (the shifted loss's logits[:, :-1],
//     rotate_half's halves) slices each rank's part alike;
//   - ai.apart.TpCopy(x) before the column linears of each region input x: identity forward, all-reduce of the
//     gradient backward (Megatron's f);
//   - ai.apart.TpAllReduce after the row linear: the partial sums all-reduced forward, identity backward (g).
// A Dropout on a split value is renamed per rank ("<name>/tp_rank_<r>"), which gives it the rank's own random stream
// (Megatron's model-parallel RNG); a Dropout on a replicated value draws the same mask on every rank.
// Everything else (norms, residuals, position embeddings) is replicated: every rank computes it whole, with the same
// values.
//
// Vocabulary regions (Megatron's VocabParallelEmbedding and parallel cross-entropy), the vocabulary V cut into t row
// ranges of ⌈V/t⌉, the last rank the rest (tp_vocabulary_rows):
//   - an embedding Gather(table [V, H], ids) reads this rank's rows: ids outside its range are masked (index 0, row
//     zeroed), then ai.apart.TpAllReduce sums the ranks' rows, so each id's row comes from the rank that holds it;
//   - an LM head (a column linear whose weight is [H, V], or Transpose([V, H]) of a tied embedding table, or Gemm's
//     transB [V, H]) keeps V/t output columns, its input read through TpCopy;
//   - a SoftmaxCrossEntropyLoss of those logits ([N, V/t] per rank, no class weights, no log_prob output read)
//     becomes ai.apart.VocabParallelCrossEntropy (row max and sum of exponentials over the group, the target logit
//     from the rank holding it), whose backward needs no message; any other reader of the split logits reads them
//     all-gathered. A tied table read by the embedding and the LM head in one stage is cut once.
// A vocabulary that leaves a rank no row, or an uneven one whose logits a Reshape with a target computed at run time
// reads, is left whole (TpShard::replicated says so, naming the rows), and so is a table another vocabulary region of
// the stage leaves whole.
//
// Under sequence parallelism (TpSequence::kSharded; Korthikanti et al., MLSys'23 §4.2.2) the values between regions
// are cut along the sequence instead of replicated:
//   - a region's closing all-reduce becomes ai.apart.TpReduceScatter along the sequence axis (a row Gemm's bias
//     is added after it, on the part), so each rank holds 1/t of the tokens of the region's output;
//   - what follows runs on that part while it is position-wise (elementwise ops, Dropout, LayerNormalization and
//     reductions, Softmax, over other axes): a whole operand with the sequence axis goes through ai.apart.TpScatter
//     (this rank's part; gradient all-gathered), one broadcast over it (a norm's scale, a bias) through TpCopy, so
//     its gradient, a partial sum over this rank's tokens, is all-reduced (Megatron all-reduces these params'
//     gradients over the TP group); a Dropout on a part draws per rank;
//   - a region input held in parts is all-gathered (ai.apart.TpAllGather, gradient reduce-scattered) in place of
//     its TpCopy; any other reader of a part (the LM head, a Reshape, a stage output) reads it all-gathered with a
//     "scatter" backward (its gradient is whole on every rank). A stage's inputs and outputs stay whole.
// docs/runtime.md "Tensor-parallel stages" documents the ops.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace apart {

struct PlanDocument;  // plan/plan.h
struct PlanTpRegion;  // plan/plan.h

inline constexpr const char* kTpCopyOp = "TpCopy";            // ai.apart: f (identity; backward all-reduce)
inline constexpr const char* kTpAllReduceOp = "TpAllReduce";  // ai.apart: g (all-reduce; backward identity)
// Sequence parallelism, each along its `axis` attribute:
inline constexpr const char* kTpAllGatherOp = "TpAllGather";          // parts concatenated; backward per kTpBackwardAttr
inline constexpr const char* kTpReduceScatterOp = "TpReduceScatter";  // part r of the sum; backward all-gather
inline constexpr const char* kTpScatterOp = "TpScatter";              // part r of a replicated x; backward all-gather
// The whole length along `axis` of a value held in sequence parts that the degree does not divide (absent when it
// does): parts are uneven then (tp_sequence_part), so an all-gather cannot read the whole length off its part.
inline constexpr const char* kTpLengthAttr = "length";
// TpAllGather's backward: "reduce_scatter" (its output feeds a TP region: each rank's gradient is a partial sum) or
// "scatter" (replicated computation: each rank's gradient is the whole one).
inline constexpr const char* kTpBackwardAttr = "backward";
inline constexpr const char* kTpBackwardReduceScatter = "reduce_scatter";
inline constexpr const char* kTpBackwardScatter = "scatter";
// The vocabulary-parallel loss (docs/runtime.md): (scores [N, this rank's rows], labels [N]) → (loss, lse [N]),
// attributes vocab_start (this rank's first row), vocab_size, ignore_index, reduction; its gradient is the second op, (dloss, scores, labels,
// lse) → dscores, with the same attributes.
inline constexpr const char* kVocabParallelCrossEntropyOp = "VocabParallelCrossEntropy";
inline constexpr const char* kVocabParallelCrossEntropyGradOp = "VocabParallelCrossEntropyGrad";
inline constexpr const char* kVocabStartAttr = "vocab_start";
inline constexpr const char* kVocabSizeAttr = "vocab_size";  // the whole vocabulary (labels are checked against it)

// What a region is: linears (attention, MLP: column then row), or a vocabulary region.
enum class TpRegionRole : uint8_t { kLinears, kEmbedding, kLmHead };

// A region as plan.json lays it out (PlanTpRegion's shard fields), by node and value names.
struct TpShardRegion {
  TpRegionRole role = TpRegionRole::kLinears;
  std::string name;
  std::vector<std::string> column_tasks, row_tasks;
  std::vector<std::string> inputs;         // replicated values the column linears read
  std::vector<std::string> sliced_inputs;  // params/constants read sliced along the split axis
  std::vector<std::pair<std::string, int>> split_values;  // value → the axis each rank holds 1/t of
  std::string end_value;  // the row linear's output (a partial sum); an embedding's Gather output; the LM head's logits
};

// A param the shard holds a slice of: its whole shape, the axis cut, and the pieces that axis is cut into first.
struct TpShardedParam {
  std::string name;
  std::vector<int64_t> shape;  // whole
  int axis = 0;
  int64_t pieces = 1;
  bool vocabulary = false;  // rows cut by tp_vocabulary_rows (uneven when the degree does not divide them)
};

struct TpShard {
  onnx::ModelProto model;
  std::vector<TpShardedParam> params;  // in initializer order
  int regions = 0;                     // regions split in this stage
  bool sequence_sharded = false;       // some values between regions are held in sequence parts (TpSequence)
  // Regions a stage boundary cuts (some of their linears in another stage): left whole, computed on every TP rank
  // (the same values, no memory saved); the stage on the other side of the cut leaves its part whole too. A vocabulary
  // region the degree does not divide is listed here too, with its rows ("/wte (50257 rows)").
  std::vector<std::string> replicated;
};

// The [begin, end) ranges along an axis of `length` that rank `rank` of `degree` holds when the axis is cut into
// `pieces` equal pieces, each cut into `degree` equal parts. InvalidModel unless length divides by pieces × degree.
std::vector<std::pair<int64_t, int64_t>> tp_shard_ranges(int64_t length, int64_t pieces, int degree, int rank);
// The rows [begin, end) of a vocabulary of `rows` that rank `rank` of `degree` holds: ⌈rows/degree⌉ each, the last
// rank what is left (Megatron-LM pads the table to a multiple instead). InvalidModel when a rank would hold none.
std::pair<int64_t, int64_t> tp_vocabulary_rows(int64_t rows, int degree, int rank);
// The sequence parts each rank holds: tp_sequence_part (plan/training.h, which the runtime's kernels read too).
// What rank `rank` holds of `param` along its axis: tp_vocabulary_rows or tp_shard_ranges (cutting and gathering).
std::vector<std::pair<int64_t, int64_t>> tp_param_ranges(const TpShardedParam& param, int degree, int rank);

// The regions plan.json lays out (its tensor_parallel.regions: attention and MLP regions with their shard layout,
// the vocabulary regions by the embedding's Gather output and the LM head's logits), as the shard pass reads them:
// what apart run cuts each TP stage by, and what `apart check` cuts them by to see that every rank's shard holds.
std::vector<TpShardRegion> tp_shard_regions(const PlanDocument& plan);
TpShardRegion tp_shard_region(const PlanTpRegion& region);  // one of them

// Rank `rank` of `degree`'s shard of `stage` (a stage's forward, as stage_K.onnx holds it). Regions none of whose
// linears are in the stage are skipped; one cut by a stage boundary stays whole (TpShard::replicated). The sliced
// initializers must hold
// their data inline (raw_data or float_data; the runtime loads external data first): InvalidModel otherwise.
// Unsupported, naming the node, for a layout this pass does not rewrite (a Slice along the split axis, a weight
// behind anything but a Transpose of an initializer, Split sizes computed at run time).
// `weights`: kCut slices the initializers' data; kShapesOnly gives the sliced initializers their shard's dims and no
// data (a graph-only model's plan, checked for whether every stage shards and its shapes infer).
// `sequence`: kSharded cuts the values between regions along the sequence (sequence parallelism, above); the axis
// is the end value's first axis before its last whose length at batch 1 exceeds 1 (the sequence of [B, S, H], the
// tokens of [B·S, H]); Unsupported, naming the value, when that length does not divide by the degree.
enum class TpWeights : uint8_t { kCut, kShapesOnly };
enum class TpSequence : uint8_t { kWhole, kSharded };
TpShard shard_stage_for_tensor_parallel(const onnx::ModelProto& stage, const std::vector<TpShardRegion>& regions,
                                        int degree, int rank, TpWeights weights = TpWeights::kCut,
                                        TpSequence sequence = TpSequence::kWhole);

// A region the shard pass refuses to cut, and why (the Unsupported's text, naming the node).
struct TpRefusal {
  std::string region;
  int degree = 0;  // the first of the degrees asked that refuses it
  std::string why;
};
// The regions of `model` (the whole model as apart partition imports it) that the shard pass refuses at one of
// `degrees`, each under its sequence mode, shapes only (weights are never read or copied). The one home of what a TP
// layout needs: apart run and apart check refuse a stage for these same reasons, and apart partition never splits a
// region listed here (driver/compile.cpp bans its seeds), so no --tp plan needs a layout apart run refuses.
std::vector<TpRefusal> tp_refused_regions(const onnx::ModelProto& model, const std::vector<TpShardRegion>& regions,
                                          const std::vector<std::pair<int, TpSequence>>& degrees);

}  // namespace apart
