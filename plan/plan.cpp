// PlanDocument ↔ plan.json: the one writer (the field order `apart partition` has always written) and the one
// reader (every field checked, every error naming the file and the field).
#include "plan/plan.h"
#include "plan/plan_file.h"

#include <algorithm>
#include <fstream>
#include <iterator>

#include "graph/checked.h"
#include "graph/error.h"
#include "graph/json_reader.h"
#include "plan/plan_summary.h"

namespace apart {

using ordered = nlohmann::ordered_json;
using json = nlohmann::json;

namespace {

template <typename T>
void put(ordered& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}

ordered cluster_json(const PlanCluster& c) {
  ordered j;
  j["devices"] = c.devices;
  put(j, "device", c.device);
  put(j, "devices_per_node", c.devices_per_node);
  put(j, "memory_bytes", c.memory_bytes);
  put(j, "device_memory_bytes", c.device_memory_bytes);
  put(j, "memory_reserve_bytes", c.memory_reserve_bytes);
  put(j, "memory_reserve", c.memory_reserve);
  put(j, "intra_node_bandwidth", c.intra_node_bandwidth);
  put(j, "inter_node_bandwidth", c.inter_node_bandwidth);
  put(j, "layout", c.layout);
  return j;
}

ordered training_json(const PlanTraining& t) {
  ordered j;
  put(j, "global_batch", t.global_batch);
  j["microbatches"] = t.microbatches;
  put(j, "microbatch_size", t.microbatch_size);
  j["schedule"] = schedule_name(t.schedule);
  put(j, "virtual_stages", t.virtual_stages);
  j["optimizer"] = optimizer_name(t.optimizer);
  j["precision"] = precision_name(t.precision);
  if (t.attention != AttentionKernel::kFused) j["attention"] = attention_kernel_name(t.attention);  // absent = flash
  j["recompute"] = t.recompute;
  put(j, "overlap_allreduce", t.overlap_allreduce);
  return j;
}

ordered options_json(const PlanOptions& o) {
  ordered j;
  j["method"] = o.method;
  j["stages"] = o.stages;
  j["replicas"] = o.replicas ? ordered(*o.replicas) : ordered("auto");
  j["microbatches"] = o.microbatches;
  j["schedule"] = schedule_name(o.schedule);
  j["recompute"] = o.recompute;
  j["blocks"] = o.blocks ? ordered(*o.blocks) : ordered("auto");
  j["balance_cap"] = o.balance_cap;
  j["time_limit_s"] = o.time_limit_s;
  put(j, "zero", o.zero);
  put(j, "tp", o.tp);
  return j;
}

void put_boundaries(ordered& j, const std::vector<PlanInput>& ins, const std::vector<PlanOutput>& outs) {
  ordered inputs = ordered::array();
  // Whole bytes in the file; a transfer is far below 2^53 bytes, so the cast is exact.
  for (const PlanInput& in : ins)
    inputs.push_back({{"value", in.value}, {"from_stage", in.from_stage}, {"bytes", static_cast<int64_t>(in.bytes)}});
  j["inputs"] = inputs;
  ordered outputs = ordered::array();
  for (const PlanOutput& out : outs)
    outputs.push_back({{"value", out.value}, {"to_stages", out.to_stages}, {"bytes", static_cast<int64_t>(out.bytes)}});
  j["outputs"] = outputs;
}

ordered stage_json(const PlanStageRecord& s) {
  ordered j;
  j["id"] = s.id;
  j["replicas"] = s.replicas;
  if (s.tp > 1) j["tp"] = s.tp;  // absent = 1: plans without tensor parallelism read and write as before
  j["devices"] = s.devices;
  j["tasks"] = s.tasks;
  put(j, "batch_tasks", s.batch_tasks);
  put(j, "microbatch_size", s.microbatch_size);
  j["forward_s"] = s.forward_s;
  j["backward_s"] = s.backward_s;
  put(j, "backward_weight_s", s.backward_weight_s);
  j["recompute"] = s.recompute;
  // Absent: full recomputation (and recompute_forward_s = forward_s), as plans before selective recomputation read.
  if (s.recompute && s.recompute_scope == RecomputeScope::kSelective)
    j["recompute_scope"] = std::string(recompute_scope_name(s.recompute_scope));
  put(j, "recompute_forward_s", s.recompute_forward_s);
  if (s.sequence_parallel) j["sequence_parallel"] = true;  // absent = false
  if (s.zero > 0) j["zero"] = s.zero;  // absent = 0: plans without ZeRO read and write as before
  put(j, "comm_s", s.comm_s);
  put(j, "allreduce_s", s.allreduce_s);
  put(j, "allreduce_exposed_s", s.allreduce_exposed_s);
  put(j, "step_s", s.step_s);
  put(j, "optimizer_s", s.optimizer_s);
  put(j, "param_bytes", s.param_bytes);
  put(j, "memory_bytes", s.memory_bytes);
  put(j, "memory_static_bytes", s.memory_static_bytes);
  put(j, "activation_bytes_per_microbatch", s.activation_bytes_per_microbatch);
  put_boundaries(j, s.inputs, s.outputs);
  return j;
}

ordered virtual_stage_json(const PlanVirtualStage& c) {
  ordered j;
  j["id"] = c.id;
  j["stage"] = c.stage;
  j["tasks"] = c.tasks;
  put_boundaries(j, c.inputs, c.outputs);
  return j;
}

ordered predicted_json(const PlanPrediction& p) {
  ordered j = ordered::object();
  put(j, "iteration_s", p.iteration_s);
  put(j, "bottleneck_stage", p.bottleneck_stage);
  put(j, "bubble_fraction", p.bubble_fraction);
  put(j, "samples_per_s", p.samples_per_s);
  put(j, "peak_memory_bytes", p.peak_memory_bytes);
  put(j, "pipeline_s", p.pipeline_s);
  put(j, "compute_lower_bound_s", p.compute_lower_bound_s);
  put(j, "source", p.source);
  put(j, "estimate_iteration_s", p.estimate_iteration_s);
  put(j, "mfu", p.mfu);
  put(j, "mfu_flops", p.mfu_flops);
  put(j, "tokens_per_s", p.tokens_per_s);
  put(j, "tflops_per_device", p.tflops_per_device);
  return j;
}

ordered search_json(const PlanSearch& s) {
  return {{"seconds", s.seconds},
          {"atomic_components", s.atomic_components},
          {"blocks", s.blocks},
          {"coarsening_levels", s.coarsening_levels},
          {"refinement_moves", s.refinement_moves},
          {"candidates", s.candidates},
          {"candidates_placed", s.candidates_placed},
          {"simulated", s.simulated},
          {"pruned_by_bound", s.pruned_by_bound},
          {"not_simulated", s.not_simulated},
          {"chosen_split", s.chosen_split},
          {"stopped_by_time_limit", s.stopped_by_time_limit}};
}

ordered tensor_parallel_json(const PlanTensorParallel& tp) {
  ordered regions = ordered::array();
  for (const PlanTpRegion& r : tp.regions) {
    ordered region = {{"kind", tp_region_kind_name(r.kind)},
                      {"name", r.name},
                      {"tasks", r.tasks},
                      {"degrees", r.degrees},
                      {"bounded_by", r.bounded_by},
                      {"end_value", r.end_value},
                      {"end_bytes_per_sample", r.end_bytes_per_sample}};
    if (r.has_shard_layout()) {
      region["column_tasks"] = r.column_tasks;
      region["row_tasks"] = r.row_tasks;
      region["inputs"] = r.inputs;
      region["sliced_inputs"] = r.sliced_inputs;
      ordered split = ordered::array();
      for (const PlanTpRegion::SplitValue& v : r.split_values) split.push_back({{"value", v.value}, {"axis", v.axis}});
      region["split_values"] = split;
    }
    regions.push_back(std::move(region));
  }
  return {{"summary", tp.summary}, {"regions", regions}};
}

}  // namespace

std::string recompute_summary(const PlanDocument& plan) {
  size_t n = 0, selective = 0;
  for (const PlanStageRecord& s : plan.stages) {
    n += s.recompute ? 1 : 0;
    selective += s.recompute && s.recompute_scope == RecomputeScope::kSelective ? 1 : 0;
  }
  if (n == 0) return "off";
  if (n == plan.stages.size() && selective == 0) return "on";
  if (selective == plan.stages.size()) return "selective";
  return std::to_string(n) + " of " + std::to_string(plan.stages.size()) + " stages" +
         (selective > 0 ? " (" + std::to_string(selective) + " selective)" : "");
}

ordered plan_to_json(const PlanDocument& plan) {
  ordered j;
  j["schema"] = kPlanSchema;
  if (plan.model)
    j["model"] = {{"path", plan.model->path}, {"sha256", plan.model->sha256}, {"tasks", plan.model->tasks},
                  {"params", plan.model->params}, {"param_bytes", plan.model->param_bytes}};
  if (plan.model && plan.model->relative_path) {  // beside path, before sha256
    ordered m = {{"path", plan.model->path}, {"relative_path", *plan.model->relative_path}};
    if (plan.model->absolute_path) m["absolute_path"] = *plan.model->absolute_path;
    for (auto it = std::next(j["model"].begin()); it != j["model"].end(); ++it) m[it.key()] = it.value();
    j["model"] = m;
  }
  if (plan.model && plan.model->constants_as_params) j["model"]["constants_as_params"] = *plan.model->constants_as_params;
  if (plan.model && plan.model->added_loss)
    j["model"]["added_loss"] = {{"form", plan.model->added_loss->form}, {"labels", plan.model->added_loss->labels}};
  if (plan.model && !plan.model->dims.empty()) j["model"]["dims"] = plan.model->dims;
  if (plan.model && plan.model->tokens_per_sample) j["model"]["tokens_per_sample"] = *plan.model->tokens_per_sample;
  if (plan.model && plan.model->flops_per_sample) j["model"]["flops_per_sample"] = *plan.model->flops_per_sample;
  j["cluster"] = cluster_json(plan.cluster);
  j["training"] = training_json(plan.training);
  if (plan.options) j["options"] = options_json(*plan.options);
  ordered stages = ordered::array();
  for (const PlanStageRecord& s : plan.stages) stages.push_back(stage_json(s));
  j["stages"] = stages;
  if (!plan.virtual_stages.empty()) {  // interleaved plans only: every other plan keeps its bytes
    ordered chunks = ordered::array();
    for (const PlanVirtualStage& c : plan.virtual_stages) chunks.push_back(virtual_stage_json(c));
    j["virtual_stages"] = chunks;
  }
  // Derived from the stages (never read back), for readers who think in Megatron-LM's degrees.
  if (!plan.stages.empty()) j["layout"] = layout_json(plan_layout(plan));
  if (plan.predicted) j["predicted"] = predicted_json(*plan.predicted);
  if (plan.search) j["search"] = search_json(*plan.search);
  if (plan.tensor_parallel) j["tensor_parallel"] = tensor_parallel_json(*plan.tensor_parallel);
  if (plan.target)
    j["target"] = {{"engine", plan.target->engine},
                   {"unrestricted_iteration_s", plan.target->unrestricted_iteration_s},
                   {"unrestricted_layout", plan.target->unrestricted_layout}};
  return j;
}

namespace {

// Two readers of one file: `strict` for what the simulator replays (a null there is a malformed plan), `lenient`
// for the figures only shown (partition writes a figure it could not compute as null: it reads as absent).
struct Readers {
  JsonReader strict;
  JsonReader lenient;
  explicit Readers(const std::string& source)
      : strict(source, kPlanSchema, "docs/plan.md"), lenient(source, kPlanSchema, "docs/plan.md", JsonReader::Null::kAbsent) {}
};

// A vocabulary name read from the file: InvalidModel naming the field and listing the accepted names.
template <typename Enum, typename Parse>
Enum read_name(const JsonReader& r, const json& obj, const std::string& path, const char* key, Enum fallback,
               Parse parse, std::string (*accepted)()) {
  const std::optional<std::string> text = r.optional_string(obj, path, key);
  if (!text) return fallback;
  try {
    return parse(*text);
  } catch (const InvalidArgument&) {
    r.fail(path + key, "is \"" + *text + "\", expected " + accepted());
  }
}

std::optional<int64_t> integer_or_auto(const JsonReader& r, const json& obj, const std::string& path, const char* key) {
  if (obj.contains(key) && obj[key].is_string() && obj[key].get<std::string>() == "auto") return std::nullopt;
  return r.optional_integer(obj, path, key, 0, limits::kMaxBatch);
}

void read_cluster(const Readers& rs, const json& j, PlanCluster& c) {
  const JsonReader& r = rs.strict;
  const JsonReader& l = rs.lenient;
  const json& cj = r.object(j, "", "cluster");
  const std::string p = "cluster.";
  c.devices = static_cast<int>(r.integer(cj, p, "devices", 1, limits::kMaxDevices));
  c.device = r.optional_string(cj, p, "device");
  if (auto n = r.optional_integer(cj, p, "devices_per_node", 1, limits::kMaxDevices)) c.devices_per_node = static_cast<int>(*n);
  c.memory_bytes = l.optional_integer(cj, p, "memory_bytes", 0, limits::kMaxByteCount);
  c.device_memory_bytes = l.optional_integer(cj, p, "device_memory_bytes", 0, limits::kMaxByteCount);
  c.memory_reserve_bytes = l.optional_integer(cj, p, "memory_reserve_bytes", 0, limits::kMaxByteCount);
  c.memory_reserve = l.optional_string(cj, p, "memory_reserve");
  if (cj.contains("intra_node_bandwidth")) c.intra_node_bandwidth = r.positive(cj, p, "intra_node_bandwidth", limits::kMaxRate);
  if (cj.contains("inter_node_bandwidth")) c.inter_node_bandwidth = r.positive(cj, p, "inter_node_bandwidth", limits::kMaxRate);
  c.layout = l.optional_string(cj, p, "layout");
}

void read_training(const Readers& rs, const json& j, PlanTraining& t) {
  const JsonReader& r = rs.strict;
  const json& tj = r.object(j, "", "training");
  const std::string p = "training.";
  t.microbatches = r.integer(tj, p, "microbatches", 1, limits::kMaxBatch);
  // Every micro-batch holds at least one sample.
  t.global_batch = r.optional_integer(tj, p, "global_batch", 1, limits::kMaxBatch);
  if (t.global_batch && t.microbatches > *t.global_batch)
    r.fail("training.microbatches", "is " + std::to_string(t.microbatches) + ", more than training.global_batch " +
                                        std::to_string(*t.global_batch) + " (a micro-batch holds at least one sample)");
  t.microbatch_size = rs.lenient.optional_integer(tj, p, "microbatch_size", 0, limits::kMaxBatch);
  t.schedule = read_name(r, tj, p, "schedule", Schedule::k1F1B, parse_schedule, schedule_names);
  if (auto v = r.optional_integer(tj, p, "virtual_stages", 1, limits::kMaxVirtualStages)) t.virtual_stages = static_cast<int>(*v);
  t.optimizer = read_name(r, tj, p, "optimizer", Optimizer::kAdam, parse_optimizer, optimizer_names);
  t.precision = read_name(r, tj, p, "precision", Precision::kFp32, parse_precision, precision_names);
  t.attention =
      read_name(r, tj, p, "attention", AttentionKernel::kFused, parse_attention_kernel, attention_kernel_names);
  t.recompute = r.boolean(tj, p, "recompute", false);
  if (tj.contains("overlap_allreduce")) t.overlap_allreduce = r.boolean(tj, p, "overlap_allreduce", true);
}

void read_options(const Readers& rs, const json& j, PlanDocument& plan) {
  if (!j.contains("options") || !j["options"].is_object()) return;
  const JsonReader& l = rs.lenient;
  const json& oj = j["options"];
  const std::string p = "options.";
  PlanOptions o;
  o.method = l.optional_string(oj, p, "method").value_or("");
  o.stages = l.optional_integer(oj, p, "stages", 0, limits::kMaxDevices).value_or(0);
  o.replicas = integer_or_auto(l, oj, p, "replicas");
  o.microbatches = l.optional_integer(oj, p, "microbatches", 0, limits::kMaxBatch).value_or(0);
  o.schedule = read_name(l, oj, p, "schedule", plan.training.schedule, parse_schedule, schedule_names);
  o.recompute = l.optional_string(oj, p, "recompute").value_or("");
  o.blocks = integer_or_auto(l, oj, p, "blocks");
  o.balance_cap = l.optional_number(oj, p, "balance_cap", 1e6).value_or(0);
  o.time_limit_s = l.optional_seconds(oj, p, "time_limit_s").value_or(0);
  o.zero = l.optional_string(oj, p, "zero");
  o.tp = l.optional_string(oj, p, "tp");
  plan.options = o;
}

// A stage's (or chunk's) task names.
std::vector<std::string> read_task_names(const JsonReader& r, const json& st, const std::string& p) {
  std::vector<std::string> names;
  const json& tasks = r.array(st, p, "tasks");
  for (size_t k = 0; k < tasks.size(); ++k) {
    if (!tasks[k].is_string()) r.fail(p + "tasks[" + std::to_string(k) + "]", "must be a string");
    names.push_back(tasks[k].get<std::string>());
  }
  return names;
}

// A stage's (or chunk's) inputs, from earlier ones or -1, and outputs, to later ones among `count`.
void read_boundaries(const JsonReader& r, const json& st, const std::string& p, int s, int count,
                     std::vector<PlanInput>& inputs, std::vector<PlanOutput>& outputs) {
  const json& ij = st.contains("inputs") ? r.array(st, p, "inputs") : json::array();
  for (size_t i = 0; i < ij.size(); ++i) {
    const std::string f = p + "inputs[" + std::to_string(i) + "].";
    if (!ij[i].is_object()) r.fail(f.substr(0, f.size() - 1), "must be an object");
    PlanInput in;
    in.value = r.optional_string(ij[i], f, "value").value_or("");
    in.from_stage = static_cast<int>(r.integer(ij[i], f, "from_stage", -1, limits::kMaxDevices));
    if (in.from_stage >= s)
      r.fail(f + "from_stage", "is " + std::to_string(in.from_stage) + ": a stage reads only from earlier stages (or -1, a model input)");
    in.bytes = r.optional_bytes(ij[i], f, "bytes").value_or(0.0);
    inputs.push_back(in);
  }
  const json& oj = st.contains("outputs") ? r.array(st, p, "outputs") : json::array();
  for (size_t o = 0; o < oj.size(); ++o) {
    const std::string f = p + "outputs[" + std::to_string(o) + "].";
    if (!oj[o].is_object()) r.fail(f.substr(0, f.size() - 1), "must be an object");
    PlanOutput out;
    out.value = r.optional_string(oj[o], f, "value").value_or("");
    const json& to = oj[o].contains("to_stages") ? r.array(oj[o], f, "to_stages") : json::array();
    for (size_t t = 0; t < to.size(); ++t) {
      const std::string tf = f + "to_stages[" + std::to_string(t) + "]";
      const int target = static_cast<int>(r.integer_at(to[t], tf, 0, limits::kMaxDevices));
      if (target <= s || target >= count)
        r.fail(tf, "is " + std::to_string(target) + ": must name a later stage (" + std::to_string(s + 1) + ".." +
                       std::to_string(count - 1) + ")");
      out.to_stages.push_back(target);
    }
    out.bytes = r.optional_bytes(oj[o], f, "bytes").value_or(0.0);
    outputs.push_back(out);
  }
}

void read_stages(const Readers& rs, const json& j, PlanDocument& plan) {
  const JsonReader& r = rs.strict;
  const JsonReader& l = rs.lenient;
  const int devices = plan.cluster.devices;
  const json& sj = r.array(j, "", "stages");
  if (sj.empty()) r.fail("stages", "must hold at least one stage");
  if (sj.size() > static_cast<size_t>(devices))
    r.fail("stages", "lists " + std::to_string(sj.size()) + " stages for cluster.devices " + std::to_string(devices) +
                         " (every stage runs on devices of its own)");
  const int num_stages = static_cast<int>(sj.size());
  std::vector<int> owner(static_cast<size_t>(devices), -1);
  for (int s = 0; s < num_stages; ++s) {
    const std::string p = "stages[" + std::to_string(s) + "].";
    const json& st = sj[static_cast<size_t>(s)];
    if (!st.is_object()) r.fail("stages[" + std::to_string(s) + "]", "must be an object");
    PlanStageRecord stage;
    stage.id = static_cast<int>(r.optional_integer(st, p, "id", 0, limits::kMaxDevices).value_or(s));
    if (stage.id != s) r.fail(p + "id", "is " + std::to_string(stage.id) + ", expected " + std::to_string(s) + " (stages in order)");
    stage.replicas = static_cast<int>(r.integer(st, p, "replicas", 1, devices));
    stage.tp = static_cast<int>(r.optional_integer(st, p, "tp", 1, kMaxTpDegree).value_or(1));
    if (tp_degree_index(stage.tp) < 0)
      r.fail(p + "tp", "is " + std::to_string(stage.tp) + ", expected 1, 2, 4 or 8 (the tensor-parallel degree)");
    const json& dj = r.array(st, p, "devices");
    if (static_cast<int64_t>(dj.size()) != int64_t{stage.replicas} * stage.tp)
      r.fail(p + "devices", "has " + std::to_string(dj.size()) + " entries, expected replicas × tp = " +
                                std::to_string(stage.replicas) + " × " + std::to_string(stage.tp));
    for (size_t d = 0; d < dj.size(); ++d) {
      const std::string f = p + "devices[" + std::to_string(d) + "]";
      const int dev = static_cast<int>(r.integer_at(dj[d], f, 0, limits::kMaxDevices));
      if (dev >= devices) r.fail(f, "is " + std::to_string(dev) + ", but cluster.devices is " + std::to_string(devices));
      if (owner[static_cast<size_t>(dev)] >= 0)
        r.fail(f, "device " + std::to_string(dev) + " is also used by stage " + std::to_string(owner[static_cast<size_t>(dev)]));
      owner[static_cast<size_t>(dev)] = s;
      stage.devices.push_back(dev);
    }
    // A tensor-parallel group (replica j: devices[j·tp, (j+1)·tp)) is devices of one node.
    const int per_node = plan.cluster.devices_per_node.value_or(devices);
    for (size_t g = 0; stage.tp > 1 && g < stage.devices.size(); g += static_cast<size_t>(stage.tp))
      for (size_t d = g + 1; d < g + static_cast<size_t>(stage.tp); ++d)
        if (stage.devices[d] / per_node != stage.devices[g] / per_node)
          r.fail(p + "devices[" + std::to_string(d) + "]",
                 "is device " + std::to_string(stage.devices[d]) + ", in another node (of " + std::to_string(per_node) +
                     " devices) than device " + std::to_string(stage.devices[g]) + " of the same tensor-parallel group; "
                     "a group's tp devices must share a node");
    if (st.contains("tasks")) stage.tasks = read_task_names(r, st, p);
    stage.batch_tasks = l.optional_integer(st, p, "batch_tasks", 0);
    stage.microbatch_size = l.optional_integer(st, p, "microbatch_size", 0, limits::kMaxBatch);
    stage.forward_s = r.seconds(st, p, "forward_s");
    stage.backward_s = r.seconds(st, p, "backward_s");
    stage.recompute = r.boolean(st, p, "recompute", plan.training.recompute);
    stage.recompute_scope = stage.recompute ? RecomputeScope::kFull : RecomputeScope::kNone;
    if (const std::optional<std::string> scope = r.optional_string(st, p, "recompute_scope")) {
      try {
        stage.recompute_scope = parse_recompute_scope(*scope);
      } catch (const InvalidArgument&) {
        r.fail(p + "recompute_scope", "is \"" + *scope + "\", expected " + "none, selective or full");
      }
      if ((stage.recompute_scope != RecomputeScope::kNone) != stage.recompute)
        r.fail(p + "recompute_scope", "is " + *scope + " but recompute is " + (stage.recompute ? "true" : "false"));
    }
    stage.recompute_forward_s = r.optional_seconds(st, p, "recompute_forward_s");
    if (stage.recompute_forward_s && !stage.recompute && *stage.recompute_forward_s > 0)
      r.fail(p + "recompute_forward_s", "is positive on a stage that does not recompute");
    // partition/ writes backward_s with the recomputed forward included (partition/stage_cost.cpp).
    const double recomputed = stage.recompute ? stage.recompute_forward_s.value_or(stage.forward_s) : 0.0;
    if (stage.recompute && stage.backward_s + 1e-12 * recomputed < recomputed)
      r.fail(p + "backward_s", "is smaller than the recomputed forward (" +
                                   std::string(stage.recompute_forward_s ? "recompute_forward_s" : "forward_s") +
                                   ") although recompute is true (backward_s must include it)");
    stage.backward_weight_s = r.optional_seconds(st, p, "backward_weight_s");
    if (stage.backward_weight_s && *stage.backward_weight_s > (stage.backward_s - recomputed) * (1 + 1e-12))
      r.fail(p + "backward_weight_s", "exceeds the backward it is part of (backward_s, less the recomputed forward)");
    stage.sequence_parallel = r.boolean(st, p, "sequence_parallel", false);
    if (stage.sequence_parallel && stage.tp == 1)
      r.fail(p + "sequence_parallel", "is true on a stage with tp 1: sequence parallelism shards across a "
                                      "tensor-parallel group (write false, or give the stage tp > 1)");
    stage.zero = static_cast<int>(r.optional_integer(st, p, "zero", 0, kMaxZeroStage).value_or(0));
    if (stage.zero > 0 && stage.replicas == 1)
      r.fail(p + "zero", "is " + std::to_string(stage.zero) +
                             " on a stage with one replica: ZeRO shards across a stage's data-parallel replicas, and "
                             "one replica has nothing to shard with (write 0, or give the stage replicas)");
    stage.comm_s = l.optional_seconds(st, p, "comm_s");
    stage.allreduce_s = r.optional_seconds(st, p, "allreduce_s");
    stage.allreduce_exposed_s = r.optional_seconds(st, p, "allreduce_exposed_s");
    if (stage.allreduce_exposed_s && *stage.allreduce_exposed_s > stage.allreduce_s.value_or(0) * (1 + 1e-12))
      r.fail(p + "allreduce_exposed_s", "exceeds " + p + "allreduce_s (the exposed part of an all-reduce)");
    stage.step_s = l.optional_seconds(st, p, "step_s");
    stage.optimizer_s = r.optional_seconds(st, p, "optimizer_s");
    stage.param_bytes = r.optional_integer(st, p, "param_bytes", 0, limits::kMaxByteCount);
    stage.memory_bytes = r.optional_integer(st, p, "memory_bytes", 0, limits::kMaxByteCount);
    stage.memory_static_bytes = r.optional_bytes(st, p, "memory_static_bytes");
    stage.activation_bytes_per_microbatch = r.optional_bytes(st, p, "activation_bytes_per_microbatch");

    read_boundaries(r, st, p, s, num_stages, stage.inputs, stage.outputs);
    plan.stages.push_back(std::move(stage));
  }
}

// Interleaved plans: the P·v chunks in pipeline order, chunk c on stage c mod P; absent under other schedules.
void read_virtual_stages(const Readers& rs, const json& j, PlanDocument& plan) {
  if (!j.contains("virtual_stages")) return;
  const JsonReader& r = rs.strict;
  const json& vj = r.array(j, "", "virtual_stages");
  if (plan.training.schedule != Schedule::kInterleaved)
    r.fail("virtual_stages", "is listed, but training.schedule is not interleaved");
  const int stages = static_cast<int>(plan.stages.size());
  const int chunks = stages * plan.training.virtual_stages.value_or(kDefaultVirtualStages);
  if (static_cast<int>(vj.size()) != chunks)
    r.fail("virtual_stages", "lists " + std::to_string(vj.size()) + " chunks, expected " + std::to_string(chunks) +
                                 " (stages × training.virtual_stages)");
  for (int c = 0; c < chunks; ++c) {
    const std::string p = "virtual_stages[" + std::to_string(c) + "].";
    const json& cj = vj[static_cast<size_t>(c)];
    if (!cj.is_object()) r.fail("virtual_stages[" + std::to_string(c) + "]", "must be an object");
    PlanVirtualStage chunk;
    chunk.id = static_cast<int>(r.integer(cj, p, "id", 0, chunks - 1));
    if (chunk.id != c) r.fail(p + "id", "is " + std::to_string(chunk.id) + ", expected " + std::to_string(c) + " (chunks in order)");
    chunk.stage = static_cast<int>(r.integer(cj, p, "stage", 0, stages - 1));
    if (chunk.stage != c % stages)
      r.fail(p + "stage", "is " + std::to_string(chunk.stage) + ", expected " + std::to_string(c % stages) +
                              " (chunk c runs on stage c mod " + std::to_string(stages) + ")");
    chunk.tasks = read_task_names(r, cj, p);
    if (chunk.tasks.empty()) r.fail(p + "tasks", "is empty: every chunk holds tasks");
    read_boundaries(r, cj, p, c, chunks, chunk.inputs, chunk.outputs);
    plan.virtual_stages.push_back(std::move(chunk));
  }
}

void read_predicted(const Readers& rs, const json& j, PlanDocument& plan) {
  if (!j.contains("predicted")) return;
  const JsonReader& r = rs.strict;
  const JsonReader& l = rs.lenient;
  const json& pj = l.object(j, "", "predicted");
  const std::string p = "predicted.";
  PlanPrediction pr;
  pr.iteration_s = r.optional_seconds(pj, p, "iteration_s");
  if (auto b = l.optional_integer(pj, p, "bottleneck_stage", 0, limits::kMaxDevices)) pr.bottleneck_stage = static_cast<int>(*b);
  pr.bubble_fraction = r.optional_number(pj, p, "bubble_fraction", 1.0);
  pr.samples_per_s = l.optional_number(pj, p, "samples_per_s", limits::kMaxRate);
  pr.peak_memory_bytes = l.optional_integer(pj, p, "peak_memory_bytes", 0, limits::kMaxByteCount);
  pr.pipeline_s = l.optional_seconds(pj, p, "pipeline_s");
  pr.compute_lower_bound_s = l.optional_seconds(pj, p, "compute_lower_bound_s");
  pr.source = l.optional_string(pj, p, "source");
  pr.estimate_iteration_s = l.optional_seconds(pj, p, "estimate_iteration_s");
  pr.mfu = l.optional_number(pj, p, "mfu", limits::kMaxRate);
  pr.mfu_flops = l.optional_string(pj, p, "mfu_flops");
  pr.tokens_per_s = l.optional_number(pj, p, "tokens_per_s", limits::kMaxRate);
  pr.tflops_per_device = l.optional_number(pj, p, "tflops_per_device", limits::kMaxRate);
  plan.predicted = pr;
}

void read_search(const Readers& rs, const json& j, PlanDocument& plan) {
  if (!j.contains("search") || !j["search"].is_object()) return;
  const JsonReader& l = rs.lenient;
  const json& sj = j["search"];
  const std::string p = "search.";
  auto count = [&](const char* key) { return l.optional_integer(sj, p, key, 0).value_or(0); };
  PlanSearch s;
  s.seconds = l.optional_seconds(sj, p, "seconds").value_or(0);
  s.atomic_components = count("atomic_components");
  s.blocks = count("blocks");
  s.coarsening_levels = count("coarsening_levels");
  s.refinement_moves = count("refinement_moves");
  s.candidates = count("candidates");
  s.candidates_placed = count("candidates_placed");
  s.simulated = count("simulated");
  s.pruned_by_bound = count("pruned_by_bound");
  s.not_simulated = count("not_simulated");
  s.chosen_split = l.optional_string(sj, p, "chosen_split").value_or("");
  s.stopped_by_time_limit = l.boolean(sj, p, "stopped_by_time_limit", false);
  plan.search = s;
}

// Optional (plans before it lack it); what is there is checked: a known kind, degrees among kTpDegrees.
void read_tensor_parallel(const Readers& rs, const json& j, PlanDocument& plan) {
  if (!j.contains("tensor_parallel")) return;
  const JsonReader& r = rs.strict;
  const json& tj = r.object(j, "", "tensor_parallel");
  PlanTensorParallel tp;
  tp.summary = r.optional_string(tj, "tensor_parallel.", "summary").value_or("");
  const json& regions = tj.contains("regions") ? r.array(tj, "tensor_parallel.", "regions") : json::array();
  for (size_t i = 0; i < regions.size(); ++i) {
    const std::string p = "tensor_parallel.regions[" + std::to_string(i) + "].";
    const json& rj = regions[i];
    if (!rj.is_object()) r.fail(p.substr(0, p.size() - 1), "must be an object");
    PlanTpRegion region;
    region.kind = read_name(r, rj, p, "kind", TpRegionKind::kMlp, parse_tp_region_kind, tp_region_kind_names);
    region.name = r.string(rj, p, "name");
    region.tasks = r.integer(rj, p, "tasks", 1);
    const json& dj = r.array(rj, p, "degrees");
    for (size_t d = 0; d < dj.size(); ++d) {
      const std::string f = p + "degrees[" + std::to_string(d) + "]";
      const int degree = static_cast<int>(r.integer_at(dj[d], f, 1, kMaxTpDegree));
      if (tp_degree_index(degree) < 0) {
        std::string accepted;
        for (int t : kTpDegrees) accepted += (accepted.empty() ? "" : ", ") + std::to_string(t);
        r.fail(f, "is " + std::to_string(degree) + ", expected one of " + accepted);
      }
      region.degrees.push_back(degree);
    }
    region.bounded_by = r.optional_string(rj, p, "bounded_by").value_or("");
    region.end_value = r.optional_string(rj, p, "end_value").value_or("");
    region.end_bytes_per_sample = r.optional_bytes(rj, p, "end_bytes_per_sample").value_or(0.0);
    auto names = [&](const char* key, std::vector<std::string>& into) {
      if (!rj.contains(key)) return;
      const json& aj = r.array(rj, p, key);
      for (size_t k = 0; k < aj.size(); ++k) {
        if (!aj[k].is_string()) r.fail(p + key + "[" + std::to_string(k) + "]", "must be a string");
        into.push_back(aj[k].get<std::string>());
      }
    };
    names("column_tasks", region.column_tasks);
    names("row_tasks", region.row_tasks);
    names("inputs", region.inputs);
    names("sliced_inputs", region.sliced_inputs);
    if (rj.contains("split_values")) {
      const json& sj = r.array(rj, p, "split_values");
      for (size_t k = 0; k < sj.size(); ++k) {
        const std::string f = p + "split_values[" + std::to_string(k) + "].";
        if (!sj[k].is_object()) r.fail(f.substr(0, f.size() - 1), "must be an object");
        region.split_values.push_back({r.string(sj[k], f, "value"), static_cast<int>(r.integer(sj[k], f, "axis", 0, 64))});
      }
    }
    tp.regions.push_back(std::move(region));
  }
  plan.tensor_parallel = std::move(tp);
}

}  // namespace

int plan_devices(const PlanDocument& plan) {
  int devices = 0;
  for (const PlanStageRecord& stage : plan.stages) devices += static_cast<int>(stage.devices.size());
  return devices;
}

bool is_virtual_stage_view(const PlanDocument& plan) {
  return !plan.virtual_stages.empty() && plan.stages.size() == plan.virtual_stages.size();
}

PlanDocument virtual_stage_view(const PlanDocument& plan) {
  if (is_virtual_stage_view(plan)) return plan;
  if (plan.virtual_stages.empty())
    throw InvalidModel("the plan's schedule is " + std::string(schedule_name(plan.training.schedule)) +
                       " but plan.json lists no virtual_stages (the tasks of each chunk): re-run apart partition to "
                       "rewrite the plan");
  const size_t p = plan.stages.size();
  const double v = static_cast<double>(plan.virtual_stages.size() / p);
  PlanDocument view = plan;
  view.stages.clear();
  for (const PlanVirtualStage& chunk : plan.virtual_stages) {
    PlanStageRecord record = plan.stages[static_cast<size_t>(chunk.id) % p];
    record.id = chunk.id;
    record.tasks = chunk.tasks;
    record.batch_tasks.reset();
    record.inputs = chunk.inputs;
    record.outputs = chunk.outputs;
    record.forward_s /= v;  // the simulator's share: 1/v of the stage's times (docs/simulator.md)
    record.backward_s /= v;
    if (record.backward_weight_s) *record.backward_weight_s /= v;
    if (record.recompute_forward_s) *record.recompute_forward_s /= v;
    view.stages.push_back(std::move(record));
  }
  return view;
}

std::string stage_file_name(const PlanDocument& plan, int stage) {
  return (is_virtual_stage_view(plan) ? "chunk_" : "stage_") + std::to_string(stage) + ".onnx";
}

PlanDocument plan_from_json(const json& j, const std::string& source) {
  const Readers rs(source);
  const JsonReader& r = rs.strict;
  if (!j.is_object()) r.fail("the document", "must be a JSON object");
  const std::string schema = r.string(j, "", "schema");
  if (schema != kPlanSchema) r.fail("schema", "is \"" + schema + "\", expected \"" + kPlanSchema + "\"");
  PlanDocument plan;
  if (j.contains("model")) {
    const JsonReader& l = rs.lenient;
    const json& m = l.object(j, "", "model");
    PlanModel model;
    model.path = l.optional_string(m, "model.", "path").value_or("");
    model.relative_path = l.optional_string(m, "model.", "relative_path");
    model.absolute_path = l.optional_string(m, "model.", "absolute_path");
    model.sha256 = l.optional_string(m, "model.", "sha256").value_or("");
    model.tasks = l.optional_integer(m, "model.", "tasks", 0).value_or(0);
    model.params = l.optional_integer(m, "model.", "params", 0, limits::kMaxByteCount).value_or(0);
    model.param_bytes = l.optional_integer(m, "model.", "param_bytes", 0, limits::kMaxByteCount).value_or(0);
    if (m.contains("constants_as_params")) model.constants_as_params = l.boolean(m, "model.", "constants_as_params", true);
    if (m.contains("added_loss")) {
      const json& a = l.object(m, "model.", "added_loss");
      model.added_loss = PlanModel::AddedLoss{l.string(a, "model.added_loss.", "form"),
                                              l.string(a, "model.added_loss.", "labels")};
    }
    if (m.contains("dims")) {
      const json& dims = l.object(m, "model.", "dims");
      for (auto it = dims.begin(); it != dims.end(); ++it)
        model.dims[it.key()] = l.integer(dims, "model.dims.", it.key().c_str(), 1, limits::kMaxByteCount);
    }
    model.tokens_per_sample = l.optional_integer(m, "model.", "tokens_per_sample", 1, limits::kMaxByteCount);
    model.flops_per_sample = l.optional_number(m, "model.", "flops_per_sample", limits::kMaxFlops);
    plan.model = model;
  }
  read_cluster(rs, j, plan.cluster);
  read_training(rs, j, plan.training);
  read_options(rs, j, plan);
  read_stages(rs, j, plan);
  read_virtual_stages(rs, j, plan);
  read_predicted(rs, j, plan);
  read_search(rs, j, plan);
  read_tensor_parallel(rs, j, plan);
  if (j.contains("target")) {
    const JsonReader& l = rs.lenient;
    const json& t = l.object(j, "", "target");
    plan.target =
        PlanTarget{l.string(t, "target.", "engine"),
                   l.optional_number(t, "target.", "unrestricted_iteration_s", limits::kMaxSeconds).value_or(0),
                   l.optional_string(t, "target.", "unrestricted_layout").value_or("")};
  }
  return plan;
}

bool is_apart_plan_json(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return false;
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  const auto schema = j.find("schema");
  return schema != j.end() && schema->is_string() && schema->get<std::string>().starts_with("apart.plan/");
}

std::filesystem::path plan_json_path(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path file = path / kPlanFile;
    if (!fs::exists(file, ec))
      throw InvalidArgument("'" + path.string() + "' holds no plan.json: give a plan directory written by "
                            "`apart partition MODEL ... -o DIR`, or its plan.json");
    return file;
  }
  if (fs::is_regular_file(path, ec)) return path;
  throw InvalidArgument("'" + path.string() + "' does not exist: give a plan directory written by "
                        "`apart partition MODEL ... -o DIR`, or its plan.json");
}

PlanDocument read_plan(const std::filesystem::path& path) {
  const std::filesystem::path file = plan_json_path(path);
  std::ifstream in(file);
  if (!in) throw SystemError("cannot read plan '" + file.string() + "' (give a plan directory written by `apart partition`, or its plan.json)");
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw InvalidModel(file.string() + ": not valid JSON (re-run `apart partition` to regenerate the plan)");
  return plan_from_json(j, file.string());
}

}  // namespace apart
