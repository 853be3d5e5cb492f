// The shard pass's rules for vocabulary regions (the header's third list): embedding Gathers, LM heads and the
// vocabulary-parallel loss.
// The rules are stated in codegen/tensor_parallel_shard.h.
#include "codegen/gradients/gradient.h"
#include "graph/error.h"
#include "graph/text.h"
#include "sharder.h"

namespace apart::tp_shard {

void Sharder::keep_shared_tables_whole(const std::vector<TpShardRegion>& regions) {
  for (const TpShardRegion& r : regions) {
    if (r.role == TpRegionRole::kLinears) continue;
    const bool in_stage = r.role == TpRegionRole::kEmbedding
                              ? producer_.count(r.end_value) > 0
                              : r.column_tasks.size() == 1 && node_of_name_.count(r.column_tasks.front()) > 0;
    if (!in_stage) continue;
    if (const std::optional<std::string> table = vocabulary_table(r); table && vocabulary_left_whole(r))
      tables_kept_whole_.insert(*table);
  }
}

std::optional<std::string> Sharder::vocabulary_table(const TpShardRegion& r) const {
  const onnx::GraphProto& g = shard_.model.graph();
  if (r.role == TpRegionRole::kEmbedding) {
    const NodeProto& n = g.node(producer_.at(r.end_value));
    if (n.input_size() == 2 && initializer_.count(n.input(0))) return n.input(0);
    return std::nullopt;
  }
  if (r.column_tasks.size() != 1) return std::nullopt;
  const std::optional<WeightSource> w = weight_source(g.node(node_of_name_.at(r.column_tasks.front())));
  if (!w) return std::nullopt;
  return g.node(w->node).input(w->input);
}

std::optional<std::string> Sharder::vocabulary_left_whole(const TpShardRegion& r) const {
  const onnx::GraphProto& g = shard_.model.graph();
  const std::optional<std::string> table = vocabulary_table(r);
  int axis = 0;
  if (r.role == TpRegionRole::kEmbedding) {
    const NodeProto& n = g.node(producer_.at(r.end_value));
    if (n.op_type() != "Gather" || !n.domain().empty() || attr_int(n, "axis", 0) != 0 || !table ||
        g.initializer(initializer_.at(*table)).dims_size() != 2)
      return "not a Gather of rows of a 2-D table";
  } else {
    if (r.column_tasks.size() != 1 || !r.row_tasks.empty()) return "not one column linear";
    const std::optional<WeightSource> w = weight_source(g.node(node_of_name_.at(r.column_tasks.front())));
    if (!w) return "its weight is neither a param nor a transposed one";
    axis = w->axis;
    std::set<std::string> outputs;
    for (const auto& o : g.output()) outputs.insert(o.name());
    const std::map<std::string, int> split(r.split_values.begin(), r.split_values.end());
    for (const auto& [v, split_axis] : r.split_values) {
      if (outputs.count(v)) return "its logits are a stage output";
      const auto readers = consumers_.find(v);
      for (int k : readers == consumers_.end() ? std::vector<int>{} : readers->second) {
        const NodeProto& reader = g.node(k);
        if ((reader.output_size() > 0 && split.count(reader.output(0))) ||
            (v == r.end_value && parallel_loss(reader, v, split_axis)))
          continue;
        return "its logits are read by " + quote(reader.name()) + ", not a SoftmaxCrossEntropyLoss the pass splits";
      }
    }
  }
  const int64_t rows = sliced_.count(*table) ? sliced_.at(*table).shape[static_cast<size_t>(axis)]
                                             : g.initializer(initializer_.at(*table)).dims(axis);
  const int64_t each = (rows + degree_ - 1) / degree_;
  if ((degree_ - 1) * each >= rows)
    return std::to_string(rows) + " vocabulary rows in parts of " + std::to_string(each) + " leave a rank none";
  // Uneven parts need each Reshape of the logits to name the vocabulary: a target computed at run time is divided
  // by the degree (shard's Div), which only equal parts allow.
  if (r.role == TpRegionRole::kLmHead && rows % degree_ != 0)
    for (const auto& [v, split_axis] : r.split_values)
      if (const auto p = producer_.find(v);
          p != producer_.end() && g.node(p->second).op_type() == "Reshape" && !known_ints(g.node(p->second).input(1)))
        return "its logits' Reshape " + quote(g.node(p->second).name()) + " computes its target at run time over " +
               std::to_string(rows) + " vocabulary rows that do not cut into " + std::to_string(degree_) +
               " equal parts";
  return std::nullopt;
}

void Sharder::shard_embedding(const TpShardRegion& r) {
  const onnx::GraphProto& g = shard_.model.graph();
  const std::string table = g.node(producer_.at(r.end_value)).input(0);
  vocabulary_tables_.insert(table);
  for (int k : consumers_.at(table)) {
    const NodeProto& n = g.node(k);
    if (n.op_type() == "Gather" && n.domain().empty() && attr_int(n, "axis", 0) == 0 && n.input(0) == table &&
        handled_readers_.insert(k).second)
      shard_gather(r, k, n.output(0));
  }
  ++shard_.regions;
}

void Sharder::shard_gather(const TpShardRegion& r, int k,
                           const std::string out) {  // out: a copy (the node's output is renamed)
  onnx::GraphProto& g = *shard_.model.mutable_graph();
  NodeProto& n = *g.mutable_node(k);
  const int32_t float_type = g.initializer(initializer_.at(n.input(0))).data_type();
  slice_initializer(n, 0, 0, 1, "embedding " + quote(n.name()) + "'s table", true);
  const int64_t vocab = sliced_.at(n.input(0)).shape[0];  // whole (a second Gather finds the table cut already)
  const auto [start, end] = tp_vocabulary_rows(vocab, degree_, rank_);
  const int64_t rows = end - start;
  const std::string p = n.name() + "/tp_vocab";
  *g.add_initializer() = int64_tensor(p + "_start", {start});
  *g.add_initializer() = int64_tensor(p + "_rows", {rows});
  *g.add_initializer() = int64_tensor(p + "_zero", {0});
  auto make = [](const std::string& op, std::vector<std::string> inputs, const std::string& output) {
    NodeProto m;
    m.set_name(output);
    m.set_op_type(op);
    for (std::string& i : inputs) m.add_input(std::move(i));
    m.add_output(output);
    return m;
  };
  std::vector<NodeProto>& before = before_[k];
  before.push_back(make("Cast", {n.input(1)}, p + "_ids"));
  autodiff::set_attr(before.back(), "to", static_cast<int64_t>(TensorProto::INT64));
  before.push_back(make("Sub", {p + "_ids", p + "_start"}, p + "_local"));
  before.push_back(make("Less", {p + "_local", p + "_zero"}, p + "_below"));
  before.push_back(make("Not", {p + "_below"}, p + "_from_start"));
  before.push_back(make("Less", {p + "_local", p + "_rows"}, p + "_before_end"));
  before.push_back(make("And", {p + "_from_start", p + "_before_end"}, p + "_mine"));
  before.push_back(make("Where", {p + "_mine", p + "_local", p + "_zero"}, p + "_index"));
  n.set_input(1, p + "_index");
  n.set_output(0, p + "_read");
  std::vector<NodeProto>& after = after_[k];
  if (opset_ >= 13) {
    *g.add_initializer() = int64_tensor(p + "_last_axis", {-1});
    after.push_back(make("Unsqueeze", {p + "_mine", p + "_last_axis"}, p + "_mine_rows"));
  } else {
    after.push_back(make("Unsqueeze", {p + "_mine"}, p + "_mine_rows"));
    autodiff::set_attr(after.back(), "axes", std::vector<int64_t>{-1});
  }
  after.push_back(make("Cast", {p + "_mine_rows"}, p + "_mask"));
  autodiff::set_attr(after.back(), "to", static_cast<int64_t>(float_type));
  after.push_back(make("Mul", {p + "_read", p + "_mask"}, p + "_masked"));
  NodeProto reduce = make(kTpAllReduceOp, {p + "_masked"}, out);
  reduce.set_name(r.name + "/" + kTpAllReduceOp + (out == r.end_value ? "" : "_" + n.name()));
  reduce.set_domain(autodiff::kApartDomain);
  after.push_back(reduce);
  add_type(out, out, n);
}

void Sharder::check_vocabulary_readers() const {
  const onnx::GraphProto& g = shard_.model.graph();
  for (const std::string& table : vocabulary_tables_)
    for (int k : consumers_.at(table))
      if (!handled_readers_.count(k))
        throw Unsupported("tensor parallelism: node " + quote(g.node(k).name()) + " (" + g.node(k).op_type() +
                          ") reads the vocabulary-split table " + quote(table) +
                          " as a whole; plan this stage with --tp 1");
}

void Sharder::shard_logits_readers(const TpShardRegion& r, const std::map<std::string, int>& split) {
  onnx::GraphProto& g = *shard_.model.mutable_graph();
  const auto readers = consumers_.find(r.end_value);
  for (int k : readers == consumers_.end() ? std::vector<int>{} : readers->second) {
    NodeProto& loss = *g.mutable_node(k);
    if (!split.count(loss.output(0))) split_loss(loss, r.end_value);
  }
}

bool Sharder::parallel_loss(const NodeProto& loss, const std::string& scores, int axis) const {
  return loss.op_type() == "SoftmaxCrossEntropyLoss" && loss.domain().empty() && loss.input(0) == scores && axis == 1 &&
         rank_of_.count(scores) && rank_of_.at(scores) == 2 && (loss.input_size() < 3 || loss.input(2).empty()) &&
         (loss.output_size() < 2 || loss.output(1).empty() || !consumers_.count(loss.output(1))) &&
         known_type(loss.input(1)) && known_type(loss.output(0)) && known_type(scores) && shape_of_.count(scores) &&
         shape_of_.count(loss.input(1)) && shape_of_.at(loss.input(1)).size() == 1 && !batch_symbol_.empty();
}

void Sharder::split_loss(NodeProto& loss, const std::string& scores) {
  const onnx::ValueInfoProto value = *known_type(loss.output(0));
  const onnx::ValueInfoProto scores_type = *known_type(scores);
  loss.set_op_type(kVocabParallelCrossEntropyOp);
  loss.set_domain(autodiff::kApartDomain);
  autodiff::set_attr(loss, kVocabStartAttr, tp_vocabulary_rows(vocabulary_, degree_, rank_).first);
  autodiff::set_attr(loss, kVocabSizeAttr, vocabulary_);
  const std::string lse = loss.name() + "/tp_lse";
  if (loss.output_size() > 1)
    loss.set_output(1, lse);
  else
    loss.add_output(lse);
  set_type(loss.output(0), value);
  // lse: one value per row of the scores, [N] (a multiple of the batch: "K*batch", as stage files write it).
  onnx::ValueInfoProto lse_type;
  auto* tensor = lse_type.mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(scores_type.type().tensor_type().elem_type());
  const int64_t rows_at_one = shape_of_.at(loss.input(1))[0];
  tensor->mutable_shape()->add_dim()->set_dim_param(
      rows_at_one == 1 ? batch_symbol_ : std::to_string(rows_at_one) + "*" + batch_symbol_);
  set_type(lse, lse_type);
}

}  // namespace apart::tp_shard
