// append_loss: softmax cross-entropy (plain or next-token shifted) appended to a logits-only export.
#include "importer/added_loss.h"

#include <limits>
#include <set>
#include <vector>

#include "graph/error.h"
#include "graph/text.h"

namespace apart {

std::string_view added_loss_form_name(AddedLossForm form) {
  switch (form) {
    case AddedLossForm::kNone: return "none";
    case AddedLossForm::kCrossEntropy: return "cross_entropy";
    case AddedLossForm::kCrossEntropyShifted: return "cross_entropy_shifted";
  }
  return "?";
}

std::optional<AddedLossForm> parse_added_loss_form(std::string_view name) {
  for (AddedLossForm f : {AddedLossForm::kCrossEntropy, AddedLossForm::kCrossEntropyShifted})
    if (name == added_loss_form_name(f)) return f;
  return std::nullopt;
}

namespace {

bool is_float_type(int32_t t) {
  return t == onnx::TensorProto::FLOAT || t == onnx::TensorProto::FLOAT16 || t == onnx::TensorProto::BFLOAT16 ||
         t == onnx::TensorProto::DOUBLE;
}

int declared_rank(const onnx::ValueInfoProto& v) {
  const auto& t = v.type().tensor_type();
  return t.has_shape() ? t.shape().dim_size() : -1;
}

// The graph output the loss reads: "logits" when the model outputs one, else the only float output of rank ≥ 2.
int logits_output(const onnx::GraphProto& g, const std::string& flag) {
  std::vector<int> candidates;
  int named = -1;
  for (int i = 0; i < g.output_size(); ++i) {
    const onnx::ValueInfoProto& out = g.output(i);
    if (!is_float_type(out.type().tensor_type().elem_type())) continue;
    if (declared_rank(out) == 0)
      throw InvalidArgument(flag + ": the model already outputs the scalar " + quote(out.name()) +
                            ", a loss; train on it as it is (leave --loss out, or name it: --loss " + out.name() + ")");
    if (out.name() == "logits") named = i;
    if (declared_rank(out) >= 2 || declared_rank(out) < 0) candidates.push_back(i);
  }
  if (named >= 0) return named;
  if (candidates.size() == 1) return candidates.front();
  std::string names;
  for (int i : candidates) names += (names.empty() ? "" : ", ") + quote(g.output(i).name());
  throw InvalidArgument(flag + ": " +
                        (candidates.empty() ? std::string("the model has no float output of rank 2 or more to read as "
                                                          "logits")
                                            : "the model has several outputs that could be the logits (" + names +
                                                  "); name the one the loss reads \"logits\"") +
                        "; apart appends the loss to a model's [..., classes] logits");
}

// Adds nodes named as torch names them inside a "/loss" scope: "/loss/Op", "/loss/Op_1", … (unique in the graph).
class LossNodes {
 public:
  explicit LossNodes(onnx::GraphProto& g) : g_(g) {
    for (const auto& n : g.node()) taken_.insert(n.name());
  }

  std::string node(const std::string& op, const std::vector<std::string>& inputs,
                   const std::vector<onnx::AttributeProto>& attrs = {}, const std::string& output = "") {
    onnx::NodeProto* n = g_.add_node();
    n->set_name(fresh("/loss/" + op));
    n->set_op_type(op);
    for (const auto& in : inputs) n->add_input(in);
    n->add_output(output.empty() ? n->name() + "_output_0" : output);
    for (const auto& a : attrs) *n->add_attribute() = a;
    return n->output(0);
  }

  std::string int64s(const std::vector<int64_t>& values) {
    onnx::AttributeProto a;
    a.set_name("value");
    a.set_type(onnx::AttributeProto::TENSOR);
    onnx::TensorProto* t = a.mutable_t();
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values) t->add_int64_data(v);
    return node("Constant", {}, {a});
  }

 private:
  std::string fresh(const std::string& base) {
    std::string name = base;
    for (int k = 1; taken_.count(name); ++k) name = base + "_" + std::to_string(k);
    taken_.insert(name);
    return name;
  }

