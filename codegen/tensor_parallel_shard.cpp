// A tensor-parallel rank's shard of a stage's forward graph (rules in the header).
#include "codegen/tensor_parallel_shard.h"

#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <charconv>
#include <functional>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "codegen/gradients/gradient.h"
#include "graph/error.h"
#include "graph/text.h"
#include "importer/guarded_inference.h"
#include "importer/importer.h"
#include "plan/plan.h"

namespace apart {

std::vector<std::pair<int64_t, int64_t>> tp_shard_ranges(int64_t length, int64_t pieces, int degree, int rank) {
  if (pieces < 1 || degree < 1 || rank < 0 || rank >= degree || length % (pieces * degree) != 0)
    throw InvalidModel("tensor parallelism: an axis of " + std::to_string(length) + " does not cut into " +
                       std::to_string(pieces) + " piece(s) of " + std::to_string(degree) + " equal parts");
  const int64_t piece = length / pieces, part = piece / degree;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t i = 0; i < pieces; ++i) ranges.emplace_back(i * piece + rank * part, i * piece + (rank + 1) * part);
  return ranges;
}

std::pair<int64_t, int64_t> tp_vocabulary_rows(int64_t rows, int degree, int rank) {
  if (degree < 1 || rank < 0 || rank >= degree || rows < 1)
    throw InvalidModel("tensor parallelism: rank " + std::to_string(rank) + " of " + std::to_string(degree) + " of " +
                       std::to_string(rows) + " vocabulary rows");
  const int64_t each = (rows + degree - 1) / degree;
  if ((degree - 1) * each >= rows)
    throw InvalidModel("tensor parallelism: " + std::to_string(rows) + " vocabulary rows in parts of " +
                       std::to_string(each) + " leave a rank of " + std::to_string(degree) + " none");
  return {rank * each, std::min(rows, (rank + 1) * each)};
}

std::vector<std::pair<int64_t, int64_t>> tp_param_ranges(const TpShardedParam& param, int degree, int rank) {
  const int64_t length = param.shape.at(static_cast<size_t>(param.axis));
  if (param.vocabulary) return {tp_vocabulary_rows(length, degree, rank)};
  return tp_shard_ranges(length, param.pieces, degree, rank);
}

namespace {

using onnx::NodeProto;
using onnx::TensorProto;

int64_t element_size(int32_t data_type) {
  switch (data_type) {
    case TensorProto::FLOAT: case TensorProto::INT32: case TensorProto::UINT32: return 4;
    case TensorProto::DOUBLE: case TensorProto::INT64: case TensorProto::UINT64: return 8;
    case TensorProto::FLOAT16: case TensorProto::BFLOAT16: case TensorProto::INT16: case TensorProto::UINT16: return 2;
    case TensorProto::INT8: case TensorProto::UINT8: case TensorProto::BOOL: return 1;
    default: return 0;
  }
}

// The tensor's bytes, from raw_data or the typed fields the slicer reads (float, int64).
std::string tensor_bytes(const TensorProto& t, const std::string& what) {
  if (t.data_location() == TensorProto::EXTERNAL)
    throw InvalidModel("tensor parallelism: " + what + " holds external data; load it inline before sharding");
  if (t.has_raw_data()) return t.raw_data();
  std::string bytes;
  if (t.float_data_size() > 0) bytes.assign(reinterpret_cast<const char*>(t.float_data().data()), t.float_data_size() * 4u);
  else if (t.int64_data_size() > 0) bytes.assign(reinterpret_cast<const char*>(t.int64_data().data()), t.int64_data_size() * 8u);
  return bytes;
}

// `t` cut to `ranges` along `axis`.
void slice_tensor(TensorProto& t, int axis, const std::vector<std::pair<int64_t, int64_t>>& ranges, const std::string& what) {
  const int64_t size = element_size(t.data_type());
  if (size == 0) throw Unsupported("tensor parallelism: " + what + " has a data type the shard cannot cut");
  std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
  const std::string bytes = tensor_bytes(t, what);
  int64_t outer = 1, inner = size;
  for (int a = 0; a < axis; ++a) outer *= dims[static_cast<size_t>(a)];
  for (size_t a = static_cast<size_t>(axis) + 1; a < dims.size(); ++a) inner *= dims[a];
  const int64_t length = dims[static_cast<size_t>(axis)];
  if (static_cast<int64_t>(bytes.size()) != outer * length * inner)
    throw InvalidModel("tensor parallelism: " + what + " holds " + std::to_string(bytes.size()) + " bytes for its shape");
  std::string out;
  int64_t kept = 0;
  for (const auto& [b, e] : ranges) kept += e - b;
  out.reserve(static_cast<size_t>(outer * kept * inner));
  for (int64_t o = 0; o < outer; ++o)
    for (const auto& [b, e] : ranges)
      out.append(bytes, static_cast<size_t>((o * length + b) * inner), static_cast<size_t>((e - b) * inner));
  t.clear_float_data();
  t.clear_int64_data();
  t.clear_int32_data();
  t.set_raw_data(out);
  t.set_dims(axis, kept);
}

TensorProto int64_tensor(const std::string& name, const std::vector<int64_t>& values) {
  TensorProto t;
  t.set_name(name);
  t.set_data_type(TensorProto::INT64);
  t.add_dims(static_cast<int64_t>(values.size()));
  t.set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t)));
  return t;
}

std::vector<int64_t> int64_values(const TensorProto& t, const std::string& what) {
  if (t.data_type() != TensorProto::INT64) throw Unsupported("tensor parallelism: " + what + " is not int64");
  const std::string bytes = tensor_bytes(t, what);
  std::vector<int64_t> v(bytes.size() / 8);
  std::memcpy(v.data(), bytes.data(), v.size() * 8);
  return v;
}

