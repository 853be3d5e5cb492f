// `apart run PLAN`: carries out a plan, one process per device (mpirun -np N), or all ranks as threads here
// (--in-process); prints each step as `apart train` does, from the rank that holds the loss.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "cli/cli_common.h"
#include "cli/command_registry.h"
#include "cli/training_flags.h"
#include "graph/checked.h"
#include "graph/error.h"
#include "graph/units.h"
#include "plan/plan.h"
#include "runtime/cuda/cuda_entry.h"
#include "train/pipeline.h"
#include "train/preemption.h"

namespace apart::cli {
namespace {

struct RunArgs : LoopFlags {
  std::string plan;
  bool optimizer_given = false;
  std::string trace;
  bool trace_all_steps = false;
  bool in_process = false;
  double comm_timeout_s = 300;
  std::string device_comm = "auto";  // --device-comm: auto (nccl on a GPU), nccl, host
  bool precision_given = false;  // else the plan's training.precision
};

std::string join(const std::vector<std::string>& names) {
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  return list;
}

std::string prefix(const RunResult& r, int rank) {
  return "[rank " + std::to_string(rank) + "/" + std::to_string(r.world) + " stage " + std::to_string(r.role.stage) +
         " replica " + std::to_string(r.role.replica) + "]";
}

// torchrun's variables, when set, must agree with the launcher's rank and size.
void check_torchrun_env(int rank, int size) {
  auto number = [](const char* name) -> int64_t {
    const char* v = std::getenv(name);
    if (!v) return -1;
    try {
      return checked_integer(static_cast<int64_t>(std::stoll(v)), int64_t{0}, limits::kMaxDevices, name);
    } catch (const std::logic_error&) {
      throw InvalidArgument(std::string("environment variable ") + name + "='" + v + "' is not a number");
    }
  };
  const int64_t world = number("WORLD_SIZE"), r = number("RANK");
  const int64_t local_rank = number("LOCAL_RANK"), local_size = number("LOCAL_WORLD_SIZE");
  const int64_t launcher_local_rank = number("OMPI_COMM_WORLD_LOCAL_RANK");
  if (local_rank >= 0 && local_size >= 0 && local_rank >= local_size)
    throw InvalidArgument("LOCAL_RANK=" + std::to_string(local_rank) + " is not below LOCAL_WORLD_SIZE=" + std::to_string(local_size));
  if (local_rank >= 0 && launcher_local_rank >= 0 && local_rank != launcher_local_rank)
    throw InvalidArgument("LOCAL_RANK=" + std::to_string(local_rank) + " but mpirun made this process local rank " +
                          std::to_string(launcher_local_rank) + " of its node (torchrun's variables must agree with it)");
  if (local_rank >= size) throw InvalidArgument("LOCAL_RANK=" + std::to_string(local_rank) + " is not below the launcher's " + std::to_string(size) + " processes");
  if (world >= 0 && world != size)
    throw InvalidArgument("WORLD_SIZE=" + std::to_string(world) + " but the launcher started " + std::to_string(size) +
                          " processes: apart run takes its ranks from mpirun (torchrun's variables must agree with it)");
  if (r >= 0 && r != rank)
    throw InvalidArgument("RANK=" + std::to_string(r) + " but this process is rank " + std::to_string(rank) + " of the launcher");
}

// How many processes of this run share this node's cores: the launcher's local size (Open MPI, torchrun, MPICH),
// else all of them (one node).
int ranks_on_this_node(int world_size) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS"}) {
    const char* v = std::getenv(name);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end == '\0' && n >= 1 && n <= world_size) return static_cast<int>(n);
  }
  return world_size;
}

void report_step(const RunResult& r, int rank, const StepRecord& s, StepLog& log, bool quiet) {
  const std::string line = log.step(s);
  if (quiet) return;
  std::printf("%s %s\n", prefix(r, rank).c_str(), line.c_str());
  std::fflush(stdout);
}

