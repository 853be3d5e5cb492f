// Issue 18's hostile-input suite: one CTest case per kind of hostile input, each built at test time in a fresh folder
// and handed to the real `apart` binary under a timeout. Every case must end in the documented exit code with a typed
// error naming the problem, without a crash, a sanitizer report or a hang, and must write nothing: the folder holds
// exactly the files it held before the run. docs/security.md lists the same table.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/support/onnx_builder.h"
#include "tests/support/run_apart.h"

namespace {

namespace fs = std::filesystem;
using apart::testing::CommandRun;
using apart::testing::OnnxBuilder;
using apart::testing::TempDir;
using json = nlohmann::json;

constexpr const char* kHostilePlanFlags = " --devices 2 --batch 4 --device a100-80gb";

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

// `apart partition MODEL … -o DIR/out` on a small cluster.
std::string partition_hostile(const TempDir& dir, const fs::path& model) {
  return "partition " + quoted(model) + kHostilePlanFlags + " -o " + quoted(dir / "out");
}

// x[batch, 3] · w[3, 4] → Relu → y, w given by `weight` (inline zeros unless it declares it otherwise).
OnnxBuilder mlp(const std::function<void(OnnxBuilder&)>& weight = {}) {
  OnnxBuilder b;
  b.input("x", {"batch", 3}).output("y");
  if (weight) weight(b);
  else b.weight("w", {3, 4});
  b.node("MatMul", {"x", "w"}, {"h"}, "matmul");
  b.node("Relu", {"h"}, {"y"}, "relu");
  return b;
}

fs::path save(const TempDir& dir, const OnnxBuilder& b, const std::string& name = "m.onnx") {
  b.save(dir / name);
  return dir / name;
}

void write(const fs::path& file, const std::string& bytes) { std::ofstream(file, std::ios::binary) << bytes; }

// w as external data with the given keys (location first), the model in DIR/folder beside a 48-byte weights file
// w.bin.
fs::path external(const TempDir& dir, const std::vector<std::pair<std::string, std::string>>& keys,
                  const std::string& folder = "") {
  const fs::path where = folder.empty() ? dir.path() : dir / folder;
  fs::create_directories(where);
  write(where / "w.bin", std::string(48, '\0'));
  OnnxBuilder b = mlp([&](OnnxBuilder& m) {
    auto* t = m.graph().add_initializer();
    t->set_name("w");
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_dims(3);
    t->add_dims(4);
    t->set_data_location(onnx::TensorProto::EXTERNAL);
    for (const auto& [key, value] : keys) {
      auto* kv = t->add_external_data();
      kv->set_key(key);
      kv->set_value(value);
    }
  });
  b.save(where / "m.onnx");
  return where / "m.onnx";
}

// An input x of the given dims feeding Relu.
fs::path relu_of(const TempDir& dir, std::initializer_list<apart::testing::Dim> dims) {
  OnnxBuilder b;
  b.input("x", dims).output("y");
  b.node("Relu", {"x"}, {"y"}, "relu");
  return save(dir, b);
}

// A plan folder of the tiny MLP planned by apart itself, to damage.
fs::path planned(const TempDir& dir) {
  const fs::path model = save(dir, mlp(), "planned.onnx");
  const CommandRun r =
      apart::testing::run_apart("partition " + quoted(model) + kHostilePlanFlags + " -o " + quoted(dir / "plan"));
  if (r.code != 0) ADD_FAILURE() << "planning the tiny MLP failed: " << r.out;
  return dir / "plan";
}

struct Hostile {
  std::string name;                                   // the CTest case: HostileInput/Refuses.<name>
  std::function<std::string(const TempDir&)> setup;  // writes the inputs; returns apart's arguments
  int code;                                           // the documented exit code
  std::string message;                                // a fragment of the error that names the problem
  std::string shell = "";                             // shell commands run before apart (limits)
};

const std::vector<Hostile>& cases() {
  static const std::vector<Hostile> all = {
      // The file itself.
      {"AnEmptyModel",
       [](const TempDir& d) {
         write(d / "m.onnx", "");
         return partition_hostile(d, d / "m.onnx");
       },
       3, "empty"},
      {"ADirectoryAsTheModel",
       [](const TempDir& d) {
         fs::create_directory(d / "m.onnx");
         return partition_hostile(d, d / "m.onnx");
       },
       2, "is a directory"},
      {"AFifoAsTheModel",
       [](const TempDir& d) {
         ::mkfifo((d / "m.onnx").c_str(), 0600);
         return partition_hostile(d, d / "m.onnx");
       },
       2, "not a regular file"},
      {"DevZeroAsTheModel", [](const TempDir& d) { return partition_hostile(d, "/dev/zero"); }, 2,
       "not a regular file"},
      {"RandomBytes",
       [](const TempDir& d) {
         std::string bytes(4096, '\0');
         uint32_t x = 12345;
         for (char& c : bytes) c = static_cast<char>((x = x * 1664525u + 1013904223u) >> 24);
         write(d / "m.onnx", bytes);
         return partition_hostile(d, d / "m.onnx");
       },
       3, "m.onnx"},
      {"ALengthFieldClaimingMoreThanRemains",
       [](const TempDir& d) {
         // ModelProto field 7 (graph), length-delimited, claiming 2^31 − 1 bytes where 3 follow.
         write(d / "m.onnx", mlp().bytes() + std::string("\x3a\xff\xff\xff\xff\x07xyz", 9));
         return partition_hostile(d, d / "m.onnx");
       },
       3, "m.onnx"},
      {"ATruncatedModel",
       [](const TempDir& d) {
         const std::string bytes = mlp().bytes();
         write(d / "m.onnx", bytes.substr(0, bytes.size() / 2));
         return partition_hostile(d, d / "m.onnx");
       },
       3, "m.onnx"},
      // The graph.
      {"ACycle",
       [](const TempDir& d) {
         OnnxBuilder b;
         b.input("x", {"batch", 3}).output("y");
         b.node("Add", {"x", "b"}, {"a"}, "first");
         b.node("Relu", {"a"}, {"b"}, "second");
         b.node("Identity", {"b"}, {"y"}, "out");
         return partition_hostile(d, save(d, b));
       },
       3, "cycle"},
      {"AnUndefinedInput",
       [](const TempDir& d) {
         OnnxBuilder b;
         b.input("x", {"batch", 3}).output("y");
         b.node("Add", {"x", "nowhere"}, {"y"}, "add");
         return partition_hostile(d, save(d, b));
       },
       3, "nowhere"},
      {"TwoNodesWritingOneValue",
       [](const TempDir& d) {
         OnnxBuilder b;
         b.input("x", {"batch", 3}).output("y");
         b.node("Relu", {"x"}, {"y"}, "one");
         b.node("Neg", {"x"}, {"y"}, "two");
         return partition_hostile(d, save(d, b));
       },
       3, "'y'"},
      {"AGraphOutputListedTwice",
       [](const TempDir& d) {
         OnnxBuilder b = mlp();
         b.output("y");
         return partition_hostile(d, save(d, b));
       },
       3, "'y'"},
      {"AnInitializerShadowingAnInputWithAnotherShape",
       [](const TempDir& d) {
         OnnxBuilder b = mlp();
         b.weight("x", {5});
         return partition_hostile(d, save(d, b));
       },
       3, "'x'"},
      {"AnUnknownOp",
       [](const TempDir& d) {
         OnnxBuilder b;
         b.input("x", {"batch", 3}).output("y");
         b.node("Frobnicate", {"x"}, {"y"}, "frob");
         return partition_hostile(d, save(d, b));
       },
       3, "has no operator 'Frobnicate'"},
      {"ANodeInADomainTheModelDoesNotImport",
       [](const TempDir& d) {
         OnnxBuilder b;
         b.input("x", {"batch", 3}).output("y");
         b.node("Relu", {"x"}, {"y"}, "relu").set_domain("com.example.secret");
         return partition_hostile(d, save(d, b));
       },
       3, "'com.example.secret', which the model does not import"},
      {"AnOpsetNewerThanApartKnows",
       [](const TempDir& d) {
         OnnxBuilder b(99);
         b.input("x", {"batch", 3}).output("y");
         b.node("Relu", {"x"}, {"y"}, "relu");
         return partition_hostile(d, save(d, b));
       },
       4, "99"},
      // Dims.
      {"AnUnboundDimParam",
       [](const TempDir& d) {
         return partition_hostile(d, relu_of(d, {"batch", "seq"}));
       },
       2, "seq"},
      {"AnInputWithoutAShape",
       [](const TempDir& d) {
         OnnxBuilder b;
         b.output("y");
         auto* in = b.graph().add_input();
         in->set_name("x");
         in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
         b.node("Relu", {"x"}, {"y"}, "relu");
         return partition_hostile(d, save(d, b));
       },
       2, "'x'"},
      // -1 is how some exporters write a dynamic dim: it must be given a size, like a named one.
      {"ANegativeDim",
       [](const TempDir& d) {
         return partition_hostile(d, relu_of(d, {"batch", -1}));
       },
       2, "unnamed dynamic dim at axis 1"},
      {"AZeroDim",
       [](const TempDir& d) {
         return partition_hostile(d, relu_of(d, {"batch", int64_t{0}}));
       },
       3, "0-sized dim"},
      {"DimsWhoseProductOverflows",
       [](const TempDir& d) {
         return partition_hostile(d, relu_of(d, {"batch", int64_t{1} << 40, int64_t{1} << 40}));
       },
       3, "'x'"},
      {"RawDataOfTheWrongLength",
       [](const TempDir& d) {
         OnnxBuilder b = mlp();
         b.graph().mutable_initializer(0)->mutable_raw_data()->resize(47);
         return partition_hostile(d, save(d, b));
       },
       3, "'w'"},
      // External data.
      {"AnAbsoluteExternalDataPath",
       [](const TempDir& d) {
         return partition_hostile(d, external(d, {{"location", "/etc/passwd"}}));
       },
       3, "absolute"},
      {"AnExternalDataPathWithDotDot",
       [](const TempDir& d) {
         return partition_hostile(d, external(d, {{"location", "../w.bin"}}));
       },
       3, ".."},
      {"ANestedExternalDataPathThatClimbsOut",
       [](const TempDir& d) {
         fs::create_directory(d / "a");
         return partition_hostile(d, external(d, {{"location", "a/../../w.bin"}}));
       },
       3, ".."},
      {"AnExternalDataFileThatIsASymlinkOutOfTheFolder",
       [](const TempDir& d) {
         fs::create_directory(d / "elsewhere");
         write(d / "elsewhere" / "secret.bin", std::string(48, '\0'));
         const fs::path model = external(d, {{"location", "w.bin"}}, "sub");
         fs::remove(d / "sub" / "w.bin");
         fs::create_symlink(d / "elsewhere" / "secret.bin", d / "sub" / "w.bin");
         return partition_hostile(d, model);
       },
       3, "outside"},
      {"AnExternalDataPathThroughASymlinkedFolder",
       [](const TempDir& d) {
         fs::create_directory(d / "elsewhere");
         write(d / "elsewhere" / "w.bin", std::string(48, '\0'));
         const fs::path model = external(d, {{"location", "link/w.bin"}}, "sub");
         fs::create_directory_symlink(d / "elsewhere", d / "sub" / "link");
         return partition_hostile(d, model);
       },
       3, "outside"},
      {"ANegativeExternalDataOffset",
       [](const TempDir& d) {
         return partition_hostile(d, external(d, {{"location", "w.bin"}, {"offset", "-8"}}));
       },
       3, "offset"},
      {"ANonNumericExternalDataOffset",
       [](const TempDir& d) {
         return partition_hostile(d, external(d, {{"location", "w.bin"}, {"offset", "12abc"}}));
       },
       3, "offset"},
      {"AHugeExternalDataOffset",
       [](const TempDir& d) {
         return partition_hostile(d, external(d, {{"location", "w.bin"}, {"offset", "99999999999999999999999"}}));
       },
       3, "offset"},
      {"AnExternalDataLengthThatDisagreesWithTheShape",
       [](const TempDir& d) {
         return partition_hostile(d, external(d, {{"location", "w.bin"}, {"length", "40"}}));
       },
       3, "length"},
      {"ExternalDataPastTheEndOfItsFile",
       [](const TempDir& d) {
         return partition_hostile(d, external(d, {{"location", "w.bin"}, {"offset", "16"}, {"length", "48"}}));
       },
       3, "w.bin"},
      {"AnUnknownExternalDataKey",
       [](const TempDir& d) {
         return partition_hostile(d, external(d, {{"location", "w.bin"}, {"compression", "zstd"}}));
       },
       3, "compression"},
      // The other files apart reads.
      {"ATruncatedPlan",
       [](const TempDir& d) {
         const fs::path plan = planned(d);
         const std::string text = apart::testing::read_file(plan / "plan.json");
         write(plan / "plan.json", text.substr(0, text.size() / 2));
         return "simulate " + quoted(plan) + " --trace " + quoted(d / "out");
       },
       3, "plan.json"},
      {"APlanWithAStageOutOfRange",
       [](const TempDir& d) {
         const fs::path plan = planned(d);
         json j = json::parse(apart::testing::read_file(plan / "plan.json"));
         j["stages"][0]["devices"] = -3;
         write(plan / "plan.json", j.dump());
         return "simulate " + quoted(plan) + " --trace " + quoted(d / "out");
       },
       3, "devices"},
      {"ACostsFileThatIsNotJson",
       [](const TempDir& d) {
         write(d / "costs.json", "{\"schema\": \"apart.costs/1\", \"tasks\": [");
         return partition_hostile(d, save(d, mlp())) + " --profile " + quoted(d / "costs.json");
       },
       2, "costs.json"},
      {"AClusterFileOfTheWrongSchema",
       [](const TempDir& d) {
         write(d / "cluster.json", R"({"schema": "apart.cluster/9", "devices": 2})");
         return "partition " + quoted(save(d, mlp())) + " --batch 4 --cluster " + quoted(d / "cluster.json") + " -o " +
                quoted(d / "out");
       },
       2, "cluster.json"},
      {"ACorruptCheckpoint",
       [](const TempDir& d) {
         fs::create_directory(d / "ckpt");
         write(d / "ckpt" / "checkpoint.apart", std::string("APARTCKP") + std::string(64, '\xff'));
         OnnxBuilder b = mlp();
         OnnxBuilder::set_int(b.node("ReduceMean", {"y"}, {"loss"}, "mean"), "keepdims", 0);
         b.output({"loss", apart::DType::kFloat32, {}});
         return "train " + quoted(save(d, b)) + " --steps 2 --batch 4 --init random --loss loss --resume " +
                quoted(d / "ckpt") + " --save-model " + quoted(d / "out");
       },
       2, "has format version 4294967295"},
      // Where the output cannot be written: a disk that fills up (a file-size limit: writes fail with EFBIG).
      {"AnOutputFolderThatFillsUp", [](const TempDir& d) { return partition_hostile(d, save(d, mlp())); }, 6,
       "failed writing", "trap '' XFSZ; ulimit -f 4; "},
      // Requests that cannot be met.
      {"AModelTooLargeForTheDevices",
       [](const TempDir& d) {
         OnnxBuilder b = mlp([](OnnxBuilder& m) { m.external_weight("w", {3, int64_t{1} << 36}, "w.bin"); });
         return partition_hostile(d, save(d, b));
       },
       5, "memory"},
      {"MoreStagesThanTheModelHasTasks",
       [](const TempDir& d) { return partition_hostile(d, save(d, mlp())) + " --stages 3"; }, 5, "--stages 3"},
      {"MoreMicroBatchesThanSamples",
       [](const TempDir& d) { return partition_hostile(d, save(d, mlp())) + " --microbatches 8"; }, 2,
       "--microbatches"},
  };
  return all;
}

std::set<fs::path> entries(const fs::path& dir) {
  std::set<fs::path> found;
  for (const auto& e : fs::recursive_directory_iterator(dir)) found.insert(e.path());
  return found;
}

void PrintTo(const Hostile& c, std::ostream* os) { *os << c.name; }

class HostileInput : public ::testing::TestWithParam<Hostile> {};

TEST_P(HostileInput, Refuses) {
  const Hostile& c = GetParam();
  TempDir dir;
  const std::string args = c.setup(dir);
  const std::set<fs::path> before = entries(dir.path());
  // A FIFO opened for reading would block: the timeout turns such a hang into a failure (exit 124).
  const CommandRun r = apart::testing::run_apart_bounded(args, c.shell);
  EXPECT_EQ(r.code, c.code) << r.out;
  EXPECT_NE(r.out.find("apart: error ["), std::string::npos) << "not a typed error: " << r.out;
  EXPECT_NE(r.out.find(c.message), std::string::npos) << "expected '" << c.message << "' in: " << r.out;
  for (const char* bug : {"AddressSanitizer", "runtime error:", "[Internal]", "terminate called"})
    EXPECT_EQ(r.out.find(bug), std::string::npos) << r.out;
  EXPECT_EQ(entries(dir.path()), before) << "the failed run left files behind";
  // APART_HOSTILE_TABLE=FILE appends this case's row to FILE: docs/security.md's table is regenerated from it.
  if (const char* table = std::getenv("APART_HOSTILE_TABLE")) {
    std::string error = r.out.substr(std::min(r.out.find("apart: error ["), r.out.size()));
    error = error.substr(0, error.find('\n'));
    for (const std::string& temp : {dir.path().string(), std::string(APART_BINARY)})
      for (size_t at; (at = error.find(temp)) != std::string::npos;) error.replace(at, temp.size(), "…");
    std::ofstream(table, std::ios::app) << "| " << c.name << " | " << r.code << " | `" << error << "` |\n";
  }
}

// Names are the model's to choose: quotes, a newline, HTML's closing script tag, slashes and non-ASCII letters must
// plan, and reach plan.json (as the same string), plan.dot (escaped inside its quoted labels) and report.html (never
// able to close its script or a tag) intact.
TEST(HostileNames, ArePlannedAndEscapedInJsonDotAndHtml) {
  TempDir dir;
  const std::string script = "</script><script>alert(1)</script>";
  const std::string node = "q\"uote\nline " + script, value = "a/b\\c \u00fcnic\u00f8de \u03b1";
  OnnxBuilder b;
  b.input("x", {"batch", 3}).output("y");
  b.weight("w", {3, 4});
  b.node("MatMul", {"x", "w"}, {value}, node);
  b.node("Relu", {value}, {"y"}, "relu");
  const fs::path model = save(dir, b);
  const fs::path plan = dir / "plan";
  const CommandRun partitioned =
      apart::testing::run_apart("partition " + quoted(model) + kHostilePlanFlags + " --dot-detail -o " + quoted(plan));
  ASSERT_EQ(partitioned.code, 0) << partitioned.out;
  const CommandRun report = apart::testing::run_apart("report " + quoted(plan) + " -o " + quoted(plan / "report.html"));
  ASSERT_EQ(report.code, 0) << report.out;

  const std::string plan_text = apart::testing::read_file(plan / "plan.json");
  const json j = json::parse(plan_text);  // throws, failing the test, if a name broke the JSON
  EXPECT_NE(j.dump().find(json(node).dump()), std::string::npos) << "plan.json lost the node's name";

  const std::string dot = apart::testing::read_file(plan / "plan.dot");
  ASSERT_NE(dot.find("alert(1)"), std::string::npos) << dot;
  EXPECT_EQ(dot.find("q\"uote"), std::string::npos) << "a bare quote ends a DOT label: " << dot;
  EXPECT_EQ(dot.find("\nline "), std::string::npos) << "a raw newline inside a DOT label: " << dot;

  const std::string html = apart::testing::read_file(plan / "report.html");
  ASSERT_FALSE(html.empty());
  EXPECT_EQ(html.find(script), std::string::npos) << "the name closes report.html's script";
  EXPECT_EQ(html.find("<script>alert(1)"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(EachKind, HostileInput, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Hostile>& info) { return info.param.name; });

}  // namespace
