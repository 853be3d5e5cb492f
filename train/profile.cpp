// Measured profiles: run the training graph on a backend's kernels with per-task timing and fold the
// times back onto the forward graph's tasks (see profile.h, docs/profiling.md).
#include "train/profile.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <cmath>
#include <atomic>
#include <exception>
#include <map>
#include <mutex>
#include <memory>
#include <numeric>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <unordered_map>

#include "codegen/autodiff.h"
#include "graph/atomic_file.h"
#include "graph/checked.h"
#include "graph/error.h"
#include "graph/statistics.h"
#include "graph/units.h"
#include "importer/model_proto.h"
#include "profiler/cost_model.h"
#include "plan/costs_json.h"
#include "profiler/device.h"
#include "runtime/cpu/threads.h"
#include "train/data.h"
#include "runtime/executor.h"
#include "runtime/half_precision.h"
#include "train/trainer.h"

namespace apart {
namespace fs = std::filesystem;

void ProfileOptions::validate() const {
  checked_integer(warmup, 0, 1000000, "--warmup");
  checked_integer(repeats, 1, 1000000, "--repeats");
  checked_number(min_seconds, 0, 3600, "--min-time (seconds)");
  checked_integer(ranks_per_node, 1, kMaxRanksPerNode, "--ranks-per-node");
  if (ranks_per_node > 1 && backend && backend->kind() != BackendKind::kCpu)
    throw InvalidArgument("--ranks-per-node " + std::to_string(ranks_per_node) +
                          ": twins share a CPU's cores; on a GPU each rank has its own device (use 1)");
}

std::string forward_scope_of(const std::string& name) {
  if (name.rfind("grad/", 0) != 0) return name;
  const size_t last = name.rfind('/');
  if (last <= 5) return "";
  return name.substr(5, last - 5);
}

namespace {

using Clock = std::chrono::steady_clock;

bool has_scalar_float_output(const TaskGraph& g) {
  for (ValueId v : g.graph_outputs()) {
    const Value& value = g.value(v);
    if (is_floating(value.dtype) && value.shape_known && value.elements == 1) return true;
  }
  return false;
}

// Times of one executor over warmup + repeats runs: per-task seconds of each timed run, and walls.
struct Runs {
  std::vector<std::vector<double>> task_seconds;  // [repeat][task]
  std::vector<double> walls;
};

// `before_timed` runs once, after the warm-up runs and before the first timed one.
Runs time_runs(Executor& executor, const std::map<std::string, Tensor>& inputs, const ProfileOptions& options,
               const std::function<void()>& before_timed) {
  Runs runs;
  double timed = 0;
  const int cap = std::max(options.repeats, kMaxProfileRepeats);
  for (int r = 0;; ++r) {
    const int done = r - options.warmup;  // timed runs so far
    if (done >= options.repeats && (timed >= options.min_seconds || done >= cap)) break;
    if (r == options.warmup) before_timed();
    if (options.on_progress)
      options.on_progress(r < options.warmup ? "run " + std::to_string(r + 1) + " of " + std::to_string(options.warmup) + " (warmup)"
                          : done < options.repeats
                              ? "run " + std::to_string(done + 1) + " of " + std::to_string(options.repeats) + " (timed)"
                              : "run " + std::to_string(done + 1) + " (timed, until " + format_seconds(options.min_seconds) + ")");
    const auto start = Clock::now();
    executor.run(inputs);
    const double wall = std::chrono::duration<double>(Clock::now() - start).count();
    if (r < options.warmup) continue;
    timed += wall;
    runs.walls.push_back(wall);
    runs.task_seconds.push_back(executor.task_seconds());
  }
  return runs;
}

std::map<std::string, Tensor> synthetic_inputs(const TaskGraph& g, uint64_t seed) {
  const auto inputs = classify_inputs(g);
  if (inputs.empty()) return {};
  return make_synthetic_data(inputs, seed)->batch(0);
}

// The N − 1 twins of ProfileOptions::ranks_per_node: each runs its own executor of the graph over and over on its
// own thread, from construction until finish(), which rethrows the first twin's error. wait_until_warm() returns
// once every twin has finished a run (or one failed), so that the timed runs all meet the twins at work; from then
// on each twin keeps its runs' times too (it times its tasks as the timed executor does, so all run alike).
class Twins {
 public:
  Twins(int count, const onnx::ModelProto& model, const fs::path& dir, const ExecutorOptions& options,
        const ImportOptions& import, uint64_t seed)
      : runs_(static_cast<size_t>(count)) {
    for (int i = 0; i < count; ++i) executors_.push_back(std::make_unique<Executor>(model, dir, options, import));
    for (size_t i = 0; i < executors_.size(); ++i)
      threads_.emplace_back([this, seed, i, e = executors_[i].get()] {
        try {
          const auto inputs = synthetic_inputs(e->model().graph, seed);
          for (bool first = true; !stop_.load(std::memory_order_relaxed); first = false) {
            const bool timed = timing_.load(std::memory_order_relaxed);
            const auto start = Clock::now();
            e->run(inputs);
            const double wall = std::chrono::duration<double>(Clock::now() - start).count();
            const std::lock_guard lock(mutex_);
            ++total_runs_;
            if (timed && !stop_.load(std::memory_order_relaxed)) {
              runs_[i].walls.push_back(wall);
              runs_[i].task_seconds.push_back(e->task_seconds());
            }
            if (first) ++warm_;
            warmed_.notify_all();
          }
        } catch (...) {
          const std::lock_guard lock(mutex_);
          if (!error_) error_ = std::current_exception();
          warmed_.notify_all();
        }
      });
  }
  // Returns once every twin is warm; the runs they start after it are kept.
  void wait_until_warm() {
    std::unique_lock lock(mutex_);
    warmed_.wait(lock, [&] { return error_ || warm_ == executors_.size(); });
    timing_ = true;
  }
  int64_t runs() {
    const std::lock_guard lock(mutex_);
    return total_runs_;
  }
  Twins(const Twins&) = delete;
  Twins& operator=(const Twins&) = delete;
  ~Twins() { join(); }
  // Stops the twins (a run under way is not kept) and hands over each one's timed runs.
  std::vector<Runs> finish() {
    join();
    if (error_) std::rethrow_exception(error_);
    return std::move(runs_);
  }

