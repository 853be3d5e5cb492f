// plan.dot and report.txt from a plan document (plan.json through plan/'s writer), and the all-or-nothing plan
// directory.
#include "codegen/plan_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "graph/error.h"
#include "graph/sha256.h"
#include "graph/units.h"
#include "graph/text.h"
#include "graph/threads.h"
#include "plan/plan_file.h"
#include "plan/plan_summary.h"
#include "plan/training.h"

namespace apart {
namespace {

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

PlanModel describe_model(const TaskGraph& graph, const std::filesystem::path& model_path) {
  PlanModel m;
  m.path = model_path.string();
  m.sha256 = sha256_file_hex(model_path);
  m.tasks = graph.num_tasks();
  for (const Value& v : graph.values())
    if (v.kind == ValueKind::kParam) {
      m.params += v.elements;
      m.param_bytes += v.bytes;
    }
  return m;
}

std::vector<TaskId> stage_task_ids(const PlanStageRecord& stage, const TaskGraph& graph) {
  std::vector<TaskId> ids;
  ids.reserve(stage.tasks.size());
  for (const std::string& name : stage.tasks) {
    const auto id = graph.find_task(name);
    if (!id)
      throw InvalidModel("stage " + std::to_string(stage.id) + " lists task '" + name +
                         "', which is not in the model (a plan of another model?)");
    ids.push_back(*id);
  }
  return ids;
}

std::string plan_to_dot(const PlanDocument& plan, const TaskGraph& graph, bool detail) {
  std::ostringstream out;
  out << "digraph plan {\n  rankdir=TB;\n  node [shape=box, fontsize=10];\n";
  std::vector<int> stage_of(graph.num_tasks(), -1);
  std::vector<std::vector<TaskId>> tasks;
  for (const PlanStageRecord& s : plan.stages) tasks.push_back(stage_task_ids(s, graph));
  for (size_t k = 0; k < plan.stages.size(); ++k)
    for (TaskId t : tasks[k])
      if (!graph.task(t).constant) stage_of[t.value()] = plan.stages[k].id;
  for (size_t k = 0; k < plan.stages.size(); ++k) {
    const PlanStageRecord& s = plan.stages[k];
    out << "  subgraph " << dot_quote("cluster_stage_" + std::to_string(s.id)) << " {\n";
    out << "    label=" << dot_quote("stage " + std::to_string(s.id) + " ×" + std::to_string(s.replicas) + "  " +
                                     format_seconds(s.step_s.value_or(0)) + " per micro-batch") << ";\n";
    if (detail) {
      for (TaskId t : tasks[k])
        if (!graph.task(t).constant)
          out << "    " << dot_quote(graph.task(t).name) << " [label=" << dot_quote(graph.task(t).name + "\n" + graph.task(t).op_type) << "];\n";
    } else {
      out << "    " << dot_quote("stage " + std::to_string(s.id)) << " [label="
          << dot_quote("stage " + std::to_string(s.id) + "\n" +
                       format_task_counts(s.tasks.size(), static_cast<size_t>(s.batch_tasks.value_or(0))) + "\n" +
                       format_bytes(static_cast<double>(s.memory_bytes.value_or(0)))) << "];\n";
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
    for (const PlanStageRecord& s : plan.stages)
      for (const PlanOutput& o : s.outputs)
        for (int to : o.to_stages)
          out << "  " << dot_quote("stage " + std::to_string(s.id)) << " -> " << dot_quote("stage " + std::to_string(to))
              << " [label=" << dot_quote(o.value) << "];\n";
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

// Characters of UTF-8 `text` (a "–" is one).
size_t chars_of(const std::string& text) {
  size_t chars = 0;
  for (unsigned char c : text) chars += (c & 0xC0) != 0x80 ? 1 : 0;
  return chars;
}

// `text` padded with spaces to `width` characters, at the left or the right.
std::string padded(const std::string& text, size_t width, bool right) {
  const size_t chars = chars_of(text);
  const std::string fill(width > chars ? width - chars : 0, ' ');
  return right ? fill + text : text + fill;
}

// One row of the stage table: the columns that say what a stage does (not its id, memory or devices), as printed,
// so that stages alike in them can share one. Memory differs between alike stages anyway (1F1B keeps fewer
// micro-batches in flight further down the pipeline): a shared row shows its range.
struct StageRow {
  std::string work;   // tasks, params, compute, comm, allreduce
  int replicas = 1;
  std::string split;  // "  TP-8  ZeRO-1" after the devices
  bool operator==(const StageRow&) const = default;
};

StageRow stage_row(const PlanStageRecord& s) {
  char line[256];
  // Compute is forward + backward (the backward includes a recomputed forward): partition/stage_cost.h.
  std::snprintf(line, sizeof line, "%-32s %9s %10s %10s %10s",
                format_task_counts(s.tasks.size(), static_cast<size_t>(s.batch_tasks.value_or(0))).c_str(),
                human_params(static_cast<double>(s.param_bytes.value_or(0)) / kParamStorageBytes).c_str(),
                format_seconds(s.forward_s + s.backward_s).c_str(), format_seconds(s.comm_s.value_or(0)).c_str(),
                format_seconds(s.allreduce_s.value_or(0)).c_str());
  // A stage whose replicas are tensor-parallel groups or shard with ZeRO says so after its devices; plans without
  // either read as before.
  return {line, s.replicas,
          (s.tp > 1 ? "  TP-" + std::to_string(s.tp) : "") + (s.zero > 0 ? "  ZeRO-" + std::to_string(s.zero) : "")};
}

// "31.13 GiB", or "24.01–39.76 GiB" for stages [a, b) (the unit once when both share it).
std::string memory_range(const std::vector<PlanStageRecord>& stages, size_t a, size_t b) {
  int64_t lo = stages[a].memory_bytes.value_or(0), hi = lo;
  for (size_t k = a; k < b; ++k) {
    lo = std::min(lo, stages[k].memory_bytes.value_or(0));
    hi = std::max(hi, stages[k].memory_bytes.value_or(0));
  }
  std::string low = format_bytes(static_cast<double>(lo));
  const std::string high = format_bytes(static_cast<double>(hi));
  if (lo == hi) return low;
  const size_t unit = high.rfind(' ');
  if (unit != std::string::npos && low.ends_with(high.substr(unit)))
    low.resize(low.size() - (high.size() - unit));
  return low + "–" + high;
}

// The stage table; under ReportFor::kTerminal a run of consecutive stages with identical rows is one row, its ids
// and devices as ranges ("1–15", "8-127"), its memory as a range, the bottleneck named when it is inside.
std::string stage_table(const PlanDocument& plan, int bottleneck, ReportFor reader) {
  const std::string limit = format_bytes(static_cast<double>(plan.cluster.memory_bytes.value_or(0)));
  std::vector<StageRow> rows;
  for (const PlanStageRecord& s : plan.stages) rows.push_back(stage_row(s));
  const bool collapse = reader == ReportFor::kTerminal;
  auto run_end = [&](size_t a) {
    size_t b = a + 1;
    while (collapse && b < rows.size() && rows[b] == rows[a]) ++b;
    return b;
  };
  size_t width = 5;  // "stage"
  for (size_t a = 0, b = 0; a < rows.size(); a = b) {
    b = run_end(a);
    const std::string last = b - a > 1 ? "–" + std::to_string(plan.stages[b - 1].id) : "";
    width = std::max(width, chars_of(std::to_string(plan.stages[a].id) + last));
  }
  std::vector<std::string> memory(rows.size());  // per run, at its first stage
  size_t memory_width = 22;  // as report.txt has always had it; on a terminal as wide as a range needs
  for (size_t a = 0, b = 0; a < rows.size(); a = b) {
    b = run_end(a);
    memory[a] = memory_range(plan.stages, a, b) + " / " + limit;
    if (collapse) memory_width = std::max(memory_width, chars_of(memory[a]));
  }
  char line[320];
  std::snprintf(line, sizeof line, "  %-32s %9s %10s %10s %10s  %s %8s %s\n", "tasks", "params", "compute", "comm",
                "allreduce", padded("memory / usable", memory_width, false).c_str(), "replicas", "devices");
  std::string out = padded("stage", width, true) + line;
  for (size_t a = 0, b = 0; a < rows.size(); a = b) {
    b = run_end(a);
    const PlanStageRecord& first = plan.stages[a];
    const PlanStageRecord& last = plan.stages[b - 1];
    std::string id = std::to_string(first.id);
    std::vector<int> devices = first.devices;
    std::string mark = first.id == bottleneck ? "  ← bottleneck" : "";
    if (b - a > 1) {
      id += "–" + std::to_string(last.id);
      devices.clear();
      for (size_t k = a; k < b; ++k) devices.insert(devices.end(), plan.stages[k].devices.begin(), plan.stages[k].devices.end());
      if (bottleneck >= first.id && bottleneck <= last.id) mark = "  ← bottleneck: stage " + std::to_string(bottleneck);
    }
    std::string where = device_range(devices);
    if (b - a > 1 && where.find(',') != std::string::npos)  // not one progression: the first and last stage's
      where = device_range(first.devices) + " … " + device_range(last.devices);
    std::snprintf(line, sizeof line, "  %s  %s %8d ", rows[a].work.c_str(),
                  padded(memory[a], memory_width, false).c_str(), rows[a].replicas);
    out += padded(id, width, true) + line + where + rows[a].split + mark + "\n";
  }
  return out;
}
}  // namespace

std::string plan_report(const PlanDocument& plan, const TaskGraph& graph, ReportFor reader) {
  const PlanCluster& c = plan.cluster;
  const PlanTraining& t = plan.training;
  const PlanModel model = plan.model.value_or(PlanModel{});
  const PlanPrediction predicted = plan.predicted.value_or(PlanPrediction{});
  const PlanSearch search = plan.search.value_or(PlanSearch{});
  const int64_t memory = c.memory_bytes.value_or(0);
  const int64_t device_memory = c.device_memory_bytes.value_or(memory);
  const int bottleneck = predicted.bottleneck_stage.value_or(-1);
  const double iteration_s = predicted.iteration_s.value_or(0);
  const double lower_bound_s = predicted.compute_lower_bound_s.value_or(0);
  std::ostringstream r;
  r << "apart plan for " << model.path << " (" << format_task_counts(graph.num_tasks(), graph.num_tasks() - graph.num_constant_tasks())
    << ", " << human_params(static_cast<double>(model.params)) << " params)\n";
  r << c.devices << " × " << c.device.value_or("") << " (" << c.devices_per_node.value_or(c.devices) << " per node, "
    << format_bytes(static_cast<double>(device_memory)) << " each, " << format_bytes(static_cast<double>(memory))
    << " usable: --memory-reserve " << c.memory_reserve.value_or("0") << "), precision " << precision_name(t.precision)
    << (t.attention == AttentionKernel::kFused ? "" : ", attention " + std::string(attention_kernel_name(t.attention)))
    << ", batch " << t.global_batch.value_or(0) << " = " << t.microbatches << " micro-batch"
    << (t.microbatches == 1 ? "" : "es") << " of " << t.microbatch_size.value_or(0)
    << " (split among a stage's replicas), " << schedule_name(t.schedule) << ", " << optimizer_name(t.optimizer)
    << ", recompute " << recompute_summary(plan) << ", method " << (plan.options ? plan.options->method : "") << "\n";
  r << plan_summary_line(plan) << "\n\n";
  r << stage_table(plan, bottleneck, reader);
  const std::string limit = format_bytes(static_cast<double>(memory));
  const int used = plan_devices(plan);
  int split = 0;  // stages with tensor-parallel groups
  for (const PlanStageRecord& s : plan.stages) split += s.tp > 1 ? 1 : 0;
  r << "\n";
  r << "predicted iteration  " << format_seconds(iteration_s) << "   (simulated: pipeline "
    << format_seconds(predicted.pipeline_s.value_or(0)) << ", then all-reduce and optimizer step; analytic estimate "
    << format_seconds(predicted.estimate_iteration_s.value_or(0)) << ")\n";
  if (plan.target) {  // --target: the restricted plan beside the unrestricted one, both simulated
    const double free_s = plan.target->unrestricted_iteration_s;
    r << "target " << plan.target->engine << "      " << format_seconds(iteration_s) << " (this plan) against "
      << format_seconds(free_s) << " unrestricted: the restriction costs "
      << (free_s > 0 ? fixed(100 * (iteration_s / free_s - 1), 1) : std::string("?")) << " %\n"
      << "  unrestricted plan  " << plan.target->unrestricted_layout << "\n";
  }
  r << "samples/s            " << format_significant(predicted.samples_per_s.value_or(0), 4) << "\n";
  r << "bubble fraction      " << fixed(predicted.bubble_fraction.value_or(0), 3) << "\n";
  r << "compute lower bound  " << format_seconds(lower_bound_s)
    << "   (total forward+backward work / " << c.devices << " devices); plan is "
    << fixed(lower_bound_s > 0 ? iteration_s / lower_bound_s : 0, 2) << "× the bound\n";
  if (predicted.mfu)
    r << "MFU                  " << fixed(100 * *predicted.mfu, 1) << " %   (" << predicted.mfu_flops.value_or("")
      << (predicted.mfu_flops == kSixNPerToken ? " × " + format_rate(predicted.tokens_per_s.value_or(0)) + " tokens/s" : " × samples/s")
      << " over " << c.devices << " × the device's " << precision_name(t.precision) << " peak; "
      << format_tflops(predicted.tflops_per_device.value_or(0)) << " per device)\n";
  r << "devices used         " << used << " of " << c.devices << ", " << c.layout.value_or("") << "\n";
  r << "peak memory          " << format_bytes(static_cast<double>(predicted.peak_memory_bytes.value_or(0))) << " of " << limit
    << " usable (" << format_bytes(static_cast<double>(device_memory)) << " less "
    << format_bytes(static_cast<double>(c.memory_reserve_bytes.value_or(0))) << " reserved)\n";
  r << "search               " << search.atomic_components << " atomic components → " << search.blocks
    << " blocks, " << search.candidates << " (S, m) candidates, " << search.simulated << " of "
    << search.candidates_placed << " placed plans simulated (" << search.pruned_by_bound
    << " ruled out by a lower bound), chosen split: " << search.chosen_split << ", "
    << fixed(search.seconds, 2) << " s" << (search.stopped_by_time_limit ? " (stopped by --time-limit)" : "")
    << "\n";
  if (plan.tensor_parallel) {
    r << "tensor-parallel      regions: " << plan.tensor_parallel->summary;
    if (split > 0)
      r << "; split in " << split << " of " << plan.stages.size() << " stages (TP-N after their devices)\n";
    else if (!plan.options || !plan.options->tp)
      r << " (found, not split: --tp 1; --tp auto lets the planner split them)\n";
    else
      r << " (found; the search split no stage)\n";
  }
  if (reader == ReportFor::kFile)
    for (const std::string& warning : plan_warnings(plan)) r << "warning: " << warning << "\n";
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
  const size_t prefix = name.starts_with("stage_") || name.starts_with("chunk_") ? 6 : 0;  // chunk_C: interleaved
  if (prefix == 0 || !name.ends_with(".onnx")) return false;
  const std::string k = name.substr(prefix, name.size() - prefix - 5);
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
  if (foreign.empty() && !is_apart_plan_json(target / kPlanFile)) foreign.push_back("plan.json (not an apart plan)");
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

void write_plan_directory(const fs::path& directory, const PlanDocument& plan, const TaskGraph& graph,
                          const fs::path& model_path, const PlanOutputs& outputs) {
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
    // The files side by side on outputs.threads, the stage files (the most work) first; each is written whole.
    const int threads = std::max(1, outputs.threads);
    const std::vector<std::function<void()>> parts = {
        [&] {
          if (outputs.stage_models)
            write_stage_models(plan, graph, model_path, tmp, outputs.stage_shapes, std::max(1, threads - 2));
        },
        [&] { write_file_atomically(tmp / "plan.json", plan_to_json(plan).dump(2) + "\n"); },
        [&] {
          write_file_atomically(tmp / "plan.dot", plan_to_dot(plan, graph, outputs.dot_detail));
          write_file_atomically(tmp / "report.txt", plan_report(plan, graph));
        },
        [&] {
          if (outputs.extra) outputs.extra(tmp);
        }};
    run_indexed(parts.size(), threads, [&](size_t part) { parts[part](); });
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
