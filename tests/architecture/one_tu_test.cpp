// One translation unit that includes the plan, runtime and partition headers compiles (the pipelined runtime is
// such a unit): no library's names clash with another's in namespace apart.
#include <gtest/gtest.h>

#include "codegen/plan_writer.h"
#include "partition/partition.h"
#include "plan/plan.h"
#include "report/report_plan.h"
#include "runtime/executor.h"
#include "train/optimizer.h"
#include "schedule/schedule.h"
#include "simulator/sim_plan.h"

namespace apart {
namespace {

TEST(OneTranslationUnit, SeesOneTrainingVocabularyForThePlannerAndTheRuntime) {
  TrainingSpec planned;  // partition/: what the planner assumed
  planned.optimizer = Optimizer::kMomentum;
  OptimizerOptions run;  // runtime/: what the optimizer step does
  run.kind = planned.optimizer;  // the same enum (plan/training.h): nothing to translate
  EXPECT_EQ(optimizer_name(run.kind), "momentum");
  EXPECT_EQ(ParamOptimizer::slots(run.kind), 1);
}

}  // namespace
}  // namespace apart
