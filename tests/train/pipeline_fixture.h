// Shared by the apart run suites: plans of a given shape (apart partition, then plan.json edited through plan/'s
// reader and writer), apart train's reference run, a plan's ranks on threads, and the equivalence check.
#pragma once

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "graph/error.h"
#include "plan/plan.h"
#include "train/pipeline.h"
#include "runtime/tensor.h"
#include "train/trainer.h"
#include "tests/support/printed_numbers.h"
#include "tests/support/read_model.h"
#include "tests/support/run_apart.h"
#include "tests/support/temp_dir.h"

namespace apart::testing {

namespace fs = std::filesystem;

// A fresh folder for one test: <name> in this process's folder for `suite` (/tmp/apart_<suite>_<pid>_<n>), which goes
// at exit, when what the test ran under mpirun is done with it.
inline fs::path scratch(const std::string& suite, const std::string& name) {
  const fs::path dir = process_temp_dir(suite) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

inline std::string gpt_tiny() { return std::string(APART_SOURCE_DIR) + "/models/gpt-tiny.onnx"; }

// What to run: stage k gets replicas[k] devices; the plan comes from apart partition (its cut of the model) and
// is then given this shape, which is what the runtime must honour.
struct Shape {
  std::vector<int> replicas;
  int64_t microbatches = 1;
  Schedule schedule = Schedule::k1F1B;
  std::vector<bool> recompute;  // by stage; empty: none
  int zero = 0;                 // the ZeRO stage of every stage with replicas
  int virtual_stages = 0;       // interleaved: chunks per device (0: partition's default, 2)
};

inline fs::path make_plan(const std::string& model, const Shape& shape, int64_t batch, const fs::path& dir) {
  const int stages = static_cast<int>(shape.replicas.size());
  const auto r = testing::run_apart("partition " + model + " --device cpu --devices " + std::to_string(stages) + " --stages " +
                                    std::to_string(stages) + " --replicas 1 --microbatches " +
                                    std::to_string(shape.microbatches) + " --batch " + std::to_string(batch) +
                                    " --schedule " + std::string(schedule_name(shape.schedule)) +
                                    (shape.virtual_stages > 0 ? " --virtual-stages " + std::to_string(shape.virtual_stages) : "") +
                                    " --no-baselines -o " + dir.string());
  EXPECT_EQ(r.code, 0) << r.out;
  PlanDocument plan = read_plan(dir);
  EXPECT_EQ(plan.stages.size(), shape.replicas.size()) << "partition did not cut " << stages << " stages";
  int device = 0;
  int total = 0;
  for (int n : shape.replicas) total += n;
  const int64_t microbatch = batch / shape.microbatches;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    PlanStageRecord& stage = plan.stages[s];
    stage.replicas = shape.replicas[s];
    stage.devices.clear();
    for (int j = 0; j < stage.replicas; ++j) stage.devices.push_back(device++);
    stage.microbatch_size = (microbatch + stage.replicas - 1) / stage.replicas;  // the planner's ⌈n / r⌉
    stage.recompute = !shape.recompute.empty() && shape.recompute[s];
    stage.zero = stage.replicas > 1 ? shape.zero : 0;
    if (stage.recompute) stage.backward_s = std::max(stage.backward_s, 2 * stage.forward_s);
  }
  plan.cluster.devices = total;
  std::ofstream(dir / "plan.json") << plan_to_json(plan).dump(2) << "\n";
  return dir;
}

struct TpShape {
  int stages = 1;
  int replicas = 1;
  int tp = 2;
  int64_t microbatches = 2;
  Schedule schedule = Schedule::k1F1B;
  int zero = 0;
  const char* recompute = "off";  // --recompute: off or on (whole stages; selective is not executed yet)
  bool sequence_parallel = false;
  int virtual_stages = 0;  // chunks per device under Schedule::kInterleaved (0: partition's default, 2)
};

// A plan of `model` (gpt-tiny by default) pinned by apart partition's own flags (--tp, --pp, --dp,
// --sequence-parallel).
inline fs::path make_tp_plan(const TpShape& shape, int64_t batch, const fs::path& dir, const std::string& model = gpt_tiny()) {
  const int devices = shape.stages * shape.replicas * shape.tp;
  const auto r = testing::run_apart(
      "partition " + model + " --device cpu --devices " + std::to_string(devices) + " --tp " + std::to_string(shape.tp) +
      " --pp " + std::to_string(shape.stages) + " --dp " + std::to_string(shape.replicas) + " --sequence-parallel " +
      (shape.sequence_parallel ? "on" : "off") +
      " --microbatches " + std::to_string(shape.microbatches) + " --batch " + std::to_string(batch) + " --schedule " +
      std::string(schedule_name(shape.schedule)) +
      (shape.virtual_stages > 0 ? " --virtual-stages " + std::to_string(shape.virtual_stages) : "") + " --zero " + std::to_string(shape.zero) + " --recompute " +
      shape.recompute + " --no-baselines -o " +
      dir.string());
  EXPECT_EQ(r.code, 0) << r.out;
  const PlanDocument plan = read_plan(dir);
  EXPECT_EQ(static_cast<int>(plan.stages.size()), shape.stages);
  if (shape.schedule == Schedule::kInterleaved) {
    EXPECT_EQ(plan.virtual_stages.size(), static_cast<size_t>(shape.stages * std::max(2, shape.virtual_stages)));
  }
  for (const PlanStageRecord& s : plan.stages) {
    EXPECT_EQ(s.tp, shape.tp);
    EXPECT_EQ(s.replicas, shape.replicas);
    EXPECT_EQ(s.sequence_parallel, shape.sequence_parallel);
  }
  return dir;
}

// `plan` (a TP plan of apart partition's) with stage k at TP degree degrees[k]: its devices renumbered in stage
// order, sequence parallelism off on a stage of degree 1 (its regions, laid out in plan.json, are then not cut).
inline fs::path with_stage_degrees(const fs::path& plan_dir, const std::vector<int>& degrees) {
  PlanDocument plan = read_plan(plan_dir);
  EXPECT_EQ(plan.stages.size(), degrees.size());
  int device = 0;
  for (size_t k = 0; k < plan.stages.size(); ++k) {
    PlanStageRecord& stage = plan.stages[k];
    stage.tp = degrees[k];
    if (stage.tp == 1) stage.sequence_parallel = false;
    stage.devices.clear();
    for (int d = 0; d < stage.replicas * stage.tp; ++d) stage.devices.push_back(device++);
  }
  plan.cluster.devices = device;
  std::ofstream(plan_dir / "plan.json") << plan_to_json(plan).dump(2) << "\n";
  return plan_dir;
}

// apart zoo's `family` (gpt, bert, t5) at 2 layers, 4 heads, hidden 64, 16 positions, 128 words: dir/<family>.onnx.
inline fs::path zoo_model(const std::string& family, const fs::path& dir) {
  const fs::path model = dir / (family + ".onnx");
  const auto z = testing::run_apart("zoo " + family + " --layers 2 --hidden 64 --heads 4 --seq 16 --vocab 128 -q -o " +
                                    model.string());
  EXPECT_EQ(z.code, 0) << z.out;
  return model;
}

struct Weights {
  std::map<std::string, Tensor> by_name;
};
inline Weights read_weights(const fs::path& model) {
  Weights w;
  const onnx::ModelProto proto = testing::read_proto(model);
  for (const auto& init : proto.graph().initializer()) w.by_name[init.name()] = tensor_from_proto(init, model.parent_path());
  return w;
}

struct Outcome {
  std::vector<double> losses;
  Weights weights;
  std::vector<RunResult> ranks;
};

inline Outcome train_reference(const std::string& model, int64_t batch, int64_t steps, const fs::path& dir, double lr = 0.05,
                               Optimizer optimizer = Optimizer::kSgd) {
  TrainOptions o;
  o.model = model;
  o.batch = batch;
  o.steps = steps;
  o.optimizer.kind = optimizer;
  o.optimizer.lr = lr;
  o.seed = 3;
  o.save_model = (dir / "reference.onnx").string();
  Outcome out;
  for (const StepRecord& s : train(o).steps) out.losses.push_back(s.loss);
  out.weights = read_weights(o.save_model);
  return out;
}

// Runs `body(rank, comm)` for every rank of a `world`-rank in-process communicator, one thread each, and returns
// what each rank threw (nullptr: it returned).
inline std::vector<std::exception_ptr> run_ranks(int world, const CommOptions& options,
                                                 const std::function<void(int rank, Communicator& comm)>& body) {
  auto comms = make_in_process_communicators(world, options);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r, *comms[static_cast<size_t>(r)]);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

inline std::string error_message(const std::exception_ptr& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "(not a std::exception)";
  }
}

