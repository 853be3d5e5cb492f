// Writes tiny ONNX models for runtime tests: a chain or a single node, to a temporary file.
#pragma once

#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "graph/dtype.h"
#include "runtime/tensor.h"

namespace apart::testing {

struct Io {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
};

inline void set_value_info(onnx::ValueInfoProto* info, const Io& io) {
  info->set_name(io.name);
  auto* tt = info->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(static_cast<int32_t>(io.dtype));
  auto* shape = tt->mutable_shape();
  for (int64_t d : io.shape) shape->add_dim()->set_dim_value(d);
}

class ModelBuilder {
 public:
  explicit ModelBuilder(int64_t opset = 17) {
    model_.set_ir_version(8);
    auto* op = model_.add_opset_import();
    op->set_domain("");
    op->set_version(opset);
    model_.mutable_graph()->set_name("test");
  }
  ModelBuilder& input(const Io& io) {
    set_value_info(model_.mutable_graph()->add_input(), io);
    return *this;
  }
  ModelBuilder& output(const Io& io) {
    set_value_info(model_.mutable_graph()->add_output(), io);
    return *this;
  }
  ModelBuilder& initializer(const Tensor& t, const std::string& name) {
    tensor_to_proto(t, name, *model_.mutable_graph()->add_initializer());
    return *this;
  }
  onnx::NodeProto& node(const std::string& op, const std::vector<std::string>& inputs, const std::vector<std::string>& outputs,
                        const std::string& name = "") {
    auto* n = model_.mutable_graph()->add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (const auto& i : inputs) n->add_input(i);
    for (const auto& o : outputs) n->add_output(o);
    return *n;
  }
  static void attr_ints(onnx::NodeProto& n, const std::string& name, const std::vector<int64_t>& v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  static void attr_int(onnx::NodeProto& n, const std::string& name, int64_t v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  std::filesystem::path write(const std::string& file) const {
    const auto dir = std::filesystem::temp_directory_path() / "apart_runtime_tests";
    std::filesystem::create_directories(dir);
    const auto path = dir / file;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    model_.SerializeToOstream(&out);
    return path;
  }
  onnx::ModelProto& proto() { return model_; }

 private:
  onnx::ModelProto model_;
};

}  // namespace apart::testing
