// apart train end to end: gpt-tiny learns the synthetic task; an mlp saved with --save-model re-imports
// with the trained loss; a resumed run equals an uninterrupted one; the CLI prints its step lines.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "graph/error.h"
#include "importer/importer.h"
#include "models/zoo.h"
#include "train/checkpoint.h"
#include "runtime/executor.h"
#include "train/trainer.h"
#include "tests/train/train_fixture.h"
#include "tests/support/run_apart.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {
namespace fs = std::filesystem;

using testing::TempDir;

std::string gpt_tiny() { return std::string(APART_SOURCE_DIR) + "/models/gpt-tiny.onnx"; }

using testing::cosine_run;
using testing::write_mlp;

double mean(const std::vector<StepRecord>& steps, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += steps[i].loss;
  return s / static_cast<double>(to - from);
}

TEST(GptTiny, LearnsTheSyntheticTaskUntilItsLossHalves) {
  TrainOptions o;
  o.model = gpt_tiny();
  o.batch = 8;
  o.steps = 80;
  o.optimizer.kind = Optimizer::kAdamW;
  o.optimizer.lr = 2e-2;
  o.schedule.kind = LrScheduleKind::kCosine;
  o.schedule.warmup_steps = 5;
  o.init = ParamInit::kModel;
  const TrainResult r = train(o);
  ASSERT_EQ(r.steps.size(), 80u);
  EXPECT_NEAR(r.steps.front().loss, 6.24, 0.3);  // ≈ ln 512 at the start
  const double last5 = mean(r.steps, r.steps.size() - 5, r.steps.size());
  EXPECT_LT(last5, 0.5 * r.steps.front().loss) << "first " << r.steps.front().loss << ", last-5 mean " << last5;
  EXPECT_EQ(r.params, 134912);
  EXPECT_GT(r.samples_per_s, 0);
}

TEST(ATrainedMlp, SavedWithSaveModelReimportsWithTheTrainedLoss) {
  TempDir dir;
  TrainOptions o;
  o.model = write_mlp(dir.file("")).string();
  o.batch = 4;
  o.steps = 20;
  o.optimizer.kind = Optimizer::kAdam;
  o.optimizer.lr = 1e-2;
  o.init = ParamInit::kRandom;
  o.seed = 3;
  o.save_model = dir.file("trained.onnx").string();
  o.checkpoint_dir = dir.file("ck").string();
  const TrainResult r = train(o);
  EXPECT_LT(r.steps.back().loss, r.steps.front().loss);

  // The loss of the saved model on batch 20 equals what training would see next: run the saved forward.
  ImportOptions io;
  io.dims["batch"] = 4;
  const ImportedModel m = import_model(dir.file("trained.onnx"), io);
  Executor ex(m);
  DataOptions d;
  d.seed = 3;
  auto data = make_data_source(d, classify_inputs(m.graph));
  const double saved_loss = ex.run(data->batch(20)).front().second.scalar_as_double();

  // Same from the checkpoint: continuing one step reports the loss of batch 20 before updating.
  TrainOptions more = o;
  more.steps = 21;
  more.resume = dir.file("ck").string();
  more.save_model.clear();
  more.checkpoint_dir.clear();
  const TrainResult next = train(more);
  ASSERT_EQ(next.steps.size(), 1u);
  EXPECT_NEAR(saved_loss, next.steps.front().loss, 1e-6 * std::abs(saved_loss) + 1e-9);
}

TEST(AResumedRun, EqualsAnUninterruptedOne) {
  TempDir dir;
  TrainOptions o = cosine_run(write_mlp(dir.file("")), 6);
  o.checkpoint_dir = dir.file("straight").string();
  const TrainResult straight = train(o);

  // The same run, interrupted after step 4 (the step-3 checkpoint is on disk), then resumed.
  TrainOptions first = o;
  first.checkpoint_dir = dir.file("at3").string();
  first.save_every = 3;
  struct Stop {};
  try {
    train(first, [](const StepRecord& s) {
      if (s.step == 4) throw Stop{};
    });
    FAIL() << "not interrupted";
  } catch (const Stop&) {
  }
  ASSERT_EQ(read_checkpoint(dir.file("at3")).step, 3);
  TrainOptions resumed = first;
  resumed.resume = dir.file("at3").string();
  resumed.checkpoint_dir = dir.file("resumed").string();
  resumed.save_every = 0;
  const TrainResult rest = train(resumed);
  ASSERT_EQ(rest.first_step, 3);
  ASSERT_EQ(rest.steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(rest.steps[i].loss, straight.steps[i + 3].loss);
  const Checkpoint a = read_checkpoint(dir.file("straight")), b = read_checkpoint(dir.file("resumed"));
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    ASSERT_EQ(a.tensors[i].first, b.tensors[i].first);
    ASSERT_EQ(a.tensors[i].second.bytes(), b.tensors[i].second.bytes());
    EXPECT_EQ(0, std::memcmp(a.tensors[i].second.raw(), b.tensors[i].second.raw(), static_cast<size_t>(a.tensors[i].second.bytes())))
        << a.tensors[i].first;
  }
}

