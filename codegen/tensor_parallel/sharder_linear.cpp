// The shard pass's rules for attention and MLP regions (the header's first list): column and row linears, the shape
// operands along their split axis, and the TpCopy/TpAllReduce pair.
// The rules are stated in codegen/tensor_parallel_shard.h.
#include <numeric>

#include "codegen/gradients/gradient.h"
#include "graph/error.h"
#include "graph/text.h"
#include "sharder.h"

namespace apart::tp_shard {

void Sharder::shard(const TpShardRegion& r, size_t index) {
  if (r.role == TpRegionRole::kEmbedding) return shard_embedding(r);
  if (r.role == TpRegionRole::kLmHead) {  // the whole vocabulary: the table's rows (it may be cut already)
    const std::string table = *vocabulary_table(r);
    const std::optional<WeightSource> w = weight_source(node_named(r.column_tasks.front()));
    vocabulary_ = sliced_.count(table) ? sliced_.at(table).shape[static_cast<size_t>(w->axis)]
                                       : shard_.model.graph().initializer(initializer_.at(table)).dims(w->axis);
  }
  const std::map<std::string, int> split(r.split_values.begin(), r.split_values.end());
  check_layout(r);
  const std::map<int, int64_t> pieces_of_node = cut_column_linears(r, split);
  slice_region_params(r, split, pieces_of_node, index);
  onnx::GraphProto& g = *shard_.model.mutable_graph();
  // Dropout on split values draws per TP rank (Megatron's model-parallel RNG): the node's name, which keys its random
  // stream (runtime/random.h), gets the rank, so the ranks' heads do not share one mask pattern. Dropout on
  // replicated values keeps its name: every rank must drop the same elements there.
  for (int k = 0; k < g.node_size(); ++k) {
    NodeProto& n = *g.mutable_node(k);
    if (n.domain().empty() && n.op_type() == "Dropout" && n.output_size() > 0 && split.count(n.output(0)))
      n.set_name(n.name() + "/tp_rank_" + std::to_string(rank_));
  }
  // Shape operands: Reshape targets, Split sizes and Expand targets along the split axis divide by the degree.
  for (int k = 0; k < g.node_size(); ++k) {
    NodeProto& n = *g.mutable_node(k);
    if (!n.domain().empty() || n.input_size() == 0) continue;
    if (n.op_type() == "Reshape" && split.count(n.output(0))) {
      divide_reshape_target(r, k, split.at(n.output(0)));
    } else if (n.op_type() == "Split" && split.count(n.input(0)) &&
               normalized(attr_int(n, "axis", 0), n.input(0)) == split.at(n.input(0))) {
      divide_split_sizes(n);
    } else if (n.op_type() == "Expand" && split.count(n.output(0))) {
      divide_expand_target(k, split.at(n.output(0)));
    } else if (n.op_type() == "Slice" && split.count(n.input(0)) && split.count(n.output(0))) {
      refuse_slice_along(n, split.at(n.input(0)));
    }
  }
  cut_row_linears(r);
  copy_region_inputs(r, index);
  for (const auto& [value, axis] : r.split_values) split_names_.insert(value);
  ++shard_.regions;
  if (r.role == TpRegionRole::kLmHead) shard_logits_readers(r, split);
}

NodeProto& Sharder::node_named(const std::string& name) {
  return *shard_.model.mutable_graph()->mutable_node(node_of_name_.at(name));
}

void Sharder::check_layout(const TpShardRegion& r) {
  // The layout comes from plan.json: a linear it names must be one (a MatMul or Gemm reading a weight).
  for (const auto* list : {&r.column_tasks, &r.row_tasks})
    for (const std::string& name : *list) {
      const NodeProto& n = node_named(name);
      if (!n.domain().empty() || (n.op_type() != "MatMul" && n.op_type() != "Gemm") || n.input_size() < 2 ||
          n.output_size() < 1)
        throw InvalidModel("tensor parallelism: region " + quote(r.name) + " names " + quote(name) +
                           " as a linear, but it is a " + n.op_type() + " with " + std::to_string(n.input_size()) +
                           " inputs; re-run apart partition");
    }
  for (const auto& [value, axis] : r.split_values)
    if (const auto it = rank_of_.find(value); it != rank_of_.end() && (axis < 0 || axis >= it->second))
      throw InvalidModel("tensor parallelism: region " + quote(r.name) + " splits " + quote(value) + " along axis " +
                         std::to_string(axis) + ", which it does not have; re-run apart partition");
}

std::map<int, int64_t> Sharder::cut_column_linears(const TpShardRegion& r, const std::map<std::string, int>& split) {
  // Column linears: the pieces their output is cut into downstream, and the chain of values that carries them.
  std::map<int, int64_t> pieces_of_node;  // node index → pieces its split output is laid out in
  const onnx::GraphProto& g = shard_.model.graph();
  for (const std::string& c : r.column_tasks) {
    NodeProto& n = node_named(c);
    int64_t pieces = 1;
    std::vector<int> chain{node_of_name_.at(c)};
    std::string v = n.output(0);
    while (true) {
      const auto it = consumers_.find(v);
      if (it == consumers_.end() || it->second.size() != 1) break;
      const NodeProto& next = g.node(it->second.front());
      const auto axis = split.find(v);
      if (axis == split.end()) break;
      if (next.op_type() == "Split" && next.domain().empty()) {
        if (normalized(attr_int(next, "axis", 0), v) == axis->second) pieces = next.output_size();
        break;
      }
      // A Slice (along another axis: one along the split axis is refused below) ends the chain like a Split would
      // not: the output is cut in one piece (the shifted loss's logits[:, :-1]).
      if (shape_like(next.op_type()) || next.output_size() != 1 || split.count(next.output(0)) == 0 ||
          split.at(next.output(0)) != axis->second)
        break;
      chain.push_back(it->second.front());
      v = next.output(0);
    }
    for (int k : chain) pieces_of_node[k] = pieces;
    const bool trans_b = n.op_type() == "Gemm" && attr_int(n, "transB", 0) != 0;
    const std::string weight = slice_weight(n, trans_b ? 0 : 1, pieces, "column linear " + quote(c) + "'s weight",
                                            r.role == TpRegionRole::kLmHead);
    if (r.role == TpRegionRole::kLmHead) {
      vocabulary_tables_.insert(weight);
      handled_readers_.insert(node_of_name_.at(c));
    }
    if (n.op_type() == "Gemm" && n.input_size() > 2 && !n.input(2).empty()) {
      const int bias_rank = rank_or(n.input(2), n);
      slice_initializer(n, 2, bias_rank - 1, pieces, "column linear " + quote(c) + "'s bias",
                        r.role == TpRegionRole::kLmHead);
    }
  }
  return pieces_of_node;
}

void Sharder::slice_region_params(const TpShardRegion& r, const std::map<std::string, int>& split,
                                  const std::map<int, int64_t>& pieces_of_node, size_t index) {
  onnx::GraphProto& g = *shard_.model.mutable_graph();
  // Params and constants read sliced (a column's bias added by its own Add): along the reader's split axis.
  for (const std::string& s : r.sliced_inputs) {
    if (sliced_.count(s)) continue;
    if (!initializer_.count(s) && !known_ints(s)) {
      slice_computed_input(r, s, split, index);
      continue;
    }
    const auto readers = consumers_.find(s);
    bool done = false;
    for (int k : readers == consumers_.end() ? std::vector<int>{} : readers->second) {
      const NodeProto& reader = g.node(k);
      if (reader.output_size() < 1 || split.count(reader.output(0)) == 0) continue;
      const int out_axis = split.at(reader.output(0));
      const int axis = out_axis - (rank_or(reader.output(0), reader) - rank_or(s, reader));
      const auto p = pieces_of_node.find(k);
      for (int i = 0; i < reader.input_size(); ++i)
        if (reader.input(i) == s) {
          slice_initializer(*g.mutable_node(k), i, axis, p == pieces_of_node.end() ? 1 : p->second,
                            "the sliced input " + quote(s), r.role == TpRegionRole::kLmHead);  // an LM head's bias
          break;
        }
      done = true;
      break;
    }
    if (!done)
      throw Unsupported("tensor parallelism: region " + quote(r.name) + " reads " + quote(s) +
                        " sliced, but no reader of it is in the stage");
  }
}

void Sharder::divide_reshape_target(const TpShardRegion& r, int k, int j) {
  onnx::GraphProto& g = *shard_.model.mutable_graph();
  NodeProto& n = *g.mutable_node(k);
  std::optional<std::vector<int64_t>> target = known_ints(n.input(1));
  APART_CHECK(target || r.role != TpRegionRole::kLmHead || vocabulary_ % degree_ == 0,
              "vocabulary_left_whole keeps an uneven LM head with a run-time logits target whole");
  if (!target) {
    // A target computed at run time (Shape → Gather → Concat, as torch exports write it). Its entry j is the split
    // dim's count (the heads), positive, as exporters write it.
    divide_computed_target(k, target_length(n), j);
    return;
  }
  if (j >= static_cast<int>(target->size())) unsupported(n, "a target shape shorter than its split axis");
  if (r.role == TpRegionRole::kLmHead && (*target)[static_cast<size_t>(j)] > 0) {  // the vocabulary: this rank's rows
    if ((*target)[static_cast<size_t>(j)] != vocabulary_)
      unsupported(n, "a logits target whose split entry is not the vocabulary");
    const auto [first, last] = tp_vocabulary_rows(vocabulary_, degree_, rank_);
    (*target)[static_cast<size_t>(j)] = last - first;
    set_ints_input(n, 1, *target);
  } else if ((*target)[static_cast<size_t>(j)] > 0) {
    if ((*target)[static_cast<size_t>(j)] % degree_ != 0) unsupported(n, "a split dim that the degree does not divide");
    (*target)[static_cast<size_t>(j)] /= degree_;
    set_ints_input(n, 1, *target);
  }
}

void Sharder::divide_computed_target(int k, int64_t length, int j) {
  onnx::GraphProto& g = *shard_.model.mutable_graph();
  NodeProto& n = *g.mutable_node(k);
  std::vector<int64_t> divisor(static_cast<size_t>(length), 1);
  divisor[static_cast<size_t>(j)] = degree_;
  const std::string name = n.name() + "/tp_divisor";
  *g.add_initializer() = int64_tensor(name, divisor);
  NodeProto div;
  div.set_name(n.name() + "/tp_target");
  div.set_op_type("Div");
  div.add_input(n.input(1));
  div.add_input(name);
  div.add_output(n.name() + "/tp_target_output");
  n.set_input(1, div.output(0));
  before_[k].push_back(div);
}

void Sharder::divide_split_sizes(NodeProto& n) {
  const bool as_input = n.input_size() > 1 && !n.input(1).empty();
  std::vector<int64_t> sizes;
  if (as_input)
    sizes = ints_of(n, 1);
  else
    for (const auto& a : n.attribute())
      if (a.name() == "split") sizes.assign(a.ints().begin(), a.ints().end());
  if (sizes.empty()) return;  // equal parts: the same count of smaller parts
  for (int64_t& s : sizes) {
    if (s % degree_ != 0) unsupported(n, "split sizes the degree does not divide");
    s /= degree_;
  }
  if (as_input)
    set_ints_input(n, 1, sizes);
  else
    for (auto& a : *n.mutable_attribute())
      if (a.name() == "split") {
        a.clear_ints();
        for (int64_t s : sizes) a.add_ints(s);
      }
}

void Sharder::divide_expand_target(int k, int axis) {
  // repeat_kv's expand over split kv heads: the target's entry on the split axis (the kv heads) divides.
  onnx::GraphProto& g = *shard_.model.mutable_graph();
  NodeProto& n = *g.mutable_node(k);
  std::optional<std::vector<int64_t>> target = known_ints(n.input(1));
  if (!target) {
    // Computed at run time (torch's expand(batch, kv, n_rep, S, d) from Shape): divided by [1, …, t, …, 1] there,
    // its kv-head entry being the positive count (the planner splits only kv heads the degree divides).
    const int64_t length = target_length(n);
    const int64_t j = axis - (rank_or(n.output(0), n) - length);
    if (j >= 0) divide_computed_target(k, length, static_cast<int>(j));  // j < 0: nothing broadcast there
    return;
  }
  const int j = axis - (rank_or(n.output(0), n) - static_cast<int>(target->size()));
  if (j >= 0 && (*target)[static_cast<size_t>(j)] > 1) {
    if ((*target)[static_cast<size_t>(j)] % degree_ != 0) unsupported(n, "a split dim that the degree does not divide");
    (*target)[static_cast<size_t>(j)] /= degree_;
    set_ints_input(n, 1, *target);
  }
}

void Sharder::refuse_slice_along(const NodeProto& n, int along) const {
  // Along another axis (rotate_half's halves of the head dim) each rank slices its own heads alike.
  std::vector<int64_t> axes;
  bool known = false;  // axes given (or implied by starts)
  size_t starts = 0;
  if (n.input_size() > 3 && !n.input(3).empty()) {
    if (const std::optional<std::vector<int64_t>> given = known_ints(n.input(3))) {
      axes = *given;
      known = true;
    }
  } else if (n.input_size() > 1) {
    if (const std::optional<std::vector<int64_t>> given = known_ints(n.input(1))) starts = given->size();
  }
  for (const auto& a : n.attribute()) {
    if (a.name() == "axes") {
      axes.assign(a.ints().begin(), a.ints().end());
      known = true;
    }
    if (a.name() == "starts") starts = static_cast<size_t>(a.ints_size());
  }
  if (!known && starts > 0) {  // absent: the first len(starts) axes
    axes.resize(starts);
    std::iota(axes.begin(), axes.end(), 0);
    known = true;
  }
  bool touches = !known;
  for (int64_t a : axes) touches = touches || normalized(a, n.input(0)) == along;
  if (touches) unsupported(n, "a Slice of a split value along its split axis");
}

void Sharder::cut_row_linears(const TpShardRegion& r) {
  // Row linears: their rows, and the forward all-reduce of their partial output.
  for (const std::string& row : r.row_tasks) {
    NodeProto& n = node_named(row);
    const bool trans_b = n.op_type() == "Gemm" && attr_int(n, "transB", 0) != 0;
    slice_weight(n, trans_b ? 1 : 0, 1, "row linear " + quote(row) + "'s weight", false);
    const std::string end = n.output(0);
    const std::string partial = end + "/tp_partial";
    n.set_output(0, partial);
    NodeProto reduce;
    reduce.set_name(r.name + "/" + kTpAllReduceOp + (r.row_tasks.size() > 1 ? "_" + row : ""));
    reduce.set_op_type(kTpAllReduceOp);
    reduce.set_domain(autodiff::kApartDomain);
    reduce.add_input(partial);
    if (n.op_type() == "Gemm" && n.input_size() > 2 && !n.input(2).empty()) {
      // Megatron's RowParallelLinear adds the bias once, after the all-reduce.
      const std::string bias = n.input(2);
      n.mutable_input()->RemoveLast();
      const std::string reduced = end + "/tp_reduced";
      reduce.add_output(reduced);
      NodeProto add;
      add.set_name(r.name + "/tp_bias");
      add.set_op_type("Add");
      add.add_input(reduced);
      add.add_input(bias);
      add.add_output(end);
      after_[node_of_name_.at(row)] = {reduce, add};
      add_type(reduced, end, n);
      region_reduces_[reduce.name()] = end;
    } else {
      reduce.add_output(end);
      after_[node_of_name_.at(row)] = {reduce};
      add_type(end, end, n);
      region_reduces_[reduce.name()] = end;
    }
  }
}

void Sharder::copy_region_inputs(const TpShardRegion& r, size_t index) {
  const onnx::GraphProto& g = shard_.model.graph();
  // Region inputs: one TpCopy each, read by the region's column linears.
  for (const std::string& x : r.inputs) {
    const std::string copy = x + "/tp_copy_" + std::to_string(index);
    int first = -1;
    for (const std::string& c : r.column_tasks) {
      NodeProto& n = node_named(c);
      if (n.input(0) != x) continue;
      n.set_input(0, copy);
      const int k = node_of_name_.at(c);
      first = first < 0 ? k : std::min(first, k);
    }
    if (first < 0) continue;
    NodeProto f;
    f.set_name(r.name + "/" + kTpCopyOp + "_" + std::to_string(index));
    f.set_op_type(kTpCopyOp);
    f.set_domain(autodiff::kApartDomain);
    f.add_input(x);
    f.add_output(copy);
    before_[first].push_back(f);
    add_type(copy, x, g.node(first));
    region_copies_.insert(f.name());
  }
}

void Sharder::slice_computed_input(const TpShardRegion& r, const std::string& s,
                                   const std::map<std::string, int>& split, size_t index) {
  onnx::GraphProto& g = *shard_.model.mutable_graph();
  const auto readers = consumers_.find(s);
  bool any = false;
  for (int k : readers == consumers_.end() ? std::vector<int>{} : readers->second) {
    NodeProto& reader = *g.mutable_node(k);
    if (reader.output_size() < 1 || split.count(reader.output(0)) == 0) continue;
    const int axis = split.at(reader.output(0)) - (rank_or(reader.output(0), reader) - rank_or(s, reader));
    const int64_t length = dim_of(s, axis, reader);
    const auto ranges = r.role == TpRegionRole::kLmHead ? std::vector{tp_vocabulary_rows(length, degree_, rank_)}
                                                        : tp_shard_ranges(length, 1, degree_, rank_);
    const std::string tag = "/tp_" + std::to_string(index) + "_" + std::to_string(k);
    NodeProto f;
    f.set_name(reader.name() + "/" + kTpCopyOp);
    f.set_op_type(kTpCopyOp);
    f.set_domain(autodiff::kApartDomain);
    f.add_input(s);
    f.add_output(s + tag + "_copy");
    add_type(f.output(0), s, reader);
    NodeProto slice;
    slice.set_name(reader.name() + "/tp_slice");
    slice.set_op_type("Slice");
    slice.add_input(f.output(0));
    for (const auto& [suffix, value] :
         {std::pair<const char*, int64_t>{"starts", ranges[0].first}, {"ends", ranges[0].second}, {"axes", axis}}) {
      const std::string name = reader.name() + "/tp_slice_" + suffix;
      *g.add_initializer() = int64_tensor(name, {value});
      slice.add_input(name);
    }
    slice.add_output(s + tag + "_slice");
    for (int i = 0; i < reader.input_size(); ++i)
      if (reader.input(i) == s) reader.set_input(i, slice.output(0));
    before_[k].push_back(f);
    before_[k].push_back(slice);
    any = true;
  }
  if (!any)
    throw Unsupported("tensor parallelism: region " + quote(r.name) + " reads " + quote(s) +
                      " sliced, but no reader of it is in the stage");
}

}  // namespace apart::tp_shard
