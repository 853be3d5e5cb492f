// Reverse-mode differentiation: walks the forward nodes backwards, asks each op's rule
// (codegen/gradients/) for its input gradients, and accumulates them with Sum.
#include "codegen/autodiff.h"

#include <onnx/version_converter/convert.h>

#include <algorithm>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "codegen/attention_fusion.h"
#include "codegen/gradients/gradient.h"
#include "graph/error.h"
#include "graph/text.h"

namespace apart {

using autodiff::Emitter;
using autodiff::GradNode;
using autodiff::ValueMeta;

namespace autodiff {

// --- Attributes, Emitter -----------------------------------------------------------

void set_attr(onnx::NodeProto& n, const std::string& name, int64_t v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}
void set_attr(onnx::NodeProto& n, const std::string& name, const std::vector<int64_t>& v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}
void set_attr(onnx::NodeProto& n, const std::string& name, float v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(v);
}
void set_attr(onnx::NodeProto& n, const std::string& name, const std::string& v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(v);
}

namespace {
void fill_scalar_tensor(onnx::TensorProto& t, double value, DType dtype) {
  t.set_data_type(static_cast<int32_t>(dtype));
  switch (dtype) {
    case DType::kFloat32: t.add_float_data(static_cast<float>(value)); break;
    case DType::kFloat64: t.add_double_data(value); break;
    case DType::kInt64: t.add_int64_data(static_cast<int64_t>(value)); break;
    case DType::kInt32: t.add_int32_data(static_cast<int32_t>(value)); break;
    default: throw Unsupported("autodiff: constants of dtype " + std::string(dtype_name(dtype)));
  }
}
}  // namespace

std::string Emitter::fresh(std::string_view hint) { return "grad/" + std::to_string(counter_++) + "_" + std::string(hint); }

onnx::NodeProto& Emitter::node(const std::string& op, const std::vector<std::string>& inputs,
                               const std::vector<std::string>& outputs, const std::string& domain) {
  auto* n = graph_.add_node();
  n->set_op_type(op);
  n->set_name("grad/" + scope_ + "/" + op + "_" + std::to_string(node_counter_++));
  if (!domain.empty()) n->set_domain(domain);
  for (const auto& i : inputs) n->add_input(i);
  for (const auto& o : outputs) n->add_output(o);
  return *n;
}

std::string Emitter::op(const std::string& op_type, const std::vector<std::string>& inputs) {
  std::string out = fresh(op_type);
  node(op_type, inputs, {out});
  return out;
}

std::string Emitter::ints(const std::vector<int64_t>& values) {
  std::string out = fresh("ints");
  auto& n = node("Constant", {}, {out});
  auto* a = n.add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  auto* t = a->mutable_t();
  t->set_data_type(static_cast<int32_t>(DType::kInt64));
  t->add_dims(static_cast<int64_t>(values.size()));
  for (int64_t v : values) t->add_int64_data(v);
  return out;
}

std::string Emitter::scalar(double value, DType dtype) {
  std::string out = fresh("scalar");
  auto& n = node("Constant", {}, {out});
  auto* a = n.add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  fill_scalar_tensor(*a->mutable_t(), value, dtype);
  return out;
}

std::string Emitter::filled(double value, DType dtype, const std::vector<int64_t>& shape) {
  if (shape.empty()) return scalar(value, dtype);
  const std::string shape_value = ints(shape);
  std::string out = fresh("filled");
  auto& n = node("ConstantOfShape", {shape_value}, {out});
  auto* a = n.add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->add_dims(1);
  fill_scalar_tensor(*a->mutable_t(), value, dtype);
  return out;
}

std::string Emitter::reshape(const std::string& x, const std::vector<int64_t>& shape) {
  return op("Reshape", {x, ints(shape)});
}

std::string Emitter::transpose(const std::string& x, const std::vector<int64_t>& perm) {
  std::string out = op("Transpose", {x});
  set_attr(last(), "perm", perm);
  return out;
}

std::string Emitter::reduce_sum(const std::string& x, const std::vector<int64_t>& axes, bool keepdims) {
  std::string out = op("ReduceSum", {x, ints(axes)});
  set_attr(last(), "keepdims", static_cast<int64_t>(keepdims ? 1 : 0));
  return out;
}

std::string Emitter::expand(const std::string& x, const std::vector<int64_t>& shape) {
  return op("Expand", {x, ints(shape)});
}

std::string Emitter::unbroadcast(const std::string& g, const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  if (from == to) return g;
  APART_CHECK(from.size() >= to.size(), "unbroadcast from a lower rank");
  const size_t lead = from.size() - to.size();
  std::vector<int64_t> axes;
  for (size_t i = 0; i < from.size(); ++i)
    if (i < lead || (to[i - lead] == 1 && from[i] != 1)) axes.push_back(static_cast<int64_t>(i));
  std::string summed = axes.empty() ? g : reduce_sum(g, axes, true);
  return reshape(summed, to);
}

// --- GradNode ----------------------------------------------------------------------

const ValueMeta& GradNode::in(size_t i) const {
  const ValueMeta& m = meta_(x(i));
  if (!m.shape_known) unsupported("input '" + x(i) + "' has no static shape (bind the model's dims: ImportOptions)");
  return m;
}
const ValueMeta& GradNode::out(size_t i) const {
  const ValueMeta& m = meta_(y(i));
  if (!m.shape_known) unsupported("output '" + y(i) + "' has no static shape (bind the model's dims: ImportOptions)");
  return m;
}
const std::vector<int64_t>& GradNode::known_ints(size_t i) const {
  const ValueMeta& m = meta_(x(i));
  if (!m.ints) unsupported("input '" + x(i) + "' must be a constant known when the model is imported");
  return *m.ints;
}
const std::string& GradNode::gy(size_t i) const {
  static const std::string kNone;
  return i < gy_.size() ? gy_[i] : kNone;
}
std::string GradNode::gy_or_zeros(size_t i) {
  if (!gy(i).empty()) return gy(i);
  return e.filled(0, out(i).dtype, out(i).shape);
}
void GradNode::give(size_t i, const std::string& grad) {
  APART_CHECK(i < given_.size(), "give: input index");
  if (wants(i)) given_[i] = grad;
}

namespace {
const onnx::AttributeProto* find_attr(const onnx::NodeProto& n, std::string_view name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}
}  // namespace

int64_t GradNode::attr_int(std::string_view name, int64_t fallback) const {
  const auto* a = find_attr(node_, name);
  return a ? a->i() : fallback;
}
float GradNode::attr_float(std::string_view name, float fallback) const {
  const auto* a = find_attr(node_, name);
  return a ? a->f() : fallback;
}
std::string GradNode::attr_string(std::string_view name, std::string fallback) const {
  const auto* a = find_attr(node_, name);
  return a ? a->s() : fallback;
}
std::optional<std::vector<int64_t>> GradNode::attr_ints(std::string_view name) const {
  const auto* a = find_attr(node_, name);
  if (!a) return std::nullopt;
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}
void GradNode::copy_attrs(onnx::NodeProto& to, const std::vector<std::string>& names) const {
  for (const auto& a : node_.attribute())
    if (names.empty() || std::find(names.begin(), names.end(), a.name()) != names.end()) *to.add_attribute() = a;
}
void GradNode::unsupported(const std::string& what) const {
  throw Unsupported("autodiff: node '" + node_.name() + "' (" + node_.op_type() + "): " + what);
}

std::map<std::string, GradRule, std::less<>>& rules() {
  static std::map<std::string, GradRule, std::less<>> r;
  return r;
}

namespace {
const std::map<std::string, GradRule, std::less<>>& registered_rules() {
  static const bool kRegistered = [] {
    register_elementwise_rules();
    register_linalg_rules();
    register_reduce_rules();
    register_shape_rules();
    register_conv_rules();
    register_transformer_rules();
    register_tensor_parallel_rules();
    return true;
  }();
  (void)kRegistered;
  return rules();
}
}  // namespace

}  // namespace autodiff

namespace {

void set_value_info(onnx::ValueInfoProto& info, std::string name, const ValueMeta& m) {  // name by value: may alias info
  info.Clear();
  info.set_name(name);
  auto* tt = info.mutable_type()->mutable_tensor_type();
  tt->set_elem_type(static_cast<int32_t>(m.dtype));
  auto* shape = tt->mutable_shape();
  for (int64_t d : m.shape) shape->add_dim()->set_dim_value(d);
}

int64_t product_of(const std::vector<int64_t>& shape) {
  int64_t p = 1;
  for (int64_t d : shape) p *= d;
  return p;
}

bool is_float(DType d) { return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kFloat16 || d == DType::kBFloat16; }

// Forward nodes the training graph changes: LayerNormalization and Dropout get their saved outputs
// (mean/inv-std-dev, mask), BatchNormalization switches to training mode.
void prepare_forward_node(onnx::NodeProto& n, int index, const TrainingGraphOptions& options, const onnx::GraphProto& g,
                          std::vector<std::pair<std::string, std::string>>& state_updates) {
  const std::string prefix = "fwd/" + std::to_string(index) + "_";
  if (n.domain().empty() && n.op_type() == "LayerNormalization") {
    while (n.output_size() < 3) n.add_output("");
    if (n.output(1).empty()) n.set_output(1, prefix + "mean");
    if (n.output(2).empty()) n.set_output(2, prefix + "inv_std_dev");
  } else if (n.domain().empty() && n.op_type() == "SoftmaxCrossEntropyLoss") {
    while (n.output_size() < 2) n.add_output("");
    if (n.output(1).empty()) n.set_output(1, prefix + "log_prob");
  } else if (n.domain().empty() && n.op_type() == "Dropout") {
    while (n.output_size() < 2) n.add_output("");
    if (n.output(1).empty()) n.set_output(1, prefix + "mask");
  } else if (n.domain().empty() && n.op_type() == "BatchNormalization" && options.batch_norm_training) {
    bool has = false;
    for (auto& a : *n.mutable_attribute())
      if (a.name() == "training_mode") a.set_i(1), has = true;
    if (!has) autodiff::set_attr(n, "training_mode", int64_t{1});
    while (n.output_size() < 3) n.add_output("");
    for (int k = 1; k <= 2; ++k) {
      if (n.output(k).empty()) n.set_output(k, prefix + (k == 1 ? "running_mean" : "running_var"));
      const std::string& stat = n.input(2 + k);
      for (const auto& init : g.initializer())
        if (init.name() == stat) state_updates.emplace_back(stat, n.output(k));
    }
  }
}

}  // namespace

bool has_gradient_rule(std::string_view op_type) { return autodiff::registered_rules().count(op_type) > 0; }

const std::vector<std::string>& forward_only_ops() {
  // No gradient flows through these: their outputs are integers, booleans or shapes, or constants of the graph.
  static const std::vector<std::string> ops = {"And",  "ArgMax", "ArgMin", "Constant", "ConstantOfShape", "Equal",
                                               "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Not", "Or",
                                               "Range", "Shape", "Size", "Xor"};
  return ops;
}

std::string choose_loss(const std::vector<LossCandidate>& outputs, const std::string& requested,
                        const std::string& model) {
  if (!requested.empty()) return requested;
  std::string loss, names;
  for (const LossCandidate& o : outputs) {
    names += (names.empty() ? "" : ", ") + quote(o.name);
    if (!o.scalar_float) continue;
    if (!loss.empty())
      throw InvalidArgument(model + " has several scalar float outputs (" + quote(loss) + ", " + quote(o.name) +
                            "): name the one to minimise with --loss NAME");
    loss = o.name;
  }
  if (loss.empty())
    throw InvalidArgument(model + " has no scalar float output to minimise (its outputs: " + names +
                          "): add a loss to the model as a graph output (e.g. a ReduceMean of the error), and name "
                          "it with --loss NAME if it is not the only scalar float output; for a logits-only export, "
                          "--loss cross_entropy --labels NAME appends one (cross_entropy_shifted: next-token)");
  return loss;
}

namespace {
int64_t default_opset(const onnx::ModelProto& model) {
  int64_t opset = 0;
  for (const auto& o : model.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") opset = o.version();
  return opset;
}
bool has_softmax(const onnx::ModelProto& model) {
  for (const auto& n : model.graph().node())
    if (n.op_type() == "Softmax") return true;
  return false;
}
}  // namespace

std::optional<onnx::ModelProto> at_training_opset(const onnx::ModelProto& forward) {
  const int64_t opset = default_opset(forward);
  if (opset >= kMinTrainingOpset) return std::nullopt;
  try {
    // The converter's adapters are ONNX's own (onnx.version_converter); they rewrite each node whose op changed
    // between the opsets (Dropout's ratio attribute → input, Squeeze/Unsqueeze/ReduceSum axes …).
    return onnx::version_conversion::ConvertVersion(forward, static_cast<int>(kMinTrainingOpset));
  } catch (const std::exception& e) {
    throw Unsupported("autodiff: the forward model has opset " + std::to_string(opset) + ", and training graphs are "
                      "built at opset " + std::to_string(kMinTrainingOpset) + ", but ONNX's version converter refused it: " +
                      printable(e.what()) + "; convert the model with onnx.version_converter.convert_version(model, " +
                      std::to_string(kMinTrainingOpset) + ") and fix what it reports");
  }
}

namespace {

// One build of a training graph, as named phases over the state they share: the forward's value metadata (from the
// importer), what is differentiated (loss, params, inputs), then the emitted model. build_training_graph runs them in
// order; each phase reads what the ones before it set.
class TrainingGraphBuild {
 public:
  TrainingGraphBuild(const onnx::ModelProto& forward, const TrainingGraphOptions& options, const TaskGraph& tg)
      : forward_(forward), fg_(forward.graph()), options_(options), tg_(tg) {
    for (const Value& v : tg.values()) metas_[v.name] = ValueMeta{v.dtype, v.shape, v.shape_known, v.known_ints};
    for (const auto& init : fg_.initializer()) initializer_names_.insert(init.name());
  }

