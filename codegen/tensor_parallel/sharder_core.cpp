// The shard pass's core (codegen/tensor_parallel/sharder.h): the stage's indexes, cutting initializers, value types,
// and the shard assembled with its collectives in place.
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <charconv>
#include <cstring>

#include "codegen/gradients/gradient.h"
#include "graph/error.h"
#include "graph/text.h"
#include "importer/guarded_inference.h"
#include "importer/importer.h"
#include "sharder.h"

namespace apart::tp_shard {

namespace {

int64_t element_size(int32_t data_type) {
  switch (data_type) {
    case TensorProto::FLOAT:
    case TensorProto::INT32:
    case TensorProto::UINT32:
      return 4;
    case TensorProto::DOUBLE:
    case TensorProto::INT64:
    case TensorProto::UINT64:
      return 8;
    case TensorProto::FLOAT16:
    case TensorProto::BFLOAT16:
    case TensorProto::INT16:
    case TensorProto::UINT16:
      return 2;
    case TensorProto::INT8:
    case TensorProto::UINT8:
    case TensorProto::BOOL:
      return 1;
    default:
      return 0;
  }
}

// The tensor's bytes, from raw_data or the typed fields the slicer reads (float, int64).
std::string tensor_bytes(const TensorProto& t, const std::string& what) {
  if (t.data_location() == TensorProto::EXTERNAL)
    throw InvalidModel("tensor parallelism: " + what + " holds external data; load it inline before sharding");
  if (t.has_raw_data()) return t.raw_data();
  std::string bytes;
  if (t.float_data_size() > 0)
    bytes.assign(reinterpret_cast<const char*>(t.float_data().data()), t.float_data_size() * 4u);
  else if (t.int64_data_size() > 0)
    bytes.assign(reinterpret_cast<const char*>(t.int64_data().data()), t.int64_data_size() * 8u);
  return bytes;
}

// `t` cut to `ranges` along `axis`.
void slice_tensor(TensorProto& t, int axis, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                  const std::string& what) {
  const int64_t size = element_size(t.data_type());
  if (size == 0) throw Unsupported("tensor parallelism: " + what + " has a data type the shard cannot cut");
  std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
  const std::string bytes = tensor_bytes(t, what);
  int64_t outer = 1, inner = size;
  for (int a = 0; a < axis; ++a) outer *= dims[static_cast<size_t>(a)];
  for (size_t a = static_cast<size_t>(axis) + 1; a < dims.size(); ++a) inner *= dims[a];
  const int64_t length = dims[static_cast<size_t>(axis)];
  if (static_cast<int64_t>(bytes.size()) != outer * length * inner)
    throw InvalidModel("tensor parallelism: " + what + " holds " + std::to_string(bytes.size()) +
                       " bytes for its shape");
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

// The stage as apart's importer reads it with its batch bound to `batch` (weights not needed).
ImportedModel import_at_batch(const onnx::ModelProto& stage, int64_t batch) {
  ImportOptions import;
  import.batch = batch;
  import.batch_explicit = true;
  import.require_external_data = false;
  import.constants_as_params = false;
  return import_model_bytes(stage.SerializeAsString(), {}, "stage", import);
}

// A dim ONNX's inference does not know: no value and no symbol, or a symbol it made up ("unk__10").
bool unknown_dim(const onnx::TensorShapeProto::Dimension& d) {
  return !d.has_dim_value() && (!d.has_dim_param() || d.dim_param().rfind("unk__", 0) == 0);
}

bool has_unknown_dim(const onnx::ValueInfoProto& vi) {
  if (!vi.type().has_tensor_type()) return false;
  if (!vi.type().tensor_type().has_shape()) return true;  // not even its rank
  const auto& dims = vi.type().tensor_type().shape().dim();
  return std::any_of(dims.begin(), dims.end(), unknown_dim);
}

}  // namespace

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

Sharder::Sharder(const onnx::ModelProto& stage, int degree, int rank, TpWeights weights, TpSequence sequence)
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
    const ImportedModel m = import_at_batch(stage, 1);
    batch_symbol_ = m.batch_dim.find('[') == std::string::npos ? m.batch_dim : std::string();
    for (const Value& v : m.graph.values())
      if (v.shape_known) {
        rank_of_[v.name] = static_cast<int>(v.shape.size());
        shape_of_[v.name] = v.shape;
      }
  } catch (const Error&) {
    // What ONNX's inference found is used; a missing rank is reported where it is needed.
  }
  fill_unknown_dims(stage);
}

