// apart check: a plan apart partition wrote passes every check; each kind of damage fails the check it belongs to
// (and only the checks that depend on it), through check_plan_folder and through the CLI's exit code.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "driver/check.h"
#include "plan/plan.h"
#include "tests/support/onnx_builder.h"
#include "tests/support/run_apart.h"
#include "tests/support/temp_dir.h"

namespace apart {
namespace {

namespace fs = std::filesystem;

const std::string kModel = std::string(APART_SOURCE_DIR) + "/models/gpt-tiny.onnx";

// <name> in this process's folder, removed at exit.
fs::path plan_dir(const std::string& name) {
  const fs::path dir = testing::process_temp_dir("check_test") / name;
  fs::remove_all(dir);
  return dir;
}

// gpt-tiny planned by apart partition with `flags` (default: 2 stages on 4 devices, batch 8).
fs::path fresh_plan(const std::string& name, const std::string& flags = "--devices 4 --stages 2 --batch 8") {
  const fs::path dir = plan_dir(name);
  const auto r = testing::run_apart("partition " + kModel + " --device cpu " + flags + " --no-baselines -q -o " + dir.string());
  EXPECT_EQ(r.code, 0) << r.out;
  return dir;
}

void rewrite(const fs::path& dir, const PlanDocument& plan) {
  std::ofstream(dir / "plan.json") << plan_to_json(plan).dump(2) << "\n";
}

// The checks that failed, by name.
std::vector<std::string> failed(const PlanCheck& check) {
  std::vector<std::string> names;
  for (const PlanFinding& f : check.findings)
    if (!f.ok) names.push_back(f.check);
  return names;
}

const PlanFinding& finding(const PlanCheck& check, const std::string& name) {
  for (const PlanFinding& f : check.findings)
    if (f.check == name) return f;
  static const PlanFinding none{false, "none", "no such check"};
  return none;
}

TEST(ApartCheck, PassesEveryCheckOnAPlanPartitionWrote) {
  const fs::path dir = fresh_plan("valid");
  const PlanCheck check = check_plan_folder(dir);
  EXPECT_TRUE(check.ok());
  EXPECT_EQ(check.findings.size(), 12u);
  EXPECT_EQ(failed(check), std::vector<std::string>{});
  EXPECT_NE(finding(check, "loss").detail.find("'loss'"), std::string::npos) << finding(check, "loss").detail;
  const auto r = testing::run_apart("check " + dir.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the plan is valid"), std::string::npos) << r.out;
}

TEST(ApartCheck, FailsTheTaskCheckForATaskInTwoStagesOrNoneOrUnknown) {
  const fs::path dir = fresh_plan("tasks");
  PlanDocument plan = read_plan(dir);
  plan.stages[1].tasks.insert(plan.stages[1].tasks.begin(), plan.stages[0].tasks.back());  // in both stages
  plan.stages[1].tasks.back() = "no-such-task";  // instead of the loss, which is then in no stage
  rewrite(dir, plan);
  const PlanCheck check = check_plan_folder(dir);
  EXPECT_EQ(failed(check), std::vector<std::string>{"tasks"}) << finding(check, "tasks").detail;
  const std::string& detail = finding(check, "tasks").detail;
  EXPECT_NE(detail.find("'no-such-task'"), std::string::npos) << detail;
  EXPECT_NE(detail.find("in two stages"), std::string::npos) << detail;
  EXPECT_NE(detail.find("in no stage"), std::string::npos) << detail;  // the task the unknown name replaced
  const auto r = testing::run_apart("check " + dir.string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("FAIL tasks"), std::string::npos) << r.out;
}

// A logits-only export plans; apart run refuses it for want of a loss, and so does check, naming --loss cross_entropy.
// Planned with --loss cross_entropy, the plan records the loss and check reads the model with it.
TEST(ApartCheck, FailsTheLossCheckOfALogitsOnlyPlanAsApartRunWouldAndPassesItWithAnAddedLoss) {
  const fs::path dir = plan_dir("logits_only");
  fs::create_directories(dir);
  const std::string logits = (dir / "logits.onnx").string();
  ASSERT_EQ(testing::run_apart("zoo gpt-tiny --loss none -q -o " + logits).code, 0);
  auto plan_with = [&](const std::string& name, const std::string& flags) {
    const fs::path out = dir / name;
    const auto r = testing::run_apart("partition " + logits + " --device cpu --devices 2 --stages 2 --batch 8 " + flags +
                                      " --no-baselines -q -o " + out.string());
    EXPECT_EQ(r.code, 0) << r.out;
    return out;
  };
  const fs::path bare = plan_with("bare", "");
  const PlanCheck check = check_plan_folder(bare);
  EXPECT_EQ(failed(check), std::vector<std::string>{"loss"});
  EXPECT_NE(finding(check, "loss").detail.find("apart run will refuse"), std::string::npos) << finding(check, "loss").detail;
  EXPECT_NE(finding(check, "loss").detail.find("--loss cross_entropy"), std::string::npos) << finding(check, "loss").detail;
  const auto r = testing::run_apart("check " + bare.string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("FAIL loss"), std::string::npos) << r.out;

  const fs::path with_loss = plan_with("with_loss", "--loss cross_entropy --labels labels");
  ASSERT_TRUE(read_plan(with_loss).model->added_loss.has_value());
  EXPECT_EQ(read_plan(with_loss).model->added_loss->form, "cross_entropy");
  const PlanCheck good = check_plan_folder(with_loss);
  EXPECT_EQ(failed(good), std::vector<std::string>{});
}

// Weights the model declares as external data that are not beside it: apart run --init model refuses, check says so.
TEST(ApartCheck, NotesWeightsThatAreNotBesideTheModelAsWhatApartRunInitModelRefuses) {
  const fs::path dir = plan_dir("weights_missing");
  fs::create_directories(dir);
  const std::string model = (dir / "m.onnx").string();
  ASSERT_EQ(testing::run_apart("zoo gpt-tiny --weights none -q -o " + model).code, 0);
  const auto r = testing::run_apart("partition " + model + " --device cpu --devices 2 --stages 2 --batch 8 --no-baselines -q -o " +
                                    (dir / "plan").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const PlanCheck check = check_plan_folder(dir / "plan");
  EXPECT_NE(finding(check, "weights").detail.find("--init model will refuse"), std::string::npos)
      << finding(check, "weights").detail;
  EXPECT_NE(finding(check, "weights").detail.find("m.weights"), std::string::npos) << finding(check, "weights").detail;
}

TEST(ApartCheck, FailsTheOrderCheckWhenAStageReadsWhatALaterOneComputes) {
  const fs::path dir = fresh_plan("order");
  PlanDocument plan = read_plan(dir);
  std::swap(plan.stages[0].tasks, plan.stages[1].tasks);
  rewrite(dir, plan);
  const PlanCheck check = check_plan_folder(dir);
  EXPECT_EQ(failed(check), std::vector<std::string>{"order"}) << finding(check, "order").detail;
  EXPECT_NE(finding(check, "order").detail.find("flow backward"), std::string::npos);
}

// (A device count below the stages' is refused by plan.json's reader already: the schema check.)
TEST(ApartCheck, FailsTheMemoryAndPredictionChecksOnEditedFigures) {
  const fs::path dir = fresh_plan("figures");
  PlanDocument plan = read_plan(dir);
  plan.stages[0].memory_bytes = *plan.cluster.memory_bytes + 1;
  plan.stages[1].forward_s *= 2;
  rewrite(dir, plan);
  const PlanCheck check = check_plan_folder(dir);
  EXPECT_EQ(failed(check), (std::vector<std::string>{"memory", "prediction"})) << finding(check, "schema").detail;
  EXPECT_NE(finding(check, "memory").detail.find("stage 0"), std::string::npos) << finding(check, "memory").detail;
}

TEST(ApartCheck, FailsTheStageFileCheckForAMissingOrForeignStageFile) {
  const fs::path dir = fresh_plan("stage_files");
  fs::copy_file(dir / "stage_0.onnx", dir / "stage_1.onnx", fs::copy_options::overwrite_existing);  // stage 0's file as 1
  PlanCheck check = check_plan_folder(dir);
  EXPECT_EQ(failed(check), std::vector<std::string>{"stage files"});
  EXPECT_NE(finding(check, "stage files").detail.find("stage_1.onnx does not"), std::string::npos)
      << finding(check, "stage files").detail;
  fs::remove(dir / "stage_1.onnx");
  check = check_plan_folder(dir);
  EXPECT_NE(finding(check, "stage files").detail.find("1 missing: 'stage_1.onnx'"), std::string::npos)
      << finding(check, "stage files").detail;
}

// A value whose shape depends on data (Reshape to the shape of NonZero's output) plans, but apart train and apart run
// refuse the model: partition warns and check's runtime finding says so, both naming the node, before any run.
TEST(ApartCheck, SaysUpFrontThatRunRefusesAModelWithAValueWithoutAStaticShapeNamingItsNode) {
  testing::OnnxBuilder b;
  b.input("x", {"batch", 4}).output("loss");
  b.weight("w", {4, 4});
  b.node("MatMul", {"x", "w"}, {"h"}, "mm");
  b.node("NonZero", {"h"}, {"nz"}, "nonzero");
  b.node("Shape", {"nz"}, {"s"}, "shape");
  b.node("Reshape", {"h", "s"}, {"r"}, "reshape_by_data");
  testing::OnnxBuilder::set_int(b.node("ReduceSum", {"r"}, {"loss"}, "sum"), "keepdims", 0);
  const fs::path dir = plan_dir("unknown_shape"), model = plan_dir("unknown_shape_model.onnx");
  b.save(model);
  const auto r = testing::run_apart("partition " + model.string() + " --device cpu --devices 1 --batch 4 --no-baselines -o " +
                                    dir.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("apart train and apart run will refuse the model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("first at node 'nonzero' (NonZero)"), std::string::npos) << r.out;
  const PlanCheck check = check_plan_folder(dir, model);
  const std::string& runtime = finding(check, "runtime").detail;
  EXPECT_NE(runtime.find("apart train and apart run will refuse the model"), std::string::npos) << runtime;
  EXPECT_NE(runtime.find("first at node 'nonzero' (NonZero)"), std::string::npos) << runtime;
  EXPECT_EQ(runtime.find("apart run executes this plan"), std::string::npos) << runtime;
}

// An interleaved plan: its chunks' files are checked beside the stages'; one written before plan.json listed its
// chunks is valid, with a runtime note asking to re-plan.
TEST(ApartCheck, ChecksAnInterleavedPlansChunkFilesAndNotesOneWithoutChunks) {
  const fs::path dir =
      fresh_plan("interleaved", "--devices 2 --stages 2 --replicas 1 --microbatches 2 --batch 8 --schedule interleaved");
  PlanCheck check = check_plan_folder(dir);
  EXPECT_EQ(failed(check), std::vector<std::string>{});
  EXPECT_NE(finding(check, "stage files").detail.find("2 stage_K.onnx and 4 chunk_C.onnx"), std::string::npos)
      << finding(check, "stage files").detail;
  EXPECT_NE(finding(check, "runtime").detail.find("apart run executes this plan"), std::string::npos)
      << finding(check, "runtime").detail;
  fs::copy_file(dir / "chunk_1.onnx", dir / "chunk_2.onnx", fs::copy_options::overwrite_existing);
  check = check_plan_folder(dir);
  EXPECT_EQ(failed(check), std::vector<std::string>{"stage files"});
  EXPECT_NE(finding(check, "stage files").detail.find("chunk_2.onnx does not"), std::string::npos)
      << finding(check, "stage files").detail;
  PlanDocument plan = read_plan(dir);
  plan.virtual_stages.clear();
  rewrite(dir, plan);
  check = check_plan_folder(dir);
  EXPECT_EQ(failed(check), std::vector<std::string>{});
  EXPECT_NE(finding(check, "runtime").detail.find("re-run apart partition"), std::string::npos)
      << finding(check, "runtime").detail;
}

// The initializers of a model file, by name.
std::map<std::string, onnx::TensorProto> initializers(const fs::path& file) {
  onnx::ModelProto m;
  std::ifstream in(file, std::ios::binary);
  EXPECT_TRUE(m.ParseFromIstream(&in)) << file;
  std::map<std::string, onnx::TensorProto> by_name;
  for (const onnx::TensorProto& t : m.graph().initializer()) by_name[t.name()] = t;
  return by_name;
}

// A TP 2 × PP 2 plan with sequence parallelism: every rank's shard cuts; --write-shards writes the four files apart
// run runs, each rank holding its rows or columns of every split weight (of each piece of a fused one: Q, K and V),
// replicated weights whole, its collectives as ai.apart nodes.
TEST(ApartCheck, CutsEveryTpRanksShardAndWritesTheShardsApartRunRuns) {
  const fs::path dir =
      fresh_plan("tp", "--devices 4 --tp 2 --pp 2 --dp 1 --sequence-parallel on --microbatches 2 --batch 8");
  const PlanCheck check = check_plan_folder(dir);
  EXPECT_EQ(failed(check), std::vector<std::string>{});
  EXPECT_NE(finding(check, "tp shards").detail.find("4 rank shards of 2 stage file(s)"), std::string::npos)
      << finding(check, "tp shards").detail;

  const fs::path out = plan_dir("tp_shards");
  const auto w = testing::run_apart("check " + dir.string() + " -q --write-shards " + out.string());
  ASSERT_EQ(w.code, 0) << w.out;
  const std::vector<TpRankShard> shards = tensor_parallel_shards(read_plan(dir), dir, TpWeights::kCut);
  ASSERT_EQ(shards.size(), 4u);
  int split = 0;
  for (const TpRankShard& s : shards) {
    const auto whole = initializers(s.file);
    const fs::path file = out / (s.file.stem().string() + ".tp_" + std::to_string(s.rank) + ".onnx");
    ASSERT_TRUE(fs::is_regular_file(file)) << file << "\n" << w.out;
    const auto mine = initializers(file);
    onnx::ModelProto written;
    std::ifstream in(file, std::ios::binary);
    ASSERT_TRUE(written.ParseFromIstream(&in));
    int collectives = 0;
    for (const onnx::NodeProto& n : written.graph().node()) collectives += n.domain() == "ai.apart";
    EXPECT_GT(collectives, 0) << file;
    std::map<std::string, TpShardedParam> cut;
    for (const TpShardedParam& p : s.shard.params) cut[p.name] = p;
    for (const auto& [name, all] : whole) {
      ASSERT_TRUE(mine.count(name)) << name << " is not in " << file;
      const std::string& bytes = mine.at(name).raw_data();
      const auto it = cut.find(name);
      if (it == cut.end()) {  // replicated: the stage file's
        EXPECT_TRUE(bytes == all.raw_data()) << name << " differs from the stage file's in " << file;
        continue;
      }
      ++split;
      const TpShardedParam& p = it->second;
      int64_t outer = 1, inner = 4;  // float32 bytes
      for (int a = 0; a < p.axis; ++a) outer *= all.dims(a);
      for (int a = p.axis + 1; a < all.dims_size(); ++a) inner *= all.dims(a);
      std::string expected;
      for (int64_t o = 0; o < outer; ++o)
        for (const auto& [begin, end] : tp_param_ranges(p, 2, s.rank))
          expected += all.raw_data().substr(static_cast<size_t>((o * all.dims(p.axis) + begin) * inner),
                                            static_cast<size_t>((end - begin) * inner));
      EXPECT_TRUE(bytes == expected) << name << ": rank " << s.rank << " does not hold its ranges along axis " << p.axis;
    }
  }
  EXPECT_GT(split, 8);
  EXPECT_NE(testing::run_apart("check " + dir.string() + " -q --write-shards " + dir.string()).code, 0)
      << "wrote shards into the plan folder";
}

// A TP region whose plan.json layout cuts its row linears as column linears too: the shard pass refuses it, and so
// does the check, before mpirun would.
TEST(ApartCheck, FailsTheTpShardCheckForARegionTheStagesCannotBeCutBy) {
  const fs::path dir = fresh_plan("tp_broken", "--devices 2 --tp 2 --pp 1 --dp 1 --microbatches 2 --batch 8");
  PlanDocument plan = read_plan(dir);
  ASSERT_TRUE(plan.tensor_parallel.has_value());
  for (PlanTpRegion& region : plan.tensor_parallel->regions)
    if (!region.row_tasks.empty()) region.column_tasks = region.row_tasks;  // the row linears cut as columns too
  rewrite(dir, plan);
  const PlanCheck check = check_plan_folder(dir);
  EXPECT_EQ(failed(check), std::vector<std::string>{"tp shards"});
  EXPECT_NE(finding(check, "tp shards").detail.find("cannot cut"), std::string::npos) << finding(check, "tp shards").detail;
}

TEST(ApartCheck, FailsTheModelCheckForOtherBytesAndSkipsWhatNeedsTheModel) {
  const fs::path dir = fresh_plan("model");
  const fs::path other = dir.parent_path() / "other.onnx";
  fs::copy_file(kModel, other, fs::copy_options::overwrite_existing);
  std::ofstream(other, std::ios::app) << '\0';  // a trailing byte: still ONNX, another sha256
  const PlanCheck check = check_plan_folder(dir, other);
  EXPECT_EQ(failed(check), (std::vector<std::string>{"model", "tasks", "order"}));
  EXPECT_NE(finding(check, "model").detail.find("not the one the plan was made for"), std::string::npos);
}

TEST(ApartCheck, ReportsAPlanJsonThatDoesNotParseAsTheOnlyCheckAndExits3) {
  const fs::path dir = fresh_plan("schema");
  std::ofstream(dir / "plan.json") << "{\"schema\": \"apart.plan/1\", \"stages\": 3}\n";
  const PlanCheck check = check_plan_folder(dir);
  EXPECT_EQ(failed(check), std::vector<std::string>{"schema"});
  EXPECT_EQ(check.findings.size(), 1u);
  const auto r = testing::run_apart("check " + dir.string() + " -q");
  EXPECT_EQ(r.code, 3) << r.out;
  const auto none = testing::run_apart("check " + (dir / "nothing").string());
  EXPECT_EQ(none.code, 2) << none.out;
}

}  // namespace
}  // namespace apart
