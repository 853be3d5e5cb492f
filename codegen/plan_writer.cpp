// plan.json, plan.dot and report.txt from a Plan, and the all-or-nothing plan directory.
#include "codegen/plan_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "codegen/sha256.h"
#include "graph/error.h"
#include "graph/units.h"
#include "graph/text.h"

namespace apart {
namespace {

// "off", "on" (every stage) or "3 of 8 stages" (recomputation where a stage needs it).
std::string recompute_summary(const Plan& plan) {
  size_t n = 0;
  for (const PlanStage& s : plan.stages) n += s.recompute ? 1 : 0;
  if (n == 0) return "off";
  if (n == plan.stages.size()) return "on";
  return std::to_string(n) + " of " + std::to_string(plan.stages.size()) + " stages";
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string human_params(double n) {
  const char* unit[] = {"", "K", "M", "B", "T"};
  int u = 0;
  while (n >= 1000 && u < 4) { n /= 1000; ++u; }
  return fixed(n, u == 0 ? 0 : 2) + unit[u];
}

}  // namespace

ModelInfo describe_model(const TaskGraph& graph, const std::filesystem::path& model_path) {
  ModelInfo m;
  m.path = model_path.string();
  m.sha256 = sha256_file_hex(model_path);
  for (const Value& v : graph.values())
    if (v.kind == ValueKind::kParam) {
      m.params += v.elements;
      m.param_bytes += v.bytes;
    }
  return m;
}

nlohmann::ordered_json plan_to_json(const Plan& plan, const TaskGraph& graph, const ModelInfo& model) {
  using json = nlohmann::ordered_json;
  const PartitionOptions& o = plan.options;
  json j;
  j["schema"] = "apart.plan/1";
  j["model"] = {{"path", model.path}, {"sha256", model.sha256}, {"tasks", graph.num_tasks()},
                {"params", model.params}, {"param_bytes", model.param_bytes}};
  j["cluster"] = {{"devices", o.cluster.devices}, {"device", o.cluster.device.name},
                  {"devices_per_node", o.cluster.devices_per_node}, {"memory_bytes", o.cluster.usable_memory_bytes()},
                  {"device_memory_bytes", o.cluster.device.memory_bytes},
                  {"memory_reserve_bytes", o.cluster.reserved_bytes()}, {"memory_reserve", o.cluster.reserve.text()},
                  {"intra_node_bandwidth", o.cluster.intra_node.bandwidth},
                  {"inter_node_bandwidth", o.cluster.inter_node.bandwidth},
                  {"layout", layout_name(plan.layout)}};
  j["training"] = {{"global_batch", o.training.global_batch}, {"microbatches", plan.microbatches},
                   {"microbatch_size", plan.microbatch_size}, {"schedule", schedule_name(plan.schedule)},
                   {"optimizer", optimizer_name(o.training.optimizer)},
                   {"precision", precision_name(o.training.precision)}, {"recompute", plan.recompute},
                   {"overlap_allreduce", o.training.overlap_allreduce}};
  json options = {{"method", method_name(o.method)},
                  {"stages", plan.stages.size()},
                  {"replicas", o.stage.replicas ? json(*o.stage.replicas) : json("auto")},
                  {"microbatches", plan.microbatches},
                  {"schedule", schedule_name(plan.schedule)},
                  {"recompute", recompute_summary(plan)},
                  {"blocks", o.block.blocks > 0 ? json(o.block.blocks) : json("auto")},
                  {"balance_cap", o.block.balance_cap},
                  {"time_limit_s", o.stage.time_limit_s}};
  j["options"] = options;
  json stages = json::array();
  for (const PlanStage& s : plan.stages) {
    json st;
    st["id"] = s.id;
    st["replicas"] = s.replicas;
    st["devices"] = s.devices;
    json tasks = json::array();
    for (TaskId t : s.tasks) tasks.push_back(graph.task(t).name);
    st["tasks"] = tasks;
    st["batch_tasks"] = s.batch_tasks;
    st["microbatch_size"] = s.cost.microbatch;
    st["forward_s"] = s.cost.forward_s;
    st["backward_s"] = s.cost.backward_s;
    st["recompute"] = s.recompute;
    st["comm_s"] = s.cost.comm_s;
    st["allreduce_s"] = s.cost.allreduce_s;
    st["allreduce_exposed_s"] = s.cost.allreduce_exposed_s;
    st["step_s"] = s.cost.step_s;
    st["param_bytes"] = s.cost.param_bytes;
    st["memory_bytes"] = s.cost.memory_bytes;
    json inputs = json::array();
    for (const StageInput& in : s.inputs)
      inputs.push_back({{"value", graph.value(in.value).name}, {"from_stage", in.from_stage},
                        {"bytes", static_cast<int64_t>(in.bytes)}});
    st["inputs"] = inputs;
    json outputs = json::array();
    for (const StageOutput& out : s.outputs)
      outputs.push_back({{"value", graph.value(out.value).name}, {"to_stages", out.to_stages},
                         {"bytes", static_cast<int64_t>(out.bytes)}});
    st["outputs"] = outputs;
    stages.push_back(st);
  }
  j["stages"] = stages;
  // The prediction is the event-level replay of this plan (what chose it); the analytic estimate rides along.
  j["predicted"] = {{"iteration_s", plan.simulated.iteration_s},
                    {"bottleneck_stage", plan.simulated.bottleneck_stage},
                    {"bubble_fraction", plan.simulated.bubble_fraction},
                    {"samples_per_s", plan.samples_per_s},
                    {"peak_memory_bytes", plan.peak_memory_bytes},
                    {"pipeline_s", plan.simulated.pipeline_s},
                    {"compute_lower_bound_s", plan.compute_lower_bound_s},
                    {"source", "simulated"},
                    {"estimate_iteration_s", plan.estimate.iteration_s}};
  j["search"] = {{"seconds", plan.search.seconds},
                 {"atomic_components", plan.search.atomic_components},
                 {"blocks", plan.search.blocks},
                 {"coarsening_levels", plan.search.coarsening_levels},
                 {"refinement_moves", plan.search.refinement_moves},
                 {"candidates", plan.search.candidates},
                 {"candidates_placed", plan.search.candidates_placed},
                 {"simulated", plan.search.simulated},
                 {"pruned_by_bound", plan.search.pruned},
                 {"not_simulated", plan.search.not_simulated},
                 {"chosen_split", plan.search.chosen_split},
                 {"stopped_by_time_limit", plan.search.stopped_by_time_limit}};
  return j;
}

std::string plan_to_dot(const Plan& plan, const TaskGraph& graph, bool detail) {
  std::ostringstream out;
  out << "digraph plan {\n  rankdir=TB;\n  node [shape=box, fontsize=10];\n";
  std::vector<int> stage_of(graph.num_tasks(), -1);
  for (const PlanStage& s : plan.stages)
    for (TaskId t : s.tasks)
      if (!graph.task(t).constant) stage_of[t.value()] = s.id;
  for (const PlanStage& s : plan.stages) {
    out << "  subgraph " << dot_quote("cluster_stage_" + std::to_string(s.id)) << " {\n";
    out << "    label=" << dot_quote("stage " + std::to_string(s.id) + " ×" + std::to_string(s.replicas) + "  " +
                                     format_seconds(s.cost.step_s) + " per micro-batch") << ";\n";
    if (detail) {
      for (TaskId t : s.tasks)
        if (!graph.task(t).constant)
          out << "    " << dot_quote(graph.task(t).name) << " [label=" << dot_quote(graph.task(t).name + "\n" + graph.task(t).op_type) << "];\n";
    } else {
      out << "    " << dot_quote("stage " + std::to_string(s.id)) << " [label="
          << dot_quote("stage " + std::to_string(s.id) + "\n" + format_task_counts(s.tasks.size(), s.batch_tasks) + "\n" +
                       format_bytes(static_cast<double>(s.cost.memory_bytes))) << "];\n";
    }
    out << "  }\n";
  }
  if (detail) {
    for (uint32_t t = 0; t < graph.num_tasks(); ++t) {
      if (stage_of[t] < 0) continue;
      for (TaskId succ : graph.successors(TaskId(t)))
        if (stage_of[succ.value()] >= 0)
          out << "  " << dot_quote(graph.task(TaskId(t)).name) << " -> " << dot_quote(graph.task(succ).name)
              << (stage_of[succ.value()] != stage_of[t] ? " [color=red]" : "") << ";\n";
    }
  } else {
    for (const PlanStage& s : plan.stages)
      for (const StageOutput& o : s.outputs)
        for (int to : o.to_stages)
          out << "  " << dot_quote("stage " + std::to_string(s.id)) << " -> " << dot_quote("stage " + std::to_string(to))
              << " [label=" << dot_quote(graph.value(o.value).name) << "];\n";
  }
  out << "}\n";
  return out.str();
}

namespace {
// "3", "0-7", or "0-56/8" (every 8th device: a pipeline-major stage).
std::string device_range(const std::vector<int>& d) {
  if (d.empty()) return "-";
  if (d.size() == 1) return std::to_string(d.front());
  const int step = d[1] - d[0];
  for (size_t i = 1; i < d.size(); ++i)
    if (d[i] - d[i - 1] != step) {
      std::string list;
      for (int x : d) list += (list.empty() ? "" : ",") + std::to_string(x);
      return list;
    }
  return std::to_string(d.front()) + "-" + std::to_string(d.back()) + (step == 1 ? "" : "/" + std::to_string(step));
}
}  // namespace

std::string plan_report(const Plan& plan, const TaskGraph& graph, const ModelInfo& model) {
  const PartitionOptions& o = plan.options;
  std::ostringstream r;
  r << "apart plan for " << model.path << " (" << format_task_counts(graph.num_tasks(), graph.num_tasks() - graph.num_constant_tasks())
    << ", " << human_params(model.params) << " params)\n";
  const int64_t device_memory = o.cluster.device.memory_bytes;
  r << o.cluster.devices << " × " << o.cluster.device.name << " (" << o.cluster.devices_per_node << " per node, "
    << format_bytes(static_cast<double>(device_memory)) << " each, " << format_bytes(static_cast<double>(o.cluster.usable_memory_bytes()))
    << " usable: --memory-reserve " << o.cluster.reserve.text() << "), precision " << precision_name(o.training.precision)
    << ", batch " << o.training.global_batch << " = " << plan.microbatches << " micro-batch"
    << (plan.microbatches == 1 ? "" : "es") << " of " << plan.microbatch_size << " (split among a stage's replicas), "
    << schedule_name(plan.schedule) << ", " << optimizer_name(o.training.optimizer) << ", recompute "
    << recompute_summary(plan) << ", method " << method_name(o.method) << "\n\n";
  char line[320];
  std::snprintf(line, sizeof line, "%5s  %-32s %9s %10s %10s %10s  %-22s %8s %s\n", "stage", "tasks", "params",
                "compute", "comm", "allreduce", "memory / usable", "replicas", "devices");
  r << line;
  const std::string limit = format_bytes(static_cast<double>(o.cluster.usable_memory_bytes()));
  for (const PlanStage& s : plan.stages) {
    const std::string mem = format_bytes(static_cast<double>(s.cost.memory_bytes)) + " / " + limit;
    const std::string devices = device_range(s.devices);
    std::snprintf(line, sizeof line, "%5d  %-32s %9s %10s %10s %10s  %-22s %8d %s%s\n", s.id,
                  format_task_counts(s.tasks.size(), s.batch_tasks).c_str(),
                  human_params(static_cast<double>(s.cost.param_bytes) / 4).c_str(), format_seconds(s.cost.compute_s).c_str(),
                  format_seconds(s.cost.comm_s).c_str(), format_seconds(s.cost.allreduce_s).c_str(), mem.c_str(), s.replicas,
                  devices.c_str(), s.id == plan.simulated.bottleneck_stage ? "  ← bottleneck" : "");
    r << line;
  }
  int used = 0;
  for (const PlanStage& s : plan.stages) used += s.replicas;
  r << "\n";
  r << "predicted iteration  " << format_seconds(plan.simulated.iteration_s) << "   (simulated: pipeline "
    << format_seconds(plan.simulated.pipeline_s) << ", then all-reduce; analytic estimate "
    << format_seconds(plan.estimate.iteration_s) << ")\n";
  r << "samples/s            " << format_significant(plan.samples_per_s, 4) << "\n";
  r << "bubble fraction      " << fixed(plan.simulated.bubble_fraction, 3) << "\n";
  r << "compute lower bound  " << format_seconds(plan.compute_lower_bound_s)
    << "   (total forward+backward work / " << o.cluster.devices << " devices); plan is "
    << fixed(plan.compute_lower_bound_s > 0 ? plan.simulated.iteration_s / plan.compute_lower_bound_s : 0, 2)
    << "× the bound\n";
  r << "devices used         " << used << " of " << o.cluster.devices << ", " << layout_name(plan.layout) << "\n";
  r << "peak memory          " << format_bytes(static_cast<double>(plan.peak_memory_bytes)) << " of " << limit
    << " usable (" << format_bytes(static_cast<double>(device_memory)) << " less "
    << format_bytes(static_cast<double>(o.cluster.reserved_bytes())) << " reserved)\n";
  r << "search               " << plan.search.atomic_components << " atomic components → " << plan.search.blocks
    << " blocks, " << plan.search.candidates << " (S, m) candidates, " << plan.search.simulated << " of "
    << plan.search.candidates_placed << " placed plans simulated (" << plan.search.pruned
    << " ruled out by a lower bound), chosen split: " << plan.search.chosen_split << ", "
    << fixed(plan.search.seconds, 2) << " s" << (plan.search.stopped_by_time_limit ? " (stopped by --time-limit)" : "")
    << "\n";
  return r.str();
}


namespace {
namespace fs = std::filesystem;

// `-o plan/` and `-o plan/.` name the folder plan.
fs::path plan_target(const fs::path& directory) {
  fs::path t = directory;
  while ((t.filename().empty() || t.filename() == ".") && t.has_parent_path() && t.parent_path() != t)
    t = t.parent_path();
  return t;
}

fs::path parent_of(const fs::path& target) { return target.has_parent_path() ? target.parent_path() : fs::path("."); }

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

// A plan.json that apart wrote: a JSON object whose schema is apart.plan/….
bool is_our_plan_json(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return false;
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  const auto schema = j.find("schema");
  return schema != j.end() && schema->is_string() && schema->get<std::string>().starts_with("apart.plan/");
}

// "'a', 'b/', 'c' and 4 more".
std::string name_list(const std::vector<std::string>& names) {
  constexpr size_t kShown = 5;
  std::string out;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) out += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > kShown) out += " and " + std::to_string(names.size() - kShown) + " more";
  return out;
}

// A new hidden folder beside the target (".plan.tmp.<random>"), never one that exists already.
fs::path make_sibling_dir(const fs::path& parent, const std::string& prefix) {
  std::random_device seed;
  std::mt19937_64 rng((static_cast<uint64_t>(seed()) << 32) ^ static_cast<uint64_t>(::getpid()));
  for (int attempt = 0; attempt < 100; ++attempt) {
    char suffix[17];
    std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(rng()));
    const fs::path dir = parent / (prefix + suffix);
    std::error_code ec;
    if (fs::create_directory(dir, ec)) return dir;
    if (ec) throw SystemError("cannot create " + quoted(dir) + ": " + ec.message());
  }
  throw SystemError("cannot create a temporary folder in " + quoted(parent));
}

}  // namespace

