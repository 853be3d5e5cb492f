// The training vocabulary: every enum value's name parses back to it; aliases and bad names.
#include "plan/training.h"

#include <gtest/gtest.h>

#include <string>

#include "graph/error.h"

namespace apart {
namespace {

TEST(TheNameTables, RoundTripEveryValue) {
  for (Schedule s : kSchedules) EXPECT_EQ(parse_schedule(schedule_name(s)), s) << schedule_name(s);
  for (Optimizer o : kOptimizers) EXPECT_EQ(parse_optimizer(optimizer_name(o)), o) << optimizer_name(o);
  for (Precision p : kPrecisions) EXPECT_EQ(parse_precision(precision_name(p)), p) << precision_name(p);
  for (TpRegionKind k : kTpRegionKinds) EXPECT_EQ(parse_tp_region_kind(tp_region_kind_name(k)), k) << tp_region_kind_name(k);
}

TEST(TheTensorParallelNames, SpellTheKindsAndRolesAsPlanJsonDoes) {
  EXPECT_EQ(tp_region_kind_names(), "attention, mlp, embedding or lm_head");
  EXPECT_EQ(tp_role_name(TpRole::kFollowsSplit), "follows-split");
  EXPECT_EQ(tp_role_name(TpRole::kColumn), "column");
  EXPECT_THROW(parse_tp_region_kind("conv"), InvalidArgument);
}

TEST(TheNameTables, SpellTheNamesPlanJsonHasAlwaysUsed) {
  EXPECT_EQ(schedule_name(Schedule::kGPipe), "gpipe");
  EXPECT_EQ(schedule_name(Schedule::k1F1B), "1f1b");
  EXPECT_EQ(schedule_name(Schedule::kInterleaved), "interleaved");
  EXPECT_EQ(optimizer_name(Optimizer::kAdam), "adam");
  EXPECT_EQ(optimizer_name(Optimizer::kAdamW), "adamw");
  EXPECT_EQ(precision_name(Precision::kMixed), "mixed");
}

TEST(TheNameTables, AcceptTheAliasesTheFlagsAccepted) {
  for (const char* mixed : {"fp16", "bf16", "amp"}) EXPECT_EQ(parse_precision(mixed), Precision::kMixed) << mixed;
  EXPECT_EQ(parse_schedule("interleaved-1f1b"), Schedule::kInterleaved);
  EXPECT_EQ(parse_schedule("interleaved1f1b"), Schedule::kInterleaved);
  // An alias is never a value's name: names come from the first row.
  EXPECT_EQ(precision_name(parse_precision("bf16")), "mixed");
}

TEST(TheParsers, NameTheFlagAndListEveryAcceptedName) {
  try {
    parse_schedule("zb");
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "--schedule zb: expected gpipe, 1f1b, interleaved or zb-h1 (also interleaved-1f1b, interleaved1f1b, zbh1)");
  }
  try {
    parse_optimizer("lamb");
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "--optimizer lamb: expected sgd, momentum, adam or adamw");
  }
  try {
    parse_precision("int8");
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "--precision int8: expected fp32, tf32 or mixed (also fp16, bf16, amp)");
  }
}

}  // namespace
}  // namespace apart
