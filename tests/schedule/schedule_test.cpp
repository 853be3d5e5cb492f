// Per-device op orders: every op exactly once, forward before backward, the documented warm-up counts.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "graph/error.h"
#include "simulator/schedule.h"

namespace apart::sim {
namespace {

void expect_complete(Schedule s, int devices, int chunks, int64_t m) {
  for (int d = 0; d < devices; ++d) {
    const auto ops = device_op_order(s, d, devices, chunks, m);
    ASSERT_EQ(ops.size(), static_cast<size_t>(2 * m * chunks));
    std::set<std::tuple<int, int64_t, int>> seen;
    for (const ComputeOp& op : ops) {
      EXPECT_EQ(op.virtual_stage % devices, d);
      if (op.kind == OpKind::kBackward) {
        EXPECT_TRUE(seen.count({op.virtual_stage, op.microbatch, 0})) << "backward before its forward";
      }
      EXPECT_TRUE(seen.insert({op.virtual_stage, op.microbatch, op.kind == OpKind::kForward ? 0 : 1}).second);
    }
  }
}

TEST(AScheduleOrder, RunsEveryOpOnceAndForwardBeforeBackward) {
  for (int devices : {1, 2, 3, 4})
    for (int64_t m : {1, 2, 5, 8}) {
      expect_complete(Schedule::kGPipe, devices, 1, m);
      expect_complete(Schedule::k1F1B, devices, 1, m);
      if (m % devices == 0)
        for (int v : {1, 2, 3}) expect_complete(Schedule::kInterleaved, devices, v, m);
    }
}

TEST(AScheduleOrder, Warms1F1BUpWithOneForwardPerStageBelow) {
  const int devices = 4;
  for (int d = 0; d < devices; ++d) {
    const auto ops = device_op_order(Schedule::k1F1B, d, devices, 1, 8);
    int warmup = 0;
    while (ops[static_cast<size_t>(warmup)].kind == OpKind::kForward) ++warmup;
    EXPECT_EQ(warmup, devices - d);
  }
}

TEST(AScheduleOrder, RefusesInterleavedWhenMicrobatchesAreNotAMultipleOfTheDepth) {
  EXPECT_THROW(device_op_order(Schedule::kInterleaved, 0, 4, 2, 6), Unsupported);
}

TEST(AScheduleName, RoundTripsAndRejectsUnknownNames) {
  for (Schedule s : {Schedule::kGPipe, Schedule::k1F1B, Schedule::kInterleaved})
    EXPECT_EQ(parse_schedule(schedule_name(s)), s);
  EXPECT_THROW(parse_schedule("zero-bubble"), InvalidArgument);
}

}  // namespace
}  // namespace apart::sim
