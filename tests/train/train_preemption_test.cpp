// Long runs survive what clusters do to them (docs/training.md "Preemption", "Checkpoints"): a stop request ends
// apart train after its step with a checkpoint that resumes bitwise; a damaged checkpoint is refused naming the tensor;
// a full disk leaves the previous checkpoint and no temporary; a resume keeps the run's learning-rate schedule.
#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "graph/crc32c.h"
#include "graph/error.h"
#include "models/zoo.h"
#include "train/checkpoint.h"
#include "train/preemption.h"
#include "train/run_checkpoint_files.h"
#include "train/trainer.h"
#include "tests/train/train_fixture.h"
#include "tests/support/run_apart.h"
#include "tests/support/temp_dir.h"

namespace apart {
namespace {
namespace fs = std::filesystem;
using testing::TempDir;

using testing::cosine_run;
using testing::write_mlp;

std::string bytes_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_bytes(const fs::path& file, const std::string& bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << bytes;
}

int temporaries_in(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) ++n;
  return n;
}

TEST(Crc32c, GivesTheStandardCheckValueByTableAndByInstructionAndContinues) {
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c(digits.data(), digits.size(), 0, false), 0xE3069283u);
  EXPECT_EQ(crc32c(digits.data(), digits.size(), 0, true), 0xE3069283u);
  std::string long_text(1000, 'x');
  for (size_t i = 0; i < long_text.size(); ++i) long_text[i] = static_cast<char>(i * 31 + 7);
  const uint32_t whole = crc32c(long_text.data(), long_text.size());
  EXPECT_EQ(whole, crc32c(long_text.data(), long_text.size(), 0, false));
  EXPECT_EQ(whole, crc32c(long_text.data() + 333, 667, crc32c(long_text.data(), 333)));
}

TEST(AStopRequest, EndsTrainAfterItsStepWithACheckpointThatResumesToTheUninterruptedLossesBitwise) {
  TempDir dir;
  const fs::path model = write_mlp(dir.file(""));
  const TrainResult straight = train(cosine_run(model, 8));

  TrainOptions first = cosine_run(model, 8);
  first.checkpoint_dir = dir.file("ck").string();
  first.save_every = 100;  // no periodic checkpoint: the stop writes the only one
  clear_stop_request();
  const TrainResult stopped = train(first, [](const StepRecord& s) {
    if (s.step == 3) request_stop(SIGTERM);  // as the handler does when the signal comes during step 3
  });
  clear_stop_request();
  EXPECT_EQ(stopped.stopped_by_signal, SIGTERM);
  ASSERT_EQ(stopped.steps.size(), 3u);
  ASSERT_EQ(read_checkpoint(dir.file("ck")).step, 3);

  TrainOptions resumed = cosine_run(model, 8);
  resumed.resume = dir.file("ck").string();
  const TrainResult rest = train(resumed);
  EXPECT_EQ(rest.stopped_by_signal, 0);
  ASSERT_EQ(rest.first_step, 3);
  ASSERT_EQ(rest.steps.size(), 5u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(stopped.steps[i].loss, straight.steps[i].loss) << "step " << i + 1;
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(rest.steps[i].loss, straight.steps[i + 3].loss) << "step " << i + 4;
    EXPECT_EQ(rest.steps[i].lr, straight.steps[i + 3].lr) << "step " << i + 4;
  }
}

TEST(AResumeWithMoreSteps, KeepsTheCheckpointsScheduleUnlessToldAndSaysSo) {
  TempDir dir;
  const fs::path model = write_mlp(dir.file(""));
  TrainOptions o = cosine_run(model, 6);
  o.checkpoint_dir = dir.file("ck").string();
  const TrainResult six = train(o);

  TrainOptions longer = cosine_run(model, 9);
  longer.resume = dir.file("ck").string();
  std::vector<std::string> notes;
  longer.on_note = [&](const std::string& n) { notes.push_back(n); };
  const TrainResult kept = train(longer);
  ASSERT_EQ(kept.steps.size(), 3u);
  LrSchedule six_steps = o.schedule;
  six_steps.total_steps = 6;
  for (const StepRecord& s : kept.steps) EXPECT_EQ(s.lr, six_steps.lr_at(s.step - 1, o.optimizer.lr));  // the minimum
  bool said = false;
  for (const std::string& n : notes) said = said || n.find("keeps the checkpoint's learning-rate schedule") != std::string::npos;
  EXPECT_TRUE(said);

  longer.schedule.total_steps = 9;  // --lr-schedule-steps 9: stretched, and said
  notes.clear();
  const TrainResult stretched = train(longer);
  LrSchedule nine = o.schedule;
  nine.total_steps = 9;
  EXPECT_EQ(stretched.steps[0].lr, nine.lr_at(6, o.optimizer.lr));
  said = false;
  for (const std::string& n : notes) said = said || n.find("--lr-schedule-steps 9 changes") != std::string::npos;
  EXPECT_TRUE(said);
}

