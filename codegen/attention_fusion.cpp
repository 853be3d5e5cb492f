// The attention pattern (profiler/attention_pattern.h) rewritten into one Attention node (see attention_fusion.h).
#include "codegen/attention_fusion.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "profiler/attention_pattern.h"

namespace apart {
namespace {

constexpr const char* kApartDomain = "ai.apart";

const onnx::AttributeProto* find_attr(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

// Who writes each value of the graph, and the literal tensors (initializers, Constant nodes' values).
struct GraphIndex {
  const onnx::GraphProto& g;
  std::map<std::string, int> producer;
  std::map<std::string, const onnx::TensorProto*> initializers;

  explicit GraphIndex(const onnx::GraphProto& graph) : g(graph) {
    for (int i = 0; i < g.node_size(); ++i)
      for (const auto& o : g.node(i).output())
        if (!o.empty()) producer[o] = i;
    for (const auto& t : g.initializer()) initializers[t.name()] = &t;
  }
  const onnx::NodeProto* producer_of(const std::string& v) const {
    auto it = producer.find(v);
    return it == producer.end() ? nullptr : &g.node(it->second);
  }
  int index_of(const std::string& v) const { return producer.at(v); }
  // A Constant node's value (never an initializer: a float initializer is a trained param by default).
  const onnx::TensorProto* constant(const std::string& v) const {
    const onnx::NodeProto* p = producer_of(v);
    if (!p || !p->domain().empty() || p->op_type() != "Constant") return nullptr;
    const auto* a = find_attr(*p, "value");
    return a && a->has_t() ? &a->t() : nullptr;
  }
  // A literal of any kind (the bool mask may be either).
  const onnx::TensorProto* literal(const std::string& v) const {
    if (auto it = initializers.find(v); it != initializers.end()) return it->second;
    return constant(v);
  }
};

int64_t element_count(const onnx::TensorProto& t) {
  int64_t n = 1;
  for (int64_t d : t.dims()) n *= d;
  return n;
}

// A scalar float literal's value (float32 or float64, inline data only).
std::optional<double> scalar_value(const onnx::TensorProto* t) {
  if (!t || element_count(*t) != 1 || t->data_location() == onnx::TensorProto::EXTERNAL) return std::nullopt;
  if (t->data_type() == onnx::TensorProto::FLOAT) {
    if (t->float_data_size() == 1) return t->float_data(0);
    if (t->raw_data().size() == sizeof(float)) {
      float f;
      std::memcpy(&f, t->raw_data().data(), sizeof f);
      return f;
    }
  } else if (t->data_type() == onnx::TensorProto::DOUBLE) {
    if (t->double_data_size() == 1) return t->double_data(0);
    if (t->raw_data().size() == sizeof(double)) {
      double d;
      std::memcpy(&d, t->raw_data().data(), sizeof d);
      return d;
    }
  }
  return std::nullopt;
}

// −∞, or float32's lowest (what torch writes as torch.finfo(dtype).min): a logit that softmax gives no weight.
bool masks_out(std::optional<double> v) {
  return v && (std::isinf(*v) ? *v < 0 : *v <= static_cast<double>(std::numeric_limits<float>::lowest()));
}

// Whether a bool literal of shape [n, n] is the causal triangle: true exactly above the diagonal (`hides_when_true`,
// Where(mask, −∞, s)), or exactly on and below it (Where(mask, s, −∞)).
bool is_causal_triangle(const onnx::TensorProto* t, bool hides_when_true) {
  if (!t || t->data_type() != onnx::TensorProto::BOOL || t->dims_size() != 2 || t->dims(0) != t->dims(1) ||
      t->data_location() == onnx::TensorProto::EXTERNAL)
    return false;
  const int64_t n = t->dims(0);
  auto at = [&](int64_t i) -> std::optional<bool> {
    if (static_cast<int64_t>(t->raw_data().size()) == n * n) return t->raw_data()[static_cast<size_t>(i)] != 0;
    if (t->int32_data_size() == n * n) return t->int32_data(static_cast<int>(i)) != 0;
    return std::nullopt;
  };
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const auto v = at(i * n + j);
      if (!v || *v != ((j > i) == hides_when_true)) return false;
    }
  return true;
}

onnx::NodeProto transpose(const std::string& in, const std::string& out, const std::vector<int64_t>& perm,
                          const std::string& name) {
  onnx::NodeProto n;
  n.set_op_type("Transpose");
  n.set_name(name);
  n.add_input(in);
  n.add_output(out);
  auto* a = n.add_attribute();
  a->set_name("perm");
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t p : perm) a->add_ints(p);
  return n;
}

// The nodes that replace a match: K's Transpose, the mask's Not (when needed), the Attention node.
// A match in the ONNX graph's terms: node indices and value names.
struct Match {
  std::set<int> nodes;
  int last = -1;  // the MatMul(P, V): the Attention node takes its place
  std::string q, k_transposed, v, y, mask;
  double scale = 1;
  bool mask_hides = true, causal = false;
  int k_transpose = -1;
};

// The literals' contents, read from the ONNX tensors (exact, unlike the task graph's guesses).
class OnnxLiterals : public AttentionLiterals {
 public:
  OnnxLiterals(const TaskGraph& g, const GraphIndex& ix) : AttentionLiterals(g), ix_(ix) {}
  std::optional<double> scale_factor(ValueId v) const override {
    const auto c = scalar_value(ix_.constant(g_.value(v).name));
    if (!c || *c == 0 || !std::isfinite(*c)) return std::nullopt;
    return c;
  }
  bool masks_out(ValueId v) const override { return apart::masks_out(scalar_value(ix_.constant(g_.value(v).name))); }
  bool causal_triangle(ValueId mask, bool hides_when_true) const override {
    return is_causal_triangle(ix_.literal(g_.value(mask).name), hides_when_true);
  }