TEST(Resume, RefusesACheckpointOfAnotherOptimizer) {
  TempDir dir;
  TrainOptions o;
  o.model = write_mlp(dir.file("")).string();
  o.batch = 2;
  o.steps = 1;
  o.optimizer.kind = Optimizer::kSgd;
  o.checkpoint_dir = dir.file("ck").string();
  train(o);
  o.optimizer.kind = Optimizer::kAdam;
  o.steps = 2;
  o.resume = o.checkpoint_dir;
  EXPECT_THROW(train(o), InvalidArgument);
}

TEST(Train, RefusesAStaticBatchThatDiffersFromBatch) {
  TempDir dir;
  auto zo = models::options_for("mlp-tiny");
  zo.batch = 3;
  models::write_zoo_model(zo, dir.file("mlp3.onnx").string());
  TrainOptions o;
  o.model = dir.file("mlp3.onnx").string();
  o.batch = 4;
  o.steps = 1;
  EXPECT_THROW(train(o), InvalidArgument);
}

TEST(TheTrainCommand, PrintsOneLinePerStepAndASummary) {
  const auto r = testing::run_apart("train " + gpt_tiny() + " --steps 3 --batch 2 --lr 1e-3 --optimizer adam");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step=1 loss="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step=3 loss="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("samples/s="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("trained 134.91K params"), std::string::npos) << r.out;
}

// Each step line carries its time and throughput (tokens/s for a sequence model: gpt-tiny's samples are 32 tokens),
// every --log-every steps and the last the elapsed time and ETA; --metrics writes one JSON object per step.
TEST(TheTrainCommand, PrintsStepTimeTokensAndEtaAndWritesOneMetricsObjectPerStep) {
  TempDir dir;
  const std::string metrics = dir.file("metrics.jsonl").string();
  const auto r = testing::run_apart("train " + gpt_tiny() + " --steps 5 --batch 2 --log-every 2 --metrics " + metrics);
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<std::string> lines;  // the step lines
  std::istringstream out(r.out);
  for (std::string line; std::getline(out, line);)
    if (line.rfind("step=", 0) == 0) lines.push_back(line);
  ASSERT_EQ(lines.size(), 5u) << r.out;
  for (size_t k = 0; k < lines.size(); ++k) {
    EXPECT_NE(lines[k].find(" tokens/s="), std::string::npos) << lines[k];
    EXPECT_NE(lines[k].find(" step_time="), std::string::npos) << lines[k];
    const bool timed = k == 1 || k == 3 || k == 4;  // steps 2 and 4 (--log-every 2) and the last
    EXPECT_EQ(lines[k].find(" eta=") != std::string::npos, timed) << lines[k];
  }
  std::ifstream in(metrics);
  std::string line;
  int64_t step = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("step").get<int64_t>(), ++step);
    EXPECT_TRUE(std::isfinite(j.at("loss").get<double>()));
    EXPECT_NEAR(j.at("tokens_per_s").get<double>(), 32 * j.at("samples_per_s").get<double>(),
                1e-9 * j.at("tokens_per_s").get<double>());
    EXPECT_GT(j.at("step_time_s").get<double>(), 0);
    EXPECT_GT(j.at("resident_peak_bytes").get<int64_t>(), 0);
  }
  EXPECT_EQ(step, 5);
  // The metrics file may not be the model it reads.
  const auto refused = testing::run_apart("train " + gpt_tiny() + " --steps 1 --metrics " + gpt_tiny());
  EXPECT_EQ(refused.code, 2) << refused.out;
}

TEST(TheTrainCommand, ExitsWithTheInvalidArgumentCodeOnBadFlags) {
  for (const std::string flags : {"--optimizer lamb", "--steps 0", "--betas 0.9", "--data /nonexistent.bin",
                                  "--lr-schedule step", "--warmup-steps 5"}) {
    const auto r = testing::run_apart("train " + gpt_tiny() + " --batch 2 " + flags);
    EXPECT_EQ(r.code, 2) << flags << ": " << r.out;
  }
}

}  // namespace
}  // namespace apart
