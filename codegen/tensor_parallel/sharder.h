// The shard pass's one object (codegen/tensor_parallel_shard.h states the rules): the stage being rewritten and what
// the rules have cut so far. Internal to apart_autodiff; its methods live one file per rule set:
//   sharder_core.cpp        the stage's indexes, cutting initializers, types, assembling the shard (finish)
//   sharder_linear.cpp      attention and MLP regions: column and row linears, shape operands, TpCopy/TpAllReduce
//   sharder_vocabulary.cpp  embeddings, LM heads and the vocabulary-parallel loss
//   sharder_sequence.cpp    sequence parallelism between regions
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "codegen/tensor_parallel_shard.h"

namespace apart::tp_shard {

using onnx::NodeProto;
using onnx::TensorProto;

// A 1-D int64 initializer holding `values`.
TensorProto int64_tensor(const std::string& name, const std::vector<int64_t>& values);
// An int64 tensor's values; Unsupported when it is not int64 (`what` names it).
std::vector<int64_t> int64_values(const TensorProto& t, const std::string& what);
// Whether `op` moves or reads a split value's layout (a chain of elementwise ops stops there).
bool shape_like(const std::string& op);

class Sharder {
 public:
  Sharder(const onnx::ModelProto& stage, int degree, int rank, TpWeights weights, TpSequence sequence);
  // This pass before any region is cut, at another degree and sequence mode (the stage read once).
  Sharder at(int degree, TpSequence sequence) const {
    Sharder s = *this;
    s.degree_ = degree;
    s.sequence_ = sequence;
    return s;
  }
  // Whether the stage holds the whole region; one cut by a stage boundary is noted and left whole, and so is a
  // vocabulary region the degree does not divide, laid out otherwise than this pass cuts, or whose table another
  // vocabulary region leaves whole (noted with why).
  bool present(const TpShardRegion& r);
  // A table that a vocabulary region of the stage leaves whole stays whole for every region reading it (a cut table
  // read whole would give wrong rows): found before any region is cut.
  void keep_shared_tables_whole(const std::vector<TpShardRegion>& regions);
  // Cuts region `r` (the plan's index-th): its linears, or its vocabulary.
  void shard(const TpShardRegion& r, size_t index);
  // The shard: collectives in place, sequence parts (TpSequence::kSharded), the sliced params listed.
  TpShard finish();

 private:
  struct WeightSource {
    int node = 0, input = 0, axis = 0;
  };
  struct Part {
    int axis = 0;  // the sequence axis of the value
    int rank = 0;
    int64_t length = 0;  // the whole value's length along it (parts uneven when the degree does not divide it)
  };

  // --- sharder_core.cpp ---
  // Dims ONNX 1.12's inference leaves unknown (a Reshape target computed from Shape over a symbolic batch): read off
  // apart's importer at batch 1 and 2, static where equal, the batch symbol ("K*batch") where doubled, so the
  // collectives' outputs have static shapes once the batch is bound. Imports the stage again only when needed.
  void fill_unknown_dims(const onnx::ModelProto& stage);
  // A region left whole, and why ("" for a stage boundary cutting it).
  bool whole(const TpShardRegion& r, const std::string& why);
  // Where a linear's weight (input 1) is held: the initializer it reads (node: the linear, input 1) or the one a
  // Transpose of it reads (node: the Transpose, input 0: a tied embedding table read as [H, V]), with the axis of that
  // initializer that holds `out_axis` of the weight. nullopt for anything else.
  std::optional<WeightSource> weight_source(const NodeProto& n, int out_axis = -1) const;
  // Cuts a linear's weight along its `axis` (a weight read through a Transpose: the table along the matching axis);
  // returns the initializer cut.
  std::string slice_weight(NodeProto& n, int axis, int64_t pieces, const std::string& what, bool vocabulary);
  [[noreturn]] void unsupported(const NodeProto& n, const std::string& what) const;
  static int64_t attr_int(const NodeProto& n, const std::string& name, int64_t fallback);
  int rank_or(const std::string& value, const NodeProto& n) const;
  int normalized(int64_t axis, const std::string& value) const;
  // The integer contents of a value held in the graph: an initializer or a Constant node's value; nullopt otherwise.
  std::optional<std::vector<int64_t>> known_ints(const std::string& v) const;
  // How many dims a Reshape's target (its input 1, a 1-D tensor) names: its inferred length, else its output's rank.
  int64_t target_length(const NodeProto& n) const;
  std::vector<int64_t> ints_of(const NodeProto& n, int input) const;
  int64_t dim_of(const std::string& value, int axis, const NodeProto& n) const;
  // A fresh int64 initializer for this node's input (the old value may be shared by other nodes).
  void set_ints_input(NodeProto& n, int input, const std::vector<int64_t>& values);
  // Cuts the initializer a node reads at `input` along `axis` (each reader sees the same slice).
  // `vocabulary`: rows cut by tp_vocabulary_rows (one piece) rather than tp_shard_ranges.
  void slice_initializer(NodeProto& n, int input, int axis, int64_t pieces, const std::string& what,
                         bool vocabulary = false);
  // value_info for a collective's output: the type `like` has in the forward.
  void add_type(const std::string& name, const std::string& like, const NodeProto& n);
  // Whether a gradient can flow into x: not a Constant node's output, not an integer or boolean initializer.
  bool carries_gradient(const std::string& x) const;
  // The whole value's type: added by this pass, or ONNX's inference of the forward, or an initializer's.
  onnx::ValueInfoProto whole_type(const std::string& v, const NodeProto& n) const;
  std::optional<onnx::ValueInfoProto> known_type(const std::string& v) const;
  int added_type_index(const std::string& v) const;
  void set_type(const std::string& v, onnx::ValueInfoProto type);

