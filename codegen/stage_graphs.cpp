// A stage's fused training graph cut into a forward graph and a backward graph, node for node
// (docs/autodiff.md, "Stage graphs").
#include "codegen/stage_graphs.h"

#include <algorithm>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "codegen/gradients/gradient.h"
#include "graph/error.h"
#include "graph/text.h"

namespace apart {

namespace {

// What the cut needs to know about the fused graph: each value's dtype, static shape and import-time
// integers, and each node's name as the importer calls it (so a random kernel draws the same stream:
// runtime/random.h keys it by that name).
struct FusedGraph {
  explicit FusedGraph(const onnx::GraphProto& g) : graph(g) {}
  const onnx::GraphProto& graph;
  int forward_nodes = 0;  // nodes [0, forward_nodes) are the forward, the rest what autodiff emitted
  std::unordered_map<std::string, const Value*> values;
  std::vector<std::string> node_names;  // by node index
  std::vector<int> topological_order;   // node indices, as the importer orders them
  std::unordered_map<std::string, int> producer;  // value → node index
  std::set<std::string> initializers;
  std::set<std::string> gradient_inputs;  // TrainingGraph::output_gradient_inputs' graph inputs

  const Value& value(const std::string& name) const {
    auto it = values.find(name);
    APART_CHECK(it != values.end(), "stage graphs: the training graph has no value " + name);
    return *it->second;
  }
  bool is_forward_value(const std::string& name) const {  // a graph input or a forward node's output
    auto it = producer.find(name);
    return it == producer.end() ? !initializers.count(name) && !gradient_inputs.count(name) : it->second < forward_nodes;
  }
};

// A value's dtype and static shape (inputs need it to import without dims to bind; outputs to declare what they
// return); without a static shape, only the dtype.
void set_value_info(onnx::ValueInfoProto& info, const std::string& name, const Value& v) {
  info.Clear();
  info.set_name(name);
  auto* tt = info.mutable_type()->mutable_tensor_type();
  tt->set_elem_type(static_cast<int32_t>(v.dtype));
  if (!v.shape_known) return;
  auto* shape = tt->mutable_shape();
  for (int64_t d : v.shape) shape->add_dim()->set_dim_value(d);
}

// Forward nodes whose outputs depend on no graph input: constants, shape arithmetic on initializers, and values
// computed from params alone (a transposed weight). The backward that reads such a value computes it again
// (constants once, when the executor loads: ExecutorOptions::precompute_constants; param-derived ones each run,
// the same kernel on the same bytes) instead of keeping a copy per micro-batch in flight.
std::vector<bool> graph_input_free_nodes(const FusedGraph& fused) {
  std::vector<bool> free(static_cast<size_t>(fused.forward_nodes), false);
  std::unordered_set<std::string> free_values(fused.initializers.begin(), fused.initializers.end());
  for (int i : fused.topological_order) {
    if (i >= fused.forward_nodes) continue;
    const auto& n = fused.graph.node(i);
    bool all = true;
    for (const auto& in : n.input()) all = all && (in.empty() || free_values.count(in));
    if (!all) continue;
    free[static_cast<size_t>(i)] = true;
    for (const auto& out : n.output()) free_values.insert(out);
  }
  return free;
}

// A Constant node holding integers the importer folded (e.g. shape arithmetic on a graph input's static shape).
onnx::NodeProto folded_constant(const std::string& name, const Value& v) {
  onnx::NodeProto n;
  n.set_op_type("Constant");
  n.set_name("stage/folded/" + name);
  n.add_output(name);
  auto* a = n.add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  auto* t = a->mutable_t();
  t->set_data_type(static_cast<int32_t>(v.dtype));
  for (int64_t d : v.shape) t->add_dims(d);
  for (int64_t x : *v.known_ints) {
    if (v.dtype == DType::kInt64) t->add_int64_data(x);
    else t->add_int32_data(static_cast<int32_t>(x));
  }
  return n;
}

// A model with `source`'s header and initializers and the given graph.
onnx::ModelProto make_model(const onnx::ModelProto& source, const std::string& suffix) {
  onnx::ModelProto model;
  model.CopyFrom(source);
  onnx::GraphProto& g = *model.mutable_graph();
  g.clear_node();
  g.clear_input();
  g.clear_output();
  g.clear_value_info();
  g.set_name(g.name() + suffix);
  return model;
}

// Drops the ai.apart opset import from a graph that uses none of its ops (the forward).
void drop_unused_apart_opset(onnx::ModelProto& model) {
  for (const auto& n : model.graph().node())
    if (n.domain() == autodiff::kApartDomain) return;
  auto* opsets = model.mutable_opset_import();
  for (int i = opsets->size() - 1; i >= 0; --i)
    if (opsets->Get(i).domain() == autodiff::kApartDomain) opsets->DeleteSubrange(i, 1);
}

// ZB-H1's split of the backward (StageGraphs::input_pass, weight_pass): `in_backward` marks the backward's nodes
// of the fused graph, `folded` the integer constants it starts with.
void split_weight_pass(const FusedGraph& fused, const onnx::ModelProto& training, const std::vector<bool>& in_backward,
                       const std::vector<onnx::NodeProto>& folded, StageGraphs& result) {
  const int nodes = fused.graph.node_size();
  std::vector<bool> in_b(static_cast<size_t>(nodes), false);
  {
    std::vector<std::string> work;
    for (const auto& [input, grad] : result.input_gradients) work.push_back(grad);
    std::unordered_set<std::string> seen(work.begin(), work.end());
    while (!work.empty()) {
      const std::string name = std::move(work.back());
      work.pop_back();
      auto it = fused.producer.find(name);
      if (it == fused.producer.end() || !in_backward[static_cast<size_t>(it->second)]) continue;
      in_b[static_cast<size_t>(it->second)] = true;
      for (const auto& in : fused.graph.node(it->second).input())
        if (!in.empty() && seen.insert(in).second) work.push_back(in);
    }
  }
  auto made_by_b = [&](const std::string& name) {
    auto it = fused.producer.find(name);
    return it != fused.producer.end() && in_backward[static_cast<size_t>(it->second)] && in_b[static_cast<size_t>(it->second)];
  };
  // What each pass reads from outside itself, and what W reads from B.
  std::unordered_set<std::string> read_by_b, read_by_w, carried;
  for (int i = 0; i < nodes; ++i) {
    if (!in_backward[static_cast<size_t>(i)]) continue;
    const bool b = in_b[static_cast<size_t>(i)];
    for (const auto& in : fused.graph.node(i).input()) {
      if (in.empty()) continue;
      (b ? read_by_b : read_by_w).insert(in);
      if (!b && made_by_b(in) && carried.insert(in).second) result.carried.push_back(in);
    }
  }
  // B's carried values in B's node order.
  std::vector<std::string> ordered;
  for (int i = 0; i < nodes; ++i)
    if (in_backward[static_cast<size_t>(i)] && in_b[static_cast<size_t>(i)])
      for (const auto& o : fused.graph.node(i).output())
        if (carried.count(o)) ordered.push_back(o);
  result.carried = ordered;

  auto build = [&](bool b, const std::unordered_set<std::string>& reads, const char* suffix) {
    onnx::ModelProto model = make_model(training, suffix);
    onnx::GraphProto& g = *model.mutable_graph();
    for (const auto& in : result.backward.graph().input())
      if (reads.count(in.name())) *g.add_input() = in;
    if (!b)
      for (const auto& c : result.carried) set_value_info(*g.add_input(), c, fused.value(c));
    for (const auto& n : folded)
      if (reads.count(n.output(0))) *g.add_node() = n;
    std::unordered_set<std::string> produced;
    for (int i = 0; i < nodes; ++i) {
      if (!in_backward[static_cast<size_t>(i)] || in_b[static_cast<size_t>(i)] != b) continue;
      auto* n = g.add_node();
      *n = fused.graph.node(i);
      n->set_name(fused.node_names[static_cast<size_t>(i)]);
      for (const auto& o : n->output()) produced.insert(o);
    }
    for (const auto& vi : fused.graph.value_info())
      if (produced.count(vi.name())) *g.add_value_info() = vi;
    auto output = [&](const std::string& name) { set_value_info(*g.add_output(), name, fused.value(name)); };
    if (b)
      for (const auto& [input, grad] : result.input_gradients) output(grad);
    for (const auto& [param, grad] : result.gradients)
      if (made_by_b(grad) == b) output(grad);
    if (b)
      for (const auto& c : result.carried) output(c);
    drop_unused_apart_opset(model);
    return model;
  };
  result.input_pass = build(true, read_by_b, ".backward_input");
  result.weight_pass = build(false, read_by_w, ".backward_weight");
}

}  // namespace

StageGraphs build_stage_graphs(const onnx::ModelProto& forward, const StageGraphOptions& options) {
  // A forward at an older opset is split as the fused graph holds it: converted (its node count may change).
  if (auto converted = at_training_opset(forward)) return build_stage_graphs(*converted, options);
  TrainingGraph tg = build_training_graph(forward, options.training);

  // --- What the fused graph holds: shapes (its inputs are static), node names, producers ---
  ImportOptions import;
  import.require_external_data = false;
  import.constants_as_params = false;  // the fused graph as built: node indices are its own
  const ImportedModel imported = import_model_bytes(tg.model.SerializeAsString(), {}, "<training graph>", import);
  FusedGraph fused(tg.model.graph());
  fused.forward_nodes = tg.forward_nodes;  // attention fused first has fewer nodes than `forward`
  for (const Value& v : imported.graph.values()) fused.values[v.name] = &v;
  fused.node_names.resize(static_cast<size_t>(fused.graph.node_size()));
  for (const Task& t : imported.graph.tasks())
    if (t.onnx_node_index >= 0) {
      fused.node_names[static_cast<size_t>(t.onnx_node_index)] = t.name;
      fused.topological_order.push_back(t.onnx_node_index);
    }
  for (int i = 0; i < fused.graph.node_size(); ++i)
    for (const auto& o : fused.graph.node(i).output())
      if (!o.empty()) fused.producer.emplace(o, i);
  for (const auto& init : fused.graph.initializer()) fused.initializers.insert(init.name());
  for (const auto& [output, grad] : tg.output_gradient_inputs) fused.gradient_inputs.insert(grad);
  if (!tg.loss_seed_input.empty()) fused.gradient_inputs.insert(tg.loss_seed_input);  // a backward input too

  StageGraphs result;
  result.loss_output = tg.loss_output;
  result.loss_seed_input = tg.loss_seed_input;
  result.gradients = tg.gradients;
  result.input_gradients = tg.input_gradients;
  result.output_gradient_inputs = tg.output_gradient_inputs;
  result.state_updates = tg.state_updates;

  // --- The backward's nodes: what autodiff emitted (with recompute: the forward's too), minus what no
  // gradient needs; a node keeps its place, so kernels run in the fused graph's order ---
  std::vector<std::string> gradient_outputs;
  for (const auto& [param, grad] : tg.gradients) gradient_outputs.push_back(grad);
  for (const auto& [input, grad] : tg.input_gradients) gradient_outputs.push_back(grad);
  const int first_backward = options.recompute ? 0 : fused.forward_nodes;
  std::vector<bool> in_backward(static_cast<size_t>(fused.graph.node_size()), false);
  {
    std::vector<std::string> work = gradient_outputs;
    std::unordered_set<std::string> seen(work.begin(), work.end());
    while (!work.empty()) {  // by producers, not by position: a forward need not list its nodes in order
      const std::string name = std::move(work.back());
      work.pop_back();
      auto it = fused.producer.find(name);
      if (it == fused.producer.end() || it->second < first_backward) continue;
      in_backward[static_cast<size_t>(it->second)] = true;
      for (const auto& in : fused.graph.node(it->second).input())
        if (!in.empty() && seen.insert(in).second) work.push_back(in);
    }
  }

  // --- What the backward reads from the forward: the stash, unless it is a constant it can compute itself ---
  const std::vector<bool> input_free = graph_input_free_nodes(fused);
  std::vector<onnx::NodeProto> folded;
  std::unordered_set<std::string> folded_values, stashed;
  auto read_from_forward = [&](const std::string& name, auto&& self) -> void {
    if (folded_values.count(name) || stashed.count(name)) return;
    auto it = fused.producer.find(name);
    const int node = it == fused.producer.end() ? -1 : it->second;
    if (node >= 0 && in_backward[static_cast<size_t>(node)]) return;
    if (node >= 0 && input_free[static_cast<size_t>(node)]) {
      in_backward[static_cast<size_t>(node)] = true;
      for (const auto& in : fused.graph.node(node).input())
        if (!in.empty() && fused.is_forward_value(in)) self(in, self);
      return;
    }
    const Value& v = fused.value(name);
    if (node >= 0 && v.known_ints && v.shape_known && (v.dtype == DType::kInt64 || v.dtype == DType::kInt32)) {
      folded_values.insert(name);
      folded.push_back(folded_constant(name, v));
      return;
    }
    stashed.insert(name);
  };
  for (int i = 0; i < fused.graph.node_size(); ++i) {
    if (!in_backward[static_cast<size_t>(i)]) continue;
    for (const auto& in : fused.graph.node(i).input())
      if (!in.empty() && fused.is_forward_value(in)) read_from_forward(in, read_from_forward);
  }
  // The stash in a fixed order: graph inputs as the graph lists them, then forward outputs by node.
  for (const auto& in : fused.graph.input())
    if (stashed.count(in.name())) result.stash.push_back(in.name());
  for (int i = 0; i < fused.forward_nodes; ++i)
    for (const auto& o : fused.graph.node(i).output())
      if (!o.empty() && stashed.count(o) && fused.producer.at(o) == i) result.stash.push_back(o);
  APART_CHECK(result.stash.size() == stashed.size(), "stage graphs: a stashed value is neither an input nor a forward output");

  // --- The forward: the fused graph's forward nodes, outputs loss · stage outputs · stash · state updates ---
  result.forward = make_model(tg.model, ".forward");
  {
    onnx::GraphProto& g = *result.forward.mutable_graph();
    for (const auto& in : fused.graph.input())
      if (!fused.gradient_inputs.count(in.name())) *g.add_input() = in;
    for (int i = 0; i < fused.forward_nodes; ++i) {
      auto* n = g.add_node();
      *n = fused.graph.node(i);
      n->set_name(fused.node_names[static_cast<size_t>(i)]);
    }
    std::unordered_set<std::string> listed;
    auto add_output = [&](const std::string& name) {
      if (listed.insert(name).second) set_value_info(*g.add_output(), name, fused.value(name));
    };
    if (!tg.loss_output.empty()) add_output(tg.loss_output);
    for (const auto& [output, grad] : tg.output_gradient_inputs) add_output(output);
    for (const auto& s : result.stash) add_output(s);
    for (const auto& [stat, update] : tg.state_updates) add_output(update);
    std::unordered_set<std::string> with_gradient{tg.loss_output};
    for (const auto& [output, grad_input] : tg.output_gradient_inputs) with_gradient.insert(output);
    for (const auto& o : forward.graph().output())
      if (!with_gradient.count(o.name())) {
        result.outputs_without_gradient.push_back(o.name());
        add_output(o.name());
      }
    drop_unused_apart_opset(result.forward);
  }

  // --- The backward: folded constants, then its nodes in fused order; inputs stash · output gradients ---
  result.backward = make_model(tg.model, ".backward");
  {
    onnx::GraphProto& g = *result.backward.mutable_graph();
    for (const auto& s : result.stash) set_value_info(*g.add_input(), s, fused.value(s));
    for (const auto& in : fused.graph.input())
      if (fused.gradient_inputs.count(in.name())) *g.add_input() = in;
    for (const auto& n : folded) *g.add_node() = n;
    std::unordered_set<std::string> produced;
    for (int i = 0; i < fused.graph.node_size(); ++i) {
      if (!in_backward[static_cast<size_t>(i)]) continue;
      auto* n = g.add_node();
      *n = fused.graph.node(i);
      n->set_name(fused.node_names[static_cast<size_t>(i)]);
      for (const auto& o : n->output()) produced.insert(o);
    }
    for (const auto& vi : fused.graph.value_info())
      if (produced.count(vi.name())) *g.add_value_info() = vi;
    for (const auto& name : gradient_outputs) set_value_info(*g.add_output(), name, fused.value(name));
    drop_unused_apart_opset(result.backward);
  }
  if (options.split_weight_pass) split_weight_pass(fused, tg.model, in_backward, folded, result);
  return result;
}

std::vector<std::string> fold_shape_only_inputs(onnx::ModelProto& stage, const std::set<std::string>& sent,
                                                const ImportOptions& import) {
  onnx::GraphProto& g = *stage.mutable_graph();
  std::set<std::string> initializers;
  for (const auto& init : g.initializer()) initializers.insert(init.name());
  std::set<std::string> unsent;
  for (const auto& in : g.input())
    if (!sent.count(in.name()) && !initializers.count(in.name())) unsent.insert(in.name());
  if (unsent.empty()) return {};
  ImportOptions shapes_only = import;
  shapes_only.require_external_data = false;
  const ImportedModel imported = import_model_bytes(stage.SerializeAsString(), {}, "stage " + g.name(), shapes_only);
  for (const Task& task : imported.graph.tasks()) {
    std::string read;
    for (ValueId in : task.inputs)
      if (in.valid() && unsent.count(imported.graph.value(in).name)) read = imported.graph.value(in).name;
    if (read.empty() || task.onnx_node_index < 0) continue;
    onnx::NodeProto& node = *g.mutable_node(task.onnx_node_index);
    const bool folded = task.outputs.size() == 1 && task.outputs[0].valid() &&
                        imported.graph.value(task.outputs[0]).known_ints && imported.graph.value(task.outputs[0]).shape_known;
    if (!folded)
      throw InvalidModel("stage " + quote(g.name()) + ": node " + quote(task.name) + " (" + task.op_type + ") reads " +
                         quote(read) + ", which the plan does not send to this stage, for more than its shape; re-run "
                         "apart partition to rewrite the plan folder");
    onnx::NodeProto constant = folded_constant(node.output(0), imported.graph.value(task.outputs[0]));
    constant.set_name(node.name());
    node = std::move(constant);
  }
  auto* inputs = g.mutable_input();
  for (int i = inputs->size() - 1; i >= 0; --i)
    if (unsent.count(inputs->Get(i).name())) inputs->DeleteSubrange(i, 1);
  return {unsent.begin(), unsent.end()};
}

ImportOptions planned_import(const PlanDocument& plan) {
  ImportOptions import;
  import.constants_as_params = !plan.model || plan.model->constants_as_params.value_or(true);
  if (plan.model) import.dims = plan.model->dims;
  if (plan.model && plan.model->added_loss) {
    const auto form = parse_added_loss_form(plan.model->added_loss->form);
    if (!form)
      throw InvalidArgument("plan.json: model.added_loss.form " + quote(plan.model->added_loss->form) +
                            " is not a loss apart adds (cross_entropy, cross_entropy_shifted)");
    import.loss = AddedLoss{*form, plan.model->added_loss->labels};
  }
  return import;
}

std::optional<PlanModel::AddedLoss> added_loss_record(const AddedLoss& loss) {
  if (!loss.enabled()) return std::nullopt;
  return PlanModel::AddedLoss{std::string(added_loss_form_name(loss.form)), loss.labels};
}

}  // namespace apart
