// ONNX → TaskGraph: safe loading, external-data metadata, dim binding, shape inference, folding.
#include "importer/importer.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/unknown_field_set.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "graph/checked.h"
#include "graph/error.h"
#include "graph/text.h"
#include "importer/added_loss.h"
#include "importer/external_data.h"
#include "importer/constant_params.h"
#include "importer/fold.h"
#include "importer/guarded_inference.h"
#include "importer/model_proto.h"
#include "importer/opset_adapter.h"

namespace apart {

namespace fs = std::filesystem;

namespace {

// Lowest default-domain opset apart imports; the highest is kMaxOpset (importer/opset_adapter.h: ONNX 1.12 knows up
// to 17, apart adapts 18–23 onto its schemas).
constexpr int64_t kMinOpset = 1;
constexpr int64_t kMinTestedOpset = 7;
// Initializers up to this many elements with integer types keep their values (shape arithmetic).
constexpr int64_t kKnownIntsLimit = 4096;
// Inline initializer data above this size is dropped after validation: planning needs shapes only.
constexpr int64_t kKeepInlineBytes = 1 << 16;
constexpr int kMaxInferenceRounds = 4;
// Protobuf recursion limit for parsing (a GraphProto inside an If inside a graph is 3 levels), and
// the deeper one used only to tell "nested too deeply" from "not a model" once parsing has failed.
constexpr int kMaxMessageNesting = 64;
constexpr int kDiagnosticMessageNesting = 1024;

std::string node_label(const onnx::NodeProto& node, int index) {
  return node.name().empty() ? node.op_type() + "_" + std::to_string(index) : node.name();
}

// NodeProto.metadata_props (field 9, IR 10) is newer than the ONNX 1.12 protos apart builds with: protobuf keeps it
// as an unknown field, whose entries are StringStringEntryProto messages.
constexpr int kNodeMetadataPropsField = 9;

// The module path the dynamo exporter keeps in a node's metadata (graph/task_graph.h scope_from_metadata).
std::string metadata_scope(const onnx::NodeProto& node) {
  std::string name_scopes, namespace_value;
  const google::protobuf::UnknownFieldSet& unknown = node.GetReflection()->GetUnknownFields(node);
  for (int i = 0; i < unknown.field_count(); ++i) {
    const google::protobuf::UnknownField& f = unknown.field(i);
    if (f.number() != kNodeMetadataPropsField || f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED)
      continue;
    onnx::StringStringEntryProto entry;
    if (!entry.ParseFromString(f.length_delimited())) continue;
    if (entry.key() == "pkg.torch.onnx.name_scopes") name_scopes = entry.value();
    if (entry.key() == "namespace") namespace_value = entry.value();
  }
  return scope_from_metadata(name_scopes, namespace_value);
}

// --- Tensor metadata --------------------------------------------------------------

int64_t typed_field_count(const onnx::TensorProto& t) {
  switch (t.data_type()) {
    case onnx::TensorProto::FLOAT: return t.float_data_size();
    case onnx::TensorProto::COMPLEX64: return t.float_data_size() / 2;
    case onnx::TensorProto::DOUBLE: return t.double_data_size();
    case onnx::TensorProto::COMPLEX128: return t.double_data_size() / 2;
    case onnx::TensorProto::INT64: return t.int64_data_size();
    case onnx::TensorProto::UINT32:
    case onnx::TensorProto::UINT64: return t.uint64_data_size();
    case onnx::TensorProto::STRING: return t.string_data_size();
    default: return t.int32_data_size();  // int8/16/32, uint8/16, bool, float16, bfloat16
  }
}

// Integer contents of a small int tensor, or nullopt.
std::optional<std::vector<int64_t>> tensor_ints(const onnx::TensorProto& t, int64_t elements) {
  if (elements > kKnownIntsLimit || t.data_location() == onnx::TensorProto::EXTERNAL) return std::nullopt;
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(elements));
  const std::string& raw = t.raw_data();
  auto read_raw = [&](auto sample) {
    using T = decltype(sample);
    if (raw.size() != static_cast<size_t>(elements) * sizeof(T)) return false;
    for (int64_t i = 0; i < elements; ++i) {
      T v;
      std::memcpy(&v, raw.data() + i * sizeof(T), sizeof(T));
      out.push_back(static_cast<int64_t>(v));
    }
    return true;
  };
  switch (t.data_type()) {
    case onnx::TensorProto::INT64:
      if (t.has_raw_data()) return read_raw(int64_t{}) ? std::optional(out) : std::nullopt;
      if (t.int64_data_size() != elements) return std::nullopt;
      return std::vector<int64_t>(t.int64_data().begin(), t.int64_data().end());
    case onnx::TensorProto::INT32:
      if (t.has_raw_data()) return read_raw(int32_t{}) ? std::optional(out) : std::nullopt;
      if (t.int32_data_size() != elements) return std::nullopt;
      return std::vector<int64_t>(t.int32_data().begin(), t.int32_data().end());
    case onnx::TensorProto::BOOL:
    case onnx::TensorProto::UINT8:
      if (t.has_raw_data()) return read_raw(uint8_t{}) ? std::optional(out) : std::nullopt;
      if (t.int32_data_size() != elements) return std::nullopt;
      return std::vector<int64_t>(t.int32_data().begin(), t.int32_data().end());
    default: return std::nullopt;
  }
}

struct TensorInfo {
  DType dtype = DType::kUndefined;
  std::vector<int64_t> dims;
  int64_t elements = 0;
  int64_t bytes = 0;
};

// Validates an initializer's dims, dtype and data length; never reads external bytes.
TensorInfo check_tensor(const onnx::TensorProto& t, const std::string& what) {
  TensorInfo info;
  auto dt = dtype_from_onnx(t.data_type());
  if (!dt || *dt == DType::kUndefined)
    throw InvalidModel(what + " has data_type " + std::to_string(t.data_type()) + ", which is not a valid ONNX element type");
  info.dtype = *dt;
  info.dims.assign(t.dims().begin(), t.dims().end());
  for (int64_t d : info.dims)
    if (d < 0) throw InvalidModel(what + " has a negative dim (" + std::to_string(d) + ") in shape " + shape_string(info.dims));
  auto n = checked_element_count(info.dims);
  if (!n) throw InvalidModel(what + " has shape [" + shape_string(info.dims) + "], whose element count overflows 64 bits");
  info.elements = *n;
  const int64_t esize = dtype_size(info.dtype);
  if (esize > 0 && __builtin_mul_overflow(info.elements, esize, &info.bytes))
    throw InvalidModel(what + " has shape [" + shape_string(info.dims) + "], whose byte size overflows 64 bits");
  if (t.data_location() == onnx::TensorProto::EXTERNAL) return info;
  if (t.has_raw_data()) {
    if (esize > 0 && static_cast<int64_t>(t.raw_data().size()) != info.bytes)
      throw InvalidModel(what + ": raw_data holds " + std::to_string(t.raw_data().size()) + " bytes but shape [" +
                         shape_string(info.dims) + "] of " + std::string(dtype_name(info.dtype)) + " needs " +
                         std::to_string(info.bytes));
    return info;
  }
  const int64_t count = typed_field_count(t);
  if (count != info.elements && !(count == 0 && info.elements == 0))
    throw InvalidModel(what + ": holds " + std::to_string(count) + " elements but shape [" + shape_string(info.dims) +
                       "] needs " + std::to_string(info.elements));
  return info;
}

void drop_tensor_data(onnx::TensorProto& t) {
  t.clear_raw_data();
  t.clear_float_data();
  t.clear_double_data();
  t.clear_int32_data();
  t.clear_int64_data();
  t.clear_uint64_data();
  t.clear_string_data();
}

// --- Types from value_info -----------------------------------------------------

struct DeclaredType {
  bool is_tensor = false;
  DType dtype = DType::kUndefined;
  bool has_shape = false;
  std::vector<int64_t> dims;  // -1 where the dim is not a known value
  bool all_known = false;
};

DeclaredType declared_type(const onnx::ValueInfoProto& vi) {
  DeclaredType d;
  if (!vi.has_type() || !vi.type().has_tensor_type()) return d;
  const auto& tt = vi.type().tensor_type();
  d.is_tensor = true;
  d.dtype = dtype_from_onnx(tt.elem_type()).value_or(DType::kUndefined);
  if (!tt.has_shape()) return d;
  d.has_shape = true;
  d.all_known = true;
  for (const auto& dim : tt.shape().dim()) {
    if (dim.has_dim_value() && dim.dim_value() >= 0) {
      d.dims.push_back(dim.dim_value());
    } else {
      d.dims.push_back(-1);
      d.all_known = false;
    }
  }
  return d;
}

// --- Subgraph free variables (If/Loop/Scan bodies read outer values implicitly) -------

void collect_free_names(const onnx::GraphProto& g, std::set<std::string>& free_names) {
  std::unordered_set<std::string> defined;
  for (const auto& i : g.input()) defined.insert(i.name());
  for (const auto& i : g.initializer()) defined.insert(i.name());
  for (const auto& n : g.node())
    for (const auto& o : n.output()) defined.insert(o);
  for (const auto& n : g.node()) {
    for (const auto& i : n.input())
      if (!i.empty() && !defined.count(i)) free_names.insert(i);
    for (const auto& a : n.attribute()) {
      std::set<std::string> inner;
      if (a.has_g()) collect_free_names(a.g(), inner);
      for (const auto& sg : a.graphs()) collect_free_names(sg, inner);
      for (const auto& name : inner)
        if (!defined.count(name)) free_names.insert(name);
    }
  }
}

Attribute convert_attribute(const onnx::AttributeProto& a) {
  Attribute out;
  out.name = a.name();
  switch (a.type()) {
    case onnx::AttributeProto::INT: out.type = Attribute::Type::kInt; out.i = a.i(); break;
    case onnx::AttributeProto::FLOAT: out.type = Attribute::Type::kFloat; out.f = a.f(); break;
    case onnx::AttributeProto::STRING: out.type = Attribute::Type::kString; out.s = a.s(); break;
    case onnx::AttributeProto::INTS:
      out.type = Attribute::Type::kInts;
      out.ints.assign(a.ints().begin(), a.ints().end());
      break;
    case onnx::AttributeProto::FLOATS:
      out.type = Attribute::Type::kFloats;
      out.floats.assign(a.floats().begin(), a.floats().end());
      break;
    case onnx::AttributeProto::STRINGS: out.type = Attribute::Type::kStrings; break;
    case onnx::AttributeProto::TENSOR: out.type = Attribute::Type::kTensor; break;
    case onnx::AttributeProto::GRAPH:
    case onnx::AttributeProto::GRAPHS: out.type = Attribute::Type::kGraph; break;
    default: out.type = Attribute::Type::kOther; break;
  }
  return out;
}

// --- Names must be UTF-8 -----------------------------------------------------------
// ONNX strings are UTF-8, and plan.json/costs.json/profile.json carry these names: one that is not
// would fail deep inside JSON output, so it is refused here, naming where it is.

// `what` (a callable, so names are built only for the message) says where `s` is.
template <class What>
void require_utf8(const std::string& s, const What& what) {
  if (!is_utf8(s))
    throw InvalidModel(what() + " is not valid UTF-8: " + quote(s) + " (the bytes that are not are shown as \\xNN); ONNX "
                       "names must be UTF-8: rename it in the exporter, or with the onnx Python package, and save again");
}

void require_utf8_value_info(const onnx::ValueInfoProto& vi, const std::string& what, const std::string& where) {
  require_utf8(vi.name(), [&] { return "the name of " + what + where; });
  if (!vi.has_type() || !vi.type().has_tensor_type() || !vi.type().tensor_type().has_shape()) return;
  for (const auto& d : vi.type().tensor_type().shape().dim())
    if (d.has_dim_param()) require_utf8(d.dim_param(), [&] { return "a dim_param of " + what + " " + quote(vi.name()) + where; });
}

// `where` is "" for the main graph, " in the body of node N (If)" for a subgraph.
void require_utf8_names(const onnx::GraphProto& g, const std::string& where) {
  const auto nth = [](const char* what, int i) { return std::string(what) + " " + std::to_string(i); };
  for (int i = 0; i < g.input_size(); ++i) require_utf8_value_info(g.input(i), nth("graph input", i), where);
  for (int i = 0; i < g.output_size(); ++i) require_utf8_value_info(g.output(i), nth("graph output", i), where);
  for (int i = 0; i < g.value_info_size(); ++i) require_utf8_value_info(g.value_info(i), nth("value_info", i), where);
  for (int i = 0; i < g.initializer_size(); ++i)
    require_utf8(g.initializer(i).name(), [&] { return "the name of " + nth("initializer", i) + where; });
  for (int i = 0; i < g.sparse_initializer_size(); ++i)
    require_utf8(g.sparse_initializer(i).values().name(), [&] { return "the name of " + nth("sparse initializer", i) + where; });
  for (int i = 0; i < g.node_size(); ++i) {
    const auto& n = g.node(i);
    require_utf8(n.op_type(), [&] { return "the op_type of " + nth("node", i) + where; });
    require_utf8(n.domain(), [&] { return "the domain of " + nth("node", i) + where; });
    const auto named = [&] { return nth("node", i) + " (" + printable(n.op_type()) + ")" + where; };
    require_utf8(n.name(), [&] { return "the name of " + named(); });
    for (int k = 0; k < n.input_size(); ++k)
      require_utf8(n.input(k), [&] { return "the value name of " + nth("input", k) + " of " + named(); });
    for (int k = 0; k < n.output_size(); ++k)
      require_utf8(n.output(k), [&] { return "the value name of " + nth("output", k) + " of " + named(); });
    for (const auto& a : n.attribute()) {
      require_utf8(a.name(), [&] { return "an attribute name of " + named(); });
      if (a.has_g()) require_utf8_names(a.g(), " in the body of " + named());
      for (const auto& sg : a.graphs()) require_utf8_names(sg, " in a body of " + named());
    }
  }
}

// --- The importer -------------------------------------------------------------------

class Importer {
 public:
  Importer(onnx::ModelProto& model, fs::path base_dir, std::string display_name, const ImportOptions& options)
      : model_(model), base_dir_(std::move(base_dir)), options_(options) {
    result_.path = std::move(display_name);
  }