  // --- sharder_linear.cpp ---
  NodeProto& node_named(const std::string& name);
  // The layout comes from plan.json: every linear it names must be one, every split axis one its value has.
  void check_layout(const TpShardRegion& r);
  // Column linears' weights (and biases) cut; returns the pieces each node's split output is laid out in (a fused
  // QKV output read by one Split: 3), by node index, for the chain of values carrying it.
  std::map<int, int64_t> cut_column_linears(const TpShardRegion& r, const std::map<std::string, int>& split);
  // The region's sliced params and constants (a column's bias added by its own Add), along their reader's split axis.
  void slice_region_params(const TpShardRegion& r, const std::map<std::string, int>& split,
                           const std::map<int, int64_t>& pieces_of_node, size_t index);
  // Node k (a Reshape of a split value along axis j): its target's entry j divided by the degree (an LM head's: this
  // rank's vocabulary rows); a target computed at run time divided by an inserted Div.
  void divide_reshape_target(const TpShardRegion& r, int k, int j);
  // Node k's shape operand (input 1, `length` entries) computed at run time: divided by [1, …, t, …, 1] (t at j)
  // through an inserted Div.
  void divide_computed_target(int k, int64_t length, int j);
  // A Split along the split axis: its sizes divided by the degree.
  void divide_split_sizes(NodeProto& n);
  // Node k (an Expand whose output is split along `axis`): the target's entry there divided (repeat_kv over split kv
  // heads); a target computed at run time divided by an inserted Div.
  void divide_expand_target(int k, int axis);
  // A Slice of a split value along another axis is cut alike on each rank; along the split axis it is refused.
  void refuse_slice_along(const NodeProto& n, int along) const;
  // Row linears' rows cut, and the TpAllReduce of their partial sums (a Gemm's bias added after it).
  void cut_row_linears(const TpShardRegion& r);
  // One TpCopy per region input, before the first column linear reading it.
  void copy_region_inputs(const TpShardRegion& r, size_t index);
  // A value computed in the stage that the region reads sliced (T5's relative position bias, computed from its
  // table): each reader in the region reads Slice(TpCopy(value)) of this rank's range. TpCopy's backward all-reduce
  // makes the gradient flowing back into the replicated computation whole on every rank (each rank's Slice gradient
  // holds only its own heads).
  void slice_computed_input(const TpShardRegion& r, const std::string& s, const std::map<std::string, int>& split,
                            size_t index);

  // --- sharder_vocabulary.cpp ---
  // The table a vocabulary region in the stage cuts: the embedding Gather's, the LM head's weight (or the table its
  // Transpose reads). nullopt when it reads none this pass can cut.
  std::optional<std::string> vocabulary_table(const TpShardRegion& r) const;
  // Why a vocabulary region the stage holds stays whole (nullopt: it is cut).
  std::optional<std::string> vocabulary_left_whole(const TpShardRegion& r) const;
  // Gather(table, ids) on this rank's rows [start, start + rows): ids outside them read row 0, zeroed by a mask; the
  // ranks' rows summed by TpAllReduce into the Gather's output.
  // Every Gather of the region's table in the stage is cut alike (T5 reads its shared table in the encoder and the
  // decoder; the plan names one region for it).
  void shard_embedding(const TpShardRegion& r);
  void shard_gather(const TpShardRegion& r, int k,
                    const std::string out);  // out: a copy (the node's output is renamed)
  // A vocabulary-split table must be read only where this pass cut its readers: a Gather left whole, or a linear the
  // pass did not split, would read the wrong rows.
  void check_vocabulary_readers() const;
  // The LM head's logits read by the loss (present() checked that nothing else reads them): the vocabulary-parallel
  // loss in its place.
  void shard_logits_readers(const TpShardRegion& r, const std::map<std::string, int>& split);
  // Whether `loss` is a SoftmaxCrossEntropyLoss this pass splits over the vocabulary: of [N, V] scores split along
  // V, without class weights, its log_prob output unread, every type it needs known.
  bool parallel_loss(const NodeProto& loss, const std::string& scores, int axis) const;
  void split_loss(NodeProto& loss, const std::string& scores);

