// stage_K.onnx: each stage's forward subgraph as a standalone ONNX model (DESIGN.md "The plan").
#include <onnx/onnx_pb.h>

#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <system_error>
#include <vector>

#include "codegen/plan_writer.h"
#include "codegen/stage_graphs.h"
#include "graph/atomic_file.h"
#include "graph/error.h"
#include "graph/threads.h"
#include "importer/model_proto.h"

namespace apart {
namespace {

// A dim that scales with the batch is a dim_param, so the stage runs at any micro-batch size.
void set_value_info(onnx::ValueInfoProto* info, const TaskGraph& graph, ValueId id, const StageShapes& shapes) {
  const Value& v = graph.value(id);
  info->set_name(v.name);
  auto* tensor = info->mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(static_cast<int32_t>(v.dtype));
  if (!v.shape_known) return;
  auto* shape = tensor->mutable_shape();
  for (size_t axis = 0; axis < v.shape.size(); ++axis) {
    const std::string& param = shapes.dim_param(id, axis);
    if (param.empty())
      shape->add_dim()->set_dim_value(v.shape[axis]);
    else
      shape->add_dim()->set_dim_param(param);
  }
}

// Stage files read external data from `weights/<the model's location>` inside the plan directory (see
// docs/runtime.md, "Stage files and external data"). There, each file is a hard link to the model's own
// file (same inode: no copy, no second 100 GB), or a copy when a link is impossible (another filesystem)
// and the file is small; a larger one is left for the user to link, with a note. A symlink would do for
// Netron but not for the runtime, whose external-data rule refuses links out of the model's folder.
constexpr uintmax_t kMaxCopyBytes = uintmax_t{1} << 30;  // 1 GiB

// False when the model's file is not there (a graph-only export); the caller notes those once.
bool place_external_data(const std::filesystem::path& model_dir, const std::string& location,
                         const std::filesystem::path& directory) {
  namespace fs = std::filesystem;
  const fs::path source = model_dir / location;
  const fs::path target = directory / kPlanWeightsFolder / location;
  std::error_code ec;
  if (fs::exists(target, ec)) return true;
  if (!fs::is_regular_file(source, ec)) return false;
  fs::create_directories(target.parent_path(), ec);
  if (ec) throw SystemError("cannot create " + target.parent_path().string() + ": " + ec.message());
  fs::create_hard_link(source, target, ec);
  if (!ec) return true;
  const uintmax_t size = fs::file_size(source, ec);
  if (!ec && size <= kMaxCopyBytes) {
    fs::copy_file(source, target, ec);
    if (!ec) return true;
  }
  std::fprintf(stderr, "apart: note: stage files: cannot hard-link %s into the plan (another filesystem?); link or copy it "
               "to PLAN/%s to run the stages\n", source.string().c_str(), (fs::path(kPlanWeightsFolder) / location).string().c_str());
  return true;
}

}  // namespace

void write_stage_models(const PlanDocument& plan, const TaskGraph& graph, const std::filesystem::path& model_path,
                        const std::filesystem::path& directory, const StageShapes& shapes, int threads) {
  // Read as the plan's task graph was imported, so that node indices agree (importer/constant_params.h).
  const onnx::ModelProto original = load_model_proto(model_path, planned_import(plan));
  const auto& g = original.graph();
  std::map<std::string, int> initializer_index;
  for (int i = 0; i < g.initializer_size(); ++i) initializer_index[g.initializer(i).name()] = i;
  std::set<ValueId> model_outputs(graph.graph_outputs().begin(), graph.graph_outputs().end());

  // The files: stage_K.onnx per stage and, for an interleaved plan, chunk_C.onnx per virtual stage (files k ≥
  // plan.stages.size()), written in one pass so that they share weights/ and its constants file.
  const PlanDocument view = plan.virtual_stages.empty() ? PlanDocument{} : virtual_stage_view(plan);
  std::vector<const PlanStageRecord*> records;
  std::vector<std::string> file_names;
  for (const PlanDocument* d : {&plan, &view})
    for (size_t k = 0; k < d->stages.size(); ++k) {
      records.push_back(&d->stages[k]);
      file_names.push_back(stage_file_name(*d, static_cast<int>(k)));
    }
  const size_t stages = records.size();
  auto family = [&](size_t k) { return k < plan.stages.size() ? 0 : 1; };  // a stage's peers: stages, or chunks
  // Which files compute (produce) and read each value; constant tasks are replicated, so a value can be
  // produced by several stages, and a stage that produces a value never receives it.
  std::vector<std::set<int>> producers(graph.num_values()), readers(graph.num_values());
  std::vector<std::vector<TaskId>> stage_tasks;
  for (const PlanStageRecord* s : records) stage_tasks.push_back(stage_task_ids(*s, graph));
  for (size_t k = 0; k < stages; ++k)
    for (TaskId t : stage_tasks[k]) {
      for (ValueId v : graph.task(t).outputs)
        if (v.valid()) producers[v.value()].insert(static_cast<int>(k));
      for (ValueId v : graph.task(t).inputs)
        if (v.valid()) readers[v.value()].insert(static_cast<int>(k));
    }
  // What each stage computes and reads; the values it reads and does not compute are its inputs or initializers.
  std::vector<std::set<ValueId>> produced(stages), read(stages);
  for (size_t k = 0; k < stages; ++k)
    for (TaskId t : stage_tasks[k]) {
      const Task& task = graph.task(t);
      APART_CHECK(task.onnx_node_index >= 0 && task.onnx_node_index < g.node_size(), "task without ONNX node");
      for (ValueId v : task.outputs)
        if (v.valid()) produced[k].insert(v);
      for (ValueId v : task.inputs)
        if (v.valid()) read[k].insert(v);
    }

  // The model's external data, linked into weights/ once (serially: the links are shared by every stage).
  std::set<std::string> placed;  // external-data locations already linked into weights/ (or noted)
  std::vector<std::string> missing;
  for (size_t k = 0; k < stages; ++k)
    for (ValueId v : read[k]) {
      if (produced[k].count(v)) continue;
      auto it = initializer_index.find(graph.value(v).name);
      if (it == initializer_index.end()) continue;
      const onnx::TensorProto& init = g.initializer(it->second);
      if (init.data_location() != onnx::TensorProto::EXTERNAL) continue;
      for (const auto& kv : init.external_data())
        if (kv.key() == "location" && placed.insert(kv.value()).second &&
            !place_external_data(model_path.parent_path(), kv.value(), directory))
          missing.push_back(kv.value());
    }

  // A large constant several stages compute (a causal mask: constant tasks are replicated into every stage that
  // reads them) is written once, to weights/stage_constants.bin, and those stages' Constant nodes point at it as
  // external data: a GPT-3 plan's 63 stage files would otherwise carry 63 copies of its 4 MiB mask. Not when the
  // model's own external data is named so.
  std::map<size_t, int> stages_of_task;
  for (const auto& tasks : stage_tasks)
    for (TaskId t : tasks) ++stages_of_task[t.value()];
  std::map<int, onnx::NodeProto> shared_nodes;  // ONNX node index → the node as the stage files hold it
  if (!placed.count(kStageConstantsFile)) {
    const std::filesystem::path file = directory / kPlanWeightsFolder / kStageConstantsFile;
    std::optional<AtomicFile> out;
    int64_t offset = 0;
    for (const auto& [task, count] : stages_of_task) {
      const int index = graph.task(TaskId(static_cast<uint32_t>(task))).onnx_node_index;
      const onnx::NodeProto& node = g.node(index);
      if (count < 2 || node.op_type() != "Constant" || !node.domain().empty()) continue;
      int value = -1;
      for (int a = 0; a < node.attribute_size(); ++a)
        if (node.attribute(a).name() == "value" && node.attribute(a).has_t()) value = a;
      if (value < 0) continue;
      const onnx::TensorProto& tensor = node.attribute(value).t();
      if (tensor.data_location() == onnx::TensorProto::EXTERNAL || !tensor.has_raw_data() ||
          tensor.raw_data().size() < kSharedConstantBytes)
        continue;
      if (!out) {
        std::error_code ec;
        std::filesystem::create_directories(file.parent_path(), ec);
        if (ec) throw SystemError("cannot create " + file.parent_path().string() + ": " + ec.message());
        out.emplace(file);
      }
      constexpr int64_t kAlignment = 4096;  // each tensor starts on a page, so a reader may map it
      const int64_t padding = (kAlignment - offset % kAlignment) % kAlignment;
      if (padding > 0) out->write(std::string(static_cast<size_t>(padding), '\0').data(), padding);
      const int64_t length = static_cast<int64_t>(tensor.raw_data().size());
      out->write(tensor.raw_data().data(), length);
      onnx::NodeProto pointing = node;
      onnx::TensorProto* t = pointing.mutable_attribute(value)->mutable_t();
      t->clear_raw_data();
      t->set_data_location(onnx::TensorProto::EXTERNAL);
      for (const auto& [key, text] : {std::pair<const char*, std::string>{"location", std::string(kPlanWeightsFolder) +
                                                                                          "/" + kStageConstantsFile},
                                      {"offset", std::to_string(offset + padding)},
                                      {"length", std::to_string(length)}}) {
        auto* kv = t->add_external_data();
        kv->set_key(key);
        kv->set_value(text);
      }
      shared_nodes.emplace(index, std::move(pointing));
      offset += padding + length;
    }
    if (out) out->commit();
  }

  // Each stage's file on its own: built and written on up to `threads` threads.
  run_indexed(stages, threads, [&](size_t k) {
    onnx::ModelProto model;
    model.set_ir_version(original.ir_version());
    model.set_producer_name("apart");
    model.set_model_version(original.model_version());
    *model.mutable_opset_import() = original.opset_import();
    onnx::GraphProto* out = model.mutable_graph();
    out->set_name(g.name() + "_" + file_names[k].substr(0, file_names[k].size() - 5));  // "_stage_3", "_chunk_5"
    for (TaskId t : stage_tasks[k]) {
      const int index = graph.task(t).onnx_node_index;
      const auto once = shared_nodes.find(index);
      *out->add_node() = once != shared_nodes.end() ? once->second : g.node(index);
    }
    for (ValueId v : read[k]) {
      if (produced[k].count(v)) continue;
      const Value& value = graph.value(v);
      auto it = initializer_index.find(value.name);
      if (it != initializer_index.end()) {
        onnx::TensorProto* init = out->add_initializer();
        *init = g.initializer(it->second);
        if (init->data_location() == onnx::TensorProto::EXTERNAL)
          for (auto& kv : *init->mutable_external_data())
            if (kv.key() == "location") kv.set_value(std::string(kPlanWeightsFolder) + "/" + kv.value());
        continue;
      }
      set_value_info(out->add_input(), graph, v, shapes);
    }
    for (ValueId v : produced[k]) {
      bool needed = model_outputs.count(v) > 0;
      for (int r : readers[v.value()])
        needed |= r != static_cast<int>(k) && family(static_cast<size_t>(r)) == family(k) && !producers[v.value()].count(r);
      if (needed) set_value_info(out->add_output(), graph, v, shapes);
    }
    AtomicFile file(directory / file_names[k]);
    if (!model.SerializeToOstream(&file.stream())) throw SystemError("cannot serialize " + file_names[k]);
    file.commit();
  });
  if (!missing.empty())
    std::fprintf(stderr, "apart: note: stage files: %zu external-data file%s (%s%s) not present beside the model; put %s under "
                 "PLAN/%s/ to run the stages\n", missing.size(), missing.size() == 1 ? " is" : "s are", missing.front().c_str(),
                 missing.size() > 1 ? ", …" : "", missing.size() == 1 ? "it" : "them", kPlanWeightsFolder);
}

}  // namespace apart
