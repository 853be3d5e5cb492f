// apart run when things go wrong: a rank that fails, vanishes or is killed ends the run on every rank; a diverging
// run stops naming the step, stage and rank; a corrupt or mismatched plan folder is refused before any message,
// with its exit code and nothing written.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "graph/error.h"
#include "plan/plan.h"
#include "runtime/communicator.h"
#include "train/pipeline.h"
#include "tests/runtime/forwarding_communicator.h"
#include "tests/train/pipeline_fixture.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using namespace apart::testing;

fs::path scratch(const std::string& name) { return testing::scratch("pipeline_fault_test", name); }

bool have_mpirun() { return run_command("command -v mpirun >/dev/null 2>&1").code == 0 && mpi_available(); }

const std::string kMpirun =
    "ASAN_OPTIONS=detect_leaks=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --timeout 120 --oversubscribe";

// What mpirun prints when --timeout ends the job: a run that hangs until then is a failure of these tests.
bool mpirun_timed_out(const std::string& out) {
  return out.find("time limit") != std::string::npos || out.find("timed out") != std::string::npos ||
         out.find("timeout") != std::string::npos;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// Stage `stage`'s file with its first inline weight cut short by one float: a plan folder whose structure is
// intact (every rank's pre-launch check passes) but whose weight only the ranks training that stage read.
void corrupt_a_weight(const fs::path& plan, int stage) {
  const fs::path file = plan / ("stage_" + std::to_string(stage) + ".onnx");
  onnx::ModelProto proto = read_proto(file);
  bool cut = false;
  for (auto& init : *proto.mutable_graph()->mutable_initializer())
    if (init.raw_data().size() >= 8) {
      init.mutable_raw_data()->resize(init.raw_data().size() - 4);
      cut = true;
      break;
    }
  ASSERT_TRUE(cut) << file << " has no inline weight to corrupt";
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(proto.SerializeToOstream(&out));
}

// ---------------------------------------------------------------------------------------------------------------
// A rank that fails, vanishes or is killed

TEST(ARankThatFailsMidRun, EndsTheRunOnEveryRankWithItsReason) {
  const fs::path dir = scratch("fails_mid_run");
  const fs::path plan = make_plan(gpt_tiny(), {{2, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const RunOptions o = run_options_like_reference(plan, 1000);
  // Rank 2 (stage 1) sends 4 gradient messages a step (2 micro-batches × 2 replicas of stage 0): its 5th send is
  // the first of step 2.
  const auto errors = run_ranks(3, CommOptions{60}, [&](int rank, Communicator& comm) {
    if (rank != 2) {
      run_plan(o, comm);
      return;
    }
    FailingCommunicator failing(comm, 5);
    run_plan(o, failing);
  });
  ASSERT_TRUE(errors[2]);
  EXPECT_THROW(std::rethrow_exception(errors[2]), SystemError);
  EXPECT_NE(error_message(errors[2]).find("injected"), std::string::npos) << error_message(errors[2]);
  for (int rank : {0, 1}) {
    ASSERT_TRUE(errors[static_cast<size_t>(rank)]) << "rank " << rank << " finished a run whose rank 2 failed";
    EXPECT_THROW(std::rethrow_exception(errors[static_cast<size_t>(rank)]), CommError) << "rank " << rank;
    // The others learn why: the failing rank's place in the plan and its error.
    EXPECT_NE(error_message(errors[static_cast<size_t>(rank)]).find("rank 2/3 stage 1 replica 0: injected"), std::string::npos)
        << error_message(errors[static_cast<size_t>(rank)]);
  }
}

TEST(ARankThatVanishes, MakesEveryOtherRankFailWhenItsWaitTimesOut) {
  const fs::path dir = scratch("vanishes");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const RunOptions o = run_options_like_reference(plan, 1000);
  // Rank 1 never takes part and never aborts (a process that hangs or lost its network): rank 0's first wait on
  // it runs into CommOptions::timeout_s.
  const auto errors = run_ranks(2, CommOptions{2}, [&](int rank, Communicator& comm) {
    if (rank == 0) run_plan(o, comm);
  });
  ASSERT_TRUE(errors[0]);
  EXPECT_THROW(std::rethrow_exception(errors[0]), CommError);
  EXPECT_NE(error_message(errors[0]).find("timed out"), std::string::npos) << error_message(errors[0]);
}

TEST(ARankWithACorruptWeight, FailsAloneAndEndsTheRunOnEveryRank) {
  const fs::path dir = scratch("corrupt_weight");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  corrupt_a_weight(plan, 1);
  const RunOptions o = run_options_like_reference(plan, 3);
  const auto errors = run_ranks(2, CommOptions{60}, [&](int, Communicator& comm) { run_plan(o, comm); });
  ASSERT_TRUE(errors[1]);
  EXPECT_THROW(std::rethrow_exception(errors[1]), InvalidModel);
  ASSERT_TRUE(errors[0]) << "rank 0 finished although rank 1 could not load its stage";
  EXPECT_THROW(std::rethrow_exception(errors[0]), CommError);
  EXPECT_NE(error_message(errors[0]).find("rank 1/2 stage 1 replica 0"), std::string::npos) << error_message(errors[0]);
}

// mpirun -np 3 with rank 1 (a replica of stage 0) killed by SIGKILL once the run printed step 1: mpirun ends the
// other ranks and returns non-zero, long before its --timeout.
TEST(ARankKilledMidRunUnderMpirun, MakesMpirunEndEveryRankWithAFailure) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("killed");
  const fs::path plan = make_plan(gpt_tiny(), {{2, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const fs::path log = dir / "mpirun.log";
  const std::string command = "exec env " + kMpirun + " -np 3 " + std::string(APART_BINARY) + " run " + plan.string() +
                              " --steps 1000 > " + log.string() + " 2>&1";
  const pid_t mpirun = ::fork();
  ASSERT_GE(mpirun, 0);
  if (mpirun == 0) {
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  auto read_log = [&] {
    std::ifstream in(log);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  // mpirun's children (the ranks) and the world rank each has, from its environment.
  auto ranks = [&] {
    std::map<int, pid_t> by_rank;
    for (const auto& entry : fs::directory_iterator("/proc")) {
      const std::string name = entry.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream stat(entry.path() / "stat");
      std::string line;
      std::getline(stat, line);
      const size_t close = line.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream fields(line.substr(close + 2));
      char state;
      pid_t parent = 0;
      fields >> state >> parent;
      if (parent != mpirun) continue;
      std::ifstream environ(entry.path() / "environ", std::ios::binary);
      std::string var;
      while (std::getline(environ, var, '\0'))
        if (var.rfind("OMPI_COMM_WORLD_RANK=", 0) == 0) by_rank[std::stoi(var.substr(21))] = std::stoi(name);
    }
    return by_rank;
  };
  int status = 0;
  bool exited = false;
  // Waits for step 1 (no bound on time here but mpirun's own --timeout, which ends the loop too).
  while (read_log().find("step=1 ") == std::string::npos) {
    if (::waitpid(mpirun, &status, WNOHANG) == mpirun) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_FALSE(exited) << "mpirun ended before step 1:\n" << read_log();
  const std::map<int, pid_t> before = ranks();
  ASSERT_EQ(before.size(), 3u) << read_log();
  ASSERT_EQ(::kill(before.at(1), SIGKILL), 0);
  ASSERT_EQ(::waitpid(mpirun, &status, 0), mpirun);
  const std::string out = read_log();
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_NE(WEXITSTATUS(status), 0) << out;
  EXPECT_FALSE(mpirun_timed_out(out)) << "the run hung until mpirun's --timeout:\n" << out;
  EXPECT_EQ(out.find("step=1000 "), std::string::npos) << "the run finished without its rank 1";
  // Every rank ends: mpirun has sent the survivors SIGTERM/SIGKILL, which they may take a moment to act on. Polled
  // for up to a minute (a liveness bound, not a timing claim); a zombie has ended.
  auto running = [](pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return false;
    const size_t close = line.rfind(')');
    return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z' && line[close + 2] != 'X';
  };
  for (int poll = 0; poll < 600; ++poll) {
    bool any = false;
    for (const auto& [rank, pid] : before) any = any || running(pid);
    if (!any) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (const auto& [rank, pid] : before) EXPECT_FALSE(running(pid)) << "rank " << rank << " (pid " << pid << ") still runs";
}

// Under mpirun an error one rank raises alone (its stage's weight is corrupt) aborts the world: mpirun returns
// the error's exit code (InvalidModel, 3) before its --timeout, and the failing rank says why.
TEST(ARankWithACorruptWeightUnderMpirun, AbortsEveryRank) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("corrupt_weight_mpi");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  corrupt_a_weight(plan, 1);
  const auto r = run_command(kMpirun + " -np 2 " + std::string(APART_BINARY) + " run " + plan.string() + " --steps 1000 2>&1");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_FALSE(mpirun_timed_out(r.out)) << r.out;
  EXPECT_NE(r.out.find("rank 1/2 stage 1 replica 0: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("aborts the run"), std::string::npos) << r.out;
}

// ---------------------------------------------------------------------------------------------------------------
// Divergence

TEST(ADivergingRun, StopsOnEveryRankNamingTheStepStageAndRank) {
  const fs::path dir = scratch("diverges");
  const fs::path plan = make_plan(gpt_tiny(), {{2, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  RunOptions o = run_options_like_reference(plan, 20);
  o.optimizer.lr = 1e30;
  o.save_model = (dir / "never.onnx").string();
  const auto errors = run_ranks(3, CommOptions{60}, [&](int, Communicator& comm) { run_plan(o, comm); });
  const std::string first = error_message(errors[0]);
  for (size_t r = 0; r < errors.size(); ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " did not stop";
    EXPECT_THROW(std::rethrow_exception(errors[r]), Infeasible) << "rank " << r;
    EXPECT_EQ(error_message(errors[r]), first) << "rank " << r << " tells another story";
  }
  // Step 1 is finite (the weights are the model's); step 2 runs on weights moved by 1e30 × the gradient.
  EXPECT_NE(first.find("training diverged at step 2: "), std::string::npos) << first;
  EXPECT_NE(first.find(" of stage "), std::string::npos) << first;
  EXPECT_NE(first.find("(rank "), std::string::npos) << first;
  EXPECT_FALSE(fs::exists(o.save_model));
}

TEST(ADivergingRunCli, ExitsWithInfeasibleAndWritesNoModel) {
  const fs::path dir = scratch("diverges_cli");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const fs::path model = dir / "trained.onnx";
  const auto r = run_apart("run " + plan.string() + " --in-process --steps 20 --optimizer sgd --lr 1e30 --save-model " +
                           model.string());
  EXPECT_EQ(r.code, exit_code(ErrorKind::kInfeasible)) << r.out;
  EXPECT_NE(r.out.find("apart: error [Infeasible]: training diverged at step 2: the loss or a gradient of stage "),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(model));
}

// ---------------------------------------------------------------------------------------------------------------
// Plan folders refused before launch

// The plan's JSON, edited.
void edit_plan_json(const fs::path& plan, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(plan / "plan.json");
  nlohmann::json j = nlohmann::json::parse(in);
  edit(j);
  std::ofstream(plan / "plan.json", std::ios::trunc) << j.dump(2) << "\n";
}

struct Corruption {
  const char* name;
  std::function<void(const fs::path& plan, const fs::path& out)> apply;  // out: a fresh folder for outputs
  ErrorKind kind;
  std::string message;  // a part of the error that names the file or field
  std::string extra_flags;
};

// Every file under `dir`, relative, with its size: what "nothing written" compares.
std::map<std::string, uintmax_t> listing(const fs::path& dir) {
  std::map<std::string, uintmax_t> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = e.file_size();
  return files;
}

class APlanFolder : public ::testing::TestWithParam<Corruption> {
 protected:
  // One good plan (2 stages, 2 micro-batches), copied for each case.
  static fs::path good_plan() {
    static const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, scratch("good") / "plan");
    return plan;
  }
};

TEST_P(APlanFolder, IsRefusedBeforeLaunchWithItsExitCodeAndNothingWritten) {
  const Corruption& c = GetParam();
  const fs::path dir = scratch(std::string("refused_") + c.name);
  const fs::path plan = dir / "plan", out = dir / "out";
  fs::copy(good_plan(), plan, fs::copy_options::recursive);
  fs::create_directories(out);
  c.apply(plan, out);
  const auto plan_files = listing(plan);
  std::string flags = c.extra_flags.empty() ? " --save-model " + (out / "trained.onnx").string() : c.extra_flags;
  if (const size_t at = flags.find("PLAN/"); at != std::string::npos) flags.replace(at, 4, plan.string());
  const auto r = run_apart("run " + plan.string() + " --in-process --steps 2" + flags);
  EXPECT_EQ(r.code, exit_code(c.kind)) << r.out;
  EXPECT_NE(r.out.find(std::string("apart: error [") + error_kind_name(c.kind) + "]: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(c.message), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step=1"), std::string::npos) << "a step ran:\n" << r.out;
  EXPECT_TRUE(listing(out).empty()) << "something was written to " << out;
  EXPECT_EQ(listing(plan), plan_files) << "the plan folder changed";
}

const fs::path kStage1 = "stage_1.onnx";

INSTANTIATE_TEST_SUITE_P(
    Corruptions, APlanFolder,
    ::testing::Values(
        Corruption{"missing_stage_file", [](const fs::path& p, const fs::path&) { fs::remove(p / kStage1); },
                   ErrorKind::kInvalidArgument, "has no stage_1.onnx (stage 1 of 2)", ""},
        Corruption{"plan_json_not_json",
                   [](const fs::path& p, const fs::path&) { std::ofstream(p / "plan.json", std::ios::trunc) << "{\"schema\": "; },
                   ErrorKind::kInvalidModel, "plan.json: not valid JSON", ""},
        Corruption{"plan_json_of_another_schema",
                   [](const fs::path& p, const fs::path&) { edit_plan_json(p, [](nlohmann::json& j) { j["schema"] = "apart.plan/9"; }); },
                   ErrorKind::kInvalidModel, "schema is \"apart.plan/9\"", ""},
        Corruption{"stage_with_no_devices",
                   [](const fs::path& p, const fs::path&) {
                     edit_plan_json(p, [](nlohmann::json& j) {
                       j["stages"][1]["replicas"] = 0;
                       j["stages"][1]["devices"] = nlohmann::json::array();
                     });
                   },
                   ErrorKind::kInvalidModel, "stages[1].replicas", ""},
        Corruption{"stage_file_not_onnx",
                   [](const fs::path& p, const fs::path&) { std::ofstream(p / kStage1, std::ios::trunc) << "not a model"; },
                   ErrorKind::kInvalidModel, "stage_1.onnx is not a valid ONNX protobuf", ""},
        Corruption{"stage_file_of_another_stage",
                   [](const fs::path& p, const fs::path&) { fs::copy_file(p / "stage_0.onnx", p / kStage1, fs::copy_options::overwrite_existing); },
                   ErrorKind::kInvalidModel, "stage_1.onnx is not stage 1 of this plan: plan.json's stages[1].inputs names", ""},
        Corruption{"model_of_other_bytes",
                   [](const fs::path& p, const fs::path&) {
                     edit_plan_json(p, [](nlohmann::json& j) { j["model"]["sha256"] = std::string(64, '0'); });
                   },
                   ErrorKind::kInvalidArgument, "is not the one the plan was made for", ""},
        Corruption{"more_replicas_than_samples_in_a_microbatch",
                   [](const fs::path& p, const fs::path&) {
                     edit_plan_json(p, [](nlohmann::json& j) {  // 5 replicas of stage 1, micro-batches of 4 samples
                       j["stages"][1]["replicas"] = 5;
                       j["stages"][1]["devices"] = {1, 2, 3, 4, 5};
                       j["cluster"]["devices"] = 6;
                     });
                   },
                   ErrorKind::kInvalidModel, "stage 1 has 5 replicas, more than the 4 samples of a micro-batch", ""},
        Corruption{"save_model_onto_the_model", [](const fs::path&, const fs::path&) {}, ErrorKind::kInvalidArgument,
                   "is the model this command reads", " --save-model " + gpt_tiny()},
        Corruption{"save_model_onto_a_stage_file", [](const fs::path&, const fs::path&) {}, ErrorKind::kInvalidArgument,
                   "is stage 1's file this command reads", " --save-model PLAN/stage_1.onnx"},
        Corruption{"save_model_into_a_missing_folder", [](const fs::path&, const fs::path&) {}, ErrorKind::kSystemError,
                   "does not exist; create it first", " --save-model /nonexistent_apart_folder/trained.onnx"}),
    [](const ::testing::TestParamInfo<Corruption>& info) { return std::string(info.param.name); });

// Under mpirun: every rank reaches the same verdict and prints it, and mpirun returns its exit code.
TEST(APlanFolderUnderMpirun, IsRefusedOnEveryRankWithTheSameErrorAndExitCode) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun";
  const fs::path dir = scratch("refused_mpi");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  std::ofstream(plan / kStage1, std::ios::trunc) << "not a model";
  const auto r = run_command(kMpirun + " -np 2 " + std::string(APART_BINARY) + " run " + plan.string() + " --steps 2 2>&1");
  EXPECT_EQ(r.code, exit_code(ErrorKind::kInvalidModel)) << r.out;
  EXPECT_EQ(count(r.out, "apart: error [InvalidModel]: " + (plan / kStage1).string() + " is not a valid ONNX protobuf"), 2u) << r.out;
  // A world of another size than the plan's: refused on each of the 3 ranks.
  const auto wrong = run_command(kMpirun + " -np 3 " + std::string(APART_BINARY) + " run " + plan.string() + " --steps 2 2>&1");
  EXPECT_EQ(wrong.code, exit_code(ErrorKind::kInvalidArgument)) << wrong.out;
  EXPECT_EQ(count(wrong.out, "this run has 3: launch it with mpirun -np 2"), 3u) << wrong.out;
}

}  // namespace
}  // namespace apart
