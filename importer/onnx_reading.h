// Reading ONNX protobuf safely (the importer's first step): a file's bytes, parsed with a nesting limit; tensors'
// sizes checked and small integer contents read, never external bytes; declared value types; the names every later
// step prints checked to be UTF-8. Internal to the importer (importer/importer.h is its interface).
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/task_graph.h"
#include "graph/text.h"

namespace apart {

// Initializers up to this many elements with integer types keep their values (shape arithmetic).
inline constexpr int64_t kKnownIntsLimit = 4096;

// --- Files and bytes ---
// The bytes of an .onnx file, after the checks that give each way of naming a wrong file its own error.
std::string read_model_file(const std::filesystem::path& path);
// Parses `bytes` into `model` with protobuf's nesting limit; InvalidModel/Unsupported naming display_name otherwise.
void parse_model_bytes(const std::string& bytes, const std::string& display_name, onnx::ModelProto& model);

// --- Nodes ---
// The node's name, or "<op>_<index>" when it has none.
std::string node_label(const onnx::NodeProto& node, int index);
// The module path the dynamo exporter keeps in a node's metadata (graph/task_graph.h scope_from_metadata).
std::string metadata_scope(const onnx::NodeProto& node);
Attribute convert_attribute(const onnx::AttributeProto& a);
// Subgraph free variables: the outer values an If/Loop/Scan body reads implicitly.
void collect_free_names(const onnx::GraphProto& g, std::set<std::string>& free_names);

// --- Tensors ---
struct TensorInfo {
  DType dtype = DType::kUndefined;
  std::vector<int64_t> dims;
  int64_t elements = 0;
  int64_t bytes = 0;
};
// Validates an initializer's dims, dtype and data length; never reads external bytes.
TensorInfo check_tensor(const onnx::TensorProto& t, const std::string& what);
// Integer contents of a small int tensor (≤ kKnownIntsLimit elements), or nullopt.
std::optional<std::vector<int64_t>> tensor_ints(const onnx::TensorProto& t, int64_t elements);
void drop_tensor_data(onnx::TensorProto& t);
// A value's element count and bytes from its shape (shape_known); InvalidModel when either overflows 64 bits.
void set_value_size(Value& v);

// --- Types from value_info ---
struct DeclaredType {
  bool is_tensor = false;
  DType dtype = DType::kUndefined;
  bool has_shape = false;
  std::vector<int64_t> dims;  // -1 where the dim is not a known value
  bool all_known = false;
};
DeclaredType declared_type(const onnx::ValueInfoProto& vi);

// --- Names must be UTF-8 ---
// ONNX strings are UTF-8, and plan.json/costs.json/profile.json carry these names: one that is not would fail deep
// inside JSON output, so it is refused here, naming where it is.
// `what` (a callable, so names are built only for the message) says where `s` is.
template <class What>
void require_utf8(const std::string& s, const What& what) {
  if (!is_utf8(s))
    throw InvalidModel(
        what() + " is not valid UTF-8: " + quote(s) +
        " (the bytes that are not are shown as \\xNN); ONNX "
        "names must be UTF-8: rename it in the exporter, or with the onnx Python package, and save again");
}

void require_utf8_value_info(const onnx::ValueInfoProto& vi, const std::string& what, const std::string& where);
// `where` is "" for the main graph, " in the body of node N (If)" for a subgraph.
void require_utf8_names(const onnx::GraphProto& g, const std::string& where);

}  // namespace apart
