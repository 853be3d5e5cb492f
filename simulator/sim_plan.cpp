// plan.json → SimPlan: every field checked, every error names the field and the file.
#include "simulator/sim_plan.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "graph/error.h"

namespace apart::sim {
namespace {

using json = nlohmann::json;

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw InvalidModel(source_ + ": " + field + " " + what +
                       " (schema apart.plan/1, docs/simulator.md; re-run `apart partition` to regenerate the plan)");
  }
  const json& member(const json& obj, const std::string& path, const char* key) const {
    if (!obj.contains(key)) fail(path + key, "is missing");
    return obj[key];
  }
  const json& object(const json& obj, const std::string& path, const char* key) const {
    const json& v = member(obj, path, key);
    if (!v.is_object()) fail(path + key, "must be an object");
    return v;
  }
  const json& array(const json& obj, const std::string& path, const char* key) const {
    const json& v = member(obj, path, key);
    if (!v.is_array()) fail(path + key, "must be an array");
    return v;
  }
  double seconds(const json& obj, const std::string& path, const char* key, std::optional<double> fallback) const {
    if (!obj.contains(key)) {
      if (fallback) return *fallback;
      fail(path + key, "is missing");
    }
    const json& v = obj[key];
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      fail(path + key, "must be a finite non-negative number");
    return v.get<double>();
  }
  int64_t integer(const json& v, const std::string& field, int64_t min) const {
    if (!v.is_number_integer() && !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()))
      fail(field, "must be an integer");
    const double d = v.get<double>();
    if (d < static_cast<double>(min) || d > 9.0e15) fail(field, "must be at least " + std::to_string(min));
    return static_cast<int64_t>(d);
  }
  int64_t integer(const json& obj, const std::string& path, const char* key, int64_t min,
                  std::optional<int64_t> fallback) const {
    if (!obj.contains(key)) {
      if (fallback) return *fallback;
      fail(path + key, "is missing");
    }
    return integer(obj[key], path + key, min);
  }
  bool boolean(const json& obj, const std::string& path, const char* key, bool fallback) const {
    if (!obj.contains(key)) return fallback;
    if (!obj[key].is_boolean()) fail(path + key, "must be true or false");
    return obj[key].get<bool>();
  }
  std::string string(const json& obj, const std::string& path, const char* key, std::optional<std::string> fallback) const {
    if (!obj.contains(key)) {
      if (fallback) return *fallback;
      fail(path + key, "is missing");
    }
    if (!obj[key].is_string()) fail(path + key, "must be a string");
    return obj[key].get<std::string>();
  }

 private:
  std::string source_;
};

}  // namespace

SimCluster cluster_links(const std::string& device, int devices, int devices_per_node) {
  SimCluster c;
  c.device = device;
  c.devices = devices;
  c.devices_per_node = devices_per_node;
  const auto names = device_preset_names();
  if (device != "cpu" && std::find(names.begin(), names.end(), device) != names.end()) {
    const Device d = device_preset(device);
    c.intra_node = d.intra_node;
    c.inter_node = d.inter_node;
    c.links_source = "profiler preset " + device;
  } else if (device == "cpu") {
    const Device d = cpu_device();
    c.intra_node = d.intra_node;
    c.inter_node = d.inter_node;
    c.links_source = "profiler cpu device (probe cache)";
  } else {
    c.intra_node = {300e9, 3e-6};
    c.inter_node = {25e9, 10e-6};
    c.links_source = "defaults for unknown device '" + device + "' (300 GB/s + 3 us in a node, 25 GB/s + 10 us between)";
  }
  return c;
}

