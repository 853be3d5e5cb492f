// plan.json → SimPlan: every field checked, every error names the field and the file.
#include "simulator/sim_plan.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "graph/error.h"
#include "graph/checked.h"
#include "graph/json_reader.h"

namespace apart::sim {

using json = nlohmann::json;

SimPlan plan_from_json(const json& j, const std::string& source) {
  const JsonReader r(source, "apart.plan/1", "docs/simulator.md");
  SimPlan plan;
  plan.source = source;
  if (!j.is_object()) r.fail("the document", "must be a JSON object");
  const std::string schema = r.string(j, "", "schema");
  if (schema != "apart.plan/1") r.fail("schema", "is \"" + schema + "\", expected \"apart.plan/1\"");

  // cluster
  const json& cj = r.object(j, "", "cluster");
  const int devices = static_cast<int>(r.integer(cj, "cluster.", "devices", 1, limits::kMaxDevices));
  const int per_node =
      static_cast<int>(r.optional_integer(cj, "cluster.", "devices_per_node", 1, limits::kMaxDevices).value_or(devices));
  const std::string device = r.optional_string(cj, "cluster.", "device").value_or("unknown");
  NamedCluster named = cluster_for_device_name(device, devices, per_node);
  plan.cluster = std::move(named.cluster);
  plan.links_source = std::move(named.links_source);
  // partition/ writes the bandwidths it planned with; prefer them so both tools see the same links.
  bool plan_bandwidths = false;
  for (auto [key, link] : {std::pair{"intra_node_bandwidth", &plan.cluster.intra_node},
                           std::pair{"inter_node_bandwidth", &plan.cluster.inter_node}}) {
    if (!cj.contains(key)) continue;
    link->bandwidth = r.positive(cj, "cluster.", key, limits::kMaxRate);
    plan_bandwidths = true;
  }
  if (plan_bandwidths) plan.links_source = "plan.json bandwidths, latencies from " + plan.links_source;

  // training
  const json& tj = r.object(j, "", "training");
  plan.training.microbatches = r.integer(tj, "training.", "microbatches", 1, limits::kMaxBatch);
  // Every micro-batch holds at least one sample.
  if (const auto batch = r.optional_integer(tj, "training.", "global_batch", 1, limits::kMaxBatch);
      batch && plan.training.microbatches > *batch)
    r.fail("training.microbatches", "is " + std::to_string(plan.training.microbatches) + ", more than training.global_batch " +
                                        std::to_string(*batch) + " (a micro-batch holds at least one sample)");
  plan.training.schedule = r.optional_string(tj, "training.", "schedule").value_or("1f1b");
  if (plan.training.schedule != "gpipe" && plan.training.schedule != "1f1b" && plan.training.schedule != "interleaved")
    r.fail("training.schedule", "is \"" + plan.training.schedule + "\", expected gpipe, 1f1b or interleaved");
  plan.training.virtual_stages = static_cast<int>(r.optional_integer(tj, "training.", "virtual_stages", 1, limits::kMaxVirtualStages).value_or(1));
  plan.training.optimizer = r.optional_string(tj, "training.", "optimizer").value_or("adam");
  plan.training.precision = r.optional_string(tj, "training.", "precision").value_or("fp32");
  const bool training_recompute = r.boolean(tj, "training.", "recompute", false);

  // stages
  const json& sj = r.array(j, "", "stages");
  if (sj.empty()) r.fail("stages", "must list at least one stage");
  if (sj.size() > static_cast<size_t>(devices))
    r.fail("stages", "lists " + std::to_string(sj.size()) + " stages for cluster.devices " + std::to_string(devices) +
                         " (every stage runs on devices of its own)");
  const int num_stages = static_cast<int>(sj.size());
  std::vector<int> owner(static_cast<size_t>(devices), -1);
  for (int s = 0; s < num_stages; ++s) {
    const std::string p = "stages[" + std::to_string(s) + "].";
    const json& st = sj[static_cast<size_t>(s)];
    if (!st.is_object()) r.fail("stages[" + std::to_string(s) + "]", "must be an object");
    SimStage stage;
    stage.id = static_cast<int>(r.optional_integer(st, p, "id", 0, limits::kMaxDevices).value_or(s));
    if (stage.id != s) r.fail(p + "id", "is " + std::to_string(stage.id) + ", expected " + std::to_string(s) + " (stages in order)");
    stage.replicas = static_cast<int>(r.integer(st, p, "replicas", 1, devices));
    const json& dj = r.array(st, p, "devices");
    if (static_cast<int>(dj.size()) != stage.replicas)
      r.fail(p + "devices", "has " + std::to_string(dj.size()) + " entries, expected replicas = " + std::to_string(stage.replicas));
    for (size_t d = 0; d < dj.size(); ++d) {
      const std::string f = p + "devices[" + std::to_string(d) + "]";
      const int dev = static_cast<int>(r.integer_at(dj[d], f, 0, limits::kMaxDevices));
      if (dev >= devices) r.fail(f, "is " + std::to_string(dev) + ", but cluster.devices is " + std::to_string(devices));
      if (owner[static_cast<size_t>(dev)] >= 0)
        r.fail(f, "device " + std::to_string(dev) + " is also used by stage " + std::to_string(owner[static_cast<size_t>(dev)]));
      owner[static_cast<size_t>(dev)] = s;
      stage.devices.push_back(dev);
    }
    stage.forward_s = r.seconds(st, p, "forward_s");
    stage.backward_s = r.seconds(st, p, "backward_s");
    if (st.contains("tasks") && st["tasks"].is_array()) stage.tasks = static_cast<int64_t>(st["tasks"].size());
    stage.recompute = r.boolean(st, p, "recompute", training_recompute);
    if (stage.recompute) {
      // partition/ writes backward_s with the recomputed forward included (partition/stage_cost.cpp).
      if (stage.backward_s + 1e-12 * stage.forward_s < stage.forward_s)
        r.fail(p + "backward_s", "is smaller than forward_s although recompute is true (backward_s must include the recomputed forward)");
      stage.backward_s = std::max(0.0, stage.backward_s - stage.forward_s);
    }
    stage.allreduce_s = r.optional_seconds(st, p, "allreduce_s").value_or(0.0);
    stage.allreduce_exposed_s = r.optional_seconds(st, p, "allreduce_exposed_s");
    if (stage.allreduce_exposed_s && *stage.allreduce_exposed_s > stage.allreduce_s * (1 + 1e-12))
      r.fail(p + "allreduce_exposed_s", "exceeds " + p + "allreduce_s (the exposed part of an all-reduce)");
    stage.memory_bytes = r.optional_integer(st, p, "memory_bytes", 0, limits::kMaxByteCount).value_or(0);
    stage.param_bytes = r.optional_integer(st, p, "param_bytes", 0, limits::kMaxByteCount);
    stage.memory_static_bytes = r.optional_bytes(st, p, "memory_static_bytes");
    stage.activation_bytes_per_microbatch = r.optional_bytes(st, p, "activation_bytes_per_microbatch");

    const json& ij = st.contains("inputs") ? r.array(st, p, "inputs") : json::array();
    for (size_t i = 0; i < ij.size(); ++i) {
      const std::string f = p + "inputs[" + std::to_string(i) + "].";
      if (!ij[i].is_object()) r.fail(f.substr(0, f.size() - 1), "must be an object");
      SimInput in;
      in.value = r.optional_string(ij[i], f, "value").value_or("");
      in.from_stage = static_cast<int>(r.integer(ij[i], f, "from_stage", -1, limits::kMaxDevices));
      if (in.from_stage >= s)
        r.fail(f + "from_stage", "is " + std::to_string(in.from_stage) + ": a stage reads only from earlier stages (or -1, a model input)");
      in.bytes = r.optional_bytes(ij[i], f, "bytes").value_or(0.0);
      stage.inputs.push_back(in);
    }
    const json& oj = st.contains("outputs") ? r.array(st, p, "outputs") : json::array();
    for (size_t o = 0; o < oj.size(); ++o) {
      const std::string f = p + "outputs[" + std::to_string(o) + "].";
      if (!oj[o].is_object()) r.fail(f.substr(0, f.size() - 1), "must be an object");
      SimOutput out;
      out.value = r.optional_string(oj[o], f, "value").value_or("");
      const json& to = oj[o].contains("to_stages") ? r.array(oj[o], f, "to_stages") : json::array();
      for (size_t t = 0; t < to.size(); ++t) {
        const std::string tf = f + "to_stages[" + std::to_string(t) + "]";
        const int target = static_cast<int>(r.integer_at(to[t], tf, 0, limits::kMaxDevices));
        if (target <= s || target >= num_stages)
          r.fail(tf, "is " + std::to_string(target) + ": must name a later stage (" + std::to_string(s + 1) + ".." +
                         std::to_string(num_stages - 1) + ")");
        out.to_stages.push_back(target);
      }
      out.bytes = r.optional_bytes(oj[o], f, "bytes").value_or(0.0);
      stage.outputs.push_back(out);
    }
    plan.stages.push_back(std::move(stage));
  }

  if (j.contains("predicted") && j["predicted"].is_object()) {
    const json& pj = j["predicted"];
    plan.predicted_iteration_s = r.optional_seconds(pj, "predicted.", "iteration_s");
    plan.predicted_bubble_fraction = r.optional_number(pj, "predicted.", "bubble_fraction", 1.0);
  }
  return plan;
}

SimPlan load_plan(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::path file = std::filesystem::is_directory(path, ec) ? path / "plan.json" : path;
  std::ifstream in(file);
  if (!in) throw SystemError("cannot read plan '" + file.string() + "' (give a plan directory written by `apart partition`, or its plan.json)");
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw InvalidModel(file.string() + ": not valid JSON (re-run `apart partition` to regenerate the plan)");
  return plan_from_json(j, file.string());
}

}  // namespace apart::sim