// What run_ranks returned when every rank must refuse: each threw InvalidArgument whose message holds `text`.
inline void expect_every_rank_refuses(const std::vector<std::exception_ptr>& errors, const std::string& text) {
  for (size_t r = 0; r < errors.size(); ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " did not refuse: " << text;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const InvalidArgument& x) {
      EXPECT_NE(std::string(x.what()).find(text), std::string::npos) << x.what();
    } catch (const std::exception& x) {
      ADD_FAILURE() << "rank " << r << ": not InvalidArgument: " << x.what();
    }
  }
}

// `apart run <args>` as `ranks` processes under mpirun (allowed as root, as CI runs), stderr with stdout.
inline testing::CommandRun mpirun_apart_run(int ranks, const std::string& args) {
  return testing::run_command(
      "ASAN_OPTIONS=detect_leaks=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --timeout 120 "
      "--oversubscribe -np " + std::to_string(ranks) + " " + std::string(APART_BINARY) + " run " + args + " 2>&1");
}

// "<rank> peak tensor memory 4.62 MiB; the plan estimates 2.73 MiB …" as apart run prints it for the rank whose
// prefix is `rank` ("[rank 0/2 stage 0 replica 0]") → {measured, planned} bytes; {0, 0} when the line is missing.
inline std::pair<double, double> peak_and_plan(const std::string& out, const std::string& rank) {
  auto bytes_at = [&](size_t at) {
    size_t used = 0;
    const double v = std::stod(out.substr(at), &used);
    const std::string unit = out.substr(at + used + 1, 3);
    return v * (unit == "GiB" ? 1 << 30 : unit == "MiB" ? 1 << 20 : unit == "KiB" ? 1 << 10 : 1);
  };
  const std::string head = rank + " peak tensor memory ";
  const size_t line = out.find(head);
  if (line == std::string::npos) return {0, 0};
  const size_t peak = line + head.size();
  const size_t plan = out.find("the plan estimates ", peak) + std::string("the plan estimates ").size();
  return {bytes_at(peak), bytes_at(plan)};
}

