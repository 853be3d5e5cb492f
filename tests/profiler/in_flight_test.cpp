// The in-flight micro-batch rule against a brute-force count over the schedules the simulator (and runtime) run.
#include <gtest/gtest.h>

#include <algorithm>

#include "profiler/memory_model.h"
#include "schedule/schedule.h"

namespace apart {
namespace {

// Most micro-batches whose forward has run and whose backward has not, walking device `stage`'s op order.
int64_t counted_in_flight(Schedule schedule, int stage, int stages, int64_t microbatches) {
  int64_t held = 0, peak = 0;
  for (const ComputeOp& op : device_op_order(schedule, stage, stages, 1, microbatches)) {
    held += op.kind == OpKind::kForward ? 1 : -1;
    peak = std::max(peak, held);
  }
  return peak;
}

TEST(TheInFlightRule, CountsWhatTheGPipeAnd1F1BOpOrdersHoldAtTheirPeak) {
  int compared = 0;
  for (int stages = 1; stages <= 6; ++stages)
    for (int64_t m = 1; m <= 9; ++m)
      for (int s = 0; s < stages; ++s) {
        EXPECT_EQ(stage_in_flight_microbatches(Schedule::kGPipe, s, stages, m),
                  counted_in_flight(Schedule::kGPipe, s, stages, m))
            << "gpipe, stage " << s << " of " << stages << ", m " << m;
        EXPECT_EQ(stage_in_flight_microbatches(Schedule::k1F1B, s, stages, m),
                  counted_in_flight(Schedule::k1F1B, s, stages, m))
            << "1f1b, stage " << s << " of " << stages << ", m " << m;
        ++compared;
      }
  EXPECT_EQ(compared, 9 * (1 + 2 + 3 + 4 + 5 + 6));
}

}  // namespace
}  // namespace apart