bool shape_like(const std::string& op) {
  return op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze" || op == "Transpose" ||
         op == "Split" || op == "Slice" || op == "MatMul" || op == "Gemm";
}

class Sharder {
 public:
  Sharder(const onnx::ModelProto& stage, int degree, int rank, TpWeights weights, TpSequence sequence)
      : degree_(degree), rank_(rank), weights_(weights), sequence_(sequence) {
    shard_.model = stage;
    onnx::GraphProto& g = *shard_.model.mutable_graph();
    for (int i = 0; i < g.node_size(); ++i) {
      node_of_name_[g.node(i).name()] = i;
      for (const std::string& o : g.node(i).output()) producer_[o] = i;
      for (const std::string& in : g.node(i).input()) consumers_[in].push_back(i);
    }
    for (int i = 0; i < g.initializer_size(); ++i) initializer_[g.initializer(i).name()] = i;
    for (const auto& o : stage.opset_import())
      if (o.domain().empty() || o.domain() == "ai.onnx") opset_ = o.version();
    // The forward's value types, for the collectives' outputs (ai.apart ops have no ONNX inference).
    onnx::ModelProto inferred = stage;
    try {
      onnx::ShapeInferenceOptions opts(/*check_type=*/false, /*error_mode=*/0, /*data_propagation=*/true);
      onnx::shape_inference::InferShapes(inferred, &guarded_schemas(), opts);
    } catch (const std::exception&) {
      // Whatever inference left is used; a missing type is reported where it is needed.
    }
    for (const auto& vi : inferred.graph().value_info()) types_[vi.name()] = vi;
    for (const auto& vi : inferred.graph().input()) types_[vi.name()] = vi;
    for (const auto& vi : inferred.graph().output()) types_[vi.name()] = vi;
    for (const auto& init : stage.graph().initializer()) rank_of_[init.name()] = init.dims_size();
    for (const auto& [name, vi] : types_)
      if (vi.type().tensor_type().has_shape()) rank_of_[name] = vi.type().tensor_type().shape().dim_size();
    // Ranks and the sizes of split axes from apart's importer too, which folds what ONNX's inference leaves unknown
    // (a Reshape target computed at run time). Read at batch 1: the split axis never scales with the batch.
    try {
      ImportOptions import;
      import.batch = 1;
      import.batch_explicit = true;
      import.require_external_data = false;
      import.constants_as_params = false;
      const ImportedModel m = import_model_bytes(stage.SerializeAsString(), {}, "stage", import);
      batch_symbol_ = m.batch_dim.find('[') == std::string::npos ? m.batch_dim : std::string();
      for (const Value& v : m.graph.values())
        if (v.shape_known) {
          rank_of_[v.name] = static_cast<int>(v.shape.size());
          shape_of_[v.name] = v.shape;
        }
    } catch (const Error&) {
      // What ONNX's inference found is used; a missing rank is reported where it is needed.
    }
  }

  // Whether the stage holds the whole region; one cut by a stage boundary is noted and left whole, and so is a
  // vocabulary region the degree does not divide, laid out otherwise than this pass cuts, or whose table another
  // vocabulary region leaves whole (noted with why).
  bool present(const TpShardRegion& r) {
    if (r.role != TpRegionRole::kEmbedding) {
      size_t found = 0;
      for (const auto* list : {&r.column_tasks, &r.row_tasks})
        for (const std::string& n : *list) found += node_of_name_.count(n);
      if (found == 0) return false;
      if (found != r.column_tasks.size() + r.row_tasks.size()) return whole(r, "");
      if (r.role == TpRegionRole::kLinears) return true;
    } else if (!producer_.count(r.end_value)) {
      return false;
    }
    if (const std::optional<std::string> why = vocabulary_left_whole(r)) return whole(r, *why);
    if (const std::optional<std::string> table = vocabulary_table(r); table && tables_kept_whole_.count(*table))
      return whole(r, "its table " + quote(*table) + " is read whole by another vocabulary region");
    return true;
  }