  onnx::GraphProto& g_;
  std::set<std::string> taken_;
};

onnx::AttributeProto int_attr(const std::string& name, int64_t v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(v);
  return a;
}

// Every value name the graph already uses (inputs, initializers, node outputs).
std::set<std::string> value_names(const onnx::GraphProto& g) {
  std::set<std::string> names;
  for (const auto& v : g.input()) names.insert(v.name());
  for (const auto& t : g.initializer()) names.insert(t.name());
  for (const auto& n : g.node())
    for (const auto& o : n.output()) names.insert(o);
  return names;
}

}  // namespace

std::string append_loss(onnx::ModelProto& model, const AddedLoss& loss) {
  if (!loss.enabled()) return "";
  const std::string flag = "--loss " + std::string(added_loss_form_name(loss.form));
  onnx::GraphProto& g = *model.mutable_graph();
  const int out_index = logits_output(g, flag);
  const onnx::ValueInfoProto logits = g.output(out_index);
  const int rank = declared_rank(logits);
  const bool shifted = loss.form == AddedLossForm::kCrossEntropyShifted;
  if (rank < (shifted ? 3 : 2))
    throw InvalidArgument(flag + ": the logits " + quote(logits.name()) + " need a declared shape of rank " +
                          (shifted ? "3 or more ([batch, sequence, classes]) for the next-token form"
                                   : "2 or more ([..., classes])") +
                          (rank < 0 ? ", and the model declares none" : ", not " + std::to_string(rank)));
  const auto& dims = logits.type().tensor_type().shape().dim();
  const int64_t classes = dims[rank - 1].has_dim_value() ? dims[rank - 1].dim_value() : 0;
  if (classes <= 0)
    throw InvalidArgument(flag + ": the class dim (the last) of the logits " + quote(logits.name()) +
                          " is not static; export the model with a fixed vocabulary size");
  if (loss.labels.empty()) throw InvalidArgument("--labels: name the labels input (e.g. --labels labels)");
  const std::set<std::string> names = value_names(g);
  if (names.count(loss.labels))
    throw InvalidArgument("--labels " + loss.labels + ": the model already has a value of that name; name the labels "
                          "input something else (--labels NAME)");
  if (names.count(kAddedLossOutput))
    throw InvalidArgument(flag + ": the model already has a value named " + quote(kAddedLossOutput) +
                          ", the name the added loss takes; rename it in the model");

  // labels: int64, the logits' dims without the class dim.
  onnx::ValueInfoProto* labels = g.add_input();
  labels->set_name(loss.labels);
  auto* lt = labels->mutable_type()->mutable_tensor_type();
  lt->set_elem_type(onnx::TensorProto::INT64);
  for (int i = 0; i + 1 < rank; ++i) *lt->mutable_shape()->add_dim() = dims[i];

  LossNodes b(g);
  std::string scores = logits.name(), targets = loss.labels;
  if (shifted) {
    // shift_logits = logits[..., :-1, :]; shift_labels = labels[..., 1:] (the sequence axis: rank - 2).
    const int64_t axis = rank - 2;
    scores = b.node("Slice", {scores, b.int64s({0}), b.int64s({-1}), b.int64s({axis})});
    targets = b.node("Slice", {targets, b.int64s({1}), b.int64s({std::numeric_limits<int64_t>::max()}),
                               b.int64s({axis})});
  }
  if (rank > 2) {
    scores = b.node("Reshape", {scores, b.int64s({-1, classes})}, {int_attr("allowzero", 0)});
    targets = b.node("Reshape", {targets, b.int64s({-1})}, {int_attr("allowzero", 0)});
  }
  onnx::AttributeProto reduction;
  reduction.set_name("reduction");
  reduction.set_type(onnx::AttributeProto::STRING);
  reduction.set_s("mean");
  b.node("SoftmaxCrossEntropyLoss", {scores, targets}, {int_attr("ignore_index", -100), reduction}, kAddedLossOutput);

  // The loss replaces the logits among the outputs.
  g.mutable_output()->DeleteSubrange(out_index, 1);
  onnx::ValueInfoProto* out = g.add_output();
  out->set_name(kAddedLossOutput);
  out->mutable_type()->mutable_tensor_type()->set_elem_type(logits.type().tensor_type().elem_type());
  out->mutable_type()->mutable_tensor_type()->mutable_shape();
  return kAddedLossOutput;
}

}  // namespace apart
