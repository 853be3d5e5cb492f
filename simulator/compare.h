// `apart simulate PLAN --compare trace.json`: the simulator's replay of a plan (predicted) against a timeline
// (measured by `apart run --trace`, or another replay), stage by stage, with the stages that miss by more than 10 %.
#pragma once

#include <string>
#include <vector>

#include "plan/trace.h"
#include "simulator/simulate.h"

namespace apart::sim {

// What a stage does in one iteration. Predicted: the replay's StageStats. Measured: the median over the trace's steps
// and the stage's replicas, one sample per (process, step) — the statistic `apart profile` takes of each task, so a
// step the machine slowed weighs no more than any other (a run's first step is left out when later ones are there:
// it warms caches and allocators up).
struct StageFigures {
  double forward_s = 0;    // per micro-batch
  double backward_s = 0;   // per micro-batch, recomputation included
  double busy_s = 0;       // Σ forward + backward over the iteration
  double comm_s = 0;       // predicted: its send and recv channels' busy time (overlaps compute); measured: posting
                           //   sends + waiting for receives (which blocks the rank, so it is part of idle)
  double allreduce_s = 0;  // the exposed gradient all-reduce, after the last backward
  double step_s = 0;       // measured: the clip-norm all-reduce over every rank (it waits for the slowest) + optimizer
  double idle_s = 0;       // iteration − busy − all-reduce − step: bubble, waiting for messages
};

struct StageComparison {
  int stage = 0;
  int replicas = 0;  // processes of the stage in the trace
  StageFigures predicted;
  StageFigures measured;
  std::vector<std::string> misses;  // "backward 2.50 ms predicted, 3.10 ms measured (+24.0 %)"
};

struct Comparison {
  std::string trace;      // the file it came from
  std::string generator;  // what wrote it
  int steps = 0;          // measured steps: every step in the trace, but step 1 when later ones are there
  bool first_step_left_out = false;
  double predicted_iteration_s = 0;
  double measured_iteration_s = 0;  // the median step
  double mean_iteration_s = 0;      // and their mean, printed beside it
  std::vector<StageComparison> stages;
};

inline constexpr double kFidelityTolerance = 0.10;  // a figure off by more than this is a miss

// Throws InvalidArgument naming `trace_source` when the timeline has events of a stage the plan lacks, or no event
// of one of its stages (a trace of another plan).
Comparison compare_with_timeline(const SimPlan& plan, const SimResult& predicted, const Timeline& measured,
                                 const std::string& trace_source);
// The table: a row per stage, predicted / measured / ratio for forward, backward, comm, all-reduce, step and idle;
// then the iteration and each miss.
std::string comparison_report(const Comparison& comparison);

}  // namespace apart::sim