 private:
  void join() {
    stop_ = true;
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }
  std::vector<std::unique_ptr<Executor>> executors_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> timing_{false};
  std::mutex mutex_;
  std::condition_variable warmed_;
  size_t warm_ = 0;
  int64_t total_runs_ = 0;
  std::vector<Runs> runs_;  // per twin, the runs it started once the timing began
  std::exception_ptr error_;
};

// Ranks sharing a node wait for the slowest of them (the gradient all-reduce, the next stage's message), and the
// cores of a shared machine need not be alike (a VM's vCPU whose host core another tenant's thread shares runs up
// to 1.5× slower than its neighbour): the runs of the executor with the largest median wall time, of the timed
// one and the twins that kept at least as many runs as ProfileOptions::repeats (fewer would be a noisy median).
// Returns the index into `all` (0: the timed executor).
size_t slowest_executor(const std::vector<const Runs*>& all, int repeats) {
  size_t slowest = 0;
  for (size_t i = 1; i < all.size(); ++i)
    if (static_cast<int>(all[i]->walls.size()) >= std::max(1, repeats) &&
        median(all[i]->walls) > median(all[slowest]->walls))
      slowest = i;
  return slowest;
}

}  // namespace

ProfileResult profile_model(const ImportedModel& model, const ImportOptions& import, const ProfileOptions& options) {
  options.validate();
  const TaskGraph& fg = model.graph;
  const size_t num_tasks = fg.num_tasks();
  ProfileResult result;
  result.warmup = options.warmup;
  result.threads = compute_threads();
  result.ranks_per_node = options.ranks_per_node;

  Backend& backend = options.backend ? *options.backend : cpu_backend();
  const bool on_cpu = backend.kind() == BackendKind::kCpu;
  const std::string device = !options.device.empty() ? options.device : on_cpu ? "cpu" : std::string(backend_name(backend.kind()));
  result.backend = backend.describe();

  // Analytic costs on the measured device (its preset, when it has one): FLOPs, bytes, saved/param bytes, and the
  // backward ratio.
  CostOptions cost_options;
  cost_options.reference_batch = model.bound_samples();
  const std::vector<std::string> presets = device_preset_names();
  const bool has_preset = std::find(presets.begin(), presets.end(), device) != presets.end();
  const CostTable analytic = estimate_costs(fg, has_preset ? device_preset(device) : cpu_device(), cost_options);
  result.table = analytic;
  if (options.on_warning)
    for (const auto& w : analytic.warnings) options.on_warning(w);
  result.table.source = "measured";
  result.table.device = device;
  result.table.microbatch_size = cost_options.reference_batch;

  const fs::path path(model.path);
  onnx::ModelProto forward = load_model_proto(path, import);  // node indices as the task graph's
  // Values do not change kernel times (no data-dependent paths besides NaN/denormals), so apart train's random
  // init serves: finite, well-scaled, and float32 masters for a half model's initializers.
  if (options.random_params) randomize_params(forward, options.seed);
  widen_half_precision(forward, path.parent_path());  // a float16/bfloat16 model trains in float32, as in apart train
  // The training graph's inputs have static shapes already (binding dims again would be refused).
  ImportOptions exec_import;
  exec_import.require_external_data = true;

  // Training graph when there is a loss and every op on its path has a gradient rule.
  std::optional<TrainingGraph> training;
  if (!options.loss.empty() || has_scalar_float_output(fg)) {
    TrainingGraphOptions tg_options;
    tg_options.loss = options.loss;
    tg_options.import = import;
    // Node for node: each measured kernel is a forward task's, or its backward's (the planner's graph is unfused).
    tg_options.fuse_attention = false;
    if (options.on_progress) options.on_progress("building the training graph");
    try {
      training = build_training_graph(forward, tg_options);
    } catch (const Unsupported& e) {
      result.backward_note = std::string("no training graph (") + e.what() + ")";
    }
  } else {
    result.backward_note = "the model has no scalar float output (loss)";
  }

  // Known now: say it before the runs, not after them.
  const std::string backward_warning = "backward_s not measured: " + result.backward_note +
                                       "; estimated as measured forward × the analytic backward/forward ratio";
  if (!result.backward_note.empty() && options.on_warning) options.on_warning(backward_warning);

  std::vector<std::vector<double>> fwd(num_tasks), bwd(num_tasks);  // [task][repeat]
  std::vector<int64_t> forward_nodes(num_tasks, 0), backward_nodes(num_tasks, 0);  // [task]: run-graph nodes
  int64_t nodes_run = 0;
  std::vector<double> constant_per_run, unattributed_per_run, tasks_per_run;
  ExecutorOptions exec_options;
  exec_options.time_tasks = true;  // on a device: a synchronize before and after each task (Executor::execute)
  exec_options.backend = &backend;
  exec_options.outputs_on_backend = true;  // the outputs are dropped: no copy back to the host inside the wall time
  // The twins (below) run with the same options, timing their tasks too: every executor does the same work.
  const int twins = options.ranks_per_node - 1;
  // The executor whose runs make the table (slowest_executor), and every executor's median wall, for the file.
  auto keep_slowest = [&](const Runs& timed, const std::vector<Runs>& twin_runs) -> const Runs& {
    std::vector<const Runs*> all{&timed};
    for (const Runs& r : twin_runs) all.push_back(&r);
    const size_t slowest = slowest_executor(all, options.repeats);
    result.slowest_executor = static_cast<int>(slowest);
    for (const Runs* r : all) result.executor_step_s.push_back(median(r->walls));
    return *all[slowest];
  };

  // Forward ONNX node index → forward task; raw ONNX node name (or <OpType>_<index>) → node index,
  // the scope autodiff gives a node's backward (first one wins for repeated names).
  std::vector<int64_t> task_of_node(static_cast<size_t>(forward.graph().node_size()), -1);
  for (uint32_t t = 0; t < num_tasks; ++t) {
    const int32_t k = fg.task(TaskId(t)).onnx_node_index;
    if (k >= 0 && static_cast<size_t>(k) < task_of_node.size()) task_of_node[static_cast<size_t>(k)] = t;
  }
  std::unordered_map<std::string, int64_t> task_of_scope;
  for (int k = 0; k < forward.graph().node_size(); ++k) {
    const auto& n = forward.graph().node(k);
    task_of_scope.emplace(n.name().empty() ? n.op_type() + "_" + std::to_string(k) : n.name(), task_of_node[static_cast<size_t>(k)]);
  }
  // The loss seed is part of the loss task's backward.
  int64_t loss_task = -1;
  if (training) {
    for (uint32_t t = 0; t < num_tasks; ++t)
      for (ValueId o : fg.task(TaskId(t)).outputs)
        if (o.valid() && fg.value(o).name == training->loss_output) loss_task = t;
  }

  auto fold = [&](const TaskGraph& run_graph, const Runs& runs, bool backward_part) {
    // Where each task of the run graph goes: (forward task, is backward), or -1.
    std::vector<std::pair<int64_t, bool>> dest(run_graph.num_tasks(), {-1, false});
    for (uint32_t i = 0; i < run_graph.num_tasks(); ++i) {
      const Task& task = run_graph.task(TaskId(i));
      if (!backward_part || task.name.rfind("grad/", 0) != 0) {
        const int32_t k = task.onnx_node_index;
        if (k >= 0 && static_cast<size_t>(k) < task_of_node.size()) dest[i] = {task_of_node[static_cast<size_t>(k)], false};
      } else {
        const std::string scope = forward_scope_of(task.name);
        auto it = task_of_scope.find(scope);
        if (it != task_of_scope.end()) dest[i] = {it->second, true};
        else if (scope == "seed") dest[i] = {loss_task, true};
      }
    }
    // The nodes that ran each step (constants folded at load did not: 0 s), per task forward and backward: the
    // executor's work outside the kernels is charged per node (see below).
    if (!runs.task_seconds.empty())
      for (uint32_t i = 0; i < run_graph.num_tasks(); ++i) {
        if (!(runs.task_seconds.front()[i] > 0)) continue;
        ++nodes_run;
        const auto [t, is_backward] = dest[i];
        if (t >= 0) ++(is_backward ? backward_nodes : forward_nodes)[static_cast<size_t>(t)];
      }
    for (const auto& seconds : runs.task_seconds) {
      std::vector<double> f(num_tasks, 0.0), b(num_tasks, 0.0);
      double constant = 0, unattributed = 0, total = 0;
      for (size_t i = 0; i < seconds.size(); ++i) {
        total += seconds[i];
        const auto [t, is_backward] = dest[i];
        if (t < 0) {
          unattributed += seconds[i];
          continue;
        }
        if (fg.task(TaskId(static_cast<uint32_t>(t))).constant) constant += seconds[i];
        (is_backward ? b : f)[static_cast<size_t>(t)] += seconds[i];
      }
      for (size_t t = 0; t < num_tasks; ++t) {
        fwd[t].push_back(f[t]);
        bwd[t].push_back(b[t]);
      }
      constant_per_run.push_back(constant);
      unattributed_per_run.push_back(unattributed);
      tasks_per_run.push_back(total);
    }
  };

  if (training) {
    Executor executor(training->model, path.parent_path(), exec_options, exec_import);
    Twins running(twins, training->model, path.parent_path(), exec_options, exec_import, options.seed);
    const Runs timed = time_runs(executor, synthetic_inputs(executor.model().graph, options.seed), options,
                                 [&] { running.wait_until_warm(); });
    const std::vector<Runs> twin_runs = running.finish();
    result.twin_runs = running.runs();
    const Runs& runs = keep_slowest(timed, twin_runs);
    fold(executor.model().graph, runs, true);
    result.fallback_ops = executor.fallback_ops();
    result.step_s = median(runs.walls);
    result.timed_s = std::accumulate(runs.walls.begin(), runs.walls.end(), 0.0);
    result.repeats = static_cast<int>(runs.walls.size());
    result.training_tasks = static_cast<int64_t>(executor.model().graph.num_tasks());
    result.backward_measured = true;
  } else {
    // The forward alone (its params possibly randomized above).
    ImportOptions forward_import = import;
    forward_import.require_external_data = true;
    auto executor = std::make_unique<Executor>(forward, path.parent_path(), exec_options, forward_import);
    Twins running(twins, forward, path.parent_path(), exec_options, forward_import, options.seed);
    forward.Clear();
    const Runs timed = time_runs(*executor, synthetic_inputs(executor->model().graph, options.seed), options,
                                 [&] { running.wait_until_warm(); });
    const std::vector<Runs> twin_runs = running.finish();
    result.twin_runs = running.runs();
    const Runs& runs = keep_slowest(timed, twin_runs);
    fold(executor->model().graph, runs, false);
    result.fallback_ops = executor->fallback_ops();
    result.step_s = median(runs.walls);
    result.timed_s = std::accumulate(runs.walls.begin(), runs.walls.end(), 0.0);
    result.repeats = static_cast<int>(runs.walls.size());
    result.training_tasks = static_cast<int64_t>(executor->model().graph.num_tasks());
  }

  result.constant_s = median(constant_per_run);
  result.unattributed_s = median(unattributed_per_run);
  result.tasks_s = median(tasks_per_run);
  // The executor's own work between kernels (gathering a node's inputs, its kernel context, releasing dead values):
  // the whole run's wall time less its kernels', spread evenly over the nodes that ran. `apart run` pays it on every
  // node of every micro-batch's forward and backward, so a task's time includes its nodes' share.
  result.dispatch_s_per_node =
      nodes_run > 0 ? std::max(0.0, result.step_s - result.tasks_s) / static_cast<double>(nodes_run) : 0;
  for (size_t t = 0; t < num_tasks; ++t) {
    TaskCost& c = result.table.tasks[t];
    // Constant tasks reading params run every step too (the tied head's Transpose of the embedding table, and its
    // backward): their time per run, which does not grow with the batch; constants folded at load ran 0 times.
    c.forward_s = median(fwd[t]) + result.dispatch_s_per_node * static_cast<double>(forward_nodes[t]);
    if (result.backward_measured) {
      c.backward_s = median(bwd[t]) + result.dispatch_s_per_node * static_cast<double>(backward_nodes[t]);
    } else {
      const TaskCost& a = analytic.tasks[t];
      c.backward_s = a.forward_s > 0 ? c.forward_s * a.backward_s / a.forward_s : a.backward_s;
    }
  }
  if (!result.backward_measured) result.table.warnings.push_back(backward_warning);
  return result;
}

nlohmann::json profile_to_json(const TaskGraph& g, const ProfileResult& r) {
  nlohmann::json j = costs_to_json(g, r.table);
  j["measurement"] = {{"warmup", r.warmup},
                      {"repeats", r.repeats},
                      {"statistic", "median"},
                      {"threads", r.threads},
                      {"ranks_per_node", r.ranks_per_node},
                      {"twin_runs", r.twin_runs},
                      {"slowest_executor", r.slowest_executor},
                      {"executor_step_s", r.executor_step_s},
                      {"backend", r.backend},
                      {"cpu_fallback_ops", r.fallback_ops},
                      {"backward", r.backward_measured ? "measured" : "estimated"},
                      {"step_s", r.step_s},
                      {"timed_s", r.timed_s},
                      {"tasks_s", r.tasks_s},
                      {"constant_s", r.constant_s},
                      {"unattributed_s", r.unattributed_s},
                      {"dispatch_s_per_node", r.dispatch_s_per_node},
                      {"graph_tasks", r.training_tasks}};
  return j;
}

void write_profile_json(const fs::path& path, const TaskGraph& g, const ProfileResult& result) {
  const std::string text = profile_to_json(g, result).dump(1) + "\n";
  write_file_atomically(path, text);
}

}  // namespace apart