void summary(const RunResult& r, int rank, const RunArgs& a) {
  std::printf("%s ran %lld steps of %s on %d ranks: loss %.4f -> %.4f, %s samples/s, %.2f s (+%.2f s setup); "
              "this rank trains %s params (%lld tensors), arena %s, optimizer state %s, gradients %s%s; data: %s\n",
              prefix(r, rank).c_str(), static_cast<long long>(r.steps.size()), a.plan.c_str(), r.world,
              r.steps.front().loss, r.steps.back().loss, format_significant(r.samples_per_s).c_str(), r.seconds,
              r.setup_seconds, format_count(static_cast<double>(r.params)).c_str(), static_cast<long long>(r.param_tensors),
              format_bytes(static_cast<double>(r.arena_bytes)).c_str(),
              format_bytes(static_cast<double>(r.optimizer_state_bytes)).c_str(),
              format_bytes(static_cast<double>(r.gradient_bytes)).c_str(),
              r.zero > 0 ? (" (ZeRO-" + std::to_string(r.zero) + ": sharded over the stage's replicas)").c_str() : "",
              r.data_description.c_str());
  if (r.planned_memory_bytes > 0)
    std::printf("%s peak tensor memory %s%s; the plan estimates %s for a device of stage %d\n", prefix(r, rank).c_str(),
                format_bytes(static_cast<double>(r.peak_tensor_bytes)).c_str(),
                a.in_process ? " (every in-process rank together)" : "",
                format_bytes(static_cast<double>(r.planned_memory_bytes)).c_str(), r.role.stage);
  if (!a.save_model.empty()) std::printf("trained model: %s\n", a.save_model.c_str());
  if (!a.trace.empty())
    std::printf("trace: %s (%s; open in https://ui.perfetto.dev, compare with apart simulate %s --compare %s)\n",
                a.trace.c_str(), a.trace_all_steps ? "every step" : "the last step", a.plan.c_str(), a.trace.c_str());
  std::fflush(stdout);
}

RunOptions run_options(const RunArgs& a) {
  RunOptions o;
  fill_loop_options(a, o);
  o.plan = a.plan;
  o.loss = apply_loss_flags(a.loss, LossFlagUse::kFormOrOutput, o.added_loss);
  o.optimizer_from_plan = !a.optimizer_given;
  o.trace = a.trace;
  o.trace_all_steps = a.trace_all_steps;
  return o;
}

