// Reading ONNX protobuf safely: files, bytes, tensors, declared types, UTF-8 names (importer/onnx_reading.h).
#include "importer/onnx_reading.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/unknown_field_set.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>

#include "graph/checked.h"

namespace apart {

namespace fs = std::filesystem;

namespace {

// Protobuf recursion limit for parsing (a GraphProto inside an If inside a graph is 3 levels), and
// the deeper one used only to tell "nested too deeply" from "not a model" once parsing has failed.
constexpr int kMaxMessageNesting = 64;
constexpr int kDiagnosticMessageNesting = 1024;

// NodeProto.metadata_props (field 9, IR 10) is newer than the ONNX 1.12 protos apart builds with: protobuf keeps it
// as an unknown field, whose entries are StringStringEntryProto messages.
constexpr int kNodeMetadataPropsField = 9;

int64_t typed_field_count(const onnx::TensorProto& t) {
  switch (t.data_type()) {
    case onnx::TensorProto::FLOAT:
      return t.float_data_size();
    case onnx::TensorProto::COMPLEX64:
      return t.float_data_size() / 2;
    case onnx::TensorProto::DOUBLE:
      return t.double_data_size();
    case onnx::TensorProto::COMPLEX128:
      return t.double_data_size() / 2;
    case onnx::TensorProto::INT64:
      return t.int64_data_size();
    case onnx::TensorProto::UINT32:
    case onnx::TensorProto::UINT64:
      return t.uint64_data_size();
    case onnx::TensorProto::STRING:
      return t.string_data_size();
    default:
      return t.int32_data_size();  // int8/16/32, uint8/16, bool, float16, bfloat16
  }
}

}  // namespace

// --- Files and bytes ----------------------------------------------------------------

void parse_model_bytes(const std::string& bytes, const std::string& display_name, onnx::ModelProto& model) {
  if (bytes.empty()) throw InvalidModel(display_name + " is empty (0 bytes); expected an ONNX model");
  if (bytes.size() > static_cast<size_t>(INT_MAX))
    throw Unsupported(display_name +
                      " is over 2 GiB: a protobuf message cannot be that large; save the model with "
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
                      "takes 3 levels, so about " +
                      std::to_string((kMaxMessageNesting - 4) / 3) +
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
      throw Unsupported(quote(path.string()) +
                        " is over 2 GiB: a protobuf message cannot be that large; save the model with "
                        "its weights as external data (onnx.save(..., save_as_external_data=True))");
    bytes.resize(size);
    in.read(bytes.data(), static_cast<std::streamsize>(size));
    if (static_cast<uintmax_t>(in.gcount()) != size) throw SystemError("could not read all of " + quote(path.string()));
  }
  return bytes;
}

// --- Nodes -------------------------------------------------------------------------

std::string node_label(const onnx::NodeProto& node, int index) {
  return node.name().empty() ? node.op_type() + "_" + std::to_string(index) : node.name();
}

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

// --- Tensors ---------------------------------------------------------------------

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
    default:
      return std::nullopt;
  }
}

TensorInfo check_tensor(const onnx::TensorProto& t, const std::string& what) {
  TensorInfo info;
  auto dt = dtype_from_onnx(t.data_type());
  if (!dt || *dt == DType::kUndefined)
    throw InvalidModel(what + " has data_type " + std::to_string(t.data_type()) +
                       ", which is not a valid ONNX element type");
  info.dtype = *dt;
  info.dims.assign(t.dims().begin(), t.dims().end());
  for (int64_t d : info.dims)
    if (d < 0)
      throw InvalidModel(what + " has a negative dim (" + std::to_string(d) + ") in shape " + shape_string(info.dims));
  auto n = checked_element_count(info.dims);
  if (!n)
    throw InvalidModel(what + " has shape [" + shape_string(info.dims) + "], whose element count overflows 64 bits");
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

void set_value_size(Value& v) {
  auto n = checked_element_count(v.shape);
  if (!n)
    throw InvalidModel("value " + quote(v.name) + " has shape [" + shape_string(v.shape) +
                       "], whose element count overflows 64 bits");
  int64_t bytes = 0;
  if (__builtin_mul_overflow(*n, dtype_size(v.dtype), &bytes))
    throw InvalidModel("value " + quote(v.name) + " has shape [" + shape_string(v.shape) +
                       "], whose byte size overflows 64 bits");
  v.shape_known = true;
  v.elements = *n;
  v.bytes = bytes;
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
    case onnx::AttributeProto::INT:
      out.type = Attribute::Type::kInt;
      out.i = a.i();
      break;
    case onnx::AttributeProto::FLOAT:
      out.type = Attribute::Type::kFloat;
      out.f = a.f();
      break;
    case onnx::AttributeProto::STRING:
      out.type = Attribute::Type::kString;
      out.s = a.s();
      break;
    case onnx::AttributeProto::INTS:
      out.type = Attribute::Type::kInts;
      out.ints.assign(a.ints().begin(), a.ints().end());
      break;
    case onnx::AttributeProto::FLOATS:
      out.type = Attribute::Type::kFloats;
      out.floats.assign(a.floats().begin(), a.floats().end());
      break;
    case onnx::AttributeProto::STRINGS:
      out.type = Attribute::Type::kStrings;
      break;
    case onnx::AttributeProto::TENSOR:
      out.type = Attribute::Type::kTensor;
      break;
    case onnx::AttributeProto::GRAPH:
    case onnx::AttributeProto::GRAPHS:
      out.type = Attribute::Type::kGraph;
      break;
    default:
      out.type = Attribute::Type::kOther;
      break;
  }
  return out;
}

void require_utf8_value_info(const onnx::ValueInfoProto& vi, const std::string& what, const std::string& where) {
  require_utf8(vi.name(), [&] { return "the name of " + what + where; });
  if (!vi.has_type() || !vi.type().has_tensor_type() || !vi.type().tensor_type().has_shape()) return;
  for (const auto& d : vi.type().tensor_type().shape().dim())
    if (d.has_dim_param())
      require_utf8(d.dim_param(), [&] { return "a dim_param of " + what + " " + quote(vi.name()) + where; });
}

void require_utf8_names(const onnx::GraphProto& g, const std::string& where) {
  const auto nth = [](const char* what, int i) { return std::string(what) + " " + std::to_string(i); };
  for (int i = 0; i < g.input_size(); ++i) require_utf8_value_info(g.input(i), nth("graph input", i), where);
  for (int i = 0; i < g.output_size(); ++i) require_utf8_value_info(g.output(i), nth("graph output", i), where);
  for (int i = 0; i < g.value_info_size(); ++i) require_utf8_value_info(g.value_info(i), nth("value_info", i), where);
  for (int i = 0; i < g.initializer_size(); ++i)
    require_utf8(g.initializer(i).name(), [&] { return "the name of " + nth("initializer", i) + where; });
  for (int i = 0; i < g.sparse_initializer_size(); ++i)
    require_utf8(g.sparse_initializer(i).values().name(),
                 [&] { return "the name of " + nth("sparse initializer", i) + where; });
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

}  // namespace apart
