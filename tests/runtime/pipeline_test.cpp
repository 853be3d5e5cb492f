// apart run against apart train: a plan's ranks (threads over the in-process communicator) compute what one
// process computes on the whole batch — per-step losses and the weights after K steps — for pipelines, replicas,
// stages with different replica counts, recomputation, GPipe and 1F1B, several micro-batch counts.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "graph/error.h"
#include "models/zoo.h"
#include "plan/plan.h"
#include "runtime/pipeline.h"
#include "runtime/tensor.h"
#include "runtime/trainer.h"
#include "tests/support/read_model.h"
#include "tests/support/run_apart.h"

namespace apart {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("apart_pipeline_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string gpt_tiny() { return std::string(APART_SOURCE_DIR) + "/models/gpt-tiny.onnx"; }

// What to run: stage k gets replicas[k] devices; the plan comes from apart partition (its cut of the model) and
// is then given this shape, which is what the runtime must honour.
struct Shape {
  std::vector<int> replicas;
  int64_t microbatches = 1;
  Schedule schedule = Schedule::k1F1B;
  std::vector<bool> recompute;  // by stage; empty: none
};

fs::path make_plan(const std::string& model, const Shape& shape, int64_t batch, const fs::path& dir) {
  const int stages = static_cast<int>(shape.replicas.size());
  const auto r = testing::run_apart("partition " + model + " --device cpu --devices " + std::to_string(stages) + " --stages " +
                                    std::to_string(stages) + " --replicas 1 --microbatches " +
                                    std::to_string(shape.microbatches) + " --batch " + std::to_string(batch) +
                                    " --schedule " + (shape.schedule == Schedule::kGPipe ? "gpipe" : "1f1b") +
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
    stage.microbatch_size = microbatch / stage.replicas;
    stage.recompute = !shape.recompute.empty() && shape.recompute[s];
    if (stage.recompute) stage.backward_s = std::max(stage.backward_s, 2 * stage.forward_s);
  }
  plan.cluster.devices = total;
  std::ofstream(dir / "plan.json") << plan_to_json(plan).dump(2) << "\n";
  return dir;
}

struct Weights {
  std::map<std::string, Tensor> by_name;
};
Weights read_weights(const fs::path& model) {
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

Outcome train_reference(const std::string& model, int64_t batch, int64_t steps, const fs::path& dir) {
  TrainOptions o;
  o.model = model;
  o.batch = batch;
  o.steps = steps;
  o.optimizer.kind = Optimizer::kSgd;
  o.optimizer.lr = 0.05;
  o.seed = 3;
  o.save_model = (dir / "reference.onnx").string();
  Outcome out;
  for (const StepRecord& s : train(o).steps) out.losses.push_back(s.loss);
  out.weights = read_weights(o.save_model);
  return out;
}

Outcome run_threads(const fs::path& plan_dir, int64_t steps, const fs::path& dir, Optimizer optimizer = Optimizer::kSgd,
                    const std::string& checkpoint_dir = "", const std::string& resume = "") {
  const PlanDocument plan = read_plan(plan_dir);
  int world = 0;
  for (const auto& s : plan.stages) world += s.replicas;
  RunOptions o;
  o.plan = plan_dir.string();
  o.steps = steps;
  o.optimizer.kind = optimizer;
  o.optimizer.lr = 0.05;
  o.optimizer_from_plan = false;
  o.seed = 3;
  fs::create_directories(dir);
  o.save_model = (dir / "run.onnx").string();
  o.checkpoint_dir = checkpoint_dir;
  o.resume = resume;
  auto comms = make_in_process_communicators(world, CommOptions{60});
  Outcome out;
  out.ranks.resize(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        out.ranks[static_cast<size_t>(r)] = run_plan(o, *comms[static_cast<size_t>(r)]);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  if (!errors[0].empty()) return out;
  for (const StepRecord& s : out.ranks[0].steps) out.losses.push_back(s.loss);
  out.weights = read_weights(o.save_model);
  return out;
}

// Summation order differs (micro-batch gradients are added, replicas all-reduced, then scaled by 1/(m·r)), so
// float32 results agree to rounding, not bitwise. Losses: 2e-5 relative. Weights: what K SGD steps changed, per
// param tensor, ‖Δrun − Δref‖ ≤ 1e-3 ‖Δref‖ (a 1 % error in any gradient fails it; rounding in Δ of weights near
// 1 is ~1e-4 of it).
void expect_same_training(const Outcome& reference, const Outcome& run, const Weights& initial, const std::string& what) {
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
    EXPECT_LE(std::sqrt(diff), 1e-3 * std::sqrt(update)) << what << ": param " << name;
    ++compared;
  }
  EXPECT_GT(compared, 0) << what;
}

// Each rank trained a strict part of the model: the plan was really split.
void expect_split(const Outcome& run, int64_t total_params) {
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

int64_t total_params(const Weights& w) {
  int64_t n = 0;
  for (const auto& [name, t] : w.by_name)
    if (t.dtype() == DType::kFloat32) n += t.elements();
  return n;
}

struct Case {
  const char* name;
  Shape shape;
};

class GptTinyPlans : public ::testing::TestWithParam<Case> {};

TEST_P(GptTinyPlans, TrainAsOneProcessTrainsOnTheWholeBatch) {
  const Case& c = GetParam();
  const fs::path dir = scratch(c.name);
  constexpr int64_t kBatch = 8, kSteps = 3;
  const Outcome reference = train_reference(gpt_tiny(), kBatch, kSteps, dir);
  const fs::path plan = make_plan(gpt_tiny(), c.shape, kBatch, dir / "plan");
  const Outcome run = run_threads(plan, kSteps, dir);
  expect_same_training(reference, run, read_weights(gpt_tiny()), c.name);
  expect_split(run, total_params(reference.weights));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GptTinyPlans,
    ::testing::Values(Case{"two_stages_1f1b_m4", {{1, 1}, 4, Schedule::k1F1B, {}}},
                      Case{"two_stages_gpipe_m2", {{1, 1}, 2, Schedule::kGPipe, {}}},
                      Case{"one_stage_two_replicas_m2", {{2}, 2, Schedule::k1F1B, {}}},
                      Case{"stages_of_two_and_one_replicas_m2", {{2, 1}, 2, Schedule::k1F1B, {}}},
                      Case{"stages_of_one_and_two_replicas_gpipe_m1", {{1, 2}, 1, Schedule::kGPipe, {}}},
                      Case{"four_stages_1f1b_m4", {{1, 1, 1, 1}, 4, Schedule::k1F1B, {}}},
                      Case{"recompute_on_the_first_of_two_stages_m4", {{1, 1}, 4, Schedule::k1F1B, {true, false}}},
                      Case{"recompute_everywhere_gpipe_m2", {{1, 1}, 2, Schedule::kGPipe, {true, true}}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(ApartRun, GivesTheSameResultTwice) {
  const fs::path dir = scratch("determinism");
  const fs::path plan = make_plan(gpt_tiny(), {{2, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const Outcome a = run_threads(plan, 2, dir / "a");
  const Outcome b = run_threads(plan, 2, dir / "b");
  ASSERT_EQ(a.losses.size(), 2u);
  EXPECT_EQ(a.losses, b.losses);
}

bool bitwise_equal(const Weights& a, const Weights& b) {
  if (a.by_name.size() != b.by_name.size()) return false;
  for (const auto& [name, t] : a.by_name) {
    auto it = b.by_name.find(name);
    if (it == b.by_name.end() || it->second.bytes() != t.bytes() ||
        std::memcmp(it->second.raw(), t.raw(), static_cast<size_t>(t.bytes())) != 0)
      return false;
  }
  return true;
}

TEST(ApartRunCheckpoints, TenStepsStraightEqualFivePlusAResumedFiveBitwise) {
  const fs::path dir = scratch("resume");
  const fs::path plan = make_plan(gpt_tiny(), {{2, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const Outcome straight = run_threads(plan, 10, dir / "straight", Optimizer::kAdam);
  const fs::path ck = dir / "ck";
  fs::create_directories(ck);
  const Outcome first = run_threads(plan, 5, dir / "first", Optimizer::kAdam, ck.string());
  ASSERT_EQ(first.losses.size(), 5u);
  EXPECT_TRUE(fs::exists(ck / "manifest.json"));
  EXPECT_TRUE(fs::exists(ck / "step_5" / "rank_2.apart"));
  // The run is told 10 steps; resumed at 5, it does steps 6..10.
  const Outcome rest = run_threads(plan, 10, dir / "rest", Optimizer::kAdam, "", ck.string());
  ASSERT_EQ(rest.losses.size(), 5u);
  ASSERT_EQ(straight.losses.size(), 10u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(first.losses[i], straight.losses[i]) << "step " << i + 1;
    EXPECT_EQ(rest.losses[i], straight.losses[5 + i]) << "step " << i + 6;
  }
  EXPECT_TRUE(bitwise_equal(rest.weights, straight.weights));
  EXPECT_EQ(rest.ranks[0].first_step, 5);
}

TEST(ApartRunCheckpoints, RefuseAnotherPlanOrRankCountSayingWhy) {
  const fs::path dir = scratch("resume_refused");
  const fs::path plan = make_plan(gpt_tiny(), {{2, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const fs::path ck = dir / "ck";
  fs::create_directories(ck);
  run_threads(plan, 1, dir / "first", Optimizer::kSgd, ck.string());
  const fs::path other = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "other");
  auto comms = make_in_process_communicators(2);
  RunOptions o;
  o.plan = other.string();
  o.steps = 2;
  o.resume = ck.string();
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        run_plan(o, *comms[static_cast<size_t>(r)]);
      } catch (const InvalidArgument& e) {
        errors[static_cast<size_t>(r)] = e.what();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = std::string("wrong type: ") + e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const std::string& e : errors) EXPECT_NE(e.find("written by a run on 3 ranks; this run has 2"), std::string::npos) << e;
}

TEST(ApartRun, SavesOneStandardModelThatApartTrainContinuesFrom) {
  const fs::path dir = scratch("save_model");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const Outcome run = run_threads(plan, 2, dir / "run");
  ASSERT_EQ(run.losses.size(), 2u);
  TrainOptions o;
  o.model = (dir / "run" / "run.onnx").string();
  o.batch = 8;
  o.steps = 1;
  const TrainResult continued = train(o);
  ASSERT_EQ(continued.steps.size(), 1u);
  EXPECT_TRUE(std::isfinite(continued.steps[0].loss));
  // Every initializer of the model is there, trained ones moved from the file's values.
  const Weights original = read_weights(gpt_tiny());
  EXPECT_EQ(run.weights.by_name.size(), original.by_name.size());
  EXPECT_FALSE(bitwise_equal(run.weights, original));
}

// run_plan on one rank throws InvalidArgument whose message has `expected`.
void expect_refused(const RunOptions& o, const std::string& expected) {
  auto comms = make_in_process_communicators(1);
  try {
    run_plan(o, *comms[0]);
    FAIL() << "expected InvalidArgument with: " << expected;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

TEST(ApartRun, RefusesAWorldOfAnotherSizeBeforeAnyWork) {
  const fs::path dir = scratch("world_size");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  RunOptions o;
  o.plan = plan.string();
  o.steps = 1;
  expect_refused(o, "mpirun -np 2");
}

TEST(ApartRun, RefusesAModelWhoseBytesAreNotThePlans) {
  const fs::path dir = scratch("sha");
  const fs::path plan = make_plan(gpt_tiny(), {{1}, 1, Schedule::k1F1B, {}}, 8, dir / "plan");
  models::ZooOptions z = models::options_for("gpt-tiny");
  z.seed = 99;
  const fs::path other = dir / "other.onnx";
  models::write_zoo_model(z, other.string());
  RunOptions o;
  o.plan = plan.string();
  o.model = other.string();
  o.steps = 1;
  expect_refused(o, "not the one the plan was made for");
}

TEST(ApartRunCli, TrainsAPlanInProcessAndPrintsEachStep) {
  const fs::path dir = scratch("cli");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const auto r = testing::run_apart("run " + plan.string() + " --steps 2 --in-process");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[rank 1/2 stage 1 replica 0] step=2 loss="), std::string::npos) << r.out;
  const auto refused = testing::run_apart("run " + plan.string() + " --steps 2");
  EXPECT_EQ(refused.code, 2) << refused.out;
  EXPECT_NE(refused.out.find("mpirun -np 2"), std::string::npos) << refused.out;
}

TEST(ApartRunCli, RunsUnderMpirunWithOneProcessPerRank) {
  if (testing::run_command("command -v mpirun >/dev/null 2>&1").code != 0 || !mpi_available()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("mpi");
  const fs::path plan = make_plan(gpt_tiny(), {{2, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const auto r = testing::run_command(
      "ASAN_OPTIONS=detect_leaks=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --timeout 120 "
      "--oversubscribe -np 3 " + std::string(APART_BINARY) + " run " + plan.string() + " --steps 2 --optimizer sgd --lr 0.05 --seed 3 "
      "--save-model " + (dir / "mpi.onnx").string() + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[rank 2/3 stage 1 replica 0] step=2 loss="), std::string::npos) << r.out;
  // The same plan on threads: the same losses to the printed digits.
  const Outcome threads = run_threads(plan, 2, dir / "threads");
  ASSERT_EQ(threads.losses.size(), 2u);
  char expected[64];
  std::snprintf(expected, sizeof expected, "step=2 loss=%.6f", threads.losses[1]);
  EXPECT_NE(r.out.find(expected), std::string::npos) << r.out;
}

}  // namespace
}  // namespace apart