  ImportedModel run() {
    read_header();
    require_utf8_names(model_.graph(), "");
    if (options_.constants_as_params) result_.constant_params = constants_to_initializers(model_);
    append_loss(model_, options_.loss);
    onnx::GraphProto& g = *model_.mutable_graph();
    result_.node_count = g.node_size();
    add_initializers(g);
    add_graph_inputs(g);
    add_nodes(g);
    std::unordered_set<std::string> outputs;
    for (const auto& o : g.output()) {
      if (!outputs.insert(o.name()).second)
        throw InvalidModel("graph output " + quote(o.name()) + " is listed twice; every graph output must be named once");
      auto id = graph().find_value(o.name());
      if (!id) throw InvalidModel("graph output " + quote(o.name()) + " is neither produced by a node nor a graph input");
      if (graph().value(*id).kind == ValueKind::kActivation) graph().value(*id).kind = ValueKind::kOutput;
      graph().mark_graph_output(*id);
    }
    graph().finalize();
    infer_shapes(g);
    graph().classify_constants();
    report_unknown_shapes();
    return std::move(result_);
  }

 private:
  TaskGraph& graph() { return result_.graph; }

  void read_header() {
    if (!model_.has_graph())
      throw InvalidModel(result_.path + " parses as protobuf but holds no graph: is it an ONNX model?");
    if (model_.ir_version() <= 0)
      throw InvalidModel(result_.path + " has no ir_version: is it an ONNX model?");
    result_.ir_version = model_.ir_version();
    require_utf8(model_.producer_name(), [] { return std::string("producer_name"); });
    require_utf8(model_.producer_version(), [] { return std::string("producer_version"); });
    for (const auto& os : model_.opset_import()) require_utf8(os.domain(), [] { return std::string("an opset_import domain"); });
    result_.producer = model_.producer_name() + (model_.producer_version().empty() ? "" : " " + model_.producer_version());
    for (const auto& os : model_.opset_import()) {
      const std::string domain = os.domain() == "ai.onnx" ? "" : os.domain();
      result_.opsets[domain] = os.version();
    }
    if (model_.opset_import_size() == 0) result_.opsets[""] = 1;  // ONNX: IR < 3 models imply opset 1
    auto it = result_.opsets.find("");
    if (it != result_.opsets.end()) {
      if (it->second < kMinOpset)
        throw Unsupported(result_.path + " imports the default ONNX domain at opset " + std::to_string(it->second) +
                          "; apart supports opsets " + std::to_string(kMinOpset) + "–" + std::to_string(kMaxOpset));
      if (it->second > kMaxOpset) refuse_newer_opset(it->second);
      if (it->second < kMinTestedOpset)
        result_.warnings.push_back("default-domain opset " + std::to_string(it->second) + " is older than 7; imported with the schemas of that opset, but untested");
    }
  }

