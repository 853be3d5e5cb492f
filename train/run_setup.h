// apart run's setup (internal to train/pipeline.cpp and its parts): the plan, the model and this rank's place in
// them, checked before any message is sent, so that a bad plan fails on every rank alike with its own error.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "importer/importer.h"
#include "plan/plan.h"
#include "train/pipeline.h"

namespace apart {

// The plan, the model and this rank's place in them: every rank reads the same files and reaches the same verdict.
struct RunSetup {
  // The pipeline this rank runs: the plan itself, or with tensor-parallel stages the view of this rank's TP rank
  // (schedule/ tensor_parallel_view: every stage tp 1, the devices of that TP rank); `full_plan` is plan.json as read.
  PlanDocument plan;
  PlanDocument full_plan;
  int tp = 1;         // the largest TP degree of any stage (schedule/ max_tp_degree); each stage's is its record's
  int positions = 1;  // pipeline positions P: the plan's stages (its view lists P·v chunks, chunk c at c mod P)
  std::filesystem::path plan_dir;
  std::filesystem::path model_path;
  RankRole role;
  int64_t global_batch = 0;
  int64_t microbatches = 1;
  int64_t microbatch_samples = 0;  // samples of a whole micro-batch (all replicas of a stage together)
  int loss_stage = -1;
  std::string loss;
  std::string plan_sha256;  // of plan.json's bytes: a checkpoint resumes only with the plan it was written for
  std::string model_sha256;
  // The whole model imported at the global batch (graph only): its loss, data roles, param holders and shapes.
  std::shared_ptr<const ImportedModel> model;
};

// Reads and checks the plan folder, its stage files and the model, imports the model, finds the loss and checks the
// outputs the flags name (--save-model, --checkpoint-dir, --trace). InvalidArgument / InvalidModel naming the file
// and what to do; the same on every rank.
RunSetup set_up_run(const RunOptions& options, int rank, int world);

// "rank 2/4 stage 1 replica 0 tp rank 1": how errors name a rank.
std::string rank_label(int rank, int world, const RankRole& role);

}  // namespace apart