  // Phase 1: the loss, the params and the inputs to differentiate, each checked against the forward.
  void choose_targets();
  // Phase 2: the forward nodes in the importer's topological order, and the float values that depend on a param or
  // a requested input (only those get gradients).
  void find_active_values();
  // Phase 3: the training model starts as the forward, with saved outputs and value types added.
  void emit_forward();
  // Phase 4: the backward: seeds at the loss (or the fed loss scale / output gradients), then each forward node's
  // rule in reverse order, its input gradients accumulated with Sum.
  void emit_backward();
  // Phase 5: the graph outputs: loss, params' and inputs' gradients (zeros where none flows), state updates.
  void emit_outputs();
  // Phase 6: value_info for the gradient values, and the ai.apart opset where its ops appear.
  void finish();

  TrainingGraph take() { return std::move(result_); }

 private:
  const ValueMeta& meta(const std::string& name) const {
    auto it = metas_.find(name);
    return it == metas_.end() ? unknown_ : it->second;
  }
  bool is_output(const std::string& name) const {
    return std::any_of(fg_.output().begin(), fg_.output().end(), [&](const auto& o) { return o.name() == name; });
  }
  std::string output_names() const {
    std::string names;
    for (const auto& o : fg_.output()) names += (names.empty() ? "" : ", ") + quote(o.name());
    return names;
  }
  // Resize's roi and scales, Upsample's scales: a param used only there sets a geometry; its gradient is zero by
  // definition, and an optimizer's weight decay would change the output's shape.
  bool sets_geometry_only(const std::string& name) const;
  // The accumulated gradient of v (one Sum over its contributions), "" when none flows to it.
  std::string gradient_of(const std::string& v);
  // Names the graph output carrying `grad` as "<of>_grad" (renaming its producer's output where that is safe).
  std::string name_output(const std::string& of, const std::string& grad);
  std::string gradient_or_zeros(const std::string& v);