  // A model past kMaxOpset: named by its first node whose op ONNX revised after kMaxOpset (newer_revision), else by
  // its opset, since the training graphs apart writes must be valid at the model's opset.
  [[noreturn]] void refuse_newer_opset(int64_t opset) const {
    const std::string known = "the ONNX operators apart knows go up to opset " + std::to_string(kMaxOpset) +
                              " (ONNX 1.12's schemas up to " + std::to_string(kLibraryOpset) + ", adapted beyond)";
    const std::string fix = "; export the model at opset " + std::to_string(kMaxOpset) +
                            " or older, or convert it with onnx.version_converter.convert_version(model, " +
                            std::to_string(kMaxOpset) + ")";
    const auto& nodes = model_.graph().node();
    for (int i = 0; i < nodes.size(); ++i) {
      const auto& node = nodes.Get(i);
      if (!node.domain().empty() && node.domain() != "ai.onnx") continue;
      const std::string revision = newer_revision(node.op_type(), opset);
      if (!revision.empty())
        throw Unsupported("node " + quote(node_label(node, i)) + " (" + printable(node.op_type()) + ") of " +
                          result_.path + " is " + revision + " (the model imports opset " + std::to_string(opset) +
                          "); " + known + fix);
    }
    throw Unsupported(result_.path + " imports the default ONNX domain at opset " + std::to_string(opset) + "; " +
                      known +
                      (opset > newest_listed_opset()
                           ? ""
                           : ", and although none of this model's ops changed after " + std::to_string(kMaxOpset) +
                                 ", the graphs apart writes "
                                 "for it would declare opset " +
                                 std::to_string(opset)) +
                      fix);
  }

  void add_initializers(onnx::GraphProto& g) {
    std::set<std::string> missing_files;
    std::set<fs::path> external_files;
    for (auto& t : *g.mutable_initializer()) {
      if (t.name().empty()) throw InvalidModel("an initializer has an empty name");
      if (graph().find_value(t.name())) throw InvalidModel("two initializers are named " + quote(t.name()));
      TensorInfo info = check_tensor(t, "initializer " + quote(t.name()));
      Value v;
      v.name = t.name();
      v.kind = ValueKind::kParam;
      v.dtype = info.dtype;
      v.shape = info.dims;
      v.shape_known = true;
      v.elements = info.elements;
      v.bytes = info.bytes;
      if (t.data_location() == onnx::TensorProto::EXTERNAL) {
        v.external_data = true;
        const ExternalData ref = external_data(t, base_dir_);
        const fs::path& file = ref.file;
        external_files.insert(file);
        if (ref.length >= 0 && info.bytes > 0 && ref.length != info.bytes)
          throw InvalidModel("initializer " + quote(t.name()) + ": external_data length " + std::to_string(ref.length) +
                             " does not match its shape [" + shape_string(info.dims) + "] (" + std::to_string(info.bytes) + " bytes)");
        std::error_code ec;
        if (!external_file_exists(ref, t.name())) {
          missing_files.insert(ref.location);
        } else {
          const auto size = fs::file_size(file, ec);
          const auto end = checked_add(ref.offset, info.bytes);
          if (!end) throw InvalidModel("initializer " + quote(t.name()) + ": external_data offset " + std::to_string(ref.offset) + " overflows");
          if (!ec && static_cast<int64_t>(size) < *end)
            throw InvalidModel("initializer " + quote(t.name()) + " reads bytes " + std::to_string(ref.offset) + "…" +
                               std::to_string(*end) + " of " + quote(ref.location) + ", which has only " +
                               std::to_string(size) + " bytes");
        }
      } else {
        v.known_ints = tensor_ints(t, info.elements);
        if (info.bytes > kKeepInlineBytes) drop_tensor_data(t);  // planning needs shapes only
      }
      graph().add_value(std::move(v));
    }
    for (const auto& st : g.sparse_initializer()) {
      const std::string& name = st.values().name();
      if (name.empty() || graph().find_value(name)) throw InvalidModel("a sparse initializer has an empty or repeated name " + quote(name));
      Value v;
      v.name = name;
      v.kind = ValueKind::kParam;
      v.dtype = dtype_from_onnx(st.values().data_type()).value_or(DType::kUndefined);
      v.shape.assign(st.dims().begin(), st.dims().end());
      auto n = checked_element_count(v.shape);
      if (!n) throw InvalidModel("sparse initializer " + quote(name) + " has an invalid or overflowing shape");
      v.shape_known = true;
      v.elements = *n;
      v.bytes = *n * dtype_size(v.dtype);
      graph().add_value(std::move(v));
    }
    result_.external_data_present = missing_files.empty();
    result_.missing_external_files.assign(missing_files.begin(), missing_files.end());
    result_.external_data_files.assign(external_files.begin(), external_files.end());
    for (const auto& f : missing_files) {
      if (options_.require_external_data)
        throw InvalidModel("the weights of " + result_.path + " are external data in " + quote(f) +
                           ", which is not present beside the model; copy it there (running needs the weights)");
      result_.notes.push_back("weights are external data in " + quote(f) +
                              ", which is not present: fine for inspect and partition (shapes suffice), needed for run");
    }
  }