inline int plan_world(const fs::path& plan_dir) { return plan_devices(read_plan(plan_dir)); }  // replicas × tp

// What apart run computes for the plan with train_reference's flags (SGD, lr 0.05, seed 3), on threads.
inline RunOptions run_options_like_reference(const fs::path& plan_dir, int64_t steps, Optimizer optimizer = Optimizer::kSgd,
                                             double lr = 0.05) {
  RunOptions o;
  o.plan = plan_dir.string();
  o.steps = steps;
  o.optimizer.kind = optimizer;
  o.optimizer.lr = lr;
  o.optimizer_from_plan = false;
  o.seed = 3;
  return o;
}

// `checkpoint_dir` / `resume`: RunOptions' fields of those names ("" = none). `backend_of_rank`: each rank's backend
// (RunOptions::backend; none: the CPU).
inline Outcome run_threads(const fs::path& plan_dir, int64_t steps, const fs::path& dir, Optimizer optimizer = Optimizer::kSgd,
                           double lr = 0.05, const std::string& checkpoint_dir = "", const std::string& resume = "",
                           const std::function<Backend*(int rank)>& backend_of_rank = {}) {
  const int world = plan_world(plan_dir);
  RunOptions o = run_options_like_reference(plan_dir, steps, optimizer, lr);
  fs::create_directories(dir);
  o.save_model = (dir / "run.onnx").string();
  o.checkpoint_dir = checkpoint_dir;
  o.resume = resume;
  Outcome out;
  out.ranks.resize(static_cast<size_t>(world));
  const auto errors = run_ranks(world, CommOptions{60}, [&](int r, Communicator& comm) {
    RunOptions mine = o;
    if (backend_of_rank) mine.backend = backend_of_rank(r);
    out.ranks[static_cast<size_t>(r)] = run_plan(mine, comm);
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(error_message(errors[static_cast<size_t>(r)]), "") << "rank " << r;
  if (errors[0]) return out;
  for (const StepRecord& s : out.ranks[0].steps) out.losses.push_back(s.loss);
  out.weights = read_weights(o.save_model);
  return out;
}

// Summation order differs (micro-batch gradients are added, replicas all-reduced, then scaled by 1/(m·r)), so
// float32 results agree to rounding, not bitwise. Losses: 2e-5 relative. Weights: what K SGD steps changed, per
// param tensor, ‖Δrun − Δref‖ ≤ 1e-3 ‖Δref‖ (a 1 % error in any gradient fails it; rounding in Δ of weights near
// 1 is ~1e-4 of it).
inline void expect_same_training(const Outcome& reference, const Outcome& run, const Weights& initial, const std::string& what) {
  ASSERT_EQ(run.losses.size(), reference.losses.size()) << what;
  ASSERT_FALSE(run.losses.empty());
  for (size_t i = 0; i < run.losses.size(); ++i)
    EXPECT_NEAR(run.losses[i], reference.losses[i], 2e-5 * std::abs(reference.losses[i])) << what << ": step " << i + 1;
  ASSERT_EQ(run.weights.by_name.size(), reference.weights.by_name.size()) << what;
  int compared = 0;
  for (const auto& [name, ref] : reference.weights.by_name) {
    auto it = run.weights.by_name.find(name);
    ASSERT_NE(it, run.weights.by_name.end()) << what << ": " << name;
    if (ref.dtype() != DType::kFloat32) continue;
    const auto w0 = initial.by_name.at(name).span<const float>();
    const auto a = ref.span<const float>();
    const auto b = it->second.span<const float>();
    ASSERT_EQ(a.size(), b.size()) << name;
    double diff = 0, update = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double da = double(a[i]) - w0[i], db = double(b[i]) - w0[i];
      diff += (da - db) * (da - db);
      update += da * da;
    }
    if (update == 0) {
      EXPECT_EQ(diff, 0) << what << ": param " << name << " moved in the run only";
      continue;
    }
    // + 1e-9: a param whose true update is 0 moves by rounding only (BERT's key bias: softmax ignores a shift of
    // every score), where a relative bar means nothing.
    EXPECT_LE(std::sqrt(diff), 1e-3 * std::sqrt(update) + 1e-9) << what << ": param " << name;
    ++compared;
  }
  EXPECT_GT(compared, 0) << what;
}

// `apart run PLAN` as `ranks` processes under mpirun (3 AdamW steps, lr 1e-3, seed 3, the model saved) and the same
// plan on threads (in `dir`): the threads' outcome and the saved weights. The step-3 loss the run prints (6 decimals)
// matches the threads' to printed_loss_tolerance: MPI's collectives may add in another order, so nothing is bitwise.
// Call it under ASSERT_NO_FATAL_FAILURE.
inline void run_under_mpirun_and_on_threads(int ranks, const fs::path& plan, const fs::path& dir, const std::string& what,
                                            Outcome* threads, Weights* saved) {
  const fs::path model = dir / (what + ".onnx");
  const auto r = mpirun_apart_run(ranks, plan.string() + " --steps 3 --optimizer adamw --lr 1e-3 --seed 3 --save-model " +
                                             model.string());
  ASSERT_EQ(r.code, 0) << what << "\n" << r.out;
  *saved = read_weights(model);
  *threads = run_threads(plan, 3, dir / (what + "_threads"), Optimizer::kAdamW, 1e-3);
  ASSERT_EQ(threads->losses.size(), 3u);
  const auto printed = testing::number_after(r.out, "step=3 loss=");
  ASSERT_TRUE(printed.has_value()) << r.out;
  EXPECT_NEAR(*printed, threads->losses[2], testing::printed_loss_tolerance(threads->losses[2])) << what << "\n"
                                                                                                 << r.out;
}

// The same params with the same bytes.
inline bool bitwise_equal(const Weights& a, const Weights& b) {
  if (a.by_name.size() != b.by_name.size()) return false;
  for (const auto& [name, t] : a.by_name) {
    auto it = b.by_name.find(name);
    if (it == b.by_name.end() || it->second.bytes() != t.bytes() ||
        std::memcmp(it->second.raw(), t.raw(), static_cast<size_t>(t.bytes())) != 0)
      return false;
  }
  return true;
}

// A resumed run equals an uninterrupted one: `steps` steps straight on plan `from`, and steps / 2 on `from` saved into
// dir/ck (left there for the caller to inspect) then resumed on plan `to` (`from` itself, or another plan of the same
// layout: the resharding path) up to `steps`, give the same per-step losses and the same weights, bit for bit;
// `resumed` (when given) gets the resumed run's outcome. Call it under ASSERT_NO_FATAL_FAILURE.
inline void expect_resumes_bitwise(const fs::path& from, const fs::path& to, const fs::path& dir, Optimizer optimizer,
                                   double lr, const std::string& what, size_t steps = 4, Outcome* resumed = nullptr) {
  const Outcome straight = run_threads(from, static_cast<int64_t>(steps), dir / "straight", optimizer, lr);
  const fs::path ck = dir / "ck";
  fs::create_directories(ck);
  const Outcome first = run_threads(from, static_cast<int64_t>(steps / 2), dir / "first", optimizer, lr, ck.string());
  const Outcome rest = run_threads(to, static_cast<int64_t>(steps), dir / "rest", optimizer, lr, "", ck.string());
  ASSERT_EQ(straight.losses.size(), steps) << what;
  ASSERT_EQ(first.losses.size(), steps / 2) << what;
  ASSERT_EQ(rest.losses.size(), steps - steps / 2) << what;
  for (size_t i = 0; i < steps; ++i)
    EXPECT_EQ(i < steps / 2 ? first.losses[i] : rest.losses[i - steps / 2], straight.losses[i]) << what << ": step " << i + 1;
  EXPECT_TRUE(bitwise_equal(rest.weights, straight.weights)) << what;
  if (resumed) *resumed = rest;
}

// Each rank trained a strict part of the model: the plan was really split.
inline void expect_split(const Outcome& run, int64_t total_params) {
  for (const RunResult& r : run.ranks) {
    if (run.ranks.size() > 1 && r.role.stage >= 0) {
      bool pipelined = false;
      for (const RunResult& other : run.ranks) pipelined = pipelined || other.role.stage != r.role.stage;
      if (pipelined) {
        EXPECT_LT(r.params, total_params) << "stage " << r.role.stage;
      }
    }
  }
}

inline int64_t total_params(const Weights& w) {
  int64_t n = 0;
  for (const auto& [name, t] : w.by_name)
    if (t.dtype() == DType::kFloat32) n += t.elements();
  return n;
}

}  // namespace apart::testing