  const onnx::ModelProto& forward_;
  const onnx::GraphProto& fg_;
  const TrainingGraphOptions& options_;
  const TaskGraph& tg_;
  std::unordered_map<std::string, ValueMeta> metas_;
  const ValueMeta unknown_;
  std::set<std::string> initializer_names_;

  std::string loss_;
  std::vector<std::string> params_;
  std::vector<int> order_;
  std::unordered_set<std::string> active_;

  TrainingGraph result_;
  onnx::GraphProto* g_ = nullptr;
  std::optional<Emitter> e_;
  std::unordered_map<std::string, std::vector<std::string>> contributions_;
  std::map<std::string, ValueMeta> grad_infos_;  // value_info for gradient values (helps ai.apart outputs)

  // emit_outputs' naming state
  std::unordered_set<std::string> backward_inputs_, taken_, claimed_;
  std::unordered_map<std::string, std::string> renamed_;  // a gradient value → the output name its producer now has
};

void TrainingGraphBuild::choose_targets() {
  loss_ = options_.loss;
  if (loss_.empty() && options_.output_gradients.empty()) {
    std::vector<LossCandidate> outputs;
    for (const auto& o : fg_.output()) {
      const ValueMeta& m = meta(o.name());
      outputs.push_back({o.name(), is_float(m.dtype) && m.shape_known && product_of(m.shape) == 1});
    }
    loss_ = choose_loss(outputs, "");
  }
  if (!loss_.empty()) {
    const ValueMeta& m = meta(loss_);
    if (!is_output(loss_))
      throw InvalidArgument("--loss " + quote(loss_) +
                            " is not a graph output; the model's outputs are: " + output_names());
    if (!is_float(m.dtype) || !m.shape_known || product_of(m.shape) != 1)
      throw InvalidArgument("the loss " + quote(loss_) + " is " + std::string(dtype_name(m.dtype)) + " [" +
                            (m.shape_known ? shape_string(m.shape) : "?") +
                            "], not a scalar float value: reduce it to "
                            "one in the model (e.g. ReduceMean) or name a scalar float output with --loss NAME");
  }
  for (const auto& o : options_.output_gradients)
    if (!is_output(o) || !is_float(meta(o).dtype) || !meta(o).shape_known)
      throw InvalidArgument("autodiff: output_gradients names " + quote(o) + ", which is not a float graph output with a static shape");

  // Default params: every float initializer but those that only set a geometry.
  params_ = options_.params;
  if (params_.empty()) {
    for (const auto& init : fg_.initializer())
      if (is_float(static_cast<DType>(init.data_type())) && !sets_geometry_only(init.name()))
        params_.push_back(init.name());
  }
  for (const auto& p : params_)
    if (!initializer_names_.count(p) || !is_float(meta(p).dtype))
      throw InvalidArgument("autodiff: param " + quote(p) + " is not a floating-point initializer of the model");
  for (const auto& x : options_.input_gradients)
    if (!metas_.count(x) || !is_float(meta(x).dtype) || !meta(x).shape_known)
      throw InvalidArgument("autodiff: input_gradients names " + quote(x) + ", which is not a float value with a static shape");
}

bool TrainingGraphBuild::sets_geometry_only(const std::string& name) const {
  bool used = false;
  for (const auto& n : fg_.node())
    for (int i = 0; i < n.input_size(); ++i) {
      if (n.input(i) != name) continue;
      used = true;
      const bool geometry = (n.op_type() == "Resize" && (i == 1 || i == 2)) || (n.op_type() == "Upsample" && i == 1);
      if (!geometry) return false;
    }
  return used;
}

void TrainingGraphBuild::find_active_values() {
  for (const Task& t : tg_.tasks())
    if (t.onnx_node_index >= 0) order_.push_back(t.onnx_node_index);
  active_.insert(params_.begin(), params_.end());
  active_.insert(options_.input_gradients.begin(), options_.input_gradients.end());
  for (int idx : order_) {
    const auto& n = fg_.node(idx);
    bool any = false;
    for (const auto& i : n.input()) any = any || (!i.empty() && active_.count(i));
    if (!any) continue;
    for (const auto& o : n.output())
      if (!o.empty() && is_float(meta(o).dtype)) active_.insert(o);
  }
}

void TrainingGraphBuild::emit_forward() {
  onnx::ModelProto& model = result_.model;
  model = forward_;
  result_.forward_nodes = forward_.graph().node_size();
  g_ = model.mutable_graph();
  onnx::GraphProto& g = *g_;
  g.clear_value_info();
  g.clear_output();
  for (auto& in : *g.mutable_input()) {
    const ValueMeta& m = meta(in.name());
    if (m.shape_known) set_value_info(in, in.name(), m);
  }
  for (int i = 0; i < g.node_size(); ++i)
    prepare_forward_node(*g.mutable_node(i), i, options_, fg_, result_.state_updates);
  // Outputs of ai.apart forward nodes (the tensor-parallel collectives) keep their types: ONNX infers none for them.
  for (const auto& n : g.node()) {
    if (n.domain() != autodiff::kApartDomain) continue;
    for (const auto& o : n.output())
      if (!o.empty() && meta(o).shape_known) set_value_info(*g.add_value_info(), o, meta(o));
  }
  e_.emplace(g, default_opset(forward_));
}

std::string TrainingGraphBuild::gradient_of(const std::string& v) {
  auto it = contributions_.find(v);
  if (it == contributions_.end() || it->second.empty()) return "";
  if (it->second.size() > 1) {
    const std::string sum = e_->op("Sum", it->second);
    grad_infos_[sum] = meta(v);
    it->second = {sum};
  }
  return it->second.front();
}

void TrainingGraphBuild::emit_backward() {
  onnx::GraphProto& g = *g_;
  Emitter& e = *e_;
  if (!loss_.empty() && !options_.loss_seed_input.empty()) {  // the loss scale, fed each step
    set_value_info(*g.add_input(), options_.loss_seed_input, meta(loss_));
    contributions_[loss_].push_back(options_.loss_seed_input);
    result_.loss_seed_input = options_.loss_seed_input;
  } else if (!loss_.empty()) {
    e.set_scope("seed");
    contributions_[loss_].push_back(e.filled(1.0, meta(loss_).dtype, meta(loss_).shape));
  }
  for (const auto& o : options_.output_gradients) {
    const std::string name = o + "_grad";
    set_value_info(*g.add_input(), name, meta(o));
    contributions_[o].push_back(name);
    result_.output_gradient_inputs.emplace_back(o, name);
  }

  const auto& rule_table = autodiff::registered_rules();
  auto meta_of = [this](const std::string& name) -> const ValueMeta& { return meta(name); };
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    const onnx::NodeProto& n = g.node(*it);
    std::vector<std::string> gys;
    bool any_gy = false;
    for (const auto& o : n.output()) {
      gys.push_back(o.empty() ? "" : gradient_of(o));
      any_gy = any_gy || !gys.back().empty();
    }
    if (!any_gy) continue;
    std::vector<bool> wants;
    bool any_want = false;
    for (const auto& i : n.input()) {
      wants.push_back(!i.empty() && active_.count(i) > 0);
      any_want = any_want || wants.back();
    }
    if (!any_want) continue;
    const std::string node_name = n.name().empty() ? n.op_type() + "_" + std::to_string(*it) : n.name();
    auto rule = n.domain().empty() || n.domain() == "ai.onnx" ? rule_table.find(n.op_type())
                : n.domain() == autodiff::kApartDomain ? rule_table.find(n.domain() + "." + n.op_type())
                                                       : rule_table.end();
    if (rule == rule_table.end())
      throw Unsupported("autodiff: node " + quote(node_name) + ": op " + (n.domain().empty() ? "" : n.domain() + ".") + n.op_type() +
                        " has no gradient rule (docs/autodiff.md lists the ops with one)");
    e.set_scope(node_name);
    const onnx::NodeProto node_copy = n;  // the emitter appends to the same repeated field
    GradNode gn(node_copy, e, meta_of, gys, wants);
    rule->second(gn);
    for (size_t i = 0; i < gn.given().size(); ++i) {
      if (gn.given()[i].empty()) continue;
      contributions_[node_copy.input(static_cast<int>(i))].push_back(gn.given()[i]);
      grad_infos_.emplace(gn.given()[i], meta(node_copy.input(static_cast<int>(i))));
    }
  }
}

std::string TrainingGraphBuild::name_output(const std::string& of, const std::string& grad) {
  onnx::GraphProto& g = *g_;
  std::string want = of + "_grad";
  for (int k = 2; taken_.count(want); ++k) want = of + "_grad#" + std::to_string(k);
  taken_.insert(want);
  const bool renamable = grad.rfind("grad/", 0) == 0 && !backward_inputs_.count(grad) && !claimed_.count(grad);
  if (renamable) {
    for (int k = g.node_size() - 1; k >= 0; --k) {
      auto* node = g.mutable_node(k);
      for (int o = 0; o < node->output_size(); ++o)
        if (node->output(o) == grad) node->set_output(o, want);
    }
    grad_infos_[want] = meta(of);
    renamed_[grad] = want;
  } else {
    // A second output of the same gradient (both inputs of an Add, say) copies it from wherever it now is.
    auto it = renamed_.find(grad);
    e_->set_scope("outputs");
    e_->node("Identity", {it != renamed_.end() ? it->second : grad}, {want});
  }
  claimed_.insert(grad);
  set_value_info(*g.add_output(), want, meta(of));
  return want;
}

std::string TrainingGraphBuild::gradient_or_zeros(const std::string& v) {
  std::string grad = gradient_of(v);
  if (grad.empty()) {
    e_->set_scope("zeros");
    grad = e_->filled(0.0, meta(v).dtype, meta(v).shape);
  }
  return grad;
}

void TrainingGraphBuild::emit_outputs() {
  onnx::GraphProto& g = *g_;
  for (const auto& n : g.node())
    for (const auto& i : n.input()) backward_inputs_.insert(i);
  for (const auto& n : g.node())
    for (const auto& o : n.output()) taken_.insert(o);
  for (const auto& i : g.input()) taken_.insert(i.name());
  for (const auto& i : g.initializer()) taken_.insert(i.name());
  if (!loss_.empty()) {
    set_value_info(*g.add_output(), loss_, meta(loss_));
    result_.loss_output = loss_;
  }
  for (const auto& o : options_.output_gradients) set_value_info(*g.add_output(), o, meta(o));
  for (const auto& p : params_) {
    const std::string grad = gradient_or_zeros(p);
    result_.gradients.emplace_back(p, name_output(p, grad));
  }
  for (const auto& x : options_.input_gradients) {
    const std::string grad = gradient_or_zeros(x);
    result_.input_gradients.emplace_back(x, name_output(x, grad));
  }
  for (const auto& [stat, out] : result_.state_updates) set_value_info(*g.add_output(), out, meta(stat));
}

void TrainingGraphBuild::finish() {
  onnx::GraphProto& g = *g_;
  std::set<std::string> outputs;
  for (const auto& o : g.output()) outputs.insert(o.name());
  std::unordered_set<std::string> produced;
  for (const auto& n : g.node())
    for (const auto& o : n.output()) produced.insert(o);
  for (const auto& [name, m] : grad_infos_)
    if (m.shape_known && name.rfind("grad/", 0) == 0 && produced.count(name) && !outputs.count(name))
      set_value_info(*g.add_value_info(), name, m);
  onnx::ModelProto& model = result_.model;
  bool uses_apart = false;
  for (const auto& n : g.node()) uses_apart = uses_apart || n.domain() == autodiff::kApartDomain;
  bool has_apart_opset = false;
  for (const auto& o : model.opset_import()) has_apart_opset = has_apart_opset || o.domain() == autodiff::kApartDomain;
  if (uses_apart && !has_apart_opset) {
    auto* o = model.add_opset_import();
    o->set_domain(autodiff::kApartDomain);
    o->set_version(1);
  }
}

}  // namespace

TrainingGraph build_training_graph(const onnx::ModelProto& forward, const TrainingGraphOptions& options) {
  if (auto converted = at_training_opset(forward)) return build_training_graph(*converted, options);

  // Static shapes and known integers of every value, from the importer.
  ImportOptions import = options.import;
  import.require_external_data = false;
  import.constants_as_params = false;  // the forward as given (callers convert first): node indices are fg's
  const ImportedModel imported =
      import_model_bytes(forward.SerializeAsString(), {},
                         forward.graph().name().empty() ? "<forward model>" : forward.graph().name(), import);
  // Attention fused first (codegen/attention_fusion.h): the fused op has a gradient rule of its own.
  if (options.fuse_attention && has_softmax(forward)) {
    onnx::ModelProto fused = forward;
    if (fuse_attention(fused, imported.graph).changed()) {
      TrainingGraphOptions as_fused = options;
      as_fused.fuse_attention = false;
      return build_training_graph(fused, as_fused);
    }
  }
  TrainingGraphBuild build(forward, options, imported.graph);
  build.choose_targets();
  build.find_active_values();
  build.emit_forward();
  build.emit_backward();
  build.emit_outputs();
  build.finish();
  return build.take();
}

}  // namespace apart