 private:
  const GraphIndex& ix_;
};

// The node of the ONNX graph that writes a task's first output (node indices and task ids differ: the task graph is
// topologically sorted, and may have been imported with Constant nodes turned into params).
int node_of(const GraphIndex& ix, const TaskGraph& g, TaskId t) {
  return ix.index_of(g.value(g.task(t).outputs[0]).name);
}

Match in_onnx_terms(const GraphIndex& ix, const TaskGraph& g, const AttentionMatch& a) {
  Match m;
  for (TaskId t : a.tasks) m.nodes.insert(node_of(ix, g, t));
  m.last = node_of(ix, g, a.last);
  auto name = [&](ValueId v) { return v.valid() ? g.value(v).name : std::string(); };
  m.q = name(a.q), m.k_transposed = name(a.k_transposed), m.v = name(a.v), m.y = name(a.y), m.mask = name(a.mask);
  m.scale = a.scale, m.mask_hides = a.mask_hides, m.causal = a.causal;
  m.k_transpose = a.k_transpose.valid() ? node_of(ix, g, a.k_transpose) : -1;
  if (m.k_transpose >= 0) m.nodes.insert(m.k_transpose);  // replaced by the Transpose that gives K
  return m;
}

std::vector<onnx::NodeProto> replacement(const GraphIndex& ix, const Match& m, bool default_domain, int serial) {
  const std::string base = "attention_fusion/" + std::to_string(serial);
  std::vector<onnx::NodeProto> out;
  const std::string k = base + "/K";
  if (m.k_transpose >= 0) {  // its perm composed with the swap of the last two axes
    const onnx::NodeProto& t = ix.g.node(m.k_transpose);
    std::vector<int64_t> perm{0, 1, 2, 3};
    if (const auto* a = find_attr(t, "perm"); a && a->ints_size() == 4)
      perm.assign(a->ints().begin(), a->ints().end());
    else
      perm = {3, 2, 1, 0};  // no perm: reversed axes
    std::swap(perm[2], perm[3]);
    out.push_back(transpose(t.input(0), k, perm, base + "/K_transpose"));
  } else {
    out.push_back(transpose(m.k_transposed, k, {0, 1, 3, 2}, base + "/K_transpose"));
  }
  const bool causal = m.causal;
  std::string mask;
  if (!m.mask.empty() && !causal) {
    mask = m.mask;
    if (m.mask_hides) {  // Attention's bool mask keeps where it is true
      mask = base + "/keep";
      onnx::NodeProto n;
      n.set_op_type("Not");
      n.set_name(base + "/mask_not");
      n.add_input(m.mask);
      n.add_output(mask);
      out.push_back(std::move(n));
    }
  }
  onnx::NodeProto a;
  a.set_op_type("Attention");
  if (!default_domain) a.set_domain(kApartDomain);
  a.set_name(base);
  for (const std::string& in : {m.q, k, m.v}) a.add_input(in);
  if (!mask.empty()) a.add_input(mask);
  a.add_output(m.y);
  auto* scale = a.add_attribute();
  scale->set_name("scale");
  scale->set_type(onnx::AttributeProto::FLOAT);
  scale->set_f(static_cast<float>(m.scale));
  if (causal) {
    auto* c = a.add_attribute();
    c->set_name("is_causal");
    c->set_type(onnx::AttributeProto::INT);
    c->set_i(1);
  }
  out.push_back(std::move(a));
  return out;
}

int64_t default_opset(const onnx::ModelProto& model) {
  int64_t opset = 0;
  for (const auto& o : model.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") opset = o.version();
  return opset;
}

}  // namespace

AttentionFusion fuse_attention(onnx::ModelProto& model, const TaskGraph& graph) {
  AttentionFusion result;
  const onnx::GraphProto& g = model.graph();
  const GraphIndex ix(g);
  std::vector<Match> matches;
  std::set<int> taken;
  for (const AttentionMatch& a : find_attention(graph, OnnxLiterals(graph, ix))) {
    matches.push_back(in_onnx_terms(ix, graph, a));
    taken.insert(matches.back().nodes.begin(), matches.back().nodes.end());
  }
  if (matches.empty()) return result;

  const bool default_domain = default_opset(model) >= 23;
  std::map<int, std::vector<onnx::NodeProto>> inserted;  // at the index of each match's last node
  for (size_t i = 0; i < matches.size(); ++i) {
    inserted[matches[i].last] = replacement(ix, matches[i], default_domain, static_cast<int>(i));
    result.nodes.push_back(inserted[matches[i].last].back().name());
  }
  onnx::GraphProto rewritten_nodes;
  for (int i = 0; i < g.node_size(); ++i) {
    if (auto it = inserted.find(i); it != inserted.end())
      for (auto& n : it->second) *rewritten_nodes.add_node() = std::move(n);
    if (!taken.count(i)) *rewritten_nodes.add_node() = g.node(i);
  }
  onnx::GraphProto& mg = *model.mutable_graph();
  mg.mutable_node()->Swap(rewritten_nodes.mutable_node());
  if (!default_domain) {  // ONNX infers nothing for ai.apart nodes: their outputs' types come from value_info
    for (const Match& m : matches) {
      const Value& y = graph.value(*graph.find_value(m.y));
      auto* info = mg.add_value_info();
      info->set_name(m.y);
      auto* tt = info->mutable_type()->mutable_tensor_type();
      tt->set_elem_type(static_cast<int32_t>(y.dtype));
      for (int64_t d : y.shape) tt->mutable_shape()->add_dim()->set_dim_value(d);
    }
    bool declared = false;
    for (const auto& o : model.opset_import()) declared = declared || o.domain() == kApartDomain;
    if (!declared) {
      auto* o = model.add_opset_import();
      o->set_domain(kApartDomain);
      o->set_version(1);
    }
  }
  return result;
}

}  // namespace apart