  // The batch dim by the kBatchDimNames rule (importer.h), among the graph inputs that are not initializers.
  struct BatchRule {
    std::string input;         // "" = no input with a leading dim
    std::string symbol;        // its dim_param; "" when unnamed or static
    int64_t fixed = -1;        // the model's own size, -1 when dynamic
  };
  BatchRule find_batch_dim(const onnx::GraphProto& g) {
    std::vector<const onnx::ValueInfoProto*> inputs;
    for (const auto& in : g.input())
      if (!graph().find_value(in.name()) && in.type().has_tensor_type() && in.type().tensor_type().has_shape())
        inputs.push_back(&in);
    for (const char* name : kBatchDimNames)
      for (const auto* in : inputs)
        for (const auto& d : in->type().tensor_type().shape().dim())
          if (d.has_dim_param() && d.dim_param() == name) return {in->name(), name, -1};
    for (const auto* in : inputs) {
      const auto& shape = in->type().tensor_type().shape();
      if (shape.dim_size() == 0) continue;
      const auto& d0 = shape.dim(0);
      if (d0.has_dim_param() && !d0.dim_param().empty()) return {in->name(), d0.dim_param(), -1};
      return {in->name(), "", d0.has_dim_value() ? d0.dim_value() : -1};
    }
    return {};
  }

  // ImportOptions::batch: puts the batch dim into dims_ unless --dim/--shape bind it (an explicit --batch
  // must then agree with them) or the model fixes it.
  void apply_batch_flag(const onnx::GraphProto& g, const BatchRule& rule) {
    const int64_t batch = options_.batch;
    if (batch <= 0 || rule.input.empty()) return;
    const std::string flag = "--batch " + std::to_string(batch);
    auto disagree = [&](const std::string& other) {
      if (options_.batch_explicit)
        throw InvalidArgument(flag + " and " + other + " disagree on the batch size; give one of them");
    };
    if (rule.fixed >= 0) {
      if (rule.fixed != batch && options_.batch_explicit)
        throw InvalidArgument("input " + quote(rule.input) + " has a static batch of " + std::to_string(rule.fixed) +
                              "; run with --batch " + std::to_string(rule.fixed) + " (or export the model with a dynamic batch)");
      return;
    }
    if (!rule.symbol.empty()) {
      if (auto d = options_.dims.find(rule.symbol); d != options_.dims.end()) {
        if (d->second != batch) disagree("--dim " + rule.symbol + "=" + std::to_string(d->second));
        return;
      }
      // A --shape of an input that carries the symbol binds it.
      for (const auto& in : g.input())
        for (const auto& [name, dims] : options_.input_shapes) {
          if (name != in.name() || !in.type().has_tensor_type()) continue;
          const auto& shape = in.type().tensor_type().shape();
          for (int i = 0; i < shape.dim_size() && static_cast<size_t>(i) < dims.size(); ++i)
            if (shape.dim(i).dim_param() == rule.symbol) {
              if (dims[i] != batch) disagree("--shape " + name + ":" + shape_string(dims));
              return;
            }
        }
      dims_[rule.symbol] = batch;
      batch_flag_dim_ = rule.symbol;
      return;
    }
    for (const auto& [name, dims] : options_.input_shapes)
      if (name == rule.input) {
        if (!dims.empty() && dims[0] != batch) disagree("--shape " + name + ":" + shape_string(dims));
        return;
      }
    unnamed_batch_ = true;  // add_graph_inputs binds the unnamed leading dims
  }

