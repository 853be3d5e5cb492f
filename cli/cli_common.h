// Flags and formatting shared by the subcommands that read a model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/units.h"
#include "graph/output_path.h"
#include "importer/importer.h"

namespace CLI {
class App;
class Option;
}

namespace apart::cli {

// --shape NAME:D0xD1x… (repeatable), --dim NAME=N (repeatable) and, where the command has no batch flag
// of its own, --batch N (binds the model's batch dim by the importer's rule, kBatchDimNames).
struct ModelFlags {
  std::vector<std::string> shapes;
  std::vector<std::string> dims;
  int64_t batch = 0;                 // 0: the command adds no --batch (partition and train have their own)
  const CLI::Option* batch_option = nullptr;
  std::string constants_as_params = "on";  // --constants-as-params on|off (ImportOptions::constants_as_params)
};
// default_batch > 0 adds --batch with that default.
void add_model_flags(CLI::App& cmd, ModelFlags& flags, int64_t default_batch = 0);
// Parses the flags; throws InvalidArgument naming the bad flag.
ImportOptions import_options(const ModelFlags& flags);
// --loss and --labels of partition, train and run. --loss cross_entropy | cross_entropy_shifted appends that loss to
// a logits-only model (ImportOptions::loss, importer/added_loss.h) with the int64 input --labels NAME; on train and
// run any other --loss names the graph output to minimise (LossFlagUse::kFormOrOutput).
enum class LossFlagUse { kFormOnly, kFormOrOutput };
struct LossFlags {
  std::string loss;
  std::string labels = "labels";
  const CLI::Option* labels_option = nullptr;
};
void add_loss_flags(CLI::App& cmd, LossFlags& flags, LossFlagUse use);
// Sets import.loss from the flags and returns the graph output to minimise ("" = the model's only scalar float
// output). Throws InvalidArgument for --labels without a loss to add, or (kFormOnly) a --loss that is no loss form.
std::string apply_loss_flags(const LossFlags& flags, LossFlagUse use, AddedLoss& loss);

// The one "apart: note:" line on stderr saying how many Constant nodes became params (importer/constant_params.h),
// nothing when none did.
void note_constant_params(const ConstantParams& converted);

// Progress of long work on stderr, prefixed "apart <command>: ". On a terminal one line rewritten in place
// (cleared by finish()); otherwise a plain line, at most one per `interval_s` (the first at once), so logs
// of CI jobs show the work is alive without one line per step.
class Progress {
 public:
  explicit Progress(std::string command, double interval_s = 10);
  void operator()(const std::string& line);
  void finish();
  ~Progress() { finish(); }

 private:
  std::string prefix_;
  double interval_s_;
  bool tty_;
  bool shown_ = false;
  double last_ = -1e300;
};

// The command line main was given (set_command_line), and the same with `--resume DIR` in place of any --resume:
// the exact command that continues a run stopped by a signal, shell-quoted, after `launcher` ("mpirun -np 3 ").
void set_command_line(int argc, char** argv);
std::string resume_command(const std::string& checkpoint_dir, const std::string& launcher = "");

// Counts, bytes and times: graph/units.h (format_count, format_bytes, format_seconds).

// What a command that read this model must not overwrite: driver/compile.h model_files.
// What a command that reads a plan (a plan folder or its plan.json) must not overwrite: plan.json and the
// costs.json and baselines.json beside it.
std::vector<InputFile> plan_inputs(const std::string& plan);

std::string human_flops(double flops);  // 1.23 GFLOP

// --device's help: the presets with their short names ("h100" = the SXM5 part) and where their figures are listed.
std::string device_flag_help(const std::string& lead = "Device preset");

// The commands that run the CPU kernels (train, run, profile) call this once: one "apart: note:" line on stderr
// when OpenBLAS runs a generic kernel on a CPU with AVX2/AVX-512 (runtime/blas_info.h), nothing otherwise.
void note_blas_kernel();

}  // namespace apart::cli