// `local_rank`: the GPU of an in-process rank (a launcher's LOCAL_RANK wins); `ranks_on_node`: the ranks sharing this
// node's GPUs (NCCL holds one rank per GPU).
void run_rank(const RunOptions& options, Communicator& comm, const RunArgs& a, int local_rank, int ranks_on_node,
              StepLog& log) {
  const std::unique_ptr<Backend> backend = make_backend(a.backend, local_rank);
  RunOptions o = options;
  o.backend = backend.get();
  // Stage boundaries and bucket all-reduces over NCCL on the GPU's buffers (collective: every rank decides alike, by
  // the same flags); the host path (MPI or threads) otherwise.
  const bool on_gpu = backend && backend->kind() == BackendKind::kCuda;
  const bool gpu_each = ranks_on_node <= cuda_device_count();  // NCCL refuses two ranks on one GPU
  const bool nccl = a.device_comm == "nccl" || (a.device_comm == "auto" && on_gpu && gpu_each);
  std::unique_ptr<Communicator> device_world;
  if (nccl) {
    if (!on_gpu) throw InvalidArgument("--device-comm nccl moves GPU buffers: it needs --backend cuda");
    if (!gpu_each)
      throw InvalidArgument("--device-comm nccl: " + std::to_string(ranks_on_node) + " ranks share this node's " +
                            std::to_string(cuda_device_count()) + " GPU(s), and NCCL holds one rank per GPU; use "
                            "--device-comm host (or auto)");
    CommOptions nccl_options;
    nccl_options.timeout_s = a.comm_timeout_s;  // a dead peer aborts the communicator after this, naming the operation
    device_world = cuda::make_nccl_communicator(comm, *backend, nccl_options);
    o.device_world = device_world.get();
  }
  const RunResult r = run_plan(o, comm, [&](const RunResult& run, const StepRecord& s) {
    if (run.reports) report_step(run, comm.rank(), s, log, a.quiet);
  });
  if (backend && !a.quiet && !r.fallback_ops.empty())
    std::fprintf(stderr, "%s backend %s; ops on the CPU kernel (no %s kernel): %s\n", prefix(r, comm.rank()).c_str(),
                 r.backend.c_str(), a.backend.backend.c_str(), join(r.fallback_ops).c_str());
  if (!a.quiet && r.role.tp_rank == 0 && r.role.replica == 0 && !r.tp_whole_regions.empty())
    std::fprintf(stderr, "%s note: stage %d computes %zu tensor-parallel region(s) whole on every TP rank (a stage "
                 "boundary cutting them, or the reason given): %s\n", prefix(r, comm.rank()).c_str(), r.role.stage, r.tp_whole_regions.size(),
                 join(r.tp_whole_regions).c_str());
  if (r.stopped_by_signal) {
    // Every rank stopped after the same step (the step's all-reduce); rank 0 says where and how to go on.
    if (comm.rank() == 0) {
      const long long at = static_cast<long long>(r.steps.empty() ? r.first_step : r.steps.back().step);
      const std::string by = r.stopped_by_signal > 0 ? stop_signal_name(r.stopped_by_signal) : "another rank's stop signal";
      if (a.checkpoint_dir.empty())
        std::fprintf(stderr, "apart run: stopped by %s after step %lld of %lld on every rank; no --checkpoint-dir was "
                     "given, so nothing was saved\n", by.c_str(), at, static_cast<long long>(a.steps));
      else
        std::fprintf(stderr, "apart run: stopped by %s after step %lld of %lld on every rank; checkpoint of step %lld: "
                     "%s/step_%lld\nresume with: %s\n", by.c_str(), at, static_cast<long long>(a.steps), at,
                     a.checkpoint_dir.c_str(), at,
                     resume_command(a.checkpoint_dir, launched_by_mpi() ? "mpirun -np " + std::to_string(comm.size()) + " " : "").c_str());
    }
    throw StoppedBySignal("stopped by a signal");
  }
  if (r.reports) summary(r, comm.rank(), a);
}