void Sharder::fill_unknown_dims(const onnx::ModelProto& stage) {
  std::vector<std::string> unknown;
  for (const auto& [name, vi] : types_)
    if (has_unknown_dim(vi) && shape_of_.count(name)) unknown.push_back(name);
  if (unknown.empty() || batch_symbol_.empty()) return;
  std::map<std::string, std::vector<int64_t>> at_two;
  try {
    const ImportedModel m = import_at_batch(stage, 2);
    for (const Value& v : m.graph.values())
      if (v.shape_known) at_two[v.name] = v.shape;
  } catch (const Error&) {
    return;  // a missing dim is reported where it is needed
  }
  for (const std::string& name : unknown) {
    const std::vector<int64_t>& one = shape_of_.at(name);
    const auto two = at_two.find(name);
    auto* shape = types_.at(name).mutable_type()->mutable_tensor_type()->mutable_shape();
    if (two == at_two.end() || two->second.size() != one.size()) continue;
    if (shape->dim_size() == 0)
      for (size_t a = 0; a < one.size(); ++a) shape->add_dim();
    if (shape->dim_size() != static_cast<int>(one.size())) continue;
    for (size_t a = 0; a < one.size(); ++a) {
      auto* d = shape->mutable_dim(static_cast<int>(a));
      if (!unknown_dim(*d)) continue;
      if (two->second[a] == one[a])
        d->set_dim_value(one[a]);
      else if (two->second[a] == 2 * one[a])
        d->set_dim_param(one[a] == 1 ? batch_symbol_ : std::to_string(one[a]) + "*" + batch_symbol_);
    }
  }
}