// A small checkpoint, every byte flipped in turn: each flip is refused (none loads), and a flip in a tensor's data
// names that tensor and the file.
TEST(ADamagedCheckpoint, IsRefusedAtEveryByteAndNamesTheTensorWhoseDataIsDamaged) {
  TempDir dir;
  Tensor a(DType::kFloat32, {3, 5}), b(DType::kFloat32, {7});
  for (int64_t i = 0; i < a.elements(); ++i) a.span<float>()[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i);
  for (int64_t i = 0; i < b.elements(); ++i) b.span<float>()[static_cast<size_t>(i)] = -1.0f - static_cast<float>(i);
  write_checkpoint(dir.file("ck"), 4, {{"optimizer", "adamw"}}, {{"param/w", &a}, {"optim/w/m", &b}});
  const fs::path file = dir.file("ck") / kCheckpointFile;
  const std::string good = bytes_of(file);
  ASSERT_NO_THROW(read_checkpoint(file));
  const fs::path damaged = dir.file("damaged.apart");
  int refused = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    write_bytes(damaged, bad);
    try {
      read_checkpoint(damaged);
      ADD_FAILURE() << "a flip of byte " << i << " of " << good.size() << " was accepted";
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_EQ(refused, static_cast<int>(good.size()));
  // Near the end of the data: the last tensor's last byte (it starts 64 bytes before the file's 64-aligned end).
  std::string bad = good;
  const size_t last = good.size() - 64 + static_cast<size_t>(b.bytes()) - 1;
  bad[last] = static_cast<char>(bad[last] ^ 0x01);
  write_bytes(damaged, bad);
  try {
    read_checkpoint(damaged);
    FAIL() << "accepted";
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'optim/w/m' fails its checksum"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(damaged.string()), std::string::npos) << e.what();
    EXPECT_EQ(exit_code(e.kind()), 7);
  }
}

// Format version 1 had no checksums: it still loads (a run of hours is not stranded), with a warning saying so.
TEST(ACheckpointWithoutChecksums, LoadsWithAWarning) {
  TempDir dir;
  Tensor a(DType::kFloat32, {4});
  write_checkpoint(dir.file("ck"), 2, {}, {{"param/w", &a}});
  const fs::path file = dir.file("ck") / kCheckpointFile;
  std::string bytes = bytes_of(file);
  bytes[8] = 1;  // version 1, and the header's checksum field back to 0
  std::memset(bytes.data() + 12, 0, 4);
  write_bytes(file, bytes);
  const Checkpoint ck = read_checkpoint(file);
  EXPECT_EQ(ck.step, 2);
  EXPECT_NE(ck.warning.find("before checkpoints carried checksums"), std::string::npos) << ck.warning;
}

TEST(ARunManifest, IsRefusedWhenAByteOfItIsFlipped) {
  TempDir dir;
  const nlohmann::ordered_json manifest = {{"format", "apart.run-checkpoint/1"}, {"step", 12}, {"folder", "step_12"},
                                           {"kept", nlohmann::json::array()}};
  const std::string text = sealed_manifest_text(manifest);
  write_bytes(dir.file("manifest.json"), text);
  EXPECT_EQ(read_sealed_manifest(dir.file("manifest.json"))["step"], 12);
  for (size_t i = 0; i < text.size(); ++i) {
    std::string bad = text;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    write_bytes(dir.file("manifest.json"), bad);
    EXPECT_THROW(read_sealed_manifest(dir.file("manifest.json")), Error) << "byte " << i << " of " << text.size();
  }
}

TEST(ApartCheck, VerifiesACheckpointWithoutTrainingAndRefusesADamagedOneWithExitCode7) {
  TempDir dir;
  const fs::path model = write_mlp(dir.file(""));
  TrainOptions o = cosine_run(model, 2);
  o.checkpoint_dir = dir.file("ck").string();
  train(o);
  EXPECT_EQ(verify_checkpoint(dir.file("ck")).size(), 1u);
  const fs::path file = dir.file("ck") / kCheckpointFile;
  std::string bytes = bytes_of(file);
  bytes[bytes.size() - 100] = static_cast<char>(bytes[bytes.size() - 100] ^ 0x40);
  write_bytes(file, bytes);
  EXPECT_THROW(verify_checkpoint(dir.file("ck")), CorruptData);
}

// The CLI end to end: a file-size limit (ulimit -f) fails the checkpoint write: the previous checkpoint stays, no
// temporary is left, the message names the folder and the bytes.
TEST(ApartTrainCli, KeepsThePreviousCheckpointAndNoTemporaryWhenTheWriteFails) {
  TempDir dir;
  const fs::path model = write_mlp(dir.file(""));
  const std::string ck = dir.file("ck").string();
  const std::string args = "train " + model.string() + " --batch 2 --init random --checkpoint-dir " + ck + " -q";
  ASSERT_EQ(testing::run_apart_bounded(args + " --steps 2").code, 0);
  const std::string before = bytes_of(fs::path(ck) / kCheckpointFile);
  // A limit below the checkpoint's size (kB blocks of 1024 bytes): the write fails with EFBIG.
  const auto limit_kb = std::to_string(before.size() / 1024 / 2);
  const auto r = testing::run_apart_bounded(args + " --steps 4 --resume " + ck, "ulimit -f " + limit_kb + "; ");
  EXPECT_EQ(r.code, 6) << r.out;
  EXPECT_NE(r.out.find("cannot write the checkpoint of step 4 ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" bytes) into " + ck), std::string::npos) << r.out;
  EXPECT_EQ(bytes_of(fs::path(ck) / kCheckpointFile), before);
  EXPECT_EQ(temporaries_in(ck), 0);
}

// "step=N loss=X" of each step line apart train printed, by step (the rest of a line is timing).
std::map<int64_t, std::string> printed_losses(const std::string& out) {
  std::map<int64_t, std::string> losses;
  size_t at = 0;
  while ((at = out.find("step=", at)) != std::string::npos) {
    if (at == 0 || out[at - 1] == '\n') {
      const std::string line = out.substr(at, out.find(" samples/s", at) - at);
      losses[std::stoll(line.substr(5))] = line;
    }
    at += 5;
  }
  return losses;
}

// SIGTERM from outside, as a scheduler sends it: the step finishes, its checkpoint is written, the exact resume command
// is printed, the exit code is 75; the printed command continues with the uninterrupted run's printed losses.
TEST(ApartTrainCli, StopsAtSigtermWithACheckpointAndExitCode75AndResumesAsPrinted) {
  TempDir dir;
  const std::string ck = dir.file("ck").string();
  const std::string log = dir.file("log").string();
  const std::string args = " train " + std::string(APART_SOURCE_DIR) + "/models/gpt-tiny.onnx --steps 30 --lr-schedule cosine --lr 0.01";
  // Started in the background; SIGTERM once it printed step 2; its exit code.
  {
    std::ofstream script(dir.file("stop.sh"));
    script << std::string(APART_BINARY) << args << " --checkpoint-dir " << ck << " >" << log << " 2>&1 </dev/null &\n"
           << "pid=$!\nfor i in $(seq 1200); do grep -q '^step=2 ' " << log << " && break; sleep 0.05; done\n"
           << "kill -TERM $pid\nwait $pid\necho exit=$?\n";
  }
  const auto r = testing::run_command("timeout 120 bash " + dir.file("stop.sh").string());
  const std::string out = bytes_of(log);
  ASSERT_NE(r.out.find("exit=75"), std::string::npos) << r.out << out;
  const auto said = out.find("resume with: ");
  ASSERT_NE(said, std::string::npos) << out;
  const std::string resume = out.substr(said + 13, out.find('\n', said) - said - 13);
  EXPECT_NE(resume.find(" --resume " + ck), std::string::npos) << resume;
  const int64_t step = read_checkpoint(ck).step;
  EXPECT_GE(step, 2);
  EXPECT_LT(step, 30);
  EXPECT_EQ(temporaries_in(ck), 0);
  const auto before = printed_losses(out);
  ASSERT_FALSE(before.empty());
  EXPECT_EQ(before.rbegin()->first, step) << out;  // the last step printed is the checkpoint's

  const auto rest = testing::run_command("timeout 120 " + resume + " 2>&1 </dev/null");
  ASSERT_EQ(rest.code, 0) << rest.out;
  const auto straight = testing::run_apart_bounded(args);
  ASSERT_EQ(straight.code, 0) << straight.out;
  const auto all = printed_losses(straight.out), resumed = printed_losses(rest.out);
  ASSERT_EQ(all.size(), 30u) << straight.out;
  ASSERT_EQ(resumed.size(), static_cast<size_t>(30 - step)) << rest.out;
  for (const auto& [k, line] : before) EXPECT_EQ(line, all.at(k));
  for (const auto& [k, line] : resumed) EXPECT_EQ(line, all.at(k));  // printed alike: the same losses and rates
}

// A second signal ends the run at once (128 + SIGTERM), and a checkpoint every step means one is often being written
// when it comes: the latest complete checkpoint still loads, every checksum good, and no temporary is left.
TEST(ApartTrainCli, EndsAtOnceAtASecondSignalLeavingTheLatestCompleteCheckpointAndNoTemporary) {
  TempDir dir;
  const std::string ck = dir.file("ck").string();
  const std::string log = dir.file("log").string();
  {
    std::ofstream script(dir.file("stop.sh"));
    script << std::string(APART_BINARY) << " train " << APART_SOURCE_DIR << "/models/gpt-tiny.onnx --steps 1000 --batch 32 "
           << "--save-every 1 --checkpoint-dir " << ck << " >" << log << " 2>&1 </dev/null &\n"
           << "pid=$!\nfor i in $(seq 1200); do grep -q '^step=3 ' " << log << " && break; sleep 0.05; done\n"
           // The second once the first is handled (the handler said so), while the step or its checkpoint runs.
           << "kill -TERM $pid\nfor i in $(seq 20000); do grep -q 'SIGTERM received' " << log << " && break; done\n"
           << "kill -TERM $pid\nwait $pid\necho exit=$?\n";
  }
  const auto r = testing::run_command("timeout 120 bash " + dir.file("stop.sh").string());
  EXPECT_NE(r.out.find("exit=143"), std::string::npos) << r.out << bytes_of(log);
  EXPECT_GE(read_checkpoint(ck).step, 3);
  EXPECT_EQ(temporaries_in(ck), 0);
}

// SIGKILL, which nothing can catch (a scheduler's grace period running out), at three points of a run that checkpoints
// every step, so that the kill often lands in a write: the latest complete checkpoint always loads, every checksum
// good, and the run resumes from it (a temporary the kill cut short may stay behind; it is never the latest).
TEST(ApartTrainCli, KilledWhileCheckpointingEveryStepLeavesTheLatestCompleteCheckpointLoadable) {
  for (const int at : {3, 5, 8}) {
    TempDir dir;
    const std::string ck = dir.file("ck").string();
    const std::string log = dir.file("log").string();
    const std::string args = " train " + std::string(APART_SOURCE_DIR) + "/models/gpt-tiny.onnx --batch 32";
    {
      std::ofstream script(dir.file("kill.sh"));
      script << std::string(APART_BINARY) << args << " --steps 1000 --save-every 1 --checkpoint-dir " << ck << " >" << log
             << " 2>&1 </dev/null &\npid=$!\nfor i in $(seq 1200); do grep -q '^step=" << at << " ' " << log
             << " && break; sleep 0.01; done\nkill -KILL $pid\nwait $pid\necho exit=$?\n";
    }
    const auto r = testing::run_command("timeout 120 bash " + dir.file("kill.sh").string());
    ASSERT_NE(r.out.find("exit=137"), std::string::npos) << r.out << bytes_of(log);
    int64_t step = 0;
    ASSERT_NO_THROW(step = read_checkpoint(ck).step) << "killed after step " << at;
    EXPECT_GE(step, at - 1);
    const auto resumed = testing::run_apart_bounded(args + " --steps " + std::to_string(step + 2) + " --resume " + ck +
                                                    " --checkpoint-dir " + ck);
    EXPECT_EQ(resumed.code, 0) << resumed.out;
  }
}

TEST(ATrainRunWithKeepLast, KeepsTheLatestCheckpointsEachResumableAndAnnouncesWhatItDeletes) {
  TempDir dir;
  const fs::path model = write_mlp(dir.file(""));
  TrainOptions o = cosine_run(model, 5);
  o.checkpoint_dir = dir.file("ck").string();
  o.save_every = 1;
  o.keep_last = 3;
  std::vector<std::string> notes;
  o.on_note = [&](const std::string& n) { notes.push_back(n); };
  const TrainResult all = train(o);
  const fs::path ck = dir.file("ck");
  EXPECT_EQ(read_checkpoint(ck).step, 5);
  EXPECT_EQ(read_checkpoint(ck / "checkpoint.step_4.apart").step, 4);
  EXPECT_EQ(read_checkpoint(ck / "checkpoint.step_3.apart").step, 3);
  EXPECT_FALSE(fs::exists(ck / "checkpoint.step_2.apart"));
  EXPECT_FALSE(fs::exists(ck / "checkpoint.step_1.apart"));
  int deleted = 0;
  for (const std::string& n : notes) deleted += n.find(" deleted (--keep-last 3)") != std::string::npos;
  EXPECT_EQ(deleted, 2);
  TrainOptions again = cosine_run(model, 5);
  again.resume = (ck / "checkpoint.step_3.apart").string();
  const TrainResult rest = train(again);
  ASSERT_EQ(rest.steps.size(), 2u);
  EXPECT_EQ(rest.steps[0].loss, all.steps[3].loss);
  EXPECT_EQ(rest.steps[1].loss, all.steps[4].loss);
}

}  // namespace
}  // namespace apart