bool is_plan_folder_file(const std::string& name) {
  for (const char* known : kPlanFolderFiles)
    if (name == known) return true;
  if (!name.starts_with("stage_") || !name.ends_with(".onnx")) return false;
  const std::string k = name.substr(6, name.size() - 6 - 5);
  return !k.empty() && k.find_first_not_of("0123456789") == std::string::npos;
}

void check_plan_directory(const fs::path& directory, const std::vector<InputFile>& inputs, bool force) {
  const fs::path target = plan_target(directory);
  const std::string where = "-o " + quoted(directory);
  if (target.empty()) throw InvalidArgument("-o: empty path; give a new folder for the plan, e.g. -o plan");
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(target, ec);
  if (fs::is_symlink(status)) {
    const fs::path to = fs::read_symlink(target, ec);
    throw InvalidArgument(where + " is a symlink to " + quoted(to) +
                          "; apart does not replace a symlink or write through one: give its target or a new folder");
  }
  const fs::path parent = parent_of(target);
  if (fs::exists(parent, ec) && !writable_directory(parent))
    throw SystemError(where + ": its folder " + quoted(parent) + " is not writable (the plan is written beside it "
                      "first, then renamed into place): choose another -o");
  const bool dot_dot = target.filename() == "..";
  if (dot_dot && !fs::exists(status)) throw InvalidArgument(where + " ends in '..'; name the plan folder itself, e.g. -o plan");
  if (!fs::exists(status)) return;
  if (!fs::is_directory(status)) throw InvalidArgument(where + " exists and is not a folder: remove it or choose another -o");
  if (contains_path(target, fs::current_path(ec)))
    throw InvalidArgument(where + " is the working folder or a folder above it; apart never replaces that, even with "
                          "--force: choose a new folder, e.g. -o plan");
  for (const InputFile& in : inputs)
    if (!in.path.empty() && contains_path(target, in.path))
      throw InvalidArgument(where + " holds " + in.role + " this command reads (" + quoted(in.path) +
                            "); apart never replaces a folder holding its own input, even with --force: choose "
                            "another -o");
  if (dot_dot) throw InvalidArgument(where + " ends in '..'; name the plan folder itself, e.g. -o plan");
  if (!writable_directory(target))
    throw SystemError(where + " is read-only; apart will not replace it: make it writable (chmod u+w) or choose "
                      "another -o");

  std::vector<std::string> foreign;
  bool empty = true;
  for (const fs::directory_entry& e : fs::directory_iterator(target, ec)) {
    empty = false;
    const std::string name = e.path().filename().string();
    const bool folder = fs::is_directory(e.symlink_status(ec));
    if (folder ? name != kPlanWeightsFolder : !is_plan_folder_file(name)) foreign.push_back(name + (folder ? "/" : ""));
  }
  if (ec) throw SystemError(where + ": cannot list it: " + ec.message());
  if (empty) return;
  std::sort(foreign.begin(), foreign.end());
  if (foreign.empty() && !is_our_plan_json(target / "plan.json")) foreign.push_back("plan.json (not an apart plan)");
  if (foreign.empty()) return;  // a plan apart wrote: replaced
  if (!force)
    throw InvalidArgument(where + " is a folder apart did not write (it holds " + name_list(foreign) +
                          "); apart replaces only a plan folder it wrote: choose another -o, or add --force to replace "
                          "it and everything in it");
  // --force: every folder inside must be writable, or the old tree could only be removed in part.
  for (auto it = fs::recursive_directory_iterator(target, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (fs::is_directory(it->symlink_status(ec)) && !writable_directory(it->path()))
      throw SystemError(where + ": " + quoted(it->path()) + " inside it is read-only, so it could not be removed "
                        "completely: make it writable or choose another -o");
  if (ec) throw SystemError(where + ": cannot list it: " + ec.message());
}

void write_plan_directory(const fs::path& directory, const Plan& plan, const TaskGraph& graph,
                          const fs::path& model_path, const ModelInfo& model, const PlanOutputs& outputs) {
  check_plan_directory(directory, outputs.inputs, outputs.force);
  const fs::path target = plan_target(directory);
  const fs::path parent = parent_of(target);
  const std::string name = target.filename().string();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) throw SystemError("-o " + quoted(directory) + ": cannot create " + quoted(parent) + ": " + ec.message());
  const fs::path tmp = make_sibling_dir(parent, "." + name + ".tmp.");
  fs::path old;
  try {
    write_file_atomically(tmp / "plan.json", plan_to_json(plan, graph, model).dump(2) + "\n");
    write_file_atomically(tmp / "plan.dot", plan_to_dot(plan, graph, outputs.dot_detail));
    write_file_atomically(tmp / "report.txt", plan_report(plan, graph, model));
    if (outputs.stage_models) write_stage_models(plan, graph, model_path, tmp, outputs.stage_shapes);
    if (outputs.extra) outputs.extra(tmp);
    // Publish: again the checks (the folder may have changed while the plan was written), move an older plan
    // aside onto an empty folder of ours, rename the new one in, then drop the old one.
    check_plan_directory(directory, outputs.inputs, outputs.force);
    if (fs::exists(fs::symlink_status(target, ec))) {
      old = make_sibling_dir(parent, "." + name + ".old.");
      fs::rename(target, old, ec);
      if (ec) throw SystemError("cannot replace " + quoted(target) + ": " + ec.message());
    }
    fs::rename(tmp, target, ec);
    if (ec) {
      std::string why = ec.message();
      if (!old.empty()) {
        fs::rename(old, target, ec);
        if (ec) why += "; the previous plan is kept in " + quoted(old);
        else old.clear();
      }
      throw SystemError("cannot rename " + quoted(tmp) + " to " + quoted(target) + ": " + why);
    }
  } catch (...) {
    std::error_code ignore;
    fs::remove_all(tmp, ignore);
    if (!old.empty()) fs::remove(old, ignore);  // only when still the empty folder made for the rename
    throw;
  }
  if (!old.empty() && (fs::remove_all(old, ec), ec))
    std::fprintf(stderr, "apart: warning: the old %s was moved to %s and could not be removed: %s\n",
                 quoted(target).c_str(), quoted(old).c_str(), ec.message().c_str());
}

}  // namespace apart
