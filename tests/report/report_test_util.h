// Small plans written in code, temp folders, and plans from `apart partition` shared by the report tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/support/run_apart.h"
#include "tests/support/temp_dir.h"

namespace apart::testing {

// A fresh folder per test, removed afterwards.
inline std::filesystem::path fresh_temp_dir(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
      ("apart_report_" + tag + "_" + std::to_string(::getpid()) + "_" + (info ? info->name() : "suite"));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

// Three stages on four devices: stage 0 feeds 1 and (skip) 2; tasks named like a GPT export.
inline nlohmann::json three_stage_plan() {
  using json = nlohmann::json;
  json plan = {{"schema", "apart.plan/1"},
               {"model", {{"path", "models/toy.onnx"}, {"tasks", 9}, {"params", 1000}, {"param_bytes", 4000}}},
               {"cluster", {{"devices", 4}, {"device", "a100-80gb"}, {"devices_per_node", 4}, {"memory_bytes", 80000000000}}},
               {"training", {{"global_batch", 8}, {"microbatches", 4}, {"microbatch_size", 2}, {"schedule", "1f1b"},
                             {"optimizer", "adam"}, {"precision", "fp32"}}},
               {"options", {{"method", "apart"}}},
               {"stages", json::array()},
               {"predicted", {{"iteration_s", 0.02}, {"bottleneck_stage", 1}, {"bubble_fraction", 0.3},
                              {"samples_per_s", 400.0}, {"peak_memory_bytes", 3000000000}, {"compute_lower_bound_s", 0.012}}},
               {"search", {{"seconds", 0.1}}}};
  const std::vector<std::vector<std::string>> tasks = {
      {"/wte/Gather", "/h.0/attn/MatMul", "/h.0/mlp/Add"},
      {"/h.1/attn/MatMul", "/h.1/mlp/Add", "/h.2/attn/MatMul"},
      {"/h.2/mlp/Add", "/ln_f/Add", "/lm_head/MatMul"}};
  for (int s = 0; s < 3; ++s) {
    json st = {{"id", s}, {"replicas", s == 0 ? 2 : 1}, {"devices", s == 0 ? json::array({0, 1}) : json::array({s + 1})},
               {"tasks", tasks[static_cast<size_t>(s)]}, {"forward_s", 0.001}, {"backward_s", 0.002},
               {"allreduce_s", s == 0 ? 0.0005 : 0.0}, {"memory_bytes", int64_t{1000000000} * (s + 1)}, {"param_bytes", 1000 * (s + 1)}};
    if (s == 0) {
      st["inputs"] = json::array({{{"value", "input_ids"}, {"from_stage", -1}, {"bytes", 64}}});
      st["outputs"] = json::array({{{"value", "x0"}, {"to_stages", {1, 2}}, {"bytes", 1000}}});
    } else if (s == 1) {
      st["inputs"] = json::array({{{"value", "x0"}, {"from_stage", 0}, {"bytes", 1000}}});
      st["outputs"] = json::array({{{"value", "x1"}, {"to_stages", {2}}, {"bytes", 2000}}});
    } else {
      st["inputs"] = json::array({{{"value", "x0"}, {"from_stage", 0}, {"bytes", 1000}},
                                  {{"value", "x1"}, {"from_stage", 1}, {"bytes", 2000}},
                                  {{"value", "labels"}, {"from_stage", -1}, {"bytes", 64}}});
      st["outputs"] = json::array({{{"value", "loss"}, {"to_stages", json::array()}, {"bytes", 4}}});
    }
    plan["stages"].push_back(st);
  }
  return plan;
}

inline void write_json(const std::filesystem::path& file, const nlohmann::json& j) { std::ofstream(file) << j.dump(1); }

// Plans of models/gpt-tiny.onnx from `apart partition` (4 × a100-80gb, batch 32, `--stages S` and any extra flags),
// made once per test program, in its folder that goes at its exit.
inline std::filesystem::path gpt_tiny_plan(int stages, const std::string& extra_flags = "") {
  static std::map<std::string, std::filesystem::path> dirs;
  const std::string flags = "--stages " + std::to_string(stages) + " " + extra_flags;
  auto [it, inserted] = dirs.emplace(flags, std::filesystem::path());
  if (inserted) {
    it->second = process_temp_dir("report_gpt_tiny") / std::to_string(dirs.size());
    const CommandRun r = run_apart("partition " + std::string(APART_SOURCE_DIR) + "/models/gpt-tiny.onnx --devices 4 "
                                   "--device a100-80gb --batch 32 " + flags + " -o " + it->second.string());
    if (r.code != 0) ADD_FAILURE() << "apart partition " << flags << " failed (" << r.code << "):\n" << r.out;
  }
  return it->second;
}

}  // namespace apart::testing
