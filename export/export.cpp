// apart export's engine-independent part: the plan's parts as whole layers, what snapping costs, export.json.
#include "export/export.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "graph/error.h"
#include "graph/text.h"
#include "plan/costs_json.h"
#include "simulator/sim_plan.h"
#include "simulator/simulate.h"

namespace fs = std::filesystem;

namespace apart {
namespace {

// Scales every stage's times by what its tasks weigh after snapping against before (costs.json's task times).
PlanDocument snapped_plan(const PlanDocument& plan, const std::vector<int>& stage_before,
                          const std::vector<int>& stage_after, const std::vector<const CostsRow*>& rows) {
  const size_t P = plan.stages.size();
  std::vector<double> fwd_before(P), fwd_after(P), bwd_before(P), bwd_after(P);
  for (size_t i = 0; i < rows.size(); ++i) {
    fwd_before[stage_before[i]] += rows[i]->cost.forward_s;
    bwd_before[stage_before[i]] += rows[i]->cost.backward_s;
    fwd_after[stage_after[i]] += rows[i]->cost.forward_s;
    bwd_after[stage_after[i]] += rows[i]->cost.backward_s;
  }
  PlanDocument snapped = plan;
  for (size_t k = 0; k < P; ++k) {
    PlanStageRecord& s = snapped.stages[k];
    const double f = fwd_before[k] > 0 ? fwd_after[k] / fwd_before[k] : 1;
    const double b = bwd_before[k] > 0 ? bwd_after[k] / bwd_before[k] : 1;
    const double recompute = s.recompute_forward_s.value_or(s.recompute ? s.forward_s : 0);
    s.forward_s *= f;
    s.backward_s = (s.backward_s - recompute) * b + recompute * f;
    if (s.recompute_forward_s) *s.recompute_forward_s *= f;
    if (s.backward_weight_s) *s.backward_weight_s *= b;
  }
  return snapped;
}

}  // namespace

std::vector<std::string> LayerCut::modules(int part) const {
  std::vector<std::string> names;
  if (part == 0)
    for (const std::string& m : stack.before)
      if (!m.empty()) names.push_back(module_fqn(m));
  for (int l = layers[part].first; l < layers[part].second; ++l) names.push_back(module_fqn(stack.layers[l]));
  if (part + 1 == static_cast<int>(layers.size()))
    for (const std::string& m : stack.after)
      if (!m.empty()) names.push_back(module_fqn(m));
  return names;
}

LayerCut layer_cut(const PlanDocument& plan, const fs::path& plan_dir) {
  const fs::path costs_file = plan_dir / "costs.json";
  std::error_code ec;
  if (!fs::is_regular_file(costs_file, ec))
    throw InvalidArgument("the plan folder " + quote(plan_dir.string()) +
                          " has no costs.json, whose task names and scopes give the layers: re-run apart partition");
  const CostsDocument costs = read_costs_document(costs_file);
  // The parts: the stages, or an interleaved plan's virtual stages (part c on stage c mod P).
  const bool chunks = !plan.virtual_stages.empty();
  const size_t parts = chunks ? plan.virtual_stages.size() : plan.stages.size();
  std::unordered_map<std::string, int> part_of;
  for (size_t c = 0; c < parts; ++c)
    for (const std::string& t : chunks ? plan.virtual_stages[c].tasks : plan.stages[c].tasks) part_of.emplace(t, c);

  LayerCut cut;
  cut.pipeline_stages = static_cast<int>(plan.stages.size());
  std::vector<const CostsRow*> rows;  // batch tasks, topological order
  std::vector<std::string> paths;
  for (const CostsRow& row : costs.rows) {
    if (row.constant) continue;
    rows.push_back(&row);
    paths.push_back(row.scope.empty() ? row.name : row.scope + "/" + row.name);
  }
  cut.stack = layer_stack(paths);
  if (cut.stack.empty())
    throw Unsupported(
        "the model's node names carry no module path with a list of layers (\"/h.3/attn/MatMul\", "
        "\"/model/layers.12/...\"): the engines cut pipelines between modules by name; export the model "
        "with torch.onnx.export, which names nodes by module");
  const int L = static_cast<int>(cut.stack.layers.size());
  std::vector<int> before(rows.size());
  std::vector<std::vector<double>> weight(L, std::vector<double>(parts, 0.0));
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto it = part_of.find(rows[i]->name);
    if (it == part_of.end())
      throw InvalidModel("costs.json's task " + quote(rows[i]->name) +
                         " is in no stage of plan.json: re-run apart partition");
    before[i] = it->second;
    const int layer = cut.stack.position[i];
    if (layer >= 0 && layer < L) weight[layer][before[i]] += rows[i]->cost.forward_s + rows[i]->cost.backward_s + 1e-30;
  }
  // Each layer to the part holding most of its time (ties: the earlier), never before the previous layer's part.
  std::vector<int> layer_part(L);
  for (int l = 0; l < L; ++l) {
    layer_part[l] = static_cast<int>(std::max_element(weight[l].begin(), weight[l].end()) - weight[l].begin());
    if (l > 0) layer_part[l] = std::max(layer_part[l], layer_part[l - 1]);
    const int holding =
        static_cast<int>(std::count_if(weight[l].begin(), weight[l].end(), [](double w) { return w > 0; }));
    if (holding > 1) ++cut.moved_layers;
  }
  cut.layers.assign(parts, {0, 0});
  for (size_t c = 0; c < parts; ++c) {
    int first = 0;
    while (first < L && layer_part[first] < static_cast<int>(c)) ++first;
    int end = first;
    while (end < L && layer_part[end] == static_cast<int>(c)) ++end;
    cut.layers[c] = {first, end};
  }
  std::vector<int> stage_before(rows.size()), stage_after(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const int layer = cut.stack.position[i];
    const int after = layer < 0 ? 0 : layer >= L ? static_cast<int>(parts) - 1 : layer_part[layer];
    if (after != before[i]) {
      ++cut.moved_tasks;
      cut.moved_seconds += rows[i]->cost.forward_s + rows[i]->cost.backward_s;
    }
    stage_before[i] = before[i] % cut.pipeline_stages;
    stage_after[i] = after % cut.pipeline_stages;
  }
  cut.original_iteration_s = sim::simulate(sim::sim_plan(plan)).iteration_s;
  cut.snapped_iteration_s =
      cut.snapped() ? sim::simulate(sim::sim_plan(snapped_plan(plan, stage_before, stage_after, rows))).iteration_s
                    : cut.original_iteration_s;
  return cut;
}