  // Binds --dim/--shape (and --batch, by the batch rule) into the graph inputs' dims, in place, so shape
  // inference sees static shapes.
  void add_graph_inputs(onnx::GraphProto& g) {
    std::set<std::string> used_dims;
    std::set<std::string> used_shapes;
    check_dim_flags_name_model_dims(g);
    const BatchRule rule = find_batch_dim(g);
    dims_ = options_.dims;
    apply_batch_flag(g, rule);
    for (auto& in : *g.mutable_input()) {
      if (in.name().empty()) throw InvalidModel("a graph input has an empty name");
      const DeclaredType declared = declared_type(in);
      if (auto existing = graph().find_value(in.name())) {
        // An initializer with the same name: ONNX IR < 4 lists every initializer as an input (a default value).
        Value& v = graph().value(*existing);
        if (v.kind != ValueKind::kParam) throw InvalidModel("two graph inputs are named " + quote(in.name()));
        const bool same_type = !declared.is_tensor || declared.dtype == v.dtype || declared.dtype == DType::kUndefined;
        bool same_shape = !declared.has_shape || declared.dims.size() == v.shape.size();
        for (size_t i = 0; same_shape && declared.has_shape && i < declared.dims.size(); ++i)
          if (declared.dims[i] >= 0 && declared.dims[i] != v.shape[i]) same_shape = false;
        if (!same_type || !same_shape)
          throw InvalidModel("initializer " + quote(in.name()) + " (" + std::string(dtype_name(v.dtype)) + " [" +
                             shape_string(v.shape) + "]) shadows the graph input of the same name, declared with a different " +
                             (same_type ? "shape" : "type") + "; rename one of them or make them agree");
        continue;
      }
      if (in.type().value_case() == onnx::TypeProto::VALUE_NOT_SET)
        throw InvalidModel("graph input " + quote(in.name()) + " declares no type (ONNX requires every graph input to " +
                           "have one); re-export the model");
      Value v;
      v.name = in.name();
      v.kind = ValueKind::kInput;
      if (!declared.is_tensor) {
        result_.warnings.push_back("graph input " + quote(in.name()) + " is not a tensor (sequence/map/optional); its size is unknown");
        graph().mark_graph_input(graph().add_value(std::move(v)));
        continue;
      }
      v.dtype = declared.dtype;
      auto* shape = in.mutable_type()->mutable_tensor_type()->mutable_shape();
      const auto explicit_shape = std::find_if(options_.input_shapes.begin(), options_.input_shapes.end(),
                                               [&](const auto& s) { return s.first == in.name(); });
      if (explicit_shape != options_.input_shapes.end()) {
        used_shapes.insert(in.name());
        const auto& dims = explicit_shape->second;
        const std::string flag = "--shape " + in.name() + ":" + shape_string(dims);
        if (declared.has_shape && static_cast<size_t>(shape->dim_size()) != dims.size())
          throw InvalidArgument(flag + " has rank " + std::to_string(dims.size()) + " but input " + quote(in.name()) +
                                " has rank " + std::to_string(shape->dim_size()));
        if (!declared.has_shape)
          for (size_t i = 0; i < dims.size(); ++i) shape->add_dim();
        for (int i = 0; i < shape->dim_size(); ++i) {
          auto* dim = shape->mutable_dim(i);
          if (dim->has_dim_value() && dim->dim_value() != dims[i])
            throw InvalidArgument(flag + " sets dim " + std::to_string(i) + " of " + quote(in.name()) + " to " +
                                  std::to_string(dims[i]) + ", but the model fixes it at " + std::to_string(dim->dim_value()));
          if (dim->has_dim_param()) {
            bind(dim->dim_param(), dims[i], flag);
          } else if (!dim->has_dim_value()) {
            result_.bindings.push_back({in.name() + "[" + std::to_string(i) + "]", dims[i], flag});
          }
          dim->set_dim_value(dims[i]);
        }
      } else if (declared.has_shape) {
        for (int i = 0; i < shape->dim_size(); ++i) {
          auto* dim = shape->mutable_dim(i);
          if (dim->has_dim_value()) {
            if (dim->dim_value() < 0)
              throw InvalidModel("graph input " + quote(in.name()) + " has a negative dim " + std::to_string(dim->dim_value()));
            continue;
          }
          if (dim->has_dim_param()) {
            // "<k>*<name>" (as stage_K.onnx writes a dim that is k times the batch) follows from --dim name=…,
            // unless the flags bind it by its full name.
            const auto scaled = dims_.count(dim->dim_param()) ? std::nullopt : parse_scaled_dim(dim->dim_param());
            const std::string& name = scaled ? scaled->second : dim->dim_param();
            auto bound = dims_.find(name);
            if (bound == dims_.end())
              throw InvalidArgument("dynamic dim " + quote(dim->dim_param()) + " of input " + quote(in.name()) + " (axis " +
                                    std::to_string(i) + ") is not bound: pass " + dim_flags_needed(*shape) +
                                    ", or the input's whole shape, --shape " + printable(in.name()) + ":" + example_shape(*shape));
            used_dims.insert(name);
            const std::string source = name == batch_flag_dim_ ? "--batch " + std::to_string(bound->second)
                                                               : "--dim " + name + "=" + std::to_string(bound->second);
            bind(name, bound->second, source);
            const int64_t value = scaled ? checked_scaled_dim(scaled->first, bound->second, source) : bound->second;
            if (scaled) bind(dim->dim_param(), value, source);
            dim->set_dim_value(value);
          } else if (i == 0 && unnamed_batch_) {
            const std::string source = "--batch " + std::to_string(options_.batch);
            result_.bindings.push_back({in.name() + "[0]", options_.batch, source});
            dim->set_dim_value(options_.batch);
          } else {
            throw InvalidArgument("input " + quote(in.name()) + " has an unnamed dynamic dim at axis " + std::to_string(i) +
                                  ": pass its whole shape, --shape " + printable(in.name()) + ":" + example_shape(*shape));
          }
        }
      } else {
        throw InvalidArgument("input " + quote(in.name()) + " declares no shape: pass its full shape with --shape " +
                              in.name() + ":D0xD1x…");
      }
      v.shape.clear();
      for (const auto& dim : shape->dim()) v.shape.push_back(dim.dim_value());
      set_size(v);
      graph().mark_graph_input(graph().add_value(std::move(v)));
    }
    for (const auto& [name, dims] : options_.input_shapes) {
      if (used_shapes.count(name)) continue;
      std::string names;
      for (const auto& in : g.input())
        if (!graph().find_value(in.name()) || graph().value(*graph().find_value(in.name())).kind == ValueKind::kInput)
          names += (names.empty() ? "" : ", ") + in.name();
      throw InvalidArgument("--shape names " + quote(name) + ", which is not an input of the model; its inputs are: " + names);
    }
    if (!rule.input.empty()) {
      const Value& first = graph().value(*graph().find_value(rule.input));
      if (!rule.symbol.empty()) result_.batch = bound_.count(rule.symbol) ? bound_.at(rule.symbol) : 0;
      else if (first.shape_known && !first.shape.empty()) result_.batch = first.shape[0];
      result_.batch_dim = !rule.symbol.empty() ? rule.symbol : rule.fixed < 0 ? rule.input + "[0]" : "";
      result_.batch_from_flag = !batch_flag_dim_.empty() || unnamed_batch_;
    }
    // Bind the same dim_params in graph outputs and value_info so declarations agree with inference.
    auto substitute = [&](onnx::ValueInfoProto& vi) {
      if (!vi.has_type() || !vi.type().has_tensor_type() || !vi.type().tensor_type().has_shape()) return;
      for (auto& dim : *vi.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim()) {
        if (!dim.has_dim_param()) continue;
        auto it = bound_.find(dim.dim_param());
        if (it != bound_.end()) {
          dim.set_dim_value(it->second);
        } else if (const auto scaled = parse_scaled_dim(dim.dim_param())) {
          auto base = bound_.find(scaled->second);
          if (base != bound_.end() && (base->second == 0 || scaled->first <= INT64_MAX / base->second))
            dim.set_dim_value(scaled->first * base->second);
        }
      }
    };
    for (auto& o : *g.mutable_output()) substitute(o);
    for (auto& vi : *g.mutable_value_info()) substitute(vi);
  }

  // "<k>*<name>" with k a positive integer → {k, name}; anything else → nullopt.
  static std::optional<std::pair<int64_t, std::string>> parse_scaled_dim(const std::string& param) {
    const size_t star = param.find('*');
    if (star == std::string::npos || star == 0 || star + 1 == param.size()) return std::nullopt;
    int64_t k = 0;
    for (size_t i = 0; i < star; ++i) {
      if (param[i] < '0' || param[i] > '9' || k > (INT64_MAX - 9) / 10) return std::nullopt;
      k = k * 10 + (param[i] - '0');
    }
    const std::string name = param.substr(star + 1);
    if (k < 1 || name.find('*') != std::string::npos) return std::nullopt;
    return std::pair{k, name};
  }

  static int64_t checked_scaled_dim(int64_t k, int64_t value, const std::string& source) {
    if (value > 0 && k > INT64_MAX / value) throw InvalidArgument(source + ": " + std::to_string(k) + "×" +
                                                                  std::to_string(value) + " overflows 64 bits");
    return k * value;
  }

  // The --dim name that binds `param`: itself, or for "<k>*<name>" the base name unless the flags name it in full.
  std::string dim_flag_name(const std::string& param) const {
    if (options_.dims.count(param)) return param;
    const auto scaled = parse_scaled_dim(param);
    return scaled ? scaled->second : param;
  }

  // The value the --dim flags give `param`, if any.
  std::optional<int64_t> dim_flag_value(const std::string& param) const {
    auto it = options_.dims.find(dim_flag_name(param));
    if (it == options_.dims.end()) return std::nullopt;
    const auto scaled = options_.dims.count(param) ? std::nullopt : parse_scaled_dim(param);
    if (!scaled) return it->second;
    if (it->second > 0 && scaled->first > INT64_MAX / it->second) return std::nullopt;
    return scaled->first * it->second;
  }

  // Every dim of the model's inputs a --dim flag may name; a --dim naming anything else is refused
  // before any other check, so the message is about that flag, not about a dim left unbound.
  void check_dim_flags_name_model_dims(const onnx::GraphProto& g) const {
    std::set<std::string> names;
    for (const auto& in : g.input()) {
      if (!in.has_type() || !in.type().has_tensor_type() || !in.type().tensor_type().has_shape()) continue;
      for (const auto& dim : in.type().tensor_type().shape().dim()) {
        if (!dim.has_dim_param()) continue;
        names.insert(dim.dim_param());
        if (const auto scaled = parse_scaled_dim(dim.dim_param())) names.insert(scaled->second);
      }
    }
    for (const auto& [name, value] : options_.dims) {
      if (names.count(name)) continue;
      std::string list;
      for (const auto& p : names) list += (list.empty() ? "" : ", ") + printable(p);
      throw InvalidArgument("--dim " + printable(name) + "=" + std::to_string(value) + ": the model has no dim " + quote(name) +
                            (list.empty() ? std::string(" (its inputs have no named dynamic dims; use --shape NAME:D0xD1x…)")
                                          : "; its dims are: " + list));
    }
  }

