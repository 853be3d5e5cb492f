// The apart executable: help, version, inspect output and documented exit codes.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/support/onnx_builder.h"
#include "tests/support/run_apart.h"

namespace {

using apart::testing::OnnxBuilder;
using apart::testing::TempDir;

using apart::testing::CommandRun;

CommandRun run(const std::string& args, bool with_stderr = true) { return apart::testing::run_apart(args, with_stderr); }

std::string fixture(const TempDir& dir) { return apart::testing::write_tiny_mlp(dir / "m.onnx"); }

TEST(TheApartCommand, PrintsItsVersion) {
  auto r = run("--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("apart "), std::string::npos);
}

TEST(TheApartCommand, ListsItsSubcommandsAndExitCodesInHelp) {
  auto r = run("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("inspect"), std::string::npos);
  EXPECT_NE(r.out.find("Exit codes"), std::string::npos);
  auto sub = run("inspect --help");
  EXPECT_EQ(sub.code, 0);
  EXPECT_NE(sub.out.find("--dim"), std::string::npos);
  EXPECT_NE(sub.out.find("--shape"), std::string::npos);
}

TEST(TheApartCommand, RejectsAnUnknownFlagWithExitCode2) {
  EXPECT_EQ(run("inspect --no-such-flag x.onnx").code, 2);
  EXPECT_EQ(run("").code, 2);
}

TEST(ApartInspect, PrintsTheDocumentedJsonKeys) {
  TempDir dir;
  auto r = run("inspect " + fixture(dir) + " --dim batch=2 --json", /*with_stderr=*/false);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tasks"], 2);
  EXPECT_EQ(j["batch_tasks"], 2);
  EXPECT_EQ(j["constant_tasks"], 0);
  EXPECT_EQ(j["params"], 12);
  EXPECT_EQ(j["param_bytes"], 48);
  EXPECT_DOUBLE_EQ(j["flops"].get<double>(), 2.0 * 2 * 3 * 4 + 2 * 4);  // MatMul 2·M·K·N + one per Relu output
  EXPECT_EQ(j["inputs"][0]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(j["outputs"][0]["name"], "y");
  EXPECT_EQ(j["ops"]["MatMul"], 1);
  EXPECT_EQ(j["ops"]["Relu"], 1);
}

TEST(ApartInspect, PrintsAReadableSummary) {
  TempDir dir;
  auto r = run("inspect " + fixture(dir) + " --shape x:5x3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("tasks       2 (2 batch, 0 constant)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("x float32 [5x3]"), std::string::npos) << r.out;
}

TEST(ApartInspect, ExitsWithTheDocumentedCodeForEachKindOfBadInput) {
  TempDir dir;
  const std::string model = fixture(dir);
  std::ofstream(dir / "empty.onnx").close();
  { std::ofstream(dir / "junk.onnx") << "this is not a protobuf at all, just text\n"; }
  EXPECT_EQ(run("inspect " + (dir / "empty.onnx").string()).code, 3);
  EXPECT_EQ(run("inspect " + (dir / "junk.onnx").string()).code, 3);
  EXPECT_EQ(run("inspect " + dir.path().string()).code, 2);
  EXPECT_EQ(run("inspect " + (dir / "absent.onnx").string()).code, 6);
  // The batch dim is bound by --batch (default 1, issue 11); any other dynamic dim must still be given.
  OnnxBuilder seq;
  seq.input("x", {"batch", "seq", 3}).output("y");
  seq.weight("w", {3, 4});
  seq.node("MatMul", {"x", "w"}, {"y"});
  seq.save(dir / "seq.onnx");
  auto unbound = run("inspect " + (dir / "seq.onnx").string());
  EXPECT_EQ(unbound.code, 2);
  EXPECT_NE(unbound.out.find("--dim seq="), std::string::npos) << unbound.out;
  EXPECT_EQ(run("inspect " + model + " --dim batch=x").code, 2);
}

}  // namespace