SimPlan plan_from_json(const json& j, const std::string& source) {
  Reader r(source);
  SimPlan plan;
  plan.source = source;
  if (!j.is_object()) r.fail("the document", "must be a JSON object");
  const std::string schema = r.string(j, "", "schema", std::nullopt);
  if (schema != "apart.plan/1") r.fail("schema", "is \"" + schema + "\", expected \"apart.plan/1\"");

  // cluster
  const json& cj = r.object(j, "", "cluster");
  const int devices = static_cast<int>(r.integer(cj, "cluster.", "devices", 1, std::nullopt));
  const int per_node = static_cast<int>(r.integer(cj, "cluster.", "devices_per_node", 1, devices));
  const std::string device = r.string(cj, "cluster.", "device", std::string("unknown"));
  plan.cluster = cluster_links(device, devices, per_node);
  // partition/ writes the bandwidths it planned with; prefer them so both tools see the same links.
  bool plan_bandwidths = false;
  for (auto [key, link] : {std::pair{"intra_node_bandwidth", &plan.cluster.intra_node},
                           std::pair{"inter_node_bandwidth", &plan.cluster.inter_node}}) {
    if (!cj.contains(key)) continue;
    const double bw = r.seconds(cj, "cluster.", key, std::nullopt);
    if (bw <= 0) r.fail(std::string("cluster.") + key, "must be positive");
    link->bandwidth = bw;
    plan_bandwidths = true;
  }
  if (plan_bandwidths) plan.cluster.links_source = "plan.json bandwidths, latencies from " + plan.cluster.links_source;

  // training
  const json& tj = r.object(j, "", "training");
  plan.training.microbatches = r.integer(tj, "training.", "microbatches", 1, std::nullopt);
  plan.training.schedule = r.string(tj, "training.", "schedule", std::string("1f1b"));
  if (plan.training.schedule != "gpipe" && plan.training.schedule != "1f1b" && plan.training.schedule != "interleaved")
    r.fail("training.schedule", "is \"" + plan.training.schedule + "\", expected gpipe, 1f1b or interleaved");
  plan.training.virtual_stages = static_cast<int>(r.integer(tj, "training.", "virtual_stages", 1, 1));
  plan.training.optimizer = r.string(tj, "training.", "optimizer", std::string("adam"));
  plan.training.precision = r.string(tj, "training.", "precision", std::string("fp32"));
  const bool training_recompute = r.boolean(tj, "training.", "recompute", false);

  // stages
  const json& sj = r.array(j, "", "stages");
  if (sj.empty()) r.fail("stages", "must list at least one stage");
  const int num_stages = static_cast<int>(sj.size());
  std::vector<int> owner(static_cast<size_t>(devices), -1);
  for (int s = 0; s < num_stages; ++s) {
    const std::string p = "stages[" + std::to_string(s) + "].";
    const json& st = sj[static_cast<size_t>(s)];
    if (!st.is_object()) r.fail("stages[" + std::to_string(s) + "]", "must be an object");
    SimStage stage;
    stage.id = static_cast<int>(r.integer(st, p, "id", 0, s));
    if (stage.id != s) r.fail(p + "id", "is " + std::to_string(stage.id) + ", expected " + std::to_string(s) + " (stages in order)");
    stage.replicas = static_cast<int>(r.integer(st, p, "replicas", 1, std::nullopt));
    const json& dj = r.array(st, p, "devices");
    if (static_cast<int>(dj.size()) != stage.replicas)
      r.fail(p + "devices", "has " + std::to_string(dj.size()) + " entries, expected replicas = " + std::to_string(stage.replicas));
    for (size_t d = 0; d < dj.size(); ++d) {
      const std::string f = p + "devices[" + std::to_string(d) + "]";
      const int dev = static_cast<int>(r.integer(dj[d], f, 0));
      if (dev >= devices) r.fail(f, "is " + std::to_string(dev) + ", but cluster.devices is " + std::to_string(devices));
      if (owner[static_cast<size_t>(dev)] >= 0)
        r.fail(f, "device " + std::to_string(dev) + " is also used by stage " + std::to_string(owner[static_cast<size_t>(dev)]));
      owner[static_cast<size_t>(dev)] = s;
      stage.devices.push_back(dev);
    }
    stage.forward_s = r.seconds(st, p, "forward_s", std::nullopt);
    stage.backward_s = r.seconds(st, p, "backward_s", std::nullopt);
    stage.recompute = r.boolean(st, p, "recompute", training_recompute);
    if (stage.recompute) {
      // partition/ writes backward_s with the recomputed forward included (partition/stage_cost.cpp).
      if (stage.backward_s + 1e-12 * stage.forward_s < stage.forward_s)
        r.fail(p + "backward_s", "is smaller than forward_s although recompute is true (backward_s must include the recomputed forward)");
      stage.backward_s = std::max(0.0, stage.backward_s - stage.forward_s);
    }
    stage.allreduce_s = r.seconds(st, p, "allreduce_s", 0.0);
    if (st.contains("allreduce_exposed_s")) {
      stage.allreduce_exposed_s = r.seconds(st, p, "allreduce_exposed_s", 0.0);
      if (*stage.allreduce_exposed_s > stage.allreduce_s * (1 + 1e-12))
        r.fail(p + "allreduce_exposed_s", "exceeds " + p + "allreduce_s (the exposed part of an all-reduce)");
    }
    stage.memory_bytes = r.integer(st, p, "memory_bytes", 0, 0);
    if (st.contains("param_bytes")) stage.param_bytes = r.integer(st, p, "param_bytes", 0, std::nullopt);
    if (st.contains("memory_static_bytes")) stage.memory_static_bytes = r.seconds(st, p, "memory_static_bytes", std::nullopt);
    if (st.contains("activation_bytes_per_microbatch"))
      stage.activation_bytes_per_microbatch = r.seconds(st, p, "activation_bytes_per_microbatch", std::nullopt);

    const json& ij = st.contains("inputs") ? r.array(st, p, "inputs") : json::array();
    for (size_t i = 0; i < ij.size(); ++i) {
      const std::string f = p + "inputs[" + std::to_string(i) + "].";
      if (!ij[i].is_object()) r.fail(f.substr(0, f.size() - 1), "must be an object");
      SimInput in;
      in.value = r.string(ij[i], f, "value", std::string());
      in.from_stage = static_cast<int>(r.integer(ij[i], f, "from_stage", -1, std::nullopt));
      if (in.from_stage >= s)
        r.fail(f + "from_stage", "is " + std::to_string(in.from_stage) + ": a stage reads only from earlier stages (or -1, a model input)");
      in.bytes = r.seconds(ij[i], f, "bytes", 0.0);
      stage.inputs.push_back(in);
    }
    const json& oj = st.contains("outputs") ? r.array(st, p, "outputs") : json::array();
    for (size_t o = 0; o < oj.size(); ++o) {
      const std::string f = p + "outputs[" + std::to_string(o) + "].";
      if (!oj[o].is_object()) r.fail(f.substr(0, f.size() - 1), "must be an object");
      SimOutput out;
      out.value = r.string(oj[o], f, "value", std::string());
      const json& to = oj[o].contains("to_stages") ? r.array(oj[o], f, "to_stages") : json::array();
      for (size_t t = 0; t < to.size(); ++t) {
        const std::string tf = f + "to_stages[" + std::to_string(t) + "]";
        const int target = static_cast<int>(r.integer(to[t], tf, 0));
        if (target <= s || target >= num_stages)
          r.fail(tf, "is " + std::to_string(target) + ": must name a later stage (" + std::to_string(s + 1) + ".." +
                         std::to_string(num_stages - 1) + ")");
        out.to_stages.push_back(target);
      }
      out.bytes = r.seconds(oj[o], f, "bytes", 0.0);
      stage.outputs.push_back(out);
    }
    plan.stages.push_back(std::move(stage));
  }

  if (j.contains("predicted") && j["predicted"].is_object()) {
    const json& pj = j["predicted"];
    if (pj.contains("iteration_s")) plan.predicted_iteration_s = r.seconds(pj, "predicted.", "iteration_s", std::nullopt);
    if (pj.contains("bubble_fraction"))
      plan.predicted_bubble_fraction = r.seconds(pj, "predicted.", "bubble_fraction", std::nullopt);
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

const Link& SimCluster::link_between_groups(const std::vector<int>& a, const std::vector<int>& b) const {
  if (a.empty() || b.empty()) return inter_node;
  const size_t pairs = std::max(a.size(), b.size());
  for (size_t i = 0; i < pairs; ++i)
    if (!same_node(a[i % a.size()], b[i % b.size()])) return inter_node;
  return intra_node;
}

}  // namespace apart::sim
