// The in-flight micro-batch rule against a brute-force count over the schedules the simulator (and runtime) run.
#include <gtest/gtest.h>

#include <algorithm>

#include "profiler/memory_model.h"
#include "schedule/schedule.h"

namespace apart {
namespace {

// Most (chunk) micro-batches whose forward has run and whose backward has not, walking device `stage`'s op order.
int64_t counted_in_flight(Schedule schedule, int stage, int stages, int64_t microbatches, int chunks = 1) {
  int64_t held = 0, peak = 0;
  for (const ComputeOp& op : device_op_order(schedule, stage, stages, chunks, microbatches)) {
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

TEST(TheInFlightRule, CountsWhatMegatronsInterleavedOrderHoldsAtItsPeakInChunks) {
  int compared = 0;
  for (int stages = 1; stages <= 5; ++stages)
    for (int v = 2; v <= 4; ++v)
      for (int64_t rounds = 1; rounds <= 4; ++rounds) {
        const int64_t m = rounds * stages;  // Megatron-LM's order needs a multiple of the stages
        for (int s = 0; s < stages; ++s) {
          const int64_t counted = counted_in_flight(Schedule::kInterleaved, s, stages, m, v);
          EXPECT_EQ(stage_in_flight_microbatches(Schedule::kInterleaved, s, stages, m, v), counted)
              << "stage " << s << " of " << stages << ", v " << v << ", m " << m;
          // Each chunk micro-batch holds 1/v of the stage's activations.
          EXPECT_DOUBLE_EQ(stage_in_flight_activations(Schedule::kInterleaved, s, stages, m, v),
                           static_cast<double>(counted) / v);
          ++compared;
        }
      }
  EXPECT_EQ(compared, 3 * 4 * (1 + 2 + 3 + 4 + 5));
}

TEST(TheInFlightRule, CountsWholeMicrobatchesAsActivationsWithoutChunks) {
  for (Schedule s : {Schedule::kGPipe, Schedule::k1F1B})
    for (int stage = 0; stage < 4; ++stage)
      EXPECT_DOUBLE_EQ(stage_in_flight_activations(s, stage, 4, 6),
                       static_cast<double>(stage_in_flight_microbatches(s, stage, 4, 6)));
}

}  // namespace
}  // namespace apart
