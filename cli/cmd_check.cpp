// `apart check`: a plan folder verified before a run (driver/check.h; docs/plan.md, "Checking a plan").
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/command_registry.h"
#include "driver/check.h"
#include "graph/error.h"
#include "train/run_checkpoint_files.h"

namespace apart::cli {
namespace {

struct CheckArgs {
  std::string plan;
  std::string model;
  std::string write_shards;
  std::string checkpoint;
  bool quiet = false;
};

void run_check(const CheckArgs& a) {
  if (!a.checkpoint.empty()) {  // every byte of the checkpoint, before the plan's own checks
    for (const std::string& line : verify_checkpoint(a.checkpoint)) std::printf("ok   checkpoint  %s\n", line.c_str());
    std::fflush(stdout);
  }
  const PlanCheck check = check_plan_folder(a.plan, a.model);
  int failed = 0;
  for (const PlanFinding& f : check.findings) {
    failed += !f.ok;
    if (!a.quiet || !f.ok) std::printf("%-4s %-11s %s\n", f.ok ? "ok" : "FAIL", f.check.c_str(), f.detail.c_str());
  }
  std::fflush(stdout);
  if (failed > 0)
    throw InvalidModel(a.plan + ": " + std::to_string(failed) + " of " + std::to_string(check.findings.size()) +
                       " checks failed (listed above)");
  if (!a.quiet) std::printf("%s: the plan is valid\n", a.plan.c_str());
  if (a.write_shards.empty()) return;
  const std::vector<std::filesystem::path> files = write_tensor_parallel_shards(a.plan, a.write_shards);
  if (files.empty()) std::printf("no tensor-parallel stage: no shards to write\n");
  for (const auto& f : files) std::printf("wrote %s\n", f.string().c_str());
}

const bool kRegistered = register_command({"check", 62, [](CLI::App& app) {
  auto args = std::make_shared<CheckArgs>();
  CLI::App* cmd = app.add_subcommand(
      "check", "Verify a plan folder before running it: schema, model sha256, partition invariants, memory, stage files, "
               "prediction (exit 3 when a check fails)");
  cmd->add_option("plan", args->plan, "Plan directory (written by `apart partition`) or its plan.json")->required();
  cmd->add_option("model", args->model, "The model the plan was made for (default: the path plan.json names)");
  cmd->add_option("--write-shards", args->write_shards,
                  "Also write each TP rank's shard of each tensor-parallel stage, as apart run cuts it, to DIR/"
                  "stage_K.tp_R.onnx (Netron-viewable; inline weights sliced, external ones as dims only)")
      ->type_name("DIR");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "Also verify every checksum of this checkpoint folder (apart run's or apart train's) without training; "
                  "a damaged one fails with exit code 7 naming the file and the tensor");
  cmd->add_flag("-q,--quiet", args->quiet, "Print only the failed checks");
  cmd->callback([args] { run_check(*args); });
}});

}  // namespace
}  // namespace apart::cli