void run_command(RunArgs a) {
  // What the plan was priced at is what runs, unless --precision says otherwise.
  const PlanDocument plan = read_plan(a.plan);
  if (!a.precision_given) {
    a.backend.precision = std::string(precision_name(plan.training.precision));
    if (plan.training.precision != Precision::kFp32 && !a.quiet)
      std::fprintf(stderr, "apart: note: running at the plan's precision, %s (--precision fp32 to override)\n",
                   a.backend.precision.c_str());
  }
  const RunOptions o = run_options(a);
  const StopSignals stop_signals;  // SIGTERM/SIGINT/SIGUSR1: every rank finishes the step, checkpoints it, exits 75
  checked_number(a.comm_timeout_s, 1, 86400, "--comm-timeout");
  std::vector<InputFile> inputs = plan_inputs(a.plan);
  if (!a.model.empty()) inputs.push_back({"the model", a.model});
  StepLog log(a.log, inputs, a.steps);  // the rank that reports the loss logs; the others never touch it
  CommOptions comm_options;
  comm_options.timeout_s = a.comm_timeout_s;
  if (launched_by_mpi()) {
    std::unique_ptr<Communicator> world = make_mpi_communicator(comm_options);
    check_torchrun_env(world->rank(), world->size());
    const int threads = apply_threads(a.training.threads, ranks_on_this_node(world->size()));
    if (world->rank() == 0) {  // one note per run, not one per rank
      if (a.backend.backend == "cpu") note_blas_kernel();
      if (!a.quiet) std::fprintf(stderr, "apart run: %d kernel thread(s) per rank (--threads)\n", threads);
    }
    run_rank(o, *world, a, 0, ranks_on_this_node(world->size()), log);
    return;
  }
  const int devices = plan_devices(plan);
  if (devices > 1 && !a.in_process)
    throw InvalidArgument("the plan " + a.plan + " runs on " + std::to_string(devices) + " processes: launch it with mpirun -np " +
                          std::to_string(devices) + " apart run " + a.plan + " (or pass --in-process to run its ranks as "
                          "threads of this process)");
  // The ranks are threads of this process: each gets its share of the cores (parallel_for's count is global).
  apply_threads(a.training.threads, devices);
  if (a.backend.backend == "cpu") note_blas_kernel();
  // Every rank on its own thread; the first error that is not a consequence of another rank's failure wins.
  auto comms = make_in_process_communicators(devices, comm_options);
  std::mutex lock;
  std::exception_ptr root, consequence;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < devices; ++rank)
    threads.emplace_back([&, rank] {
      try {
        run_rank(o, *comms[static_cast<size_t>(rank)], a, rank, devices, log);
      } catch (const CommError&) {
        std::lock_guard<std::mutex> g(lock);
        if (!consequence) consequence = std::current_exception();
      } catch (...) {
        std::lock_guard<std::mutex> g(lock);
        if (!root) root = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (root) std::rethrow_exception(root);
  if (consequence) std::rethrow_exception(consequence);
}

const bool kRegistered = register_command({"run", 65, [](CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Carry out a plan: mpirun -np N apart run PLAN_DIR (pipeline stages, replicas, micro-batches; docs/runtime.md)");
  cmd->add_option("plan", args->plan, "The plan folder apart partition wrote")->required();
  cmd->add_option("--model", args->model, "The model the plan was made for (default: plan.json's model.path; its sha256 must match)");
  add_loss_flags(*cmd, args->loss, LossFlagUse::kFormOrOutput);
  cmd->add_option("--steps", args->steps, "Optimizer steps")->capture_default_str();
  add_training_flags(*cmd, args->training, "sgd, momentum, adam or adamw (default: the plan's training.optimizer)");
  add_backend_flags(*cmd, args->backend, /*precision_from_plan=*/true);
  cmd->add_option("--save-model", args->save_model, "Gather every stage's trained weights into one ONNX model here (rank 0 writes it)");
  cmd->add_option("--checkpoint-dir", args->checkpoint_dir,
                  "Every rank writes its shard here (params, optimizer state), then rank 0 the manifest: at the end and --save-every");
  cmd->add_option("--save-every", args->save_every, "Also checkpoint every N steps");
  cmd->add_option("--keep-last", args->keep_last,
                  "Keep the newest N checkpoint folders (DIR/step_K, each resumable alone); older ones are deleted, "
                  "each announced")->capture_default_str();
  cmd->add_option("--resume", args->resume, "Continue from this checkpoint folder (same plan, same rank count)");
  cmd->add_option("--trace", args->trace,
                  "Write the measured timeline of the last step here (Chrome trace, as apart simulate --trace; rank 0 writes it)");
  cmd->add_flag("--trace-all-steps", args->trace_all_steps, "With --trace: every step, not only the last");
  cmd->add_flag("--in-process", args->in_process, "Run every rank as a thread of this process (no mpirun; for small plans)");
  cmd->add_option("--comm-timeout", args->comm_timeout_s, "Seconds a rank waits for a message before the run fails")->capture_default_str();
  cmd->add_option("--device-comm", args->device_comm,
                  "Stage boundaries and gradient all-reduces: auto (NCCL under --backend cuda with a GPU per rank), "
                  "nccl, or host (MPI or threads, through host buffers)")
      ->check(CLI::IsMember({"auto", "nccl", "host"}))
      ->capture_default_str();
  add_step_log_flags(*cmd, args->log);
  cmd->add_flag("-q,--quiet", args->quiet, "Print only the summary");
  cmd->callback([args, cmd] {
    args->optimizer_given = cmd->count("--optimizer") > 0;
    args->precision_given = cmd->count("--precision") > 0;
    run_command(*args);
  });
}});

}  // namespace
}  // namespace apart::cli
