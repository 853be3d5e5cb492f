// ONNX → TaskGraph: the importer's steps in order — the header and opsets, initializers, graph inputs with their dims
// bound (importer/input_binding.h), nodes, shape inference — over bytes read safely (importer/onnx_reading.h).
#include "importer/importer.h"

#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <optional>
#include <set>
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
#include "importer/input_binding.h"
#include "importer/model_proto.h"
#include "importer/onnx_reading.h"
#include "importer/opset_adapter.h"

namespace apart {

namespace fs = std::filesystem;

namespace {

// Lowest default-domain opset apart imports; the highest is kMaxOpset (importer/opset_adapter.h: ONNX 1.12 knows up
// to 17, apart adapts 18–23 onto its schemas).
constexpr int64_t kMinOpset = 1;
constexpr int64_t kMinTestedOpset = 7;
// Inline initializer data above this size is dropped after validation: planning needs shapes only.
constexpr int64_t kKeepInlineBytes = 1 << 16;
constexpr int kMaxInferenceRounds = 4;

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
    bind_graph_inputs(g, options_, result_);
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
      set_value_size(v);
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
  ImportedModel result_;
};

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

}  // namespace apart