  // --- sharder_sequence.cpp ---
  // Rewrites the graph (nodes in order, collectives in place) so that the values between regions are held in
  // sequence parts: regions' all-reduces become reduce-scatters, position-wise readers keep parts, every other
  // reader reads them all-gathered.
  void shard_sequence();
  // A collective the shard placed, turned into `op`, its name saying so ("<region>/TpAllReduce" → "…/TpReduceScatter").
  static void rename_op(NodeProto& n, const char* op);
  // The value x + suffix, which `make` defines the first time it is asked for.
  std::string once(const std::string& x, const std::string& suffix,
                   const std::function<void(const std::string&)>& make);
  // A collective node: `cut`, when given, its axis (and the whole length where the parts are uneven).
  NodeProto collective(const char* op, const std::string& x, const std::string& y, std::optional<Part> cut,
                       const char* backward = nullptr) const;
  void set_cut(NodeProto& c, const Part& cut) const;
  // The sequence axis of a region's output: its first axis before the last longer than 1 at batch 1. A length the
  // degree does not divide is cut into uneven parts (tp_sequence_part) when it is static (the stage's own shapes
  // say so: a [B·S, H] token axis grows with the batch, which a part's length cannot follow).
  Part sequence_part(const std::string& end, const NodeProto& n) const;
  // Whether the stage's own shape inference (the batch symbolic) leaves `value`'s `axis` symbolic (a dim_param or
  // unknown length, as the batch is).
  bool symbolic_dim(const std::string& value, int axis) const;
  // Whether the stage's own shape inference (the batch symbolic) gives `value` the length `length` along `axis`.
  bool static_dim(const std::string& value, int axis, int64_t length) const;
  // The inputs of n that line up with its output position by position (the others: Dropout's ratio, Clip's bounds).
  static std::vector<int> data_inputs(const NodeProto& n);
  // Where n's outputs hold their parts if n works position by position along its inputs' sequence axis; nullopt
  // when it mixes positions (or is not known to keep them apart), so its reader of a part needs it whole.
  std::optional<Part> position_wise(const NodeProto& n) const;
  int normalized(int64_t axis, int rank) const;
  // `whole` with this rank's part of `cut`'s axis (a symbolic length becomes unknown).
  onnx::ValueInfoProto part_type(onnx::ValueInfoProto whole, const Part& cut) const;

  int degree_, rank_;
  TpWeights weights_;
  TpSequence sequence_;
  int64_t opset_ = 17;
  TpShard shard_;
  std::map<std::string, int> node_of_name_, producer_, initializer_, rank_of_;
  std::map<std::string, std::vector<int>> consumers_;
  std::map<std::string, onnx::ValueInfoProto> types_;
  std::map<std::string, std::vector<int64_t>> shape_of_;  // the importer's, at batch 1
  std::string batch_symbol_;                              // the stage's batch dim_param ("" when static)
  int64_t vocabulary_ = 0;                                // the LM head being cut: its whole vocabulary
  std::set<std::string> tables_kept_whole_;  // read by a vocabulary region left whole (keep_shared_tables_whole)
  std::set<std::string> vocabulary_tables_;  // params cut along the vocabulary …
  std::set<int> handled_readers_;            // … and the nodes reading them that the pass cut (Gathers, LM heads)
  std::map<std::string, TpShardedParam> sliced_;
  std::map<int, std::vector<NodeProto>> before_, after_;
  std::vector<onnx::ValueInfoProto> added_types_;
  std::set<std::string> split_names_;
  std::set<std::string> region_copies_;                   // the TpCopy of each region input, by node name
  std::map<std::string, std::string> region_reduces_;     // each region's closing TpAllReduce → its end value
  std::map<std::string, Part> part_of_;                   // values held in sequence parts
  std::map<std::string, onnx::ValueInfoProto> whole_of_;  // … and their whole types
  std::set<std::string> collectives_made_;  // outputs of the TpScatter, TpCopy and TpAllGather nodes placed so far
};

}  // namespace apart::tp_shard
