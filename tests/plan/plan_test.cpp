// The plan document: plan.json read and written again is byte-identical; corrupt plans get errors naming the field.
#include "plan/plan.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "graph/error.h"

namespace apart {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<fs::path> golden_plans() {
  std::vector<fs::path> plans;
  for (const auto& dir : fs::directory_iterator(fs::path(APART_TEST_DATA_DIR) / "golden" / "plans"))
    if (fs::exists(dir.path() / "plan.json")) plans.push_back(dir.path() / "plan.json");
  std::sort(plans.begin(), plans.end());
  return plans;
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(APlanDocument, WritesARealPlanBackByteForByte) {
  const auto plans = golden_plans();
  ASSERT_FALSE(plans.empty());
  for (const fs::path& file : plans) {
    const std::string text = read_text(file);
    const PlanDocument plan = read_plan(file);
    // The goldens hold search.seconds as 0 (tests/cli/plan_goldens_test.cpp): compare the rest byte for byte.
    const std::string written = std::regex_replace(plan_to_json(plan).dump(2) + "\n",
                                                   std::regex(R"("seconds": [-0-9.e+]+)"), "\"seconds\": 0");
    EXPECT_EQ(written, text) << file;
  }
}

TEST(APlanDocument, ReadsTheVocabularyAsEnums) {
  const PlanDocument plan = read_plan(golden_plans().front());
  EXPECT_EQ(optimizer_name(plan.training.optimizer), "adamw");  // partition's default, as train's
  ASSERT_FALSE(plan.stages.empty());
  EXPECT_FALSE(plan.stages.front().tasks.empty());
  ASSERT_TRUE(plan.search.has_value());
}

std::string error_of(const json& j) {
  try {
    plan_from_json(j, "p.json");
  } catch (const InvalidModel& e) {
    return e.what();
  }
  return "no error";
}

TEST(APlanReader, NamesTheFieldOfACorruptRealPlan) {
  const json real = json::parse(read_text(golden_plans().front()));
  struct Case {
    std::function<void(json&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["training"]["optimizer"] = "lamb"; },
       "training.optimizer is \"lamb\", expected sgd, momentum, adam or adamw"},
      {[](json& j) { j["training"]["precision"] = "int8"; }, "training.precision is \"int8\""},
      {[](json& j) { j["training"]["schedule"] = "zb"; },
       "training.schedule is \"zb\", expected gpipe, 1f1b, interleaved or zb-h1"},
      {[](json& j) { j["training"]["attention"] = "fused"; },
       "training.attention is \"fused\", expected flash or materialized"},
      {[](json& j) { j["stages"][0]["tasks"][0] = 7; }, "stages[0].tasks[0] must be a string"},
      {[](json& j) { j["stages"][0]["forward_s"] = -1; },
       "stages[0].forward_s must be a finite number in [0, 32000000]"},
      {[](json& j) { j["cluster"]["memory_bytes"] = "lots"; }, "cluster.memory_bytes"},
      {[](json& j) { j["predicted"] = 3; }, "predicted must be an object"},
      {[](json& j) { j["search"]["candidates"] = -2; }, "search.candidates"},
      {[](json& j) { j["options"]["replicas"] = "some"; }, "options.replicas"},
      {[](json& j) { j["tensor_parallel"] = 1; }, "tensor_parallel must be an object"},
      {[](json& j) {
         j["tensor_parallel"] = {{"regions", {{{"kind", "conv"}, {"name", "a"}, {"tasks", 1}, {"degrees", {1}}}}}};
       },
       "tensor_parallel.regions[0].kind is \"conv\", expected attention, mlp, embedding or lm_head"},
      {[](json& j) {
         j["tensor_parallel"] = {{"regions", {{{"kind", "mlp"}, {"name", "a"}, {"tasks", 1}, {"degrees", {1, 3}}}}}};
       },
       "tensor_parallel.regions[0].degrees[1] is 3, expected one of 1, 2, 4, 8"},
      {[](json& j) {
         j["tensor_parallel"] = {{"regions", {{{"kind", "mlp"}, {"tasks", 1}, {"degrees", {1}}}}}};
       },
       "tensor_parallel.regions[0].name"},
  };
  for (const Case& c : cases) {
    json j = real;
    c.edit(j);
    const std::string message = error_of(j);
    EXPECT_NE(message.find(c.message), std::string::npos) << "expected '" << c.message << "' in: " << message;
    EXPECT_NE(message.find("p.json: "), std::string::npos) << message;
  }
}

// A golden plan with one stage made to have `replicas` replicas (devices 0..replicas-1, the rest dropped).
json one_stage_plan(int replicas) {
  json j = json::parse(read_text(golden_plans().front()));
  json stage = j["stages"][0];
  stage["replicas"] = replicas;
  stage["devices"] = json::array();
  for (int d = 0; d < replicas; ++d) stage["devices"].push_back(d);
  stage["inputs"] = json::array();
  stage["outputs"] = json::array();
  j["stages"] = json::array({stage});
  j["cluster"]["devices"] = std::max(replicas, 1);
  return j;
}

// Two stages of one device, two chunks each, as apart partition --schedule interleaved writes them: chunk c on stage
// c mod 2, values along the chain c → c + 1.
json interleaved_plan() {
  PlanDocument plan;
  plan.cluster.devices = 2;
  plan.training.global_batch = 4;
  plan.training.microbatches = 2;
  plan.training.schedule = Schedule::kInterleaved;
  plan.training.virtual_stages = 2;
  for (int s = 0; s < 2; ++s) {
    PlanStageRecord& stage = plan.stages.emplace_back();
    stage.id = s;
    stage.devices = {s};
    stage.tasks = {"t" + std::to_string(s)};
    stage.forward_s = 1;
    stage.backward_s = 2;
  }
  plan.stages[0].inputs = {{"x", -1, 8}};
  plan.stages[0].outputs = {{"a", {1}, 8}};
  plan.stages[1].inputs = {{"a", 0, 8}};
  for (int c = 0; c < 4; ++c) {
    PlanVirtualStage& chunk = plan.virtual_stages.emplace_back();
    chunk.id = c;
    chunk.stage = c % 2;
    chunk.tasks = {"c" + std::to_string(c)};
    chunk.inputs = {c == 0 ? PlanInput{"x", -1, 8} : PlanInput{"v" + std::to_string(c - 1), c - 1, 8}};
    if (c < 3) chunk.outputs = {{"v" + std::to_string(c), {c + 1}, 8}};
  }
  return json::parse(plan_to_json(plan).dump());
}

TEST(APlanReader, ReadsAnInterleavedPlansChunksWritesThemBackAndViewsThemAsStagesOnTheirStagesDevices) {
  const json j = interleaved_plan();
  const PlanDocument plan = plan_from_json(j);
  ASSERT_EQ(plan.virtual_stages.size(), 4u);
  EXPECT_EQ(json::parse(plan_to_json(plan).dump()), j);
  EXPECT_FALSE(is_virtual_stage_view(plan));
  EXPECT_EQ(stage_file_name(plan, 1), "stage_1.onnx");
  const PlanDocument view = virtual_stage_view(plan);
  ASSERT_TRUE(is_virtual_stage_view(view));
  ASSERT_EQ(view.stages.size(), 4u);
  for (int c = 0; c < 4; ++c) {
    const PlanStageRecord& chunk = view.stages[static_cast<size_t>(c)];
    EXPECT_EQ(chunk.id, c);
    EXPECT_EQ(chunk.devices, std::vector<int>{c % 2});
    EXPECT_EQ(chunk.tasks, std::vector<std::string>{"c" + std::to_string(c)});
    EXPECT_DOUBLE_EQ(chunk.forward_s, 0.5) << "1/v of the stage's";
    EXPECT_DOUBLE_EQ(chunk.backward_s, 1.0);
    EXPECT_EQ(stage_file_name(view, c), "chunk_" + std::to_string(c) + ".onnx");
  }
}

TEST(APlanReader, RefusesChunksOfAnotherCountStageOrOrderOrUnderAnotherSchedule) {
  auto refused = [](const std::function<void(json&)>& damage, const std::string& field) {
    json j = interleaved_plan();
    damage(j);
    try {
      plan_from_json(j, "p.json");
      ADD_FAILURE() << "accepted damage to " << field;
    } catch (const InvalidModel& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  refused([](json& j) { j["virtual_stages"].erase(3); }, "virtual_stages lists 3 chunks, expected 4");
  refused([](json& j) { j["virtual_stages"][1]["stage"] = 0; }, "virtual_stages[1].stage");
  refused([](json& j) { j["virtual_stages"][2]["id"] = 3; }, "virtual_stages[2].id");
  refused([](json& j) { j["virtual_stages"][1]["inputs"][0]["from_stage"] = 2; }, "virtual_stages[1].inputs[0].from_stage");
  refused([](json& j) { j["virtual_stages"][0]["tasks"] = json::array(); }, "virtual_stages[0].tasks");
  refused([](json& j) { j["training"]["schedule"] = "1f1b"; }, "training.schedule is not interleaved");
}

TEST(AnInterleavedPlanWithoutChunks, IsRefusedWhenViewedAskingToReplan) {
  json j = interleaved_plan();
  j.erase("virtual_stages");
  EXPECT_THROW(virtual_stage_view(plan_from_json(j)), InvalidModel);
}

TEST(APlanReader, ReadsTheAttentionKernelPricedAndWritesOnlyMaterializedBack) {
  json j = one_stage_plan(4);
  EXPECT_EQ(plan_from_json(j).training.attention, AttentionKernel::kFused) << "absent: flash";
  EXPECT_FALSE(plan_to_json(plan_from_json(j))["training"].contains("attention")) << "flash is not written";
  j["training"]["attention"] = "materialized";
  const PlanDocument plan = plan_from_json(j);
  EXPECT_EQ(plan.training.attention, AttentionKernel::kMaterialized);
  EXPECT_EQ(plan_to_json(plan)["training"]["attention"], "materialized");
}

TEST(APlanReader, ReadsAStagesZeroStageAndWritesItBack) {
  json j = one_stage_plan(4);
  EXPECT_EQ(plan_from_json(j).stages[0].zero, 0) << "absent: 0";
  EXPECT_FALSE(plan_to_json(plan_from_json(j))["stages"][0].contains("zero")) << "0 is not written";
  for (int zero = 1; zero <= kMaxZeroStage; ++zero) {
    j["stages"][0]["zero"] = zero;
    const PlanDocument plan = plan_from_json(j);
    EXPECT_EQ(plan.stages[0].zero, zero);
    EXPECT_EQ(plan_to_json(plan)["stages"][0]["zero"], zero);
  }
}

TEST(APlanReader, ReadsAStagesTensorParallelDegreeWithReplicasTimesDegreeDevicesAndWritesItBack) {
  json j = one_stage_plan(8);  // 8 devices, one node (devices_per_node absent or ≥ 8 in the golden)
  j["cluster"]["devices_per_node"] = 8;
  EXPECT_EQ(plan_from_json(j).stages[0].tp, 1) << "absent: 1";
  EXPECT_FALSE(plan_to_json(plan_from_json(j))["stages"][0].contains("tp")) << "1 is not written";
  for (int tp : {2, 4, 8}) {
    j["stages"][0]["tp"] = tp;
    j["stages"][0]["replicas"] = 8 / tp;
    const PlanDocument plan = plan_from_json(j);
    EXPECT_EQ(plan.stages[0].tp, tp);
    EXPECT_EQ(plan.stages[0].replicas, 8 / tp);
    EXPECT_EQ(plan_to_json(plan)["stages"][0]["tp"], tp);
  }
}

TEST(APlanReader, RefusesADegreeOutsideOneTwoFourEightADeviceCountOtherThanReplicasTimesDegreeAndAGroupAcrossNodes) {
  json j = one_stage_plan(8);
  j["cluster"]["devices_per_node"] = 4;
  j["stages"][0]["replicas"] = 2;
  j["stages"][0]["tp"] = 3;
  EXPECT_NE(error_of(j).find("stages[0].tp is 3"), std::string::npos) << error_of(j);
  j["stages"][0]["tp"] = 16;
  EXPECT_NE(error_of(j).find("stages[0].tp"), std::string::npos) << error_of(j);
  j["stages"][0]["tp"] = 2;  // 2 × 2 = 4 devices, 8 listed
  EXPECT_NE(error_of(j).find("expected replicas × tp = 2 × 2"), std::string::npos) << error_of(j);
  j["stages"][0]["tp"] = 4;
  EXPECT_EQ(error_of(j), "no error");  // groups 0-3 and 4-7, one node each
  j["stages"][0]["devices"] = json::array({0, 1, 2, 4, 3, 5, 6, 7});  // group 0 holds device 4 of the next node
  const std::string message = error_of(j);
  EXPECT_NE(message.find("stages[0].devices[3]"), std::string::npos) << message;
  EXPECT_NE(message.find("must share a node"), std::string::npos) << message;
}

TEST(APlanReader, RefusesAZeroStageOutOfRangeOrOnAOneReplicaStage) {
  json j = one_stage_plan(4);
  j["stages"][0]["zero"] = 4;
  EXPECT_NE(error_of(j).find("stages[0].zero"), std::string::npos) << error_of(j);
  j["stages"][0]["zero"] = -1;
  EXPECT_NE(error_of(j).find("stages[0].zero"), std::string::npos) << error_of(j);
  json single = one_stage_plan(1);
  single["stages"][0]["zero"] = 2;
  const std::string message = error_of(single);
  EXPECT_NE(message.find("stages[0].zero is 2 on a stage with one replica"), std::string::npos) << message;
  EXPECT_NE(message.find("nothing to shard"), std::string::npos) << message;
  single["stages"][0]["zero"] = 0;
  EXPECT_EQ(error_of(single), "no error");
}

TEST(APlanReader, ReadsARecomputeScopeAndItsRecomputedForwardAndWritesThemBack) {
  json j = one_stage_plan(2);
  json& st = j["stages"][0];
  st["recompute"] = true;
  st["backward_s"] = st["forward_s"].get<double>() * 3;
  EXPECT_EQ(plan_from_json(j).stages[0].recompute_scope, RecomputeScope::kFull) << "absent on a recomputing stage";
  EXPECT_FALSE(plan_to_json(plan_from_json(j))["stages"][0].contains("recompute_scope")) << "full is not written";
  st["recompute_scope"] = "selective";
  st["recompute_forward_s"] = st["forward_s"].get<double>() / 4;
  const PlanDocument plan = plan_from_json(j);
  EXPECT_EQ(plan.stages[0].recompute_scope, RecomputeScope::kSelective);
  ASSERT_TRUE(plan.stages[0].recompute_forward_s.has_value());
  EXPECT_DOUBLE_EQ(*plan.stages[0].recompute_forward_s, st["forward_s"].get<double>() / 4);
  const json back = plan_to_json(plan)["stages"][0];
  EXPECT_EQ(back["recompute_scope"], "selective");
  EXPECT_DOUBLE_EQ(back["recompute_forward_s"].get<double>(), st["forward_s"].get<double>() / 4);
  json none = one_stage_plan(2);
  none["stages"][0]["recompute"] = false;
  EXPECT_EQ(plan_from_json(none).stages[0].recompute_scope, RecomputeScope::kNone);
}

TEST(APlanReader, RefusesARecomputeScopeThatDisagreesWithRecomputeOrAnUnknownOne) {
  json j = one_stage_plan(2);
  j["stages"][0]["recompute"] = false;
  j["stages"][0]["recompute_scope"] = "selective";
  EXPECT_NE(error_of(j).find("stages[0].recompute_scope is selective but recompute is false"), std::string::npos)
      << error_of(j);
  j["stages"][0]["recompute_scope"] = "attention";
  EXPECT_NE(error_of(j).find("expected none, selective or full"), std::string::npos) << error_of(j);
  j["stages"][0].erase("recompute_scope");
  j["stages"][0]["recompute_forward_s"] = 0.5;
  EXPECT_NE(error_of(j).find("stages[0].recompute_forward_s is positive on a stage that does not recompute"),
            std::string::npos)
      << error_of(j);
  json big = one_stage_plan(2);
  big["stages"][0]["recompute"] = true;
  big["stages"][0]["recompute_forward_s"] = big["stages"][0]["backward_s"].get<double>() * 2;
  EXPECT_NE(error_of(big).find("stages[0].backward_s"), std::string::npos) << error_of(big);
}

TEST(APlanReader, ReadsSequenceParallelOnlyOnATensorParallelStage) {
  json j = one_stage_plan(8);
  j["cluster"]["devices_per_node"] = 8;
  EXPECT_FALSE(plan_from_json(j).stages[0].sequence_parallel) << "absent: false";
  j["stages"][0]["sequence_parallel"] = true;
  EXPECT_NE(error_of(j).find("stages[0].sequence_parallel is true on a stage with tp 1"), std::string::npos)
      << error_of(j);
  j["stages"][0]["tp"] = 4;
  j["stages"][0]["replicas"] = 2;
  const PlanDocument plan = plan_from_json(j);
  EXPECT_TRUE(plan.stages[0].sequence_parallel);
  EXPECT_EQ(plan_to_json(plan)["stages"][0]["sequence_parallel"], true);
  j["stages"][0]["sequence_parallel"] = false;
  EXPECT_FALSE(plan_to_json(plan_from_json(j))["stages"][0].contains("sequence_parallel")) << "false is not written";
}

TEST(APlanReader, ReadsNullFiguresThatAreOnlyShownAsAbsent) {
  json j = json::parse(read_text(golden_plans().front()));
  j["predicted"]["compute_lower_bound_s"] = nullptr;  // partition writes a figure it could not compute as null
  const PlanDocument plan = plan_from_json(j);
  EXPECT_FALSE(plan.predicted->compute_lower_bound_s.has_value());
  j["stages"][0]["forward_s"] = nullptr;  // what the simulator replays may not be null
  EXPECT_NE(error_of(j).find("stages[0].forward_s"), std::string::npos);
}

TEST(APlanReader, ReadsAPlanWithoutTensorParallelRegions) {
  json j = json::parse(read_text(golden_plans().front()));
  j.erase("tensor_parallel");  // plans before the field, and plans of models without regions
  EXPECT_FALSE(plan_from_json(j).tensor_parallel.has_value());
  EXPECT_FALSE(plan_to_json(plan_from_json(j)).contains("tensor_parallel"));
}

TEST(APlanDocument, KeepsItsTensorParallelRegionsThroughTheWriterAndTheReader) {
  PlanDocument plan = read_plan(golden_plans().front());
  PlanTensorParallel tp;
  tp.summary = "1 attention, embedding";
  tp.regions.push_back({TpRegionKind::kAttention, "/h.0/attn", 21, {1, 2, 4}, "12 heads", "/h.0/attn/proj/MatMul_output_0", 3072});
  tp.regions.push_back({TpRegionKind::kEmbedding, "/wte", 1, {1}, "50257 vocabulary rows", "/wte/Gather_output_0", 3072});
  plan.tensor_parallel = tp;
  const PlanDocument back = plan_from_json(json::parse(plan_to_json(plan).dump()));
  ASSERT_TRUE(back.tensor_parallel.has_value());
  EXPECT_EQ(back.tensor_parallel->summary, tp.summary);
  ASSERT_EQ(back.tensor_parallel->regions.size(), 2u);
  const PlanTpRegion& a = back.tensor_parallel->regions[0];
  EXPECT_EQ(a.kind, TpRegionKind::kAttention);
  EXPECT_EQ(a.name, "/h.0/attn");
  EXPECT_EQ(a.tasks, 21);
  EXPECT_EQ(a.degrees, (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(a.bounded_by, "12 heads");
  EXPECT_EQ(a.end_value, "/h.0/attn/proj/MatMul_output_0");
  EXPECT_EQ(a.end_bytes_per_sample, 3072);
  EXPECT_EQ(back.tensor_parallel->regions[1].kind, TpRegionKind::kEmbedding);
  EXPECT_EQ(plan_to_json(back).dump(), plan_to_json(plan).dump());
}

TEST(APlanDocument, KeepsARegionsShardLayoutThroughTheWriterAndTheReader) {
  PlanDocument plan = read_plan(golden_plans().front());
  PlanTensorParallel tp;
  PlanTpRegion r{TpRegionKind::kMlp, "/h.0/mlp", 8, {1, 2}, "3072 ffn features", "/h.0/mlp/fc2/MatMul_output_0", 3072};
  r.column_tasks = {"/h.0/mlp/fc1/MatMul"};
  r.row_tasks = {"/h.0/mlp/fc2/MatMul"};
  r.inputs = {"/h.0/ln_2/Add_1_output_0"};
  r.sliced_inputs = {"h.0.mlp.fc1.bias"};
  r.split_values = {{"/h.0/mlp/fc1/MatMul_output_0", 2}, {"/h.0/mlp/act/Mul_output_0", 2}};
  tp.regions.push_back(r);
  plan.tensor_parallel = tp;
  const auto written = plan_to_json(plan);
  const PlanDocument back = plan_from_json(json::parse(written.dump()));
  const PlanTpRegion& b = back.tensor_parallel->regions.at(0);
  EXPECT_TRUE(b.has_shard_layout());
  EXPECT_EQ(b.column_tasks, r.column_tasks);
  EXPECT_EQ(b.row_tasks, r.row_tasks);
  EXPECT_EQ(b.inputs, r.inputs);
  EXPECT_EQ(b.sliced_inputs, r.sliced_inputs);
  EXPECT_EQ(b.split_values, r.split_values);
  EXPECT_EQ(plan_to_json(back).dump(), written.dump());
  json bad = json::parse(written.dump());
  bad["tensor_parallel"]["regions"][0]["split_values"][0]["axis"] = -1;
  EXPECT_THROW(plan_from_json(bad), InvalidModel);
  bad = json::parse(written.dump());
  bad["tensor_parallel"]["regions"][0]["row_tasks"][0] = 7;
  EXPECT_THROW(plan_from_json(bad), InvalidModel);
}

TEST(APlanReader, RefusesAPathThatIsNeitherAPlanDirectoryNorAFile) {
  EXPECT_THROW(read_plan(fs::path(APART_TEST_DATA_DIR) / "no such plan"), InvalidArgument);
  EXPECT_THROW(read_plan(fs::path(APART_TEST_DATA_DIR)), InvalidArgument);  // a folder without plan.json
}

}  // namespace
}  // namespace apart
