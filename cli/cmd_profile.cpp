// `apart profile`: every task's forward/backward time measured on the CPU's or a GPU's kernels, as apart.costs/1 JSON.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/cli_common.h"
#include "cli/command_registry.h"
#include "cli/training_flags.h"
#include "driver/compile.h"
#include "graph/error.h"
#include "graph/text.h"
#include "importer/importer.h"
#include "profiler/device.h"
#include "train/profile.h"

namespace apart::cli {
namespace {

struct ProfileArgs {
  std::string model;
  ModelFlags model_flags;
  BackendFlags backend;
  std::string device;
  std::string loss;
  std::string init = "model";
  uint64_t seed = 0;
  int threads = 0;
  ProfileOptions options;
  std::string output;
  bool quiet = false;
};

void print_summary(const ImportedModel& m, const ProfileResult& r) {
  std::map<std::string, std::pair<double, double>> by_op;  // op → (forward, backward)
  double fwd = 0, bwd = 0;
  for (uint32_t t = 0; t < m.graph.num_tasks(); ++t) {
    const TaskCost& c = r.table.tasks[t];
    auto& [f, b] = by_op[m.graph.task(TaskId(t)).op_type];
    f += c.forward_s, b += c.backward_s, fwd += c.forward_s, bwd += c.backward_s;
  }
  std::vector<std::pair<std::string, std::pair<double, double>>> rows(by_op.begin(), by_op.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.second.first + a.second.second > b.second.first + b.second.second;
  });
  std::fprintf(stderr, "%-28s %12s %12s %7s\n", "op", "forward ms", "backward ms", "share");
  const double total = std::max(1e-30, fwd + bwd);
  for (const auto& [op, t] : rows) {
    if (t.first + t.second <= 0) continue;
    std::fprintf(stderr, "%-28s %12.3f %12.3f %6.1f%%\n", printable(op).c_str(), 1e3 * t.first, 1e3 * t.second,
                 100 * (t.first + t.second) / total);
  }
  std::fprintf(stderr, "%-28s %12.3f %12.3f\n", "total (tasks)", 1e3 * fwd, 1e3 * bwd);
  std::fprintf(stderr, "step (wall, median of %d) %.3f ms; constant tasks %.3f ms, backward not tied to a task %.3f ms%s\n",
               r.repeats, 1e3 * r.step_s, 1e3 * r.constant_s, 1e3 * r.unattributed_s,
               r.backward_measured ? "" : "; backward estimated (no loss)");
}

void run_profile(const ProfileArgs& a) {
  const std::unique_ptr<Backend> backend = make_backend(a.backend);
  ProfileOptions options = a.options;
  options.backend = backend.get();
  options.device = a.device;
  try {  // a preset's alias ("h100") stands for the preset's name, which partition --profile checks against
    if (!a.device.empty()) options.device = device_preset_name(a.device);
  } catch (const InvalidArgument&) {
    // another device's name: kept as given (no preset, analytic figures of the cpu)
  }
  options.loss = a.loss;
  options.seed = a.seed;
  if (a.init == "random") options.random_params = true;
  else if (a.init != "model") throw InvalidArgument("--init: unknown value '" + a.init + "' (use model or random)");
  options.validate();
  // Each of the node's ranks gets its share of the cores, as `apart run` gives it (training_flags.h).
  apply_threads(a.threads, options.ranks_per_node);
  if (!backend) note_blas_kernel();
  const ImportOptions import = import_options(a.model_flags);
  const ImportedModel m = import_model(a.model, import);
  note_constant_params(m.constant_params);
  if (!a.output.empty()) check_output_file(a.output, model_files(a.model, m), "-o");
  Progress progress("profile");
  options.on_progress = [&](const std::string& line) { progress(line); };
  // Warnings as soon as they are known (no loss: before minutes of runs, not after them).
  options.on_warning = [&](const std::string& w) {
    progress.finish();
    std::fprintf(stderr, "apart: warning: %s\n", printable(w).c_str());
  };
  const ProfileResult result = profile_model(m, import, options);
  progress.finish();
  if (backend) note_backend(result.backend, result.fallback_ops);
  if (!a.quiet) print_summary(m, result);
  if (a.output.empty()) {
    std::cout << profile_to_json(m.graph, result).dump(1) << "\n";
  } else {
    write_profile_json(a.output, m.graph, result);
    std::fprintf(stderr, "apart: wrote %zu measured task costs (micro-batch %lld) to %s\n", result.table.tasks.size(),
                 static_cast<long long>(result.table.microbatch_size), a.output.c_str());
  }
}

const bool kRegistered = register_command({"profile", 45, [](CLI::App& app) {
  auto args = std::make_shared<ProfileArgs>();
  CLI::App* cmd = app.add_subcommand(
      "profile", "Per-task forward/backward time measured on the CPU's or a GPU's kernels (apart.costs/1 JSON, source measured)");
  cmd->add_option("model", args->model, "ONNX model file")->required();
  add_model_flags(*cmd, args->model_flags, /*default_batch=*/1);
  add_backend_flags(*cmd, args->backend);
  cmd->add_option("--device", args->device,
                  "The device preset the times stand for, as `apart partition --profile` checks it (e.g. h200-141gb); "
                  "default: cpu, or cuda with --backend cuda");
  cmd->add_option("--warmup", args->options.warmup, "Untimed runs first")->capture_default_str();
  cmd->add_option("--repeats", args->options.repeats, "Timed runs; each task's time is their median")->capture_default_str();
  args->options.min_seconds = 1;
  cmd->add_option("--min-time", args->options.min_seconds,
                  "More timed runs past --repeats until they add up to this many seconds (at most 1000 runs; 0: off), "
                  "so that a fast model's medians are steady")
      ->capture_default_str();
  cmd->add_option("--ranks-per-node", args->options.ranks_per_node,
                  "Profile as one of N ranks of `apart run` on this machine: N - 1 twins run the same graph meanwhile "
                  "and each gets 1/N of the cores (CPU backend)")
      ->capture_default_str();
  cmd->add_option("--loss", args->loss, "Scalar output to differentiate (default: the only scalar float output)");
  cmd->add_option("--init", args->init, "Params: model (the file's weights) or random (models saved without weights)")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Seed for synthetic inputs and --init random")->capture_default_str();
  add_threads_flag(*cmd, args->threads);
  cmd->add_flag("-q,--quiet", args->quiet, "No per-op summary on stderr");
  cmd->add_option("-o,--output", args->output, "Write the JSON here (temp file + rename); default stdout");
  cmd->callback([args] { run_profile(*args); });
}});

}  // namespace
}  // namespace apart::cli
