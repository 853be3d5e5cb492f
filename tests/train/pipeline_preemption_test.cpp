// apart run stopped by a signal (docs/runtime.md "Checkpoints"): every rank stops after the same step, however late
// each saw the request, a consistent sharded checkpoint of that step is written, and resuming gives the uninterrupted
// run's losses and weights bitwise; --keep-last keeps resumable step folders and deletes (announcing) the rest.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>

#include "graph/error.h"
#include "train/pipeline.h"
#include "train/preemption.h"
#include "train/run_checkpoint_files.h"
#include "tests/train/pipeline_fixture.h"
#include "tests/support/run_apart.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using namespace apart::testing;

fs::path scratch(const std::string& name) { return testing::scratch("pipeline_preemption_test", name); }

// The plan's run with a cosine schedule; `stop_at`: the step whose end rank `stopper` requests the stop at (0: none).
Outcome run_stopped(const fs::path& plan, int64_t steps, const fs::path& dir, const std::string& checkpoint_dir,
                    const std::string& resume, int64_t stop_at, int stopper, std::vector<std::string>* notes = nullptr,
                    int64_t keep_last = 1, int64_t save_every = 0) {
  const int world = plan_world(plan);
  RunOptions o = run_options_like_reference(plan, steps, Optimizer::kAdamW, 0.01);
  o.schedule.kind = LrScheduleKind::kCosine;
  o.schedule.warmup_steps = 1;
  fs::create_directories(dir);
  o.save_model = (dir / "run.onnx").string();
  o.checkpoint_dir = checkpoint_dir;
  o.resume = resume;
  o.keep_last = keep_last;
  o.save_every = save_every;
  if (notes) o.on_note = [notes](const std::string& n) { notes->push_back(n); };
  Outcome out;
  out.ranks.resize(static_cast<size_t>(world));
  clear_stop_request();
  const auto errors = run_ranks(world, CommOptions{60}, [&](int r, Communicator& comm) {
    out.ranks[static_cast<size_t>(r)] = run_plan(o, comm, [&](const RunResult&, const StepRecord& s) {
      if (r == stopper && s.step == stop_at) request_stop(SIGUSR1);
    });
  });
  clear_stop_request();
  for (int r = 0; r < world; ++r) EXPECT_EQ(error_message(errors[static_cast<size_t>(r)]), "") << "rank " << r;
  for (const StepRecord& s : out.ranks[0].steps) out.losses.push_back(s.loss);
  if (fs::exists(o.save_model)) out.weights = read_weights(o.save_model);
  return out;
}

// Stopped by its last rank after step 2, every rank stops after step 3 and the resume continues bitwise; `what` names
// the layout.
void expect_stops_and_resumes_bitwise(const fs::path& plan, const fs::path& dir, const std::string& what) {
  const int last = plan_world(plan) - 1;
  const Outcome straight = run_stopped(plan, 7, dir / "straight", "", "", 0, -1);
  ASSERT_EQ(straight.losses.size(), 7u) << what;
  const fs::path ck = dir / "ck";
  fs::remove_all(ck);
  // The last rank asks after its step 2; the others may be past reading the flag for step 3 already: the step's
  // all-reduce makes all of them stop after step 3.
  const Outcome first = run_stopped(plan, 7, dir / "first", ck.string(), "", 2, last);
  for (const RunResult& r : first.ranks) {
    EXPECT_NE(r.stopped_by_signal, 0) << what << ": stage " << r.role.stage;
    ASSERT_FALSE(r.steps.empty()) << what;
    EXPECT_EQ(r.steps.back().step, 3) << what << ": stage " << r.role.stage;
  }
  EXPECT_TRUE(fs::exists(ck / "step_3" / ("rank_" + std::to_string(last) + ".apart"))) << what;
  EXPECT_FALSE(fs::exists(dir / "first" / "run.onnx")) << what;  // not trained to the end: no model written
  EXPECT_EQ(verify_checkpoint(ck).size(), static_cast<size_t>(last + 2)) << what;  // the manifest and every shard
  const Outcome rest = run_stopped(plan, 7, dir / "rest", ck.string(), ck.string(), 0, -1);
  ASSERT_EQ(rest.losses.size(), 4u) << what;
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(first.losses[i], straight.losses[i]) << what << ": step " << i + 1;
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(rest.losses[i], straight.losses[i + 3]) << what << ": step " << i + 4;
  EXPECT_TRUE(bitwise_equal(rest.weights, straight.weights)) << what;
}