  // "--dim batch=<size> --dim feat=<size>": the flags that bind every named dim of `shape` still unbound.
  std::string dim_flags_needed(const onnx::TensorShapeProto& shape) const {
    std::vector<std::string> flags;
    for (const auto& d : shape.dim()) {
      if (!d.has_dim_param() || d.has_dim_value() || dim_flag_value(d.dim_param())) continue;
      const std::string flag = "--dim " + printable(dim_flag_name(d.dim_param())) + "=<size>";
      if (std::find(flags.begin(), flags.end(), flag) == flags.end()) flags.push_back(flag);
    }
    std::string out;
    for (const auto& f : flags) out += (out.empty() ? "" : " ") + f;
    return out;
  }

  // "4x<feat>x<axis2>" for --shape: fixed and flag-bound dims as numbers, the rest as placeholders.
  std::string example_shape(const onnx::TensorShapeProto& shape) const {
    std::string s;
    for (int i = 0; i < shape.dim_size(); ++i) {
      if (i) s += 'x';
      const auto& d = shape.dim(i);
      if (d.has_dim_value()) s += std::to_string(d.dim_value());
      else if (!d.has_dim_param()) s += "<axis" + std::to_string(i) + ">";
      else if (const auto v = dim_flag_value(d.dim_param())) s += std::to_string(*v);
      else s += "<" + printable(d.dim_param()) + ">";
    }
    return s;
  }

  void bind(const std::string& dim, int64_t value, const std::string& source) {
    if (value < 0) throw InvalidArgument(source + ": dims must be non-negative");
    auto [it, inserted] = bound_.emplace(dim, value);
    if (!inserted && it->second != value)
      throw InvalidArgument("dim " + quote(dim) + " is bound to both " + std::to_string(it->second) + " and " +
                            std::to_string(value) + " (" + source + ")");
    if (inserted) result_.bindings.push_back({dim, value, source});
  }

  void set_size(Value& v) {
    auto n = checked_element_count(v.shape);
    if (!n) throw InvalidModel("value " + quote(v.name) + " has shape [" + shape_string(v.shape) + "], whose element count overflows 64 bits");
    int64_t bytes = 0;
    if (__builtin_mul_overflow(*n, dtype_size(v.dtype), &bytes))
      throw InvalidModel("value " + quote(v.name) + " has shape [" + shape_string(v.shape) + "], whose byte size overflows 64 bits");
    v.shape_known = true;
    v.elements = *n;
    v.bytes = bytes;
  }

  // "'', 'com.microsoft'": the domains opset_import declares, for messages.
  std::string imported_domains() const {
    std::string out;
    for (const auto& [domain, version] : result_.opsets) out += (out.empty() ? "" : ", ") + quote(domain);
    return out.empty() ? "nothing" : out;
  }

  ValueId value_for(const std::string& name) {
    if (auto id = graph().find_value(name)) return *id;
    Value v;
    v.name = name;
    return graph().add_value(std::move(v));
  }

  // ONNX 1.12's shape-inference functions trust a node to match its schema: a Scan without num_scan_inputs, a
  // Loop body given as an int, dereference null inside libonnx (found by fuzz/import.cpp; tests/regress/import/).
  // So every node with a known schema, and every node of its subgraphs, is checked against it (required and
  // unknown attributes, attribute types, input and output counts) before inference runs.
  void verify_against_schema(const onnx::OpSchema& schema, const onnx::NodeProto& node, const std::string& label) {
    try {
      schema.Verify(node);
    } catch (const std::exception& e) {
      throw InvalidModel("node " + quote(label) + " (" + node.op_type() + ") does not match ONNX's " + node.op_type() +
                         "-" + std::to_string(schema.since_version()) + " schema: " + printable(e.what()) +
                         "; re-export the model or fix the node");
    }
    for (const auto& a : node.attribute()) {
      if (a.has_g()) verify_subgraph(a.g(), label);
      for (const auto& sg : a.graphs()) verify_subgraph(sg, label);
    }
  }
  void verify_subgraph(const onnx::GraphProto& body, const std::string& owner) {
    for (int i = 0; i < body.node_size(); ++i) {
      const auto& node = body.node(i);
      const std::string domain = node.domain() == "ai.onnx" ? "" : node.domain();
      auto opset = result_.opsets.find(domain);
      if (opset == result_.opsets.end()) continue;
      const std::string label = owner + "/" + node_label(node, i);
      const OpsetSchema found = opset_schema(node.op_type(), static_cast<int>(opset->second), domain);
      refuse_unadapted(found, node, label, opset->second);
      if (found.schema != nullptr) verify_against_schema(*found.schema, node, label);
    }
  }

  // Unsupported for a node at opset > 17 whose op revision apart does not adapt (opset_adapter.h), or that uses a new
  // attribute in a way the adapted schema does not infer.
  void refuse_unadapted(const OpsetSchema& found, const onnx::NodeProto& node, const std::string& label,
                        int64_t opset) {
    std::string problem = found.refusal;
    if (problem.empty() && found.schema != nullptr && node.domain().empty())
      problem = adapted_node_problem(node, opset);
    if (!problem.empty())
      throw Unsupported("node " + quote(label) + " (" + printable(node.op_type()) + "): " + problem +
                        "; apart knows ONNX "
                        "operators up to opset " +
                        std::to_string(kMaxOpset) + ", with ONNX 1.12's schemas up to " +
                        std::to_string(kLibraryOpset) + "; export the model at opset " + std::to_string(kLibraryOpset) +
                        " or replace the node");
  }

