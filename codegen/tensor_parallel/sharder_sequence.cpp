// The shard pass's rules for sequence parallelism between regions (the header's second list).
// The rules are stated in codegen/tensor_parallel_shard.h.
#include <algorithm>

#include "codegen/gradients/gradient.h"
#include "graph/error.h"
#include "graph/text.h"
#include "plan/plan.h"  // tp_sequence_part (plan/training.h)
#include "sharder.h"

namespace apart::tp_shard {

void Sharder::shard_sequence() {
  onnx::GraphProto& g = *shard_.model.mutable_graph();
  producer_.clear();  // the nodes moved (finish placed the collectives): known_ints and carries_gradient read it
  for (int k = 0; k < g.node_size(); ++k)
    for (const std::string& o : g.node(k).output()) producer_[o] = k;
  std::set<std::string> graph_outputs;
  for (const auto& o : g.output()) graph_outputs.insert(o.name());
  std::map<std::string, std::string> renamed;  // a stage output held in parts → the parts' name
  google::protobuf::RepeatedPtrField<NodeProto> nodes;
  auto emit = [&](const NodeProto& n) { *nodes.Add() = n; };
  // Output i of n holds parts; a stage output is all-gathered right after (stage boundaries stay whole).
  auto hold_parts = [&](NodeProto& n, int i, Part part, std::vector<NodeProto>& after) {
    const std::string whole = n.output(i);
    const std::optional<onnx::ValueInfoProto> type = known_type(whole);
    std::string held = whole;
    if (graph_outputs.count(whole)) {
      held = whole + "/sp_part";
      n.set_output(i, held);
      renamed[whole] = held;
      after.push_back(collective(kTpAllGatherOp, held, whole, part, kTpBackwardScatter));
    }
    part_of_[held] = part;
    if (type) whole_of_[held] = *type;
    if (held != whole || added_type_index(whole) >= 0) {
      if (!type) unsupported(n, "sequence parallelism over a value of unknown type (" + quote(whole) + ")");
      set_type(held, part_type(*type, part));
    }
    shard_.sequence_sharded = true;
  };
  for (int k = 0; k < g.node_size(); ++k) {
    NodeProto n = g.node(k);
    for (int i = 0; i < n.input_size(); ++i)
      if (const auto it = renamed.find(n.input(i)); it != renamed.end()) n.set_input(i, it->second);
    std::vector<NodeProto> after;
    if (const auto end = region_reduces_.find(n.name()); end != region_reduces_.end()) {
      // The region's partial sums: each rank keeps its part of the sum.
      rename_op(n, kTpReduceScatterOp);
      const Part part = sequence_part(end->second, n);
      set_cut(n, part);
      hold_parts(n, 0, part, after);
      emit(n);
      for (const NodeProto& a : after) emit(a);
      continue;
    }
    std::vector<int> held;
    for (int i = 0; i < n.input_size(); ++i)
      if (part_of_.count(n.input(i))) held.push_back(i);
    if (held.empty()) {
      emit(n);
      continue;
    }
    if (region_copies_.count(n.name())) {  // a region input: all-gathered for the column linears
      const Part part = part_of_.at(n.input(0));
      rename_op(n, kTpAllGatherOp);
      set_cut(n, part);
      autodiff::set_attr(n, kTpBackwardAttr, std::string(kTpBackwardReduceScatter));
      emit(n);
      continue;
    }
    if (const std::optional<Part> out = position_wise(n)) {
      for (int i : data_inputs(n)) {
        const std::string x = n.input(i);
        if (x.empty() || part_of_.count(x)) continue;
        const int aligned = out->axis - (out->rank - rank_or(x, n));
        // Read at batch 1, a batch dim is 1 too: broadcasting it would give every rank the whole operand against
        // its part (a silently wrong loss, e.g. a [batch, S, H] target beside a part cut along a batch the stage
        // baked into its reshapes). Only a static 1 broadcasts.
        if (aligned >= 0 && dim_of(x, aligned, n) == 1 && symbolic_dim(x, aligned))
          unsupported(n, "sequence parallelism over an operand whose axis " + std::to_string(aligned) + " (" +
                             quote(x) + ") grows with the batch while its parts are cut along a static axis");
        if (aligned >= 0 && dim_of(x, aligned, n) != 1) {
          const Part cut{aligned, rank_or(x, n), out->length};
          if (dim_of(x, aligned, n) != cut.length)
            unsupported(n, "sequence parallelism over an operand whose axis " + std::to_string(aligned) + " (" +
                               quote(x) + ") is not the sequence of " + std::to_string(cut.length));
          n.set_input(i, once(x, "/sp_scatter_" + std::to_string(aligned), [&](const std::string& y) {
                        const onnx::ValueInfoProto type = whole_type(x, n);
                        emit(collective(kTpScatterOp, x, y, cut));
                        set_type(y, part_type(type, cut));
                      }));
        } else if (carries_gradient(x)) {
          n.set_input(i, once(x, "/sp_copy", [&](const std::string& y) {
                        const onnx::ValueInfoProto type = whole_type(x, n);
                        emit(collective(kTpCopyOp, x, y, std::nullopt));
                        set_type(y, type);
                      }));
        }
      }
      if (n.op_type() == "Dropout") n.set_name(n.name() + "/tp_rank_" + std::to_string(rank_));
      for (int i = 0; i < n.output_size(); ++i)
        if (!n.output(i).empty()) hold_parts(n, i, *out, after);
    } else {
      for (int i : held) {
        const std::string x = n.input(i);
        n.set_input(i, once(x, "/sp_gather", [&](const std::string& y) {
                      const auto type = whole_of_.find(x);
                      if (type == whole_of_.end())
                        unsupported(n, "sequence parallelism over a value of unknown type (" + quote(x) + ")");
                      emit(collective(kTpAllGatherOp, x, y, part_of_.at(x), kTpBackwardScatter));
                      set_type(y, type->second);
                    }));
      }
    }
    emit(n);
    for (const NodeProto& a : after) emit(a);
  }
  g.mutable_node()->Swap(&nodes);
}

void Sharder::rename_op(NodeProto& n, const char* op) {
  std::string name = n.name();
  if (const size_t at = name.rfind(n.op_type()); at != std::string::npos) name.replace(at, n.op_type().size(), op);
  n.set_name(name);
  n.set_op_type(op);
}

std::string Sharder::once(const std::string& x, const std::string& suffix,
                          const std::function<void(const std::string&)>& make) {
  std::string y = x + suffix;
  if (collectives_made_.insert(y).second) make(y);
  return y;
}

NodeProto Sharder::collective(const char* op, const std::string& x, const std::string& y, std::optional<Part> cut,
                              const char* backward) const {
  NodeProto c;
  c.set_name(y);
  c.set_op_type(op);
  c.set_domain(autodiff::kApartDomain);
  c.add_input(x);
  c.add_output(y);
  if (cut) set_cut(c, *cut);
  if (backward != nullptr) autodiff::set_attr(c, kTpBackwardAttr, std::string(backward));
  return c;
}

void Sharder::set_cut(NodeProto& c, const Part& cut) const {
  autodiff::set_attr(c, "axis", static_cast<int64_t>(cut.axis));
  if (cut.length % degree_ != 0) autodiff::set_attr(c, kTpLengthAttr, cut.length);
}

Sharder::Part Sharder::sequence_part(const std::string& end, const NodeProto& n) const {
  const auto shape = shape_of_.find(end);
  if (shape == shape_of_.end())
    unsupported(n, "sequence parallelism over a value of unknown shape (" + quote(end) + ")");
  for (size_t a = 0; a + 1 < shape->second.size(); ++a) {
    const int64_t length = shape->second[a];
    if (length <= 1) continue;
    const auto refuse = [&](const std::string& why) {
      throw Unsupported("sequence parallelism: region output " + quote(end) + " has " + std::to_string(length) +
                        " positions along axis " + std::to_string(a) + ", " + why +
                        "; plan with --sequence-parallel off");
    };
    if (length < degree_) refuse("fewer than the " + std::to_string(degree_) + " TP ranks");
    if (length % degree_ != 0 && !static_dim(end, static_cast<int>(a), length))
      refuse("which do not cut into " + std::to_string(degree_) + " equal parts and grow with the batch");
    return Part{static_cast<int>(a), static_cast<int>(shape->second.size()), length};
  }
  unsupported(n, "sequence parallelism over a value with no sequence axis (" + quote(end) + ")");
}

bool Sharder::symbolic_dim(const std::string& value, int axis) const {
  const auto it = types_.find(value);
  if (it == types_.end() || !it->second.type().tensor_type().has_shape()) return false;
  const auto& shape = it->second.type().tensor_type().shape();
  return axis < shape.dim_size() && !shape.dim(axis).has_dim_value();
}

bool Sharder::static_dim(const std::string& value, int axis, int64_t length) const {
  const auto it = types_.find(value);
  if (it == types_.end() || !it->second.type().tensor_type().has_shape()) return false;
  const auto& shape = it->second.type().tensor_type().shape();
  return axis < shape.dim_size() && shape.dim(axis).has_dim_value() && shape.dim(axis).dim_value() == length;
}

std::vector<int> Sharder::data_inputs(const NodeProto& n) {
  const std::string& op = n.op_type();
  if (op == "Dropout" || op == "Clip" || op == "Cast" || op == "Softmax" || op == "LogSoftmax" ||
      op.rfind("Reduce", 0) == 0)
    return {0};
  std::vector<int> all(static_cast<size_t>(n.input_size()));
  for (int i = 0; i < n.input_size(); ++i) all[static_cast<size_t>(i)] = i;
  return all;
}

std::optional<Sharder::Part> Sharder::position_wise(const NodeProto& n) const {
  static const std::set<std::string> elementwise = {"Add",
                                                    "Sub",
                                                    "Mul",
                                                    "Div",
                                                    "Pow",
                                                    "Sqrt",
                                                    "Reciprocal",
                                                    "Tanh",
                                                    "Erf",
                                                    "Relu",
                                                    "Gelu",
                                                    "Sigmoid",
                                                    "Exp",
                                                    "Log",
                                                    "Neg",
                                                    "Abs",
                                                    "Cast",
                                                    "Identity",
                                                    "Where",
                                                    "Max",
                                                    "Min",
                                                    "Sum",
                                                    "Mean",
                                                    "Softplus",
                                                    "LeakyRelu",
                                                    "Elu",
                                                    "Selu",
                                                    "HardSigmoid",
                                                    "HardSwish",
                                                    "Clip",
                                                    "Dropout",
                                                    "LayerNormalization",
                                                    "RMSNormalization",
                                                    "Softmax",
                                                    "LogSoftmax",
                                                    "ReduceMean",
                                                    "ReduceSum",
                                                    "ReduceMax",
                                                    "ReduceMin",
                                                    "ReduceSumSquare",
                                                    "ReduceL2",
                                                    "ReduceProd"};
  if (!n.domain().empty() || !elementwise.count(n.op_type())) return std::nullopt;
  const std::vector<int> data = data_inputs(n);
  for (int i = 0; i < n.input_size(); ++i)
    if (part_of_.count(n.input(i)) && std::find(data.begin(), data.end(), i) == data.end()) return std::nullopt;
  const bool norm = n.op_type() == "LayerNormalization" || n.op_type() == "RMSNormalization";
  const bool broadcasts = data.size() > 1 && !norm;
  int out_rank = 0;
  for (int i : data) {
    const std::string& x = n.input(i);
    if (x.empty()) continue;
    const auto part = part_of_.find(x);
    const int r = part != part_of_.end() ? part->second.rank : rank_or(x, n);
    out_rank = broadcasts ? std::max(out_rank, r) : (i == 0 ? r : out_rank);
  }
  std::optional<int> axis;
  for (int i : data) {
    const auto part = part_of_.find(n.input(i));
    if (part == part_of_.end()) continue;
    const int a = part->second.axis + (out_rank - part->second.rank);
    if (axis && *axis != a) return std::nullopt;
    axis = a;
  }
  if (!axis || (!broadcasts && !part_of_.count(n.input(0)))) return std::nullopt;
  const std::string& op = n.op_type();
  if (norm && *axis >= normalized(attr_int(n, "axis", -1), out_rank)) return std::nullopt;
  if (op == "Softmax" || op == "LogSoftmax") {
    // Opset 13 on: along `axis` (default −1); before: over the flattened axes from `axis` (default 1) on.
    const int over = normalized(attr_int(n, "axis", opset_ >= 13 ? -1 : 1), out_rank);
    if (opset_ >= 13 ? *axis == over : *axis >= over) return std::nullopt;
  }
  if (op.rfind("Reduce", 0) == 0) {
    if (attr_int(n, "keepdims", 1) != 1) return std::nullopt;
    std::vector<int64_t> axes;
    for (const auto& a : n.attribute())
      if (a.name() == "axes") axes.assign(a.ints().begin(), a.ints().end());
    if (n.input_size() > 1 && !n.input(1).empty()) {
      const std::optional<std::vector<int64_t>> known = known_ints(n.input(1));
      if (!known) return std::nullopt;
      axes = *known;
    }
    if (axes.empty()) return std::nullopt;  // every axis (or none, noop_with_empty_axes): keep it simple
    for (int64_t a : axes)
      if (normalized(a, out_rank) == *axis) return std::nullopt;
  }
  int64_t length = 0;  // every part read has the same sequence
  for (int i : data)
    if (const auto part = part_of_.find(n.input(i)); part != part_of_.end()) length = part->second.length;
  return Part{*axis, out_rank, length};
}

int Sharder::normalized(int64_t axis, int rank) const { return static_cast<int>(axis < 0 ? axis + rank : axis); }

onnx::ValueInfoProto Sharder::part_type(onnx::ValueInfoProto whole, const Part& cut) const {
  auto* shape = whole.mutable_type()->mutable_tensor_type()->mutable_shape();
  if (cut.axis < shape->dim_size()) {
    auto* d = shape->mutable_dim(cut.axis);
    if (d->has_dim_value()) {
      const auto [begin, end] = tp_sequence_part(d->dim_value(), degree_, rank_);
      d->set_dim_value(end - begin);
    } else {
      d->clear_dim_param();
    }
  }
  return whole;
}

}  // namespace apart::tp_shard
