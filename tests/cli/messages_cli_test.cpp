// Messages a person can act on (issue 11): names that are not UTF-8 or carry terminal escapes, flag errors
// in the documented form, `train --loss`, `--init random` for a graph-only export, METIS kept off stdout.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/support/onnx_builder.h"
#include "tests/support/run_apart.h"

namespace {

namespace fs = std::filesystem;
using apart::testing::CommandRun;
using apart::testing::OnnxBuilder;
using apart::testing::read_file;
using apart::testing::TempDir;

CommandRun run_cli(const std::string& args) { return apart::testing::run_apart(args); }

// x[batch, 3] → MatMul w → h → Relu → y, with the node and value names given.
std::string mlp(const TempDir& dir, const std::string& file, const std::string& node, const std::string& hidden,
                const std::string& output = "y") {
  OnnxBuilder b;
  b.input("x", {"batch", 3}).output(output);
  b.weight("w", {3, 4});
  b.node("MatMul", {"x", "w"}, {hidden}, node);
  b.node("Relu", {hidden}, {output}, "relu");
  b.save(dir / file);
  return (dir / file).string();
}

bool has_raw_control_characters_of_names(const std::string& text) {
  return text.find('\x1b') != std::string::npos || text.find('\x07') != std::string::npos ||
         text.find("\nfake line") != std::string::npos;
}

TEST(NamesThatAreNotUtf8, AreAnInvalidModelForPartitionCostsAndProfileNotAnInternalError) {
  TempDir dir;
  for (const auto& model : {mlp(dir, "node.onnx", "matmul\xff", "h"), mlp(dir, "value.onnx", "matmul", "h\xfe\xc0")}) {
    for (const std::string& args : {"partition " + model + " --batch 2 -o " + (dir / "plan").string(),
                                    "costs " + model + " --dim batch=2", "profile " + model + " --dim batch=2"}) {
      const CommandRun r = run_cli(args);
      EXPECT_EQ(r.code, 3) << args << "\n" << r.out;
      EXPECT_NE(r.out.find("apart: error [InvalidModel]:"), std::string::npos) << r.out;
      EXPECT_NE(r.out.find("not valid UTF-8"), std::string::npos) << r.out;
      EXPECT_EQ(r.out.find("json.exception"), std::string::npos) << r.out;
    }
  }
}

TEST(NamesWithTerminalEscapes, ReachInspectErrorsAndPlanDotEscaped) {
  TempDir dir;
  const std::string osc = "\x1b]0;pwned\x07";
  const std::string model = mlp(dir, "m.onnx", osc, "h" + osc, "a\nfake line");
  const CommandRun inspect = run_cli("inspect " + model + " --dim batch=2");
  ASSERT_EQ(inspect.code, 0) << inspect.out;
  EXPECT_FALSE(has_raw_control_characters_of_names(inspect.out)) << inspect.out;
  EXPECT_NE(inspect.out.find("output      a\\nfake line float32 [2x4]"), std::string::npos) << inspect.out;

  const CommandRun partition = run_cli("partition " + model + " --batch 2 --dot-detail -o " + (dir / "plan").string());
  ASSERT_EQ(partition.code, 0) << partition.out;
  EXPECT_FALSE(has_raw_control_characters_of_names(partition.out)) << partition.out;
  const std::string dot = read_file(dir / "plan" / "plan.dot");
  ASSERT_NE(dot.find("MatMul"), std::string::npos) << dot;
  EXPECT_FALSE(has_raw_control_characters_of_names(dot)) << dot;
  EXPECT_NE(dot.find("\\\\x1b]0;pwned\\\\x07"), std::string::npos) << dot;  // shown as text in the label

  OnnxBuilder dangling;  // an error message naming a model-controlled value
  dangling.input("x", {2, 3}).output("y").output("\x1b[2J\nfake line");
  dangling.node("Relu", {"x"}, {"y"});
  dangling.save(dir / "dangling.onnx");
  const CommandRun error = run_cli("inspect " + (dir / "dangling.onnx").string());
  EXPECT_EQ(error.code, 3) << error.out;
  EXPECT_NE(error.out.find("'\\x1b[2J\\nfake line'"), std::string::npos) << error.out;
  EXPECT_FALSE(has_raw_control_characters_of_names(error.out)) << error.out;
}

TEST(FlagErrorsFoundByTheParser, TakeTheDocumentedFormAndExitCode) {
  TempDir dir;
  const std::string model = mlp(dir, "m.onnx", "matmul", "h");
  const CommandRun missing = run_cli("partition " + model + " -o " + (dir / "plan").string());
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_EQ(missing.out.rfind("apart: error [InvalidArgument]: --batch is required", 0), 0u) << missing.out;
  EXPECT_NE(missing.out.find("`apart partition --help`"), std::string::npos) << missing.out;
  // Every missing flag and argument in one message, not one per run.
  const CommandRun all_missing = run_cli("partition");
  EXPECT_EQ(all_missing.code, 2) << all_missing.out;
  EXPECT_NE(all_missing.out.find("these are required: model, --batch, --output"), std::string::npos) << all_missing.out;
  // A misspelt flag: the one meant.
  const CommandRun misspelt = run_cli("train " + model + " --stepz 3");
  EXPECT_EQ(misspelt.code, 2) << misspelt.out;
  EXPECT_NE(misspelt.out.find("did you mean --steps for --stepz?"), std::string::npos) << misspelt.out;
  const CommandRun convert = run_cli("inspect " + model + " --dim batch=2 --top many");
  EXPECT_EQ(convert.code, 2) << convert.out;
  EXPECT_EQ(convert.out.rfind("apart: error [InvalidArgument]: ", 0), 0u) << convert.out;
  EXPECT_NE(convert.out.find("many"), std::string::npos) << convert.out;
  // No command: the usage with every command, then the error.
  const CommandRun none = run_cli("");
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_NE(none.out.find("Usage: apart [OPTIONS] SUBCOMMAND"), std::string::npos) << none.out;
  EXPECT_NE(none.out.find("partition"), std::string::npos) << none.out;
  EXPECT_NE(none.out.find("\napart: error [InvalidArgument]: a command is required"), std::string::npos) << none.out;
  // A misspelt command: the one meant, and the list.
  const CommandRun typo = run_cli("partiton " + model);
  EXPECT_EQ(typo.code, 2) << typo.out;
  EXPECT_EQ(typo.out.rfind("apart: error [InvalidArgument]: unknown command 'partiton'; did you mean 'partition'? "
                           "the commands are ",
                           0),
            0u)
      << typo.out;
  const CommandRun strange = run_cli("deploy");
  EXPECT_EQ(strange.code, 2) << strange.out;
  EXPECT_EQ(strange.out.find("did you mean"), std::string::npos) << strange.out;
  EXPECT_EQ(run_cli("partition --help").code, 0);
  EXPECT_EQ(run_cli("--version").code, 0);
}

// x[batch, 3] → MatMul w → h, with two scalar losses of h (ReduceMean, ReduceSum) and h itself as outputs.
std::string two_losses(const TempDir& dir) {
  OnnxBuilder b;
  b.input("x", {"batch", 3}).output("mean").output("sum").output("h");
  b.weight("w", {3, 4});
  b.node("MatMul", {"x", "w"}, {"h"});
  OnnxBuilder::set_int(b.node("ReduceMean", {"h"}, {"mean"}), "keepdims", 0);
  OnnxBuilder::set_int(b.node("ReduceSum", {"h", "axes"}, {"sum"}), "keepdims", 0);
  b.int_initializer("axes", {0, 1});
  b.save(dir / "losses.onnx");
  return (dir / "losses.onnx").string();
}

// --device takes a preset's short name (the SXM part, as the presets are), says which name it meant for a typo and
// why an ambiguous or PCIe name is not a preset; `apart devices` lists the presets with the figures the model uses.
TEST(ADeviceFlag, TakesTheShortNameOfAnSxmPresetAndSaysWhatATypoMeant) {
  TempDir dir;
  const std::string model = mlp(dir, "m.onnx", "matmul", "h");
  const CommandRun h100 =
      run_cli("partition " + model + " --device h100 --devices 8 --batch 8 -q -o " + (dir / "p").string());
  ASSERT_EQ(h100.code, 0) << h100.out;
  EXPECT_NE(read_file(dir / "p" / "plan.json").find("\"device\": \"h100-80gb\""), std::string::npos);
  const CommandRun typo = run_cli("costs " + model + " --device h10");
  EXPECT_EQ(typo.code, 2) << typo.out;
  EXPECT_NE(typo.out.find("unknown device 'h10'; did you mean 'h100-80gb'?"), std::string::npos) << typo.out;
  const CommandRun ambiguous = run_cli("costs " + model + " --device A100");
  EXPECT_EQ(ambiguous.code, 2) << ambiguous.out;
  EXPECT_NE(ambiguous.out.find("ambiguous: a100-40gb or a100-80gb"), std::string::npos) << ambiguous.out;
  const CommandRun pcie = run_cli("costs " + model + " --device h100-pcie");
  EXPECT_EQ(pcie.code, 2) << pcie.out;
  EXPECT_NE(pcie.out.find("the presets are SXM parts"), std::string::npos) << pcie.out;
  EXPECT_NE(run_cli("partition --help").out.find("h100-80gb (or h100)"), std::string::npos);
}

TEST(ApartDevices, ListsEveryPresetWithItsPartAndFigures) {
  const CommandRun table = run_cli("devices --no-cpu");
  ASSERT_EQ(table.code, 0) << table.out;
  for (const char* row : {"v100-32gb", "a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb"})
    EXPECT_NE(table.out.find(row), std::string::npos) << row << "\n" << table.out;
  EXPECT_NE(table.out.find("989.5"), std::string::npos) << table.out;  // H100 SXM5's dense BF16 TFLOP/s
  EXPECT_NE(table.out.find("NVIDIA H100 SXM5 80 GB"), std::string::npos) << table.out;
  const CommandRun json = apart::testing::run_apart("devices --no-cpu --json", /*with_stderr=*/false);
  ASSERT_EQ(json.code, 0) << json.out;
  EXPECT_NE(json.out.find("\"peak_fp16_flops\": 989500000000000.0"), std::string::npos) << json.out;
}

TEST(ApartTrain, TakesTheLossToMinimiseFromLoss) {
  TempDir dir;
  const std::string model = two_losses(dir);
  const CommandRun ambiguous = run_cli("train " + model + " --steps 1 --batch 2");
  EXPECT_EQ(ambiguous.code, 2) << ambiguous.out;
  EXPECT_NE(ambiguous.out.find("--loss NAME"), std::string::npos) << ambiguous.out;
  const CommandRun chosen = run_cli("train " + model + " --steps 2 --batch 2 --loss mean -q");
  EXPECT_EQ(chosen.code, 0) << chosen.out;
  const CommandRun not_scalar = run_cli("train " + model + " --steps 1 --batch 2 --loss h");
  EXPECT_EQ(not_scalar.code, 2) << not_scalar.out;
  EXPECT_NE(not_scalar.out.find("'h' is float32 [2x4], not a scalar"), std::string::npos) << not_scalar.out;
  const CommandRun absent = run_cli("train " + model + " --steps 1 --batch 2 --loss nosuch");
  EXPECT_EQ(absent.code, 2) << absent.out;
  EXPECT_NE(absent.out.find("the model's outputs are: 'mean', 'sum', 'h'"), std::string::npos) << absent.out;
  EXPECT_NE(run_cli("train --help").out.find("--loss"), std::string::npos);

  const CommandRun no_loss = run_cli("train " + mlp(dir, "m.onnx", "matmul", "h") + " --steps 1 --batch 2");
  EXPECT_EQ(no_loss.code, 2) << no_loss.out;
  EXPECT_NE(no_loss.out.find("add a loss to the model"), std::string::npos) << no_loss.out;
  EXPECT_NE(no_loss.out.find("--loss NAME"), std::string::npos) << no_loss.out;
}

TEST(BackendFlags, NameTheKnownBackendsAndPrecisionsAndCudaWithoutAGpuIsUnsupported) {
  TempDir dir;
  const std::string model = two_losses(dir) + " --loss mean --steps 1 --batch 2 -q";
  const CommandRun unknown = run_cli("train " + model + " --backend tpu");
  EXPECT_EQ(unknown.code, 2) << unknown.out;
  EXPECT_NE(unknown.out.find("use cpu or cuda"), std::string::npos) << unknown.out;
  const CommandRun precision = run_cli("train " + model + " --precision fp64");
  EXPECT_EQ(precision.code, 2) << precision.out;
  EXPECT_NE(precision.out.find("fp32, tf32 or mixed"), std::string::npos) << precision.out;
  EXPECT_EQ(run_cli("train " + model + " --backend cpu --precision tf32").code, 0);
  // A build without CUDA (the dev preset), or a machine without a GPU: Unsupported, exit 4, saying which.
  const CommandRun cuda = run_cli("train " + model + " --backend cuda");
  EXPECT_TRUE(cuda.code == 0 || cuda.code == 4) << cuda.out;
  if (cuda.code == 4) {
    EXPECT_TRUE(cuda.out.find("[Unsupported]") != std::string::npos && cuda.out.find("CUDA") != std::string::npos) << cuda.out;
  }
  for (const char* command : {"run", "profile"})
    EXPECT_NE(run_cli(std::string(command) + " --help").out.find("--backend"), std::string::npos);
}

TEST(ApartTrain, OnAGraphOnlyExportPointsToInitRandom) {
  TempDir dir;
  OnnxBuilder b;  // weights as external data in w.bin, which is not there
  b.input("x", {"batch", 3}).output("loss");
  b.external_weight("w", {3, 4}, "w.bin");
  b.node("MatMul", {"x", "w"}, {"h"});
  OnnxBuilder::set_int(b.node("ReduceMean", {"h"}, {"loss"}), "keepdims", 0);
  b.save(dir / "graph_only.onnx");
  const CommandRun r = run_cli("train " + (dir / "graph_only.onnx").string() + " --steps 1 --batch 2");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("'w.bin'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--init random"), std::string::npos) << r.out;
  EXPECT_EQ(run_cli("train " + (dir / "graph_only.onnx").string() + " --steps 1 --batch 2 --init random -q").code, 0);
}

TEST(ApartTrain, OnTheSharedGraphOnlyResnet50PointsToInitRandom) {
  const fs::path model = fs::path(APART_SHARED_MODELS_DIR) / "resnet50.onnx";
  if (!fs::exists(model)) GTEST_SKIP() << model << " is not present";
  const CommandRun r = run_cli("train " + model.string() + " --steps 1 --batch 1");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--init random"), std::string::npos) << r.out;
}

}  // namespace