  void add_nodes(onnx::GraphProto& g) {
    std::set<std::string> opaque_ops;
    std::unordered_set<std::string> produced;
    for (int i = 0; i < g.node_size(); ++i) {
      const auto& node = g.node(i);
      Task t;
      t.name = node_label(node, i);
      if (t.name.find('/') == std::string::npos) t.scope = metadata_scope(node);
      t.op_type = node.op_type();
      t.domain = node.domain() == "ai.onnx" ? "" : node.domain();
      t.onnx_node_index = i;
      if (t.op_type.empty()) throw InvalidModel("node " + std::to_string(i) + " (" + quote(t.name) + ") has no op_type");
      for (const auto& in : node.input()) t.inputs.push_back(in.empty() ? ValueId::invalid() : value_for(in));
      for (const auto& out : node.output()) {
        if (out.empty()) {
          t.outputs.push_back(ValueId::invalid());
          continue;
        }
        t.outputs.push_back(value_for(out));
      }
      // Subgraph bodies (If/Loop/Scan) read outer values implicitly: make those explicit inputs.
      bool has_subgraph = false;
      for (const auto& a : node.attribute()) {
        t.attributes.push_back(convert_attribute(a));
        has_subgraph |= a.has_g() || a.graphs_size() > 0;
      }
      if (has_subgraph) {
        std::set<std::string> free_names;
        for (const auto& a : node.attribute()) {
          if (a.has_g()) collect_free_names(a.g(), free_names);
          for (const auto& sg : a.graphs()) collect_free_names(sg, free_names);
        }
        for (const auto& name : free_names)
          if (graph().find_value(name)) t.inputs.push_back(graph().find_value(name).value());
      }
      auto opset = result_.opsets.find(t.domain);
      if (opset == result_.opsets.end())
        throw InvalidModel("node " + quote(t.name) + " (" + printable(t.op_type) + ") is in domain " + quote(t.domain) +
                           ", which the model does not import (its opset_import lists " + imported_domains() +
                           "); add the domain to opset_import or re-export the model");
      const int version = static_cast<int>(opset->second);
      const OpsetSchema found = opset_schema(t.op_type, version, t.domain);
      refuse_unadapted(found, node, t.name, version);
      const onnx::OpSchema* schema = found.schema;
      if (schema != nullptr) verify_against_schema(*schema, node, t.name);
      // The default domain is ONNX's own: an op it does not define at the model's opset is a broken model, not a
      // custom op to estimate (custom ops live in their own domains).
      if (schema == nullptr && t.domain.empty())
        throw InvalidModel("node " + quote(t.name) + ": ONNX opset " + std::to_string(version) + " has no operator " +
                           quote(t.op_type) + " in its default domain (a typo, an op from a newer opset, or a custom "
                           "op that belongs in a domain of its own); re-export the model");
      if (schema == nullptr) {
        t.opaque = true;
        opaque_ops.insert((t.domain.empty() ? "" : t.domain + "::") + t.op_type);
      }
      // Small integer constants feed shape arithmetic.
      if (t.op_type == "Constant" && t.domain.empty() && node.output_size() == 1) {
        for (const auto& a : node.attribute()) {
          if (a.name() == "value" && a.has_t()) {
            TensorInfo info = check_tensor(a.t(), "the value of Constant node " + quote(t.name));
            Value& out = graph().value(t.outputs[0]);
            out.known_ints = tensor_ints(a.t(), info.elements);
          }
        }
      }
      // ConstantOfShape's integer fill value, kept on the task (Attribute::ints) for folding (fold.cpp).
      if (t.op_type == "ConstantOfShape" && t.domain.empty()) {
        for (const auto& a : node.attribute()) {
          if (a.name() != "value" || !a.has_t()) continue;
          const TensorInfo info = check_tensor(a.t(), "the value of ConstantOfShape node " + quote(t.name));
          if (auto v = tensor_ints(a.t(), info.elements); v && v->size() == 1)
            for (Attribute& attr : t.attributes)
              if (attr.name == "value") attr.ints = *v;
        }
      }
      graph().add_task(std::move(t));
    }
    if (!opaque_ops.empty()) {
      std::string list;
      for (const auto& op : opaque_ops) list += (list.empty() ? "" : ", ") + op;
      result_.warnings.push_back("ops unknown to ONNX " + std::string("1.12") + " imported as opaque tasks (cost unknown): " + list);
    }
  }

  // ONNX shape inference (with data propagation), then our folding; repeats while folding
  // makes new values known, feeding them back to inference as initializers.
  void infer_shapes(onnx::GraphProto& g) {
    // Inference needs nodes in topological order: use the order finalize() chose.
    {
      google::protobuf::RepeatedPtrField<onnx::NodeProto> sorted;
      sorted.Reserve(g.node_size());
      for (const Task& t : graph().tasks()) *sorted.Add() = std::move(*g.mutable_node(t.onnx_node_index));
      g.mutable_node()->Swap(&sorted);
    }
    std::unordered_set<std::string> injected;
    for (int round = 0; round < kMaxInferenceRounds; ++round) {
      run_onnx_inference();
      apply_inferred_types(g);
      const size_t folded = fold_shape_arithmetic(graph());
      if (folded == 0) break;
      // Feed newly known values to the next round, as initializers replacing their producers.
      bool fed = false;
      std::unordered_set<std::string> to_drop;
      for (const Task& t : graph().tasks()) {
        bool all = !t.outputs.empty();
        for (ValueId o : t.outputs) {
          if (!o.valid() || !graph().value(o).known_ints || !graph().value(o).shape_known) all = false;
          else if (graph().value(o).dtype != DType::kInt64 && graph().value(o).dtype != DType::kInt32) all = false;
        }
        if (!all) continue;
        for (ValueId o : t.outputs) {
          const Value& v = graph().value(o);
          if (injected.count(v.name)) continue;
          injected.insert(v.name);
          to_drop.insert(v.name);
          onnx::TensorProto* init = g.add_initializer();
          init->set_name(v.name);
          init->set_data_type(v.dtype == DType::kInt32 ? onnx::TensorProto::INT32 : onnx::TensorProto::INT64);
          for (int64_t d : v.shape) init->add_dims(d);
          for (int64_t x : *v.known_ints) {
            if (v.dtype == DType::kInt32) init->add_int32_data(static_cast<int32_t>(x));
            else init->add_int64_data(x);
          }
          fed = true;
        }
      }
      if (!fed || !has_unknown_shapes()) break;
      auto* nodes = g.mutable_node();
      nodes->erase(std::remove_if(nodes->begin(), nodes->end(),
                                  [&](const onnx::NodeProto& n) {
                                    return n.output_size() > 0 && std::all_of(n.output().begin(), n.output().end(),
                                                                              [&](const std::string& o) { return to_drop.count(o) > 0; });
                                  }),
                   nodes->end());
      // A stale value_info without a shape would override the new initializer's type.
      auto* infos = g.mutable_value_info();
      infos->erase(std::remove_if(infos->begin(), infos->end(),
                                  [&](const onnx::ValueInfoProto& vi) { return to_drop.count(vi.name()) > 0; }),
                   infos->end());
      if (model_.ir_version() < 4) model_.set_ir_version(4);  // initializers that are not inputs
    }
    name_inference_hazards();
  }

  // The checks GuardedSchemaRegistry makes before ONNX infers a node (inference_hazard), made again on what inference
  // learned, so such a node is named instead of left unknown.
  void name_inference_hazards() {
    for (const Task& t : graph().tasks()) {
      if (!t.domain.empty()) continue;
      const auto known = [&](size_t i) {
        return i < t.inputs.size() && t.inputs[i].valid() && graph().value(t.inputs[i]).shape_known;
      };
      NodeShapes node;
      node.inputs = t.inputs.size();
      node.rank = [&](size_t i) { return known(i) ? static_cast<int>(graph().value(t.inputs[i]).shape.size()) : -1; };
      node.ints_length = [&](const char* name) {
        const Attribute* a = t.attr(name);
        return a == nullptr ? -1 : static_cast<int>(a->ints.size());
      };
      node.name = [&](size_t i) { return quote(graph().value(t.inputs[i]).name); };
      node.shape = [&](size_t i) { return shape_string(graph().value(t.inputs[i]).shape); };
      const std::string hazard = inference_hazard(t.op_type, node);
      if (!hazard.empty())
        throw InvalidModel("node " + quote(t.name) + " (" + t.op_type + "): " + hazard +
                           "; re-export the model or fix the node");
    }
  }