  // A table that a vocabulary region of the stage leaves whole stays whole for every region reading it (a cut table
  // read whole would give wrong rows): found before any region is cut.
  void keep_shared_tables_whole(const std::vector<TpShardRegion>& regions) {
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

  // The table a vocabulary region in the stage cuts: the embedding Gather's, the LM head's weight (or the table its
  // Transpose reads). nullopt when it reads none this pass can cut.
  std::optional<std::string> vocabulary_table(const TpShardRegion& r) const {
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

  // Why a vocabulary region the stage holds stays whole (nullopt: it is cut).
  std::optional<std::string> vocabulary_left_whole(const TpShardRegion& r) const {
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
        if (const auto p = producer_.find(v); p != producer_.end() && g.node(p->second).op_type() == "Reshape" &&
                                              !known_ints(g.node(p->second).input(1)))
          return "its logits' Reshape " + quote(g.node(p->second).name()) + " computes its target at run time over " +
                 std::to_string(rows) + " vocabulary rows that do not cut into " + std::to_string(degree_) +
                 " equal parts";
    return std::nullopt;
  }

  void shard(const TpShardRegion& r, size_t index) {
    if (r.role == TpRegionRole::kEmbedding) return shard_embedding(r);
    if (r.role == TpRegionRole::kLmHead) {  // the whole vocabulary: the table's rows (it may be cut already)
      const std::string table = *vocabulary_table(r);
      const std::optional<WeightSource> w = weight_source(shard_.model.graph().node(node_of_name_.at(r.column_tasks.front())));
      vocabulary_ = sliced_.count(table) ? sliced_.at(table).shape[static_cast<size_t>(w->axis)]
                                         : shard_.model.graph().initializer(initializer_.at(table)).dims(w->axis);
    }
    std::map<std::string, int> split(r.split_values.begin(), r.split_values.end());
    onnx::GraphProto& g = *shard_.model.mutable_graph();
    auto node = [&](const std::string& name) -> NodeProto& { return *g.mutable_node(node_of_name_.at(name)); };
    // The layout comes from plan.json: a linear it names must be one (a MatMul or Gemm reading a weight).
    for (const auto* list : {&r.column_tasks, &r.row_tasks})
      for (const std::string& name : *list) {
        const NodeProto& n = node(name);
        if (!n.domain().empty() || (n.op_type() != "MatMul" && n.op_type() != "Gemm") || n.input_size() < 2 ||
            n.output_size() < 1)
          throw InvalidModel("tensor parallelism: region " + quote(r.name) + " names " + quote(name) + " as a linear, but it is a " +
                             n.op_type() + " with " + std::to_string(n.input_size()) + " inputs; re-run apart partition");
      }
    for (const auto& [value, axis] : r.split_values)
      if (const auto it = rank_of_.find(value); it != rank_of_.end() && (axis < 0 || axis >= it->second))
        throw InvalidModel("tensor parallelism: region " + quote(r.name) + " splits " + quote(value) + " along axis " +
                           std::to_string(axis) + ", which it does not have; re-run apart partition");

    // Column linears: the pieces their output is cut into downstream, and the chain of values that carries them.
    std::map<int, int64_t> pieces_of_node;  // node index → pieces its split output is laid out in
    for (const std::string& c : r.column_tasks) {
      NodeProto& n = node(c);
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
        if (next.op_type() == "Slice") unsupported(next, "a Slice of a column linear's output (use Split)");
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
      if (!done) throw Unsupported("tensor parallelism: region " + quote(r.name) + " reads " + quote(s) + " sliced, but no reader of it is in the stage");
    }
    // Dropout on split values draws per TP rank (Megatron's model-parallel RNG): the node's name, which keys its random
    // stream (runtime/random.h), gets the rank, so the ranks' heads do not share one mask pattern. Dropout on
    // replicated values keeps its name: every rank must drop the same elements there.
    for (int k = 0; k < g.node_size(); ++k) {
      NodeProto& n = *g.mutable_node(k);
      if (n.domain().empty() && n.op_type() == "Dropout" && n.output_size() > 0 && split.count(n.output(0)))
        n.set_name(n.name() + "/tp_rank_" + std::to_string(rank_));
    }
    // Shape operands: Reshape targets and Split sizes along the split axis divide by the degree.
    for (int k = 0; k < g.node_size(); ++k) {
      NodeProto& n = *g.mutable_node(k);
      if (!n.domain().empty() || n.input_size() == 0) continue;
      if (n.op_type() == "Reshape" && split.count(n.output(0))) {
        const int j = split.at(n.output(0));
        std::optional<std::vector<int64_t>> target = known_ints(n.input(1));
        APART_CHECK(target || r.role != TpRegionRole::kLmHead || vocabulary_ % degree_ == 0,
                    "vocabulary_left_whole keeps an uneven LM head with a run-time logits target whole");
        if (!target) {
          // A target computed at run time (Shape → Gather → Concat, as torch exports write it): divided by a constant
          // [1, …, t, …, 1] there. Its entry j is the split dim's count (the heads), positive, as exporters write it.
          std::vector<int64_t> divisor(static_cast<size_t>(target_length(n)), 1);
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
          continue;
        }
        if (j >= static_cast<int>(target->size())) unsupported(n, "a target shape shorter than its split axis");
        if (r.role == TpRegionRole::kLmHead && (*target)[static_cast<size_t>(j)] > 0) {  // the vocabulary: this rank's rows
          if ((*target)[static_cast<size_t>(j)] != vocabulary_) unsupported(n, "a logits target whose split entry is not the vocabulary");
          const auto [first, last] = tp_vocabulary_rows(vocabulary_, degree_, rank_);
          (*target)[static_cast<size_t>(j)] = last - first;
          set_ints_input(n, 1, *target);
        } else if ((*target)[static_cast<size_t>(j)] > 0) {
          if ((*target)[static_cast<size_t>(j)] % degree_ != 0) unsupported(n, "a split dim that the degree does not divide");
          (*target)[static_cast<size_t>(j)] /= degree_;
          set_ints_input(n, 1, *target);
        }
      } else if (n.op_type() == "Split" && split.count(n.input(0)) &&
                 normalized(attr_int(n, "axis", 0), n.input(0)) == split.at(n.input(0))) {
        const bool as_input = n.input_size() > 1 && !n.input(1).empty();
        std::vector<int64_t> sizes;
        if (as_input) sizes = ints_of(n, 1);
        else
          for (const auto& a : n.attribute())
            if (a.name() == "split") sizes.assign(a.ints().begin(), a.ints().end());
        if (sizes.empty()) continue;  // equal parts: the same count of smaller parts
        for (int64_t& s : sizes) {
          if (s % degree_ != 0) unsupported(n, "split sizes the degree does not divide");
          s /= degree_;
        }
        if (as_input) set_ints_input(n, 1, sizes);
        else
          for (auto& a : *n.mutable_attribute())
            if (a.name() == "split") {
              a.clear_ints();
              for (int64_t s : sizes) a.add_ints(s);
            }
      } else if (n.op_type() == "Expand" && split.count(n.output(0))) {
        // repeat_kv's expand over split kv heads: the target's entry on the split axis (the kv heads) divides.
        std::optional<std::vector<int64_t>> target = known_ints(n.input(1));
        if (!target) unsupported(n, "an Expand target computed at run time");
        const int j = split.at(n.output(0)) - (rank_or(n.output(0), n) - static_cast<int>(target->size()));
        if (j >= 0 && (*target)[static_cast<size_t>(j)] > 1) {
          if ((*target)[static_cast<size_t>(j)] % degree_ != 0)
            unsupported(n, "a split dim that the degree does not divide");
          (*target)[static_cast<size_t>(j)] /= degree_;
          set_ints_input(n, 1, *target);
        }
      } else if (n.op_type() == "Slice" && split.count(n.input(0)) && split.count(n.output(0))) {
        // Along another axis (rotate_half's halves of the head dim) each rank slices its own heads alike.
        const int along = split.at(n.input(0));
        std::optional<std::vector<int64_t>> axes;
        size_t starts = 0;
        if (n.input_size() > 3 && !n.input(3).empty())
          axes = known_ints(n.input(3));
        else if (n.input_size() > 1)
          starts = known_ints(n.input(1)).value_or(std::vector<int64_t>{}).size();
        for (const auto& a : n.attribute()) {
          if (a.name() == "axes") axes = std::vector<int64_t>(a.ints().begin(), a.ints().end());
          if (a.name() == "starts") starts = static_cast<size_t>(a.ints_size());
        }
        if (!axes && starts > 0) {  // absent: the first len(starts) axes
          axes.emplace(starts);
          std::iota(axes->begin(), axes->end(), 0);
        }
        bool touches = !axes.has_value();
        for (int64_t a : axes.value_or(std::vector<int64_t>{})) touches = touches || normalized(a, n.input(0)) == along;
        if (touches) unsupported(n, "a Slice of a split value along its split axis");
      }
    }
    // Row linears: their rows, and the forward all-reduce of their partial output.
    for (const std::string& row : r.row_tasks) {
      NodeProto& n = node(row);
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
    // Region inputs: one TpCopy each, read by the region's column linears.
    for (const std::string& x : r.inputs) {
      const std::string copy = x + "/tp_copy_" + std::to_string(index);
      int first = -1;
      for (const std::string& c : r.column_tasks) {
        NodeProto& n = node(c);
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
    for (const auto& [value, axis] : r.split_values) split_names_.insert(value);
    ++shard_.regions;
    if (r.role == TpRegionRole::kLmHead) shard_logits_readers(r, split);
  }

  // --- Vocabulary regions (the header's third list) ------------------------------------------------------------------

  // A region left whole, and why ("" for a stage boundary cutting it).
  bool whole(const TpShardRegion& r, const std::string& why) {
    shard_.replicated.push_back(why.empty() ? r.name : r.name + " (" + why + ")");
    return false;
  }
  // Where a linear's weight (input 1) is held: the initializer it reads (node: the linear, input 1) or the one a
  // Transpose of it reads (node: the Transpose, input 0: a tied embedding table read as [H, V]), with the axis of that
  // initializer that holds `out_axis` of the weight. nullopt for anything else.
  struct WeightSource {
    int node = 0, input = 0, axis = 0;
  };
  std::optional<WeightSource> weight_source(const NodeProto& n, int out_axis = -1) const {
    const std::string& w = n.input(1);
    const int linear = node_of_name_.at(n.name());
    const bool trans_b = n.op_type() == "Gemm" && attr_int(n, "transB", 0) != 0;
    if (out_axis < 0) out_axis = trans_b ? 0 : 1;  // the output columns
    if (initializer_.count(w)) return WeightSource{linear, 1, out_axis};
    const auto p = producer_.find(w);
    if (p == producer_.end()) return std::nullopt;
    const NodeProto& t = shard_.model.graph().node(p->second);
    if (t.op_type() != "Transpose" || !t.domain().empty() || t.input_size() != 1 || !initializer_.count(t.input(0)) ||
        shard_.model.graph().initializer(initializer_.at(t.input(0))).dims_size() != 2)
      return std::nullopt;
    std::vector<int64_t> perm{1, 0};  // the default: reversed
    for (const auto& a : t.attribute())
      if (a.name() == "perm") perm.assign(a.ints().begin(), a.ints().end());
    if (perm.size() != 2 || out_axis > 1) return std::nullopt;
    return WeightSource{p->second, 0, static_cast<int>(perm[static_cast<size_t>(out_axis)])};
  }
  // Cuts a linear's weight along its `axis` (a weight read through a Transpose: the table along the matching axis);
  // returns the initializer cut.
  std::string slice_weight(NodeProto& n, int axis, int64_t pieces, const std::string& what, bool vocabulary) {
    const std::optional<WeightSource> w = initializer_.count(n.input(1)) ? std::nullopt : weight_source(n, axis);
    if (!w) {
      slice_initializer(n, 1, axis, pieces, what, vocabulary);
      return n.input(1);
    }
    NodeProto& holder = *shard_.model.mutable_graph()->mutable_node(w->node);
    slice_initializer(holder, w->input, w->axis, pieces, what, vocabulary);
    split_names_.insert(holder.output(0));  // its declared whole shape goes
    handled_readers_.insert(w->node);
    return holder.input(w->input);
  }

  // Gather(table, ids) on this rank's rows [start, start + rows): ids outside them read row 0, zeroed by a mask; the
  // ranks' rows summed by TpAllReduce into the Gather's output.
  // Every Gather of the region's table in the stage is cut alike (T5 reads its shared table in the encoder and the
  // decoder; the plan names one region for it).
  void shard_embedding(const TpShardRegion& r) {
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
  void shard_gather(const TpShardRegion& r, int k, const std::string out) {  // out: a copy (the node's output is renamed)
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

  // A vocabulary-split table must be read only where this pass cut its readers: a Gather left whole, or a linear the
  // pass did not split, would read the wrong rows.
  void check_vocabulary_readers() const {
    const onnx::GraphProto& g = shard_.model.graph();
    for (const std::string& table : vocabulary_tables_)
      for (int k : consumers_.at(table))
        if (!handled_readers_.count(k))
          throw Unsupported("tensor parallelism: node " + quote(g.node(k).name()) + " (" + g.node(k).op_type() +
                            ") reads the vocabulary-split table " + quote(table) +
                            " as a whole; plan this stage with --tp 1");
  }

  // The LM head's logits read by the loss (present() checked that nothing else reads them): the vocabulary-parallel
  // loss in its place.
  void shard_logits_readers(const TpShardRegion& r, const std::map<std::string, int>& split) {
    onnx::GraphProto& g = *shard_.model.mutable_graph();
    const auto readers = consumers_.find(r.end_value);
    for (int k : readers == consumers_.end() ? std::vector<int>{} : readers->second) {
      NodeProto& loss = *g.mutable_node(k);
      if (!split.count(loss.output(0))) split_loss(loss, r.end_value);
    }
  }
  // Whether `loss` is a SoftmaxCrossEntropyLoss this pass splits over the vocabulary: of [N, V] scores split along
  // V, without class weights, its log_prob output unread, every type it needs known.
  bool parallel_loss(const NodeProto& loss, const std::string& scores, int axis) const {
    return loss.op_type() == "SoftmaxCrossEntropyLoss" && loss.domain().empty() && loss.input(0) == scores && axis == 1 &&
           rank_of_.count(scores) && rank_of_.at(scores) == 2 && (loss.input_size() < 3 || loss.input(2).empty()) &&
           (loss.output_size() < 2 || loss.output(1).empty() || !consumers_.count(loss.output(1))) &&
           known_type(loss.input(1)) && known_type(loss.output(0)) && known_type(scores) && shape_of_.count(scores) &&
           shape_of_.count(loss.input(1)) && shape_of_.at(loss.input(1)).size() == 1 && !batch_symbol_.empty();
  }
  void split_loss(NodeProto& loss, const std::string& scores) {
    const onnx::ValueInfoProto value = *known_type(loss.output(0));
    const onnx::ValueInfoProto scores_type = *known_type(scores);
    loss.set_op_type(kVocabParallelCrossEntropyOp);
    loss.set_domain(autodiff::kApartDomain);
    autodiff::set_attr(loss, kVocabStartAttr, tp_vocabulary_rows(vocabulary_, degree_, rank_).first);
    autodiff::set_attr(loss, kVocabSizeAttr, vocabulary_);
    const std::string lse = loss.name() + "/tp_lse";
    if (loss.output_size() > 1) loss.set_output(1, lse);
    else loss.add_output(lse);
    set_type(loss.output(0), value);
    // lse: one value per row of the scores, [N] (a multiple of the batch: "K*batch", as stage files write it).
    onnx::ValueInfoProto lse_type;
    auto* tensor = lse_type.mutable_type()->mutable_tensor_type();
    tensor->set_elem_type(scores_type.type().tensor_type().elem_type());
    const int64_t rows_at_one = shape_of_.at(loss.input(1))[0];
    tensor->mutable_shape()->add_dim()->set_dim_param(rows_at_one == 1 ? batch_symbol_
                                                                       : std::to_string(rows_at_one) + "*" + batch_symbol_);
    set_type(lse, lse_type);
  }

  TpShard finish() {
    onnx::GraphProto& g = *shard_.model.mutable_graph();
    if (shard_.regions == 0) return std::move(shard_);
    check_vocabulary_readers();
    // The collectives in place: each TpCopy before the first linear reading it, each TpAllReduce after its row.
    google::protobuf::RepeatedPtrField<NodeProto> nodes;
    for (int k = 0; k < g.node_size(); ++k) {
      for (const NodeProto& n : before_[k]) *nodes.Add() = n;
      *nodes.Add() = g.node(k);
      for (const NodeProto& n : after_[k]) *nodes.Add() = n;
    }
    g.mutable_node()->Swap(&nodes);
    if (sequence_ == TpSequence::kSharded) shard_sequence();
    // Declared shapes of split values and sequence parts are the whole model's: drop them (the importer infers the
    // shard's).
    auto* infos = g.mutable_value_info();
    for (int i = infos->size() - 1; i >= 0; --i)
      if (split_names_.count(infos->Get(i).name()) || part_of_.count(infos->Get(i).name())) infos->DeleteSubrange(i, 1);
    for (const auto& vi : added_types_) *g.add_value_info() = vi;
    bool has_opset = false;
    for (const auto& o : shard_.model.opset_import()) has_opset = has_opset || o.domain() == autodiff::kApartDomain;
    if (!has_opset) {
      auto* o = shard_.model.add_opset_import();
      o->set_domain(autodiff::kApartDomain);
      o->set_version(1);
    }
    // The sliced params, in initializer order.
    for (const auto& init : g.initializer()) {
      auto it = sliced_.find(init.name());
      if (it != sliced_.end()) shard_.params.push_back(it->second);
    }
    return std::move(shard_);
  }

 private:
  [[noreturn]] void unsupported(const NodeProto& n, const std::string& what) const {
    throw Unsupported("tensor parallelism: node " + quote(n.name()) + " (" + n.op_type() + "): " + what +
                      " is not sharded yet; plan this stage with --tp 1");
  }
  static int64_t attr_int(const NodeProto& n, const std::string& name, int64_t fallback) {
    for (const auto& a : n.attribute())
      if (a.name() == name) return a.i();
    return fallback;
  }
  int rank_or(const std::string& value, const NodeProto& n) const {
    const auto it = rank_of_.find(value);
    if (it == rank_of_.end()) unsupported(n, "a value of unknown rank (" + quote(value) + ")");
    return it->second;
  }
  int normalized(int64_t axis, const std::string& value) const {
    const auto it = rank_of_.find(value);
    const int64_t r = it == rank_of_.end() ? 0 : it->second;
    return static_cast<int>(axis < 0 ? axis + r : axis);
  }
  // The integer contents of a value held in the graph: an initializer or a Constant node's value; nullopt otherwise.
  std::optional<std::vector<int64_t>> known_ints(const std::string& v) const {
    const onnx::GraphProto& g = shard_.model.graph();
    if (auto it = initializer_.find(v); it != initializer_.end()) return int64_values(g.initializer(it->second), quote(v));
    if (auto it = producer_.find(v); it != producer_.end()) {
      const NodeProto& p = g.node(it->second);
      if (p.op_type() == "Constant" && p.domain().empty())
        for (const auto& a : p.attribute())
          if (a.name() == "value" && a.has_t()) return int64_values(a.t(), quote(v));
    }
    return std::nullopt;
  }
  // How many dims a Reshape's target (its input 1, a 1-D tensor) names: its inferred length, else its output's rank.
  int64_t target_length(const NodeProto& n) const {
    if (const auto it = types_.find(n.input(1)); it != types_.end() && it->second.type().tensor_type().has_shape()) {
      const auto& shape = it->second.type().tensor_type().shape();
      if (shape.dim_size() == 1 && shape.dim(0).has_dim_value()) return shape.dim(0).dim_value();
    }
    return rank_or(n.output(0), n);
  }
  std::vector<int64_t> ints_of(const NodeProto& n, int input) const {
    if (auto v = known_ints(n.input(input))) return *v;
    unsupported(n, "a shape operand computed at run time (" + quote(n.input(input)) + ")");
  }
  // A value computed in the stage that the region reads sliced (T5's relative position bias, computed from its
  // table): each reader in the region reads Slice(TpCopy(value)) of this rank's range. TpCopy's backward all-reduce
  // makes the gradient flowing back into the replicated computation whole on every rank (each rank's Slice gradient
  // holds only its own heads).
  void slice_computed_input(const TpShardRegion& r, const std::string& s, const std::map<std::string, int>& split,
                            size_t index) {
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
      for (const auto& [suffix, value] : {std::pair<const char*, int64_t>{"starts", ranges[0].first},
                                          {"ends", ranges[0].second}, {"axes", axis}}) {
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
    if (!any) throw Unsupported("tensor parallelism: region " + quote(r.name) + " reads " + quote(s) + " sliced, but no reader of it is in the stage");
  }
  int64_t dim_of(const std::string& value, int axis, const NodeProto& n) const {
    if (const auto known = shape_of_.find(value); known != shape_of_.end() && axis >= 0 &&
                                                  axis < static_cast<int>(known->second.size()))
      return known->second[static_cast<size_t>(axis)];
    const auto it = types_.find(value);
    if (it != types_.end() && it->second.type().tensor_type().has_shape()) {
      const auto& shape = it->second.type().tensor_type().shape();
      if (axis >= 0 && axis < shape.dim_size() && shape.dim(axis).has_dim_value()) return shape.dim(axis).dim_value();
    }
    unsupported(n, "a sliced input of unknown size along its split axis (" + quote(value) + ")");
  }
  // A fresh int64 initializer for this node's input (the old value may be shared by other nodes).
  void set_ints_input(NodeProto& n, int input, const std::vector<int64_t>& values) {
    const std::string name = n.name() + "/tp_" + std::to_string(input);
    *shard_.model.mutable_graph()->add_initializer() = int64_tensor(name, values);
    n.set_input(input, name);
  }
  // Cuts the initializer a node reads at `input` along `axis` (each reader sees the same slice).
  // `vocabulary`: rows cut by tp_vocabulary_rows (one piece) rather than tp_shard_ranges.
  void slice_initializer(NodeProto& n, int input, int axis, int64_t pieces, const std::string& what,
                         bool vocabulary = false) {
    const std::string& v = n.input(input);
    const auto it = initializer_.find(v);
    if (it == initializer_.end()) unsupported(n, what + " that is not an initializer of the stage (" + quote(v) + ")");
    if (const auto done = sliced_.find(v); done != sliced_.end()) {
      if (done->second.axis != axis || done->second.pieces != pieces || done->second.vocabulary != vocabulary)
        unsupported(n, what + " " + quote(v) + " cut along two axes (another reader cuts it along " +
                           std::to_string(done->second.axis) + ")");
      return;
    }
    TensorProto& t = *shard_.model.mutable_graph()->mutable_initializer(it->second);
    if (axis < 0 || axis >= t.dims_size()) unsupported(n, what + " with no axis " + std::to_string(axis));
    TpShardedParam p{v, std::vector<int64_t>(t.dims().begin(), t.dims().end()), axis, pieces, vocabulary};
    const auto ranges = tp_param_ranges(p, degree_, rank_);
    if (weights_ == TpWeights::kCut || t.data_location() != TensorProto::EXTERNAL) {
      slice_tensor(t, axis, ranges, what + " " + quote(v));
    } else {  // shapes only: the shard's dims, its external data's length to match (the bytes are never read)
      int64_t kept = 0;
      for (const auto& [b, e] : ranges) kept += e - b;
      const int64_t length = t.dims(axis);
      t.set_dims(axis, kept);
      for (auto& entry : *t.mutable_external_data()) {
        if (entry.key() != "length") continue;
        int64_t bytes = 0;
        const auto [end, ec] = std::from_chars(entry.value().data(), entry.value().data() + entry.value().size(), bytes);
        if (ec != std::errc() || end != entry.value().data() + entry.value().size() || bytes < 0)
          throw InvalidModel("tensor parallelism: " + what + " " + quote(v) + " has external data length " + quote(entry.value()));
        entry.set_value(std::to_string(bytes / length * kept));
      }
    }
    sliced_[v] = p;
  }
  // value_info for a collective's output: the type `like` has in the forward.
  void add_type(const std::string& name, const std::string& like, const NodeProto& n) {
    const auto it = types_.find(like);
    if (it == types_.end() || !it->second.type().has_tensor_type()) unsupported(n, "a value of unknown type (" + quote(like) + ")");
    onnx::ValueInfoProto vi = it->second;
    vi.set_name(name);
    added_types_.push_back(vi);
  }


  // --- Sequence parallelism (the header's second list) --------------------------------------------------------------

  struct Part {
    int axis = 0;  // the sequence axis of the value
    int rank = 0;
    int64_t length = 0;  // the whole value's length along it (parts uneven when the degree does not divide it)
  };

  // Rewrites the graph (nodes in order, collectives in place) so that the values between regions are held in
  // sequence parts: regions' all-reduces become reduce-scatters, position-wise readers keep parts, every other
  // reader reads them all-gathered.
  void shard_sequence() {
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
            if (type == whole_of_.end()) unsupported(n, "sequence parallelism over a value of unknown type (" + quote(x) + ")");
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

  // A collective the shard placed, turned into `op`, its name saying so ("<region>/TpAllReduce" → "…/TpReduceScatter").
  static void rename_op(NodeProto& n, const char* op) {
    std::string name = n.name();
    if (const size_t at = name.rfind(n.op_type()); at != std::string::npos) name.replace(at, n.op_type().size(), op);
    n.set_name(name);
    n.set_op_type(op);
  }

  // The value x + suffix, which `make` defines the first time it is asked for.
  std::string once(const std::string& x, const std::string& suffix, const std::function<void(const std::string&)>& make) {
    std::string y = x + suffix;
    if (collectives_made_.insert(y).second) make(y);
    return y;
  }

  // A collective node: `cut`, when given, its axis (and the whole length where the parts are uneven).
  NodeProto collective(const char* op, const std::string& x, const std::string& y, std::optional<Part> cut,
                       const char* backward = nullptr) const {
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
  void set_cut(NodeProto& c, const Part& cut) const {
    autodiff::set_attr(c, "axis", static_cast<int64_t>(cut.axis));
    if (cut.length % degree_ != 0) autodiff::set_attr(c, kTpLengthAttr, cut.length);
  }

  // The sequence axis of a region's output: its first axis before the last longer than 1 at batch 1. A length the
  // degree does not divide is cut into uneven parts (tp_sequence_part) when it is static (the stage's own shapes
  // say so: a [B·S, H] token axis grows with the batch, which a part's length cannot follow).
  Part sequence_part(const std::string& end, const NodeProto& n) const {
    const auto shape = shape_of_.find(end);
    if (shape == shape_of_.end()) unsupported(n, "sequence parallelism over a value of unknown shape (" + quote(end) + ")");
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
  // Whether the stage's own shape inference (the batch symbolic) leaves `value`'s `axis` symbolic (a dim_param or
  // unknown length, as the batch is).
  bool symbolic_dim(const std::string& value, int axis) const {
    const auto it = types_.find(value);
    if (it == types_.end() || !it->second.type().tensor_type().has_shape()) return false;
    const auto& shape = it->second.type().tensor_type().shape();
    return axis < shape.dim_size() && !shape.dim(axis).has_dim_value();
  }
  // Whether the stage's own shape inference (the batch symbolic) gives `value` the length `length` along `axis`.
  bool static_dim(const std::string& value, int axis, int64_t length) const {
    const auto it = types_.find(value);
    if (it == types_.end() || !it->second.type().tensor_type().has_shape()) return false;
    const auto& shape = it->second.type().tensor_type().shape();
    return axis < shape.dim_size() && shape.dim(axis).has_dim_value() && shape.dim(axis).dim_value() == length;
  }

  // The inputs of n that line up with its output position by position (the others: Dropout's ratio, Clip's bounds).
  static std::vector<int> data_inputs(const NodeProto& n) {
    const std::string& op = n.op_type();
    if (op == "Dropout" || op == "Clip" || op == "Cast" || op == "Softmax" || op == "LogSoftmax" ||
        op.rfind("Reduce", 0) == 0)
      return {0};
    std::vector<int> all(static_cast<size_t>(n.input_size()));
    for (int i = 0; i < n.input_size(); ++i) all[static_cast<size_t>(i)] = i;
    return all;
  }

  // Where n's outputs hold their parts if n works position by position along its inputs' sequence axis; nullopt
  // when it mixes positions (or is not known to keep them apart), so its reader of a part needs it whole.
  std::optional<Part> position_wise(const NodeProto& n) const {
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
  int normalized(int64_t axis, int rank) const { return static_cast<int>(axis < 0 ? axis + rank : axis); }

  // Whether a gradient can flow into x: not a Constant node's output, not an integer or boolean initializer.
  bool carries_gradient(const std::string& x) const {
    const onnx::GraphProto& g = shard_.model.graph();
    if (const auto it = producer_.find(x); it != producer_.end() && g.node(it->second).op_type() == "Constant") return false;
    int32_t type = 0;
    if (const auto it = initializer_.find(x); it != initializer_.end()) type = g.initializer(it->second).data_type();
    else if (const auto t = types_.find(x); t != types_.end()) type = t->second.type().tensor_type().elem_type();
    return type == 0 || type == TensorProto::FLOAT || type == TensorProto::DOUBLE || type == TensorProto::FLOAT16 ||
           type == TensorProto::BFLOAT16;
  }

  // The whole value's type: added by this pass, or ONNX's inference of the forward, or an initializer's.
  onnx::ValueInfoProto whole_type(const std::string& v, const NodeProto& n) const {
    if (std::optional<onnx::ValueInfoProto> type = known_type(v)) return *type;
    unsupported(n, "sequence parallelism over a value of unknown type (" + quote(v) + ")");
  }
  std::optional<onnx::ValueInfoProto> known_type(const std::string& v) const {
    if (const int i = added_type_index(v); i >= 0) return added_types_[static_cast<size_t>(i)];
    if (const auto it = types_.find(v); it != types_.end() && it->second.type().has_tensor_type()) return it->second;
    if (const auto it = initializer_.find(v); it != initializer_.end()) {
      const TensorProto& t = shard_.model.graph().initializer(it->second);
      onnx::ValueInfoProto vi;
      vi.set_name(v);
      auto* tensor = vi.mutable_type()->mutable_tensor_type();
      tensor->set_elem_type(t.data_type());
      for (int64_t d : t.dims()) tensor->mutable_shape()->add_dim()->set_dim_value(d);
      return vi;
    }
    return std::nullopt;
  }
  // `whole` with this rank's part of `cut`'s axis (a symbolic length becomes unknown).
  onnx::ValueInfoProto part_type(onnx::ValueInfoProto whole, const Part& cut) const {
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
  int added_type_index(const std::string& v) const {
    for (size_t i = 0; i < added_types_.size(); ++i)
      if (added_types_[i].name() == v) return static_cast<int>(i);
    return -1;
  }
  void set_type(const std::string& v, onnx::ValueInfoProto type) {
    type.set_name(v);
    if (const int i = added_type_index(v); i >= 0) added_types_[static_cast<size_t>(i)] = std::move(type);
    else added_types_.push_back(std::move(type));
  }

  int degree_, rank_;
  TpWeights weights_;
  TpSequence sequence_;
  int64_t opset_ = 17;
  TpShard shard_;
  std::map<std::string, int> node_of_name_, producer_, initializer_, rank_of_;
  std::map<std::string, std::vector<int>> consumers_;
  std::map<std::string, onnx::ValueInfoProto> types_;
  std::map<std::string, std::vector<int64_t>> shape_of_;  // the importer's, at batch 1
  std::string batch_symbol_;                               // the stage's batch dim_param ("" when static)
  int64_t vocabulary_ = 0;  // the LM head being cut: its whole vocabulary
  std::set<std::string> tables_kept_whole_;  // read by a vocabulary region left whole (keep_shared_tables_whole)
  std::set<std::string> vocabulary_tables_;  // params cut along the vocabulary …
  std::set<int> handled_readers_;            // … and the nodes reading them that the pass cut (Gathers, LM heads)
  std::map<std::string, TpShardedParam> sliced_;
  std::map<int, std::vector<NodeProto>> before_, after_;
  std::vector<onnx::ValueInfoProto> added_types_;
  std::set<std::string> split_names_;
  std::set<std::string> region_copies_;               // the TpCopy of each region input, by node name
  std::map<std::string, std::string> region_reduces_;  // each region's closing TpAllReduce → its end value
  std::map<std::string, Part> part_of_;                // values held in sequence parts
  std::map<std::string, onnx::ValueInfoProto> whole_of_;  // … and their whole types
  std::set<std::string> collectives_made_;  // outputs of the TpScatter, TpCopy and TpAllGather nodes placed so far
};

}  // namespace

TpShard shard_stage_for_tensor_parallel(const onnx::ModelProto& stage, const std::vector<TpShardRegion>& regions,
                                        int degree, int rank, TpWeights weights, TpSequence sequence) {
  if (degree < 1 || rank < 0 || rank >= degree)
    throw InvalidArgument("tensor parallelism: rank " + std::to_string(rank) + " of degree " + std::to_string(degree));
  Sharder sharder(stage, degree, rank, weights, sequence);
  if (degree > 1) {
    sharder.keep_shared_tables_whole(regions);
    for (size_t i = 0; i < regions.size(); ++i)
      if (sharder.present(regions[i])) sharder.shard(regions[i], i);
  }
  return sharder.finish();
}

std::vector<TpShardRegion> tp_shard_regions(const PlanDocument& plan) {
  std::vector<TpShardRegion> regions;
  if (!plan.tensor_parallel) return regions;
  for (const PlanTpRegion& r : plan.tensor_parallel->regions) {
    TpShardRegion& region = regions.emplace_back();
    region.role = r.kind == TpRegionKind::kEmbedding ? TpRegionRole::kEmbedding
                  : r.kind == TpRegionKind::kLmHead  ? TpRegionRole::kLmHead
                                                     : TpRegionRole::kLinears;
    region.name = r.name;
    region.column_tasks = r.column_tasks;
    region.row_tasks = r.row_tasks;
    region.inputs = r.inputs;
    region.sliced_inputs = r.sliced_inputs;
    for (const PlanTpRegion::SplitValue& v : r.split_values) region.split_values.emplace_back(v.value, v.axis);
    region.end_value = r.end_value;
  }
  return regions;
}

}  // namespace apart