TEST(ApartRunStopped, StopsEveryRankAfterTheSameStepAndResumesToTheUninterruptedRunBitwise) {
  const fs::path dir = scratch("stopped");
  expect_stops_and_resumes_bitwise(make_plan(gpt_tiny(), {{2, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "pp_dp" / "plan"),
                                   dir / "pp_dp", "2 stages, 2 + 1 replicas");
  expect_stops_and_resumes_bitwise(make_plan(gpt_tiny(), {{2}, 2, Schedule::k1F1B, {}, 3}, 8, dir / "zero3" / "plan"),
                                   dir / "zero3", "ZeRO-3 over 2 replicas");
  TpShape tp;
  tp.stages = 2;
  expect_stops_and_resumes_bitwise(make_tp_plan(tp, 8, dir / "tp" / "plan"), dir / "tp", "TP 2 x PP 2");
}

TEST(ApartRunKeepLast, KeepsTheNewestStepFoldersEachResumableAndAnnouncesWhatItDeletes) {
  const fs::path dir = scratch("keep_last");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const fs::path ck = dir / "ck";
  fs::remove_all(ck);
  std::vector<std::string> notes;
  const Outcome all = run_stopped(plan, 6, dir / "all", ck.string(), "", 0, -1, &notes, 2, 1);
  EXPECT_TRUE(fs::exists(ck / "step_6"));
  EXPECT_TRUE(fs::exists(ck / "step_5"));
  EXPECT_FALSE(fs::exists(ck / "step_4"));
  int written = 0, deleted = 0;
  for (const std::string& n : notes) {
    written += n.find(" written: ") != std::string::npos;
    deleted += n.find(" deleted (--keep-last 2)") != std::string::npos;
  }
  EXPECT_EQ(written, 6);
  EXPECT_EQ(deleted, 4);
  // The older kept folder resumes on its own: step 6 again from step 5, as the run computed it.
  const Outcome again = run_stopped(plan, 6, dir / "again", "", (ck / "step_5").string(), 0, -1);
  ASSERT_EQ(again.losses.size(), 1u);
  EXPECT_EQ(again.losses[0], all.losses[5]);
}

// Under mpirun, as a scheduler does it: SIGUSR1 to mpirun (which forwards it to every rank) once step 2 is printed;
// every rank stops after the same step with a consistent checkpoint and exit code 75, rank 0 prints the command that
// resumes, and that command continues with the losses the uninterrupted threads' run printed.
TEST(ApartRunStoppedUnderMpirun, ExitsWith75AndItsPrintedCommandResumesToTheUninterruptedLosses) {
  const fs::path dir = scratch("mpirun");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const fs::path ck = dir / "ck", log = dir / "log";
  fs::remove_all(ck);
  const std::string args = " run " + plan.string() + " --steps 20 --optimizer adamw --lr 0.01 --lr-schedule cosine --seed 3";
  {
    std::ofstream script(dir / "stop.sh");
    // As mpirun_apart_run: no LeakSanitizer in the sanitized build (MPI's own allocations at exit are reported as
    // leaks, and its exit code would replace apart's 75).
    script << "export ASAN_OPTIONS=detect_leaks=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\n"
           << "mpirun --timeout 120 --oversubscribe -np 2 " << APART_BINARY << args << " --checkpoint-dir "
           << ck.string() << " >" << log.string() << " 2>&1 </dev/null &\n"
           << "pid=$!\nfor i in $(seq 2400); do grep -q ' step=2 ' " << log.string() << " && break; sleep 0.05; done\n"
           << "kill -USR1 $pid\nwait $pid\necho exit=$?\n";
  }
  const auto r = testing::run_command("timeout 180 bash " + (dir / "stop.sh").string());
  std::ifstream in(log);
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_NE(r.out.find("exit=75"), std::string::npos) << r.out << out;
  const auto said = out.find("resume with: ");
  ASSERT_NE(said, std::string::npos) << out;
  const std::string resume = out.substr(said + 13, out.find('\n', said) - said - 13);
  ASSERT_EQ(resume.rfind("mpirun -np 2 ", 0), 0u) << resume;
  const auto lines = verify_checkpoint(ck);
  EXPECT_EQ(lines.size(), 3u);  // the manifest and both shards, every checksum good
  // Resumed under mpirun (the allowances of root and oversubscription added to the printed command).
  const auto rest = testing::run_command(
      "ASAN_OPTIONS=detect_leaks=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "timeout 180 mpirun "
      "--timeout 120 --oversubscribe" +
      resume.substr(6) + " 2>&1 </dev/null");
  ASSERT_EQ(rest.code, 0) << rest.out;
  const auto straight = mpirun_apart_run(2, args.substr(5));
  ASSERT_EQ(straight.code, 0) << straight.out;
  // "step=N loss=X" as the loss rank printed it, in both runs: the resumed steps print the uninterrupted run's.
  auto printed = [](const std::string& text) {
    std::map<int64_t, std::string> losses;
    for (size_t at = text.find(" step="); at != std::string::npos; at = text.find(" step=", at + 1)) {
      const std::string line = text.substr(at + 1, text.find(" samples/s", at) - at - 1);
      losses[std::stoll(line.substr(5))] = line;
    }
    return losses;
  };
  const auto all = printed(straight.out), before = printed(out), after = printed(rest.out);
  ASSERT_EQ(all.size(), 20u) << straight.out;
  ASSERT_FALSE(before.empty());
  ASSERT_EQ(before.size() + after.size(), 20u) << out << rest.out;
  for (const auto& [k, line] : before) EXPECT_EQ(line, all.at(k));
  for (const auto& [k, line] : after) EXPECT_EQ(line, all.at(k));
}

// A file-size limit (ulimit -f) fails every rank's save together: exit 6 naming the folder and the bytes, the manifest
// still names the previous step, whose shards load, and neither the failed step's folder nor a temporary is left.
TEST(ApartRunCheckpointWriteFailing, StopsEveryRankAndLeavesThePreviousCheckpointTheLatest) {
  const fs::path dir = scratch("write_failing");
  const fs::path plan = make_plan(gpt_tiny(), {{1, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const fs::path ck = dir / "ck";
  fs::remove_all(ck);
  const std::string args = "run " + plan.string() + " --in-process --seed 3 --checkpoint-dir " + ck.string();
  const auto first = testing::run_apart_bounded(args + " --steps 2");
  ASSERT_EQ(first.code, 0) << first.out;
  const auto r = testing::run_apart_bounded(args + " --steps 4 --resume " + ck.string(), "ulimit -f 64; ");
  EXPECT_EQ(r.code, 6) << r.out;
  EXPECT_NE(r.out.find("cannot write the checkpoint of step 4 ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" bytes) into " + (ck / "step_4").string()), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(ck / "step_4"));
  EXPECT_EQ(verify_checkpoint(ck).size(), 3u);  // step_2: its manifest and both shards
  for (const auto& e : fs::recursive_directory_iterator(ck))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

}  // namespace
}  // namespace apart