  void run_onnx_inference() {
    try {
      onnx::ShapeInferenceOptions opts(/*check_type=*/false, /*error_mode=*/0, /*data_propagation=*/true);
      onnx::shape_inference::InferShapes(model_, &guarded_schemas(), opts);
    } catch (const std::exception& e) {
      // Declared shapes disagree with inferred ones, or an op's inference rejected its input.
      std::string what = printable(e.what());  // quotes node names raw
      if (what.size() > 400) {
        size_t cut = 400;
        while (cut > 0 && (static_cast<unsigned char>(what[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
        what = what.substr(0, cut) + "…";
      }
      result_.warnings.push_back("ONNX shape inference stopped: " + what + "; using declared shapes where inference did not finish");
    }
  }

  bool has_unknown_shapes() const {
    for (const Value& v : result_.graph.values())
      if (!v.shape_known && v.producer.valid()) return true;
    return false;
  }

  void apply_inferred_types(const onnx::GraphProto& g) {
    auto apply = [&](const onnx::ValueInfoProto& vi) {
      auto id = graph().find_value(vi.name());
      if (!id) return;
      Value& v = graph().value(*id);
      if (v.kind == ValueKind::kParam || v.kind == ValueKind::kInput) return;
      const DeclaredType d = declared_type(vi);
      if (!d.is_tensor) return;
      if (v.dtype == DType::kUndefined) v.dtype = d.dtype;
      if (v.shape_known || !d.has_shape || !d.all_known) return;
      v.shape = d.dims;
      set_size(v);
    };
    for (const auto& vi : g.value_info()) apply(vi);
    for (const auto& vi : g.output()) apply(vi);
  }

  void report_unknown_shapes() {
    std::vector<std::string> unknown;
    for (const Value& v : graph().values())
      if (!v.shape_known && v.producer.valid()) unknown.push_back(v.name);
    result_.unknown_shape_values = unknown;
    if (!unknown.empty()) result_.warnings.push_back(unknown_shapes_warning(graph(), unknown));
  }

  onnx::ModelProto& model_;
  fs::path base_dir_;
  const ImportOptions& options_;
  std::map<std::string, int64_t> dims_;  // --dim, plus the batch dim when --batch binds it
  std::string batch_flag_dim_;           // the dim_param --batch bound, if any
  bool unnamed_batch_ = false;           // --batch binds the inputs' unnamed leading dims
  ImportedModel result_;
  std::map<std::string, int64_t> bound_;
};

void parse_model_bytes(const std::string& bytes, const std::string& display_name, onnx::ModelProto& model) {
  if (bytes.empty()) throw InvalidModel(display_name + " is empty (0 bytes); expected an ONNX model");
  if (bytes.size() > static_cast<size_t>(INT_MAX))
    throw Unsupported(display_name + " is over 2 GiB: a protobuf message cannot be that large; save the model with "
                                     "its weights as external data (onnx.save(..., save_as_external_data=True))");
  const auto parse = [&](onnx::ModelProto& into, int recursion_limit) {
    google::protobuf::io::ArrayInputStream raw(bytes.data(), static_cast<int>(bytes.size()));
    google::protobuf::io::CodedInputStream coded(&raw);
    coded.SetTotalBytesLimit(INT_MAX);
    coded.SetRecursionLimit(recursion_limit);
    return into.ParseFromCodedStream(&coded) && coded.ConsumedEntireMessage();
  };
  if (parse(model, kMaxMessageNesting)) return;
  // Protobuf gives one failure for every cause; a second parse with a deeper limit (only to diagnose:
  // the model is refused either way) tells nesting that is too deep from bytes that are not a model.
  onnx::ModelProto probe;
  if (parse(probe, kDiagnosticMessageNesting))
    throw Unsupported(display_name + " nests messages deeper than the " + std::to_string(kMaxMessageNesting) +
                      " levels apart reads (protobuf's recursion limit): every If/Loop/Scan body inside another "
                      "takes 3 levels, so about " + std::to_string((kMaxMessageNesting - 4) / 3) +
                      " nested bodies fit; flatten the nested control flow (e.g. fold constant If conditions with "
                      "onnxsim) and export again");
  throw InvalidModel(display_name + " is not a valid ONNX protobuf (truncated or not an .onnx file)");
}

// The bytes of an .onnx file, after the checks that give each way of naming a wrong file its own error.
std::string read_model_file(const fs::path& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) throw SystemError("cannot open " + quote(path.string()) + ": no such file");
  if (fs::is_directory(status))
    throw InvalidArgument(quote(path.string()) + " is a directory; pass the path of an .onnx file");
  if (!fs::is_regular_file(status)) throw InvalidArgument(quote(path.string()) + " is not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SystemError("cannot open " + quote(path.string()) + ": " + std::strerror(errno));
  std::string bytes;
  const auto size = fs::file_size(path, ec);
  if (!ec) {
    if (size > static_cast<uintmax_t>(INT_MAX))
      throw Unsupported(quote(path.string()) + " is over 2 GiB: a protobuf message cannot be that large; save the model with "
                                               "its weights as external data (onnx.save(..., save_as_external_data=True))");
    bytes.resize(size);
    in.read(bytes.data(), static_cast<std::streamsize>(size));
    if (static_cast<uintmax_t>(in.gcount()) != size) throw SystemError("could not read all of " + quote(path.string()));
  }
  return bytes;
}

}  // namespace

ImportedModel import_model_bytes(const std::string& bytes, const fs::path& base_dir, const std::string& display_name,
                                 const ImportOptions& options) {
  onnx::ModelProto model;
  parse_model_bytes(bytes, display_name, model);
  Importer importer(model, base_dir, display_name, options);
  return importer.run();
}

ImportedModel import_model(const fs::path& path, const ImportOptions& options) {
  return import_model_bytes(read_model_file(path), path.parent_path(), path.string(), options);
}

onnx::ModelProto load_model_proto(const fs::path& path) {
  onnx::ModelProto model;
  parse_model_bytes(read_model_file(path), path.string(), model);
  return model;
}

onnx::ModelProto load_model_proto(const fs::path& path, const ImportOptions& options) {
  onnx::ModelProto model = load_model_proto(path);
  if (options.constants_as_params) constants_to_initializers(model);
  append_loss(model, options.loss);
  return model;
}

MissingInterface missing_interface(const onnx::ModelProto& model, const std::vector<std::string>& inputs,
                                   const std::vector<std::string>& outputs) {
  std::set<std::string> has_in, has_out;
  for (const auto& info : model.graph().input()) has_in.insert(info.name());
  for (const auto& info : model.graph().output()) has_out.insert(info.name());
  MissingInterface missing;
  for (const std::string& v : inputs)
    if (!has_in.count(v)) missing.inputs.push_back(v);
  for (const std::string& v : outputs)
    if (!has_out.count(v)) missing.outputs.push_back(v);
  return missing;
}

std::pair<std::string, std::vector<int64_t>> parse_shape_flag(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw InvalidArgument("--shape " + quote(text) + ": expected NAME:D0xD1x… (e.g. input:8x3x224x224)");
  std::string name = text.substr(0, colon);
  std::string dims_text = text.substr(colon + 1);
  std::vector<int64_t> dims;
  if (dims_text == "scalar" || dims_text.empty()) return {name, dims};
  std::stringstream ss(dims_text);
  std::string part;
  while (std::getline(ss, part, 'x')) {
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || errno == ERANGE || v < 0)
      throw InvalidArgument("--shape " + quote(text) + ": dim " + quote(part) + " is not a non-negative integer");
    checked_integer(static_cast<int64_t>(v), 0, limits::kMaxDim, "--shape " + quote(text) + ": dim " + quote(part));
    dims.push_back(v);
  }
  if (!dims_text.empty() && dims_text.back() == 'x') throw InvalidArgument("--shape " + quote(text) + ": trailing 'x'");
  return {name, dims};
}

std::pair<std::string, int64_t> parse_dim_flag(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    throw InvalidArgument("--dim " + quote(text) + ": expected NAME=VALUE (e.g. batch=8)");
  const std::string value = text.substr(eq + 1);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE || v < 0)
    throw InvalidArgument("--dim " + quote(text) + ": " + quote(value) + " is not a positive integer");
  // A dim bound to 0 makes every tensor that carries it empty: nothing to plan or train.
  checked_integer(static_cast<int64_t>(v), 1, limits::kMaxDim, "--dim " + quote(text) + ": the value");
  return {text.substr(0, eq), v};
}

}  // namespace apart
