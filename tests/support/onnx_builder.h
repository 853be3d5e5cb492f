// Builds small ONNX models in code for tests (no opaque binaries in the repository).
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "graph/dtype.h"
#include "tests/support/temp_dir.h"

namespace apart::testing {

// A dim is a number, or a symbolic name when `param` is non-empty.
struct Dim {
  int64_t value = -1;
  std::string param;
  Dim(int64_t v) : value(v) {}  // NOLINT: implicit on purpose, reads as a shape literal
  Dim(const char* p) : param(p) {}  // NOLINT
};

// A graph input or output with a static shape.
struct Io {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
};

class OnnxBuilder {
 public:
  explicit OnnxBuilder(int64_t opset = 17, int64_t ir_version = 8) {
    model_.set_ir_version(ir_version);
    model_.set_producer_name("apart-tests");
    auto* os = model_.add_opset_import();
    os->set_domain("");
    os->set_version(opset);
    model_.mutable_graph()->set_name("test");
  }

  onnx::GraphProto& graph() { return *model_.mutable_graph(); }
  onnx::ModelProto& model() { return model_; }

  OnnxBuilder& input(const std::string& name, std::initializer_list<Dim> dims, int elem = onnx::TensorProto::FLOAT) {
    fill(*graph().add_input(), name, dims, elem);
    return *this;
  }
  OnnxBuilder& input(const Io& io) {
    fill(*graph().add_input(), io);
    return *this;
  }
  OnnxBuilder& output(const Io& io) {
    fill(*graph().add_output(), io);
    return *this;
  }
  OnnxBuilder& output(const std::string& name, int elem = onnx::TensorProto::FLOAT) {
    auto* o = graph().add_output();
    o->set_name(name);
    o->mutable_type()->mutable_tensor_type()->set_elem_type(elem);
    return *this;
  }
  // A float initializer with inline zeros.
  OnnxBuilder& weight(const std::string& name, std::vector<int64_t> dims) {
    auto* t = graph().add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    int64_t n = 1;
    for (int64_t d : dims) {
      t->add_dims(d);
      n *= d;
    }
    t->mutable_raw_data()->assign(static_cast<size_t>(n) * 4, '\0');
    return *this;
  }
  OnnxBuilder& int_initializer(const std::string& name, std::vector<int64_t> values) {
    auto* t = graph().add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values) t->add_int64_data(v);
    return *this;
  }
  // An initializer holding a tensor's values: any type with a `tensor_to_proto(tensor, name, TensorProto&)` found
  // by argument-dependent lookup (runtime/tensor.h's Tensor), so this header needs no runtime/ header.
  template <class Tensor>
  OnnxBuilder& initializer(const Tensor& tensor, const std::string& name) {
    tensor_to_proto(tensor, name, *graph().add_initializer());
    return *this;
  }
  // A float initializer declared as external data.
  OnnxBuilder& external_weight(const std::string& name, std::vector<int64_t> dims, const std::string& location,
                               int64_t offset = 0) {
    auto* t = graph().add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    t->set_data_location(onnx::TensorProto::EXTERNAL);
    auto* kv = t->add_external_data();
    kv->set_key("location");
    kv->set_value(location);
    kv = t->add_external_data();
    kv->set_key("offset");
    kv->set_value(std::to_string(offset));
    return *this;
  }
  onnx::NodeProto& node(const std::string& op, std::vector<std::string> inputs, std::vector<std::string> outputs,
                        const std::string& name = "") {
    auto* n = graph().add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (auto& i : inputs) n->add_input(i);
    for (auto& o : outputs) n->add_output(o);
    return *n;
  }
  static void set_int(onnx::NodeProto& n, const std::string& name, int64_t v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void set_ints(onnx::NodeProto& n, const std::string& name, std::vector<int64_t> v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }

  std::string bytes() const { return model_.SerializeAsString(); }
  void save(const std::filesystem::path& path) const {
    std::ofstream out(path, std::ios::binary);
    out << bytes();
  }
  // Saves as `file` in this process's folder under the system temp dir (removed at exit); returns the path.
  std::filesystem::path write(const std::string& file) const {
    const std::filesystem::path path = process_temp_dir("test_models") / file;
    save(path);
    return path;
  }

 private:
  static void fill(onnx::ValueInfoProto& vi, const std::string& name, std::initializer_list<Dim> dims, int elem) {
    vi.set_name(name);
    auto* tt = vi.mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem);
    auto* shape = tt->mutable_shape();
    for (const Dim& d : dims) {
      auto* dim = shape->add_dim();
      if (!d.param.empty()) dim->set_dim_param(d.param);
      else if (d.value >= 0) dim->set_dim_value(d.value);
    }
  }
  static void fill(onnx::ValueInfoProto& vi, const Io& io) {
    vi.set_name(io.name);
    auto* tt = vi.mutable_type()->mutable_tensor_type();
    tt->set_elem_type(static_cast<int32_t>(io.dtype));
    auto* shape = tt->mutable_shape();
    for (int64_t d : io.shape) shape->add_dim()->set_dim_value(d);
  }
  onnx::ModelProto model_;
};

// The tiny model the CLI tests run on: y = Relu(x · w), x [batch, 3], w [3, 4]. Writes `file`, returns its path.
inline std::string write_tiny_mlp(const std::filesystem::path& file) {
  OnnxBuilder b;
  b.input("x", {"batch", 3}).output("y");
  b.weight("w", {3, 4});
  b.node("MatMul", {"x", "w"}, {"h"});
  b.node("Relu", {"h"}, {"y"});
  b.save(file);
  return file.string();
}

// A file's bytes ("" when it cannot be read): goldens, stage files, plan.json.
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace apart::testing
