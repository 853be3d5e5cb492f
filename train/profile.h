// Measured profiles (`apart profile`): per-task forward/backward seconds from the real kernels of a backend (the CPU's,
// or a GPU's), written as apart.costs/1 with "source": "measured" (docs/profiling.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "importer/importer.h"
#include "runtime/backend.h"
#include "profiler/cost_table.h"

namespace apart {

inline constexpr int kMaxRanksPerNode = 256;
inline constexpr int kMaxProfileRepeats = 1000;  // timed runs ProfileOptions::min_seconds may add up to

struct ProfileOptions {
  int warmup = 2;    // untimed runs first (arena, page faults, BLAS thread start-up)
  int repeats = 5;   // timed runs; a task's time is the median over them
  // More timed runs, past `repeats`, until they add up to this many seconds (at most kMaxProfileRepeats runs in all):
  // a model whose step takes milliseconds gets hundreds of runs, so one slow run moves no median. 0: exactly repeats.
  double min_seconds = 0;
  std::string loss;  // scalar output to differentiate; empty: the graph's only scalar float output
  bool random_params = false;  // fill float initializers with random values (models saved without weights)
  uint64_t seed = 0;           // synthetic inputs and random params
  // The kernels to time (not owned; nullptr: the CPU backend). On a device the executor synchronizes before and after
  // each task, so that a task's time is its kernels' alone, not the launch queue's.
  Backend* backend = nullptr;
  // The device preset the times stand for (the cluster's device in `apart partition --profile`), which also gives the
  // analytic FLOPs and bytes; "": "cpu" on the CPU backend, the backend's name ("cuda") on another.
  std::string device;
  // Ranks of `apart run` that will share this machine's cores (CPU backend only): N − 1 twin executors run the same
  // graph on their own threads throughout the warm-up and timed runs, so each task's time carries the contention
  // for caches and memory bandwidth that N ranks of one node meet, which a lone process does not see. Every
  // executor times its runs; the table is the slowest one's (ranks wait for the slowest: see profile.cpp).
  int ranks_per_node = 1;
  // Called as soon as a phase starts ("building the training graph", "run 3 of 7 (timed)") and as soon as a
  // warning is known (the same text also lands in the table's warnings); both may be empty.
  std::function<void(const std::string&)> on_progress;
  std::function<void(const std::string&)> on_warning;
  void validate() const;       // InvalidArgument
};

// How the times were taken, beside the table (the file's "measurement" object).
struct ProfileResult {
  CostTable table;               // by forward TaskId; source "measured", device "cpu"
  bool backward_measured = false;  // false: no loss (or no gradient rule) — backward = forward × analytic ratio
  std::string backward_note;       // why the backward is estimated, when it is
  int warmup = 0;
  int repeats = 0;                 // timed runs made (≥ ProfileOptions::repeats with min_seconds)
  int threads = 0;                 // hardware threads the kernels may use
  int ranks_per_node = 1;          // executors that ran at once (ProfileOptions::ranks_per_node)
  int64_t twin_runs = 0;           // whole runs the twins finished meanwhile (each at least one before the timing)
  // With twins: the executor whose runs the table holds, the slowest by median wall time (0: the first, which
  // times `repeats` runs and more), and each executor's median wall time.
  int slowest_executor = 0;
  std::vector<double> executor_step_s;
  std::string backend;             // Backend::describe() of what was timed
  std::vector<std::string> fallback_ops;  // ops timed on the CPU kernel for want of a backend kernel
  double step_s = 0;               // median wall time of one whole run (forward + backward)
  double timed_s = 0;              // Σ the timed runs' wall times (≥ ProfileOptions::min_seconds unless capped)
  double tasks_s = 0;              // Σ per-task medians (forward + backward, constant tasks included)
  double constant_s = 0;           // of which constant tasks reading params (in the table: time per run, fixed)
  double unattributed_s = 0;       // backward nodes tied to no forward task (loss seed, zero gradients)
  double dispatch_s_per_node = 0;  // (step_s − tasks_s) / nodes run each step: the executor's work per node
                                   // between kernels, included in each task's times by its node count
  int64_t training_tasks = 0;      // tasks of the graph that ran (training graph, or the forward)
};

// Profiles `model` (imported by the caller with the dims/shapes to measure at; its batch is the
// micro-batch size). Builds the training graph (codegen/autodiff.h), runs it warmup + repeats times
// with per-task timing, and attributes every forward node to its task and every backward node
// (named grad/<forward node>/<op>_<k>) to the task it differentiates. FLOPs, bytes, saved and param
// bytes come from the analytic model on the `cpu` device so the file is complete. Throws what import,
// autodiff and the executor throw (Unsupported for ops without a kernel).
ProfileResult profile_model(const ImportedModel& model, const ImportOptions& import, const ProfileOptions& options);

// apart.costs/1 (plan/costs_json.h) plus a "measurement" object; read back by read_costs_json.
nlohmann::json profile_to_json(const TaskGraph& g, const ProfileResult& result);
// Temporary file + rename: no partial file on failure. Throws SystemError.
void write_profile_json(const std::filesystem::path& path, const TaskGraph& g, const ProfileResult& result);

// Which forward task a training-graph node belongs to, by name: a forward node's own name, or the
// scope of a backward node "grad/<scope>/<op>_<k>". Returns "" for names of neither kind.
std::string forward_scope_of(const std::string& training_node_name);

}  // namespace apart
