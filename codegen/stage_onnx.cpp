// stage_K.onnx: each stage's forward subgraph as a standalone ONNX model (DESIGN.md "The plan").
#include <onnx/onnx_pb.h>

#include <cstdio>
#include <map>
#include <set>
#include <system_error>
#include <vector>

#include "codegen/plan_writer.h"
#include "graph/error.h"
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
                        const std::filesystem::path& directory, const StageShapes& shapes) {
  const onnx::ModelProto original = load_model_proto(model_path);
  const auto& g = original.graph();
  std::map<std::string, int> initializer_index;
  for (int i = 0; i < g.initializer_size(); ++i) initializer_index[g.initializer(i).name()] = i;
  std::set<ValueId> model_outputs(graph.graph_outputs().begin(), graph.graph_outputs().end());
  std::set<std::string> placed;  // external-data locations already linked into weights/ (or noted)
  std::vector<std::string> missing;

  // Which stages compute (produce) and read each value; constant tasks are replicated, so a value can be
  // produced by several stages, and a stage that produces a value never receives it.
  const size_t stages = plan.stages.size();
  std::vector<std::set<int>> producers(graph.num_values()), readers(graph.num_values());
  std::vector<std::vector<TaskId>> stage_tasks;
  for (const PlanStageRecord& s : plan.stages) stage_tasks.push_back(stage_task_ids(s, graph));
  for (size_t k = 0; k < plan.stages.size(); ++k)
    for (TaskId t : stage_tasks[k]) {
      const PlanStageRecord& s = plan.stages[k];
      for (ValueId v : graph.task(t).outputs)
        if (v.valid()) producers[v.value()].insert(s.id);
      for (ValueId v : graph.task(t).inputs)
        if (v.valid()) readers[v.value()].insert(s.id);
    }

  for (size_t k = 0; k < stages; ++k) {
    const PlanStageRecord& s = plan.stages[k];
    onnx::ModelProto model;
    model.set_ir_version(original.ir_version());
    model.set_producer_name("apart");
    model.set_model_version(original.model_version());
    *model.mutable_opset_import() = original.opset_import();
    onnx::GraphProto* out = model.mutable_graph();
    out->set_name(g.name() + "_stage_" + std::to_string(k));
    std::set<ValueId> produced, read;
    for (TaskId t : stage_tasks[k]) {
      const Task& task = graph.task(t);
      APART_CHECK(task.onnx_node_index >= 0 && task.onnx_node_index < g.node_size(), "task without ONNX node");
      *out->add_node() = g.node(task.onnx_node_index);
      for (ValueId v : task.outputs)
        if (v.valid()) produced.insert(v);
      for (ValueId v : task.inputs)
        if (v.valid()) read.insert(v);
    }
    for (ValueId v : read) {
      if (produced.count(v)) continue;
      const Value& value = graph.value(v);
      auto it = initializer_index.find(value.name);
      if (it != initializer_index.end()) {
        onnx::TensorProto* init = out->add_initializer();
        *init = g.initializer(it->second);
        if (init->data_location() == onnx::TensorProto::EXTERNAL)
          for (auto& kv : *init->mutable_external_data())
            if (kv.key() == "location") {
              if (placed.insert(kv.value()).second && !place_external_data(model_path.parent_path(), kv.value(), directory))
                missing.push_back(kv.value());
              kv.set_value(std::string(kPlanWeightsFolder) + "/" + kv.value());
            }
        continue;
      }
      set_value_info(out->add_input(), graph, v, shapes);
    }
    for (ValueId v : produced) {
      bool needed = model_outputs.count(v) > 0;
      for (int r : readers[v.value()]) needed |= r != s.id && !producers[v.value()].count(r);
      if (needed) set_value_info(out->add_output(), graph, v, shapes);
    }
    std::string bytes;
    if (!model.SerializeToString(&bytes)) throw SystemError("cannot serialize stage " + std::to_string(k));
    write_file_atomically(directory / ("stage_" + std::to_string(k) + ".onnx"), bytes);
  }
  if (!missing.empty())
    std::fprintf(stderr, "apart: note: stage files: %zu external-data file%s (%s%s) not present beside the model; put %s under "
                 "PLAN/%s/ to run the stages\n", missing.size(), missing.size() == 1 ? " is" : "s are", missing.front().c_str(),
                 missing.size() > 1 ? ", …" : "", missing.size() == 1 ? "it" : "them", kPlanWeightsFolder);
}

}  // namespace apart