ExportFiles export_plan(const fs::path& plan_path, Engine engine) {
  const fs::path json = plan_json_path(plan_path);
  const PlanDocument plan = read_plan(json);
  std::vector<Inexpressible> refused = inexpressible_fields(plan, engine);
  std::optional<LayerCut> cut;
  try {
    cut = layer_cut(plan, json.parent_path());
  } catch (const Unsupported& e) {
    refused.push_back({"stages[].tasks", e.what()});
  }
  if (cut)
    for (size_t c = 1; c + 1 < cut->layers.size(); ++c)
      if (cut->layers[c].first == cut->layers[c].second)
        refused.push_back(
            {"stages[].tasks", "pipeline part " + std::to_string(c) +
                                   " holds no whole layer once the cuts are snapped to layers (the model has " +
                                   std::to_string(cut->stack.layers.size()) + " layers in " +
                                   std::to_string(cut->layers.size()) + " parts)"});
  if (!refused.empty()) {
    std::string why;
    for (const Inexpressible& r : refused) why += (why.empty() ? " " : "; ") + r.field + ": " + r.reason;
    throw Unsupported(std::string(engine_name(engine)) + " cannot express this plan:" + why +
                      ". Plan for it with apart partition --target " + std::string(engine_name(engine)) +
                      " (the search restricted to what it runs)");
  }
  ExportFiles out;
  nlohmann::ordered_json notes = nlohmann::ordered_json::array();
  out.files = engine_files(plan, *cut, engine, notes);
  nlohmann::ordered_json& s = out.summary;
  s["schema"] = "apart.export/1";
  s["format"] = engine_name(engine);
  s["checked_against"] = engine_capabilities(engine).release;
  s["plan"] = json.string();
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const auto& f : out.files) files.push_back(f.first);
  s["files"] = files;
  s["layers"] = {{"container", module_fqn(cut->stack.container)},
                 {"count", cut->stack.layers.size()},
                 {"before", nlohmann::ordered_json::array()},
                 {"after", nlohmann::ordered_json::array()}};
  for (const std::string& m : cut->stack.before)
    s["layers"]["before"].push_back(m.empty() ? "(unscoped)" : module_fqn(m));
  for (const std::string& m : cut->stack.after)
    s["layers"]["after"].push_back(m.empty() ? "(unscoped)" : module_fqn(m));
  nlohmann::ordered_json parts = nlohmann::ordered_json::array();
  for (size_t c = 0; c < cut->layers.size(); ++c)
    parts.push_back({{"part", c},
                     {"stage", static_cast<int>(c) % cut->pipeline_stages},
                     {"first_layer", cut->layers[c].first},
                     {"layers", cut->layers[c].second - cut->layers[c].first},
                     {"modules", cut->modules(static_cast<int>(c))}});
  s["parts"] = parts;
  const double cost = cut->original_iteration_s > 0 ? cut->snapped_iteration_s / cut->original_iteration_s - 1 : 0;
  s["snapping"] = {{"moved_layers", cut->moved_layers},
                   {"moved_tasks", cut->moved_tasks},
                   {"moved_seconds_per_microbatch", cut->moved_seconds},
                   {"plan_iteration_s", cut->original_iteration_s},
                   {"snapped_iteration_s", cut->snapped_iteration_s},
                   {"cost_fraction", cost},
                   {"how",
                    "both simulated; the snapped stages' forward and backward times scaled by their tasks' "
                    "costs.json times (boundary transfers and memory as the plan's)"}};
  s["not_expressed"] = notes;
  out.files.emplace_back("export.json", s.dump(2) + "\n");
  return out;
}

}  // namespace apart