bool Sharder::present(const TpShardRegion& r) {
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

bool Sharder::whole(const TpShardRegion& r, const std::string& why) {
  shard_.replicated.push_back(why.empty() ? r.name : r.name + " (" + why + ")");
  return false;
}

std::optional<Sharder::WeightSource> Sharder::weight_source(const NodeProto& n, int out_axis) const {
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

std::string Sharder::slice_weight(NodeProto& n, int axis, int64_t pieces, const std::string& what, bool vocabulary) {
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

TpShard Sharder::finish() {
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

void Sharder::unsupported(const NodeProto& n, const std::string& what) const {
  throw Unsupported("tensor parallelism: node " + quote(n.name()) + " (" + n.op_type() + "): " + what +
                    " is not sharded yet; plan this stage with --tp 1");
}

int64_t Sharder::attr_int(const NodeProto& n, const std::string& name, int64_t fallback) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.i();
  return fallback;
}

int Sharder::rank_or(const std::string& value, const NodeProto& n) const {
  const auto it = rank_of_.find(value);
  if (it == rank_of_.end()) unsupported(n, "a value of unknown rank (" + quote(value) + ")");
  return it->second;
}

int Sharder::normalized(int64_t axis, const std::string& value) const {
  const auto it = rank_of_.find(value);
  const int64_t r = it == rank_of_.end() ? 0 : it->second;
  return static_cast<int>(axis < 0 ? axis + r : axis);
}

std::optional<std::vector<int64_t>> Sharder::known_ints(const std::string& v) const {
  const onnx::GraphProto& g = shard_.model.graph();
  if (auto it = initializer_.find(v); it != initializer_.end())
    return int64_values(g.initializer(it->second), quote(v));
  if (auto it = producer_.find(v); it != producer_.end()) {
    const NodeProto& p = g.node(it->second);
    if (p.op_type() == "Constant" && p.domain().empty())
      for (const auto& a : p.attribute())
        if (a.name() == "value" && a.has_t()) return int64_values(a.t(), quote(v));
  }
  return std::nullopt;
}

int64_t Sharder::target_length(const NodeProto& n) const {
  if (const auto it = types_.find(n.input(1)); it != types_.end() && it->second.type().tensor_type().has_shape()) {
    const auto& shape = it->second.type().tensor_type().shape();
    if (shape.dim_size() == 1 && shape.dim(0).has_dim_value()) return shape.dim(0).dim_value();
  }
  return rank_or(n.output(0), n);
}

std::vector<int64_t> Sharder::ints_of(const NodeProto& n, int input) const {
  if (auto v = known_ints(n.input(input))) return *v;
  unsupported(n, "a shape operand computed at run time (" + quote(n.input(input)) + ")");
}

int64_t Sharder::dim_of(const std::string& value, int axis, const NodeProto& n) const {
  if (const auto known = shape_of_.find(value);
      known != shape_of_.end() && axis >= 0 && axis < static_cast<int>(known->second.size()))
    return known->second[static_cast<size_t>(axis)];
  const auto it = types_.find(value);
  if (it != types_.end() && it->second.type().tensor_type().has_shape()) {
    const auto& shape = it->second.type().tensor_type().shape();
    if (axis >= 0 && axis < shape.dim_size() && shape.dim(axis).has_dim_value()) return shape.dim(axis).dim_value();
  }
  unsupported(n, "a sliced input of unknown size along its split axis (" + quote(value) + ")");
}

void Sharder::set_ints_input(NodeProto& n, int input, const std::vector<int64_t>& values) {
  const std::string name = n.name() + "/tp_" + std::to_string(input);
  *shard_.model.mutable_graph()->add_initializer() = int64_tensor(name, values);
  n.set_input(input, name);
}

void Sharder::slice_initializer(NodeProto& n, int input, int axis, int64_t pieces, const std::string& what,
                                bool vocabulary) {
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
        throw InvalidModel("tensor parallelism: " + what + " " + quote(v) + " has external data length " +
                           quote(entry.value()));
      entry.set_value(std::to_string(bytes / length * kept));
    }
  }
  sliced_[v] = p;
}

void Sharder::add_type(const std::string& name, const std::string& like, const NodeProto& n) {
  const auto it = types_.find(like);
  if (it == types_.end() || !it->second.type().has_tensor_type())
    unsupported(n, "a value of unknown type (" + quote(like) + ")");
  onnx::ValueInfoProto vi = it->second;
  vi.set_name(name);
  added_types_.push_back(vi);
}

bool Sharder::carries_gradient(const std::string& x) const {
  const onnx::GraphProto& g = shard_.model.graph();
  if (const auto it = producer_.find(x); it != producer_.end() && g.node(it->second).op_type() == "Constant")
    return false;
  int32_t type = 0;
  if (const auto it = initializer_.find(x); it != initializer_.end())
    type = g.initializer(it->second).data_type();
  else if (const auto t = types_.find(x); t != types_.end())
    type = t->second.type().tensor_type().elem_type();
  return type == 0 || type == TensorProto::FLOAT || type == TensorProto::DOUBLE || type == TensorProto::FLOAT16 ||
         type == TensorProto::BFLOAT16;
}

onnx::ValueInfoProto Sharder::whole_type(const std::string& v, const NodeProto& n) const {
  if (std::optional<onnx::ValueInfoProto> type = known_type(v)) return *type;
  unsupported(n, "sequence parallelism over a value of unknown type (" + quote(v) + ")");
}

std::optional<onnx::ValueInfoProto> Sharder::known_type(const std::string& v) const {
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

int Sharder::added_type_index(const std::string& v) const {
  for (size_t i = 0; i < added_types_.size(); ++i)
    if (added_types_[i].name() == v) return static_cast<int>(i);
  return -1;
}

void Sharder::set_type(const std::string& v, onnx::ValueInfoProto type) {
  type.set_name(v);
  if (const int i = added_type_index(v); i >= 0)
    added_types_[static_cast<size_t>(i)] = std::move(type);
  else
    added_types_.push_back(std::move(type));
}

}  // namespace apart::tp_shard
