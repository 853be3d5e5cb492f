// apart run's stage boundaries over NCCL, host side (runtime/nccl_host.h): how a rank's sends, receives and bucket
// all-reduces go onto one serialized stream, and a rendezvous model of that stream that finds deadlocks, run over the
// action lists of every schedule apart run executes.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/nccl_host.h"
#include "schedule/schedule.h"
#include "tests/schedule/schedule_test_util.h"

namespace apart::nccl {
namespace {

using Kind = StreamOp::Kind;
StreamOp send_to(int peer) { return {Kind::kSend, peer, -1}; }
StreamOp recv_from(int peer) { return {Kind::kRecv, peer, -1}; }
StreamOp collective(int group) { return {Kind::kCollective, -1, group}; }

// Every op alone on the stream: what posting each message as the schedule reaches it gives.
std::vector<StreamItem> one_by_one(const std::vector<StreamOp>& ops) {
  std::vector<StreamItem> items;
  for (size_t i = 0; i < ops.size(); ++i) items.push_back({{i}});
  return items;
}

std::vector<std::vector<StreamItem>> grouped(const std::vector<std::vector<StreamOp>>& ops) {
  std::vector<std::vector<StreamItem>> items;
  for (const auto& rank : ops) items.push_back(group_stream_ops(rank));
  return items;
}

TEST(GroupStreamOps, PutsEachReceiveWithTheSendsDeferredBeforeItAndLeavesCollectivesInPlace) {
  const std::vector<StreamOp> ops{send_to(1), send_to(2), recv_from(1), collective(0), send_to(1), recv_from(2),
                                  send_to(2)};
  const std::vector<StreamItem> items = group_stream_ops(ops);
  ASSERT_EQ(items.size(), 4u);
  EXPECT_EQ(items[0].ops, (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(items[1].ops, (std::vector<size_t>{3}));
  EXPECT_EQ(items[2].ops, (std::vector<size_t>{4, 5}));
  EXPECT_EQ(items[3].ops, (std::vector<size_t>{6}));  // the step's end posts the last sends
  EXPECT_TRUE(group_stream_ops({}).empty());
}

// 1F1B's steady state between two stages: each sends, then waits for the other's message.
TEST(AStreamOfMessagesPostedOneByOne, DeadlocksWhereTwoNeighboursEachSendFirstAndGroupedSendsDoNot) {
  const std::vector<std::vector<StreamOp>> ops{{send_to(1), recv_from(1)}, {send_to(0), recv_from(0)}};
  EXPECT_EQ(stuck_ranks(ops, {one_by_one(ops[0]), one_by_one(ops[1])}, {}), (std::vector<int>{0, 1}));
  EXPECT_TRUE(stuck_ranks(ops, grouped(ops), {}).empty());
}

TEST(StuckRanks, NamesTheRanksOfAnUnmatchedReceiveAndOfACollectiveAMemberNeverPosts) {
  const std::vector<std::vector<StreamOp>> unmatched{{recv_from(1)}, {}};
  EXPECT_EQ(stuck_ranks(unmatched, grouped(unmatched), {}), (std::vector<int>{0}));
  const std::vector<std::vector<StreamOp>> missing{{collective(7)}, {}};
  EXPECT_EQ(stuck_ranks(missing, grouped(missing), {{7, {0, 1}}}), (std::vector<int>{0}));
  // Two collectives of different groups in opposite orders on two ranks deadlock; in one order they finish.
  const std::vector<std::vector<StreamOp>> crossed{{collective(1), collective(2)}, {collective(2), collective(1)}};
  const std::map<int, std::vector<int>> both{{1, {0, 1}}, {2, {0, 1}}};
  EXPECT_EQ(stuck_ranks(crossed, grouped(crossed), both), (std::vector<int>{0, 1}));
  const std::vector<std::vector<StreamOp>> ordered{{collective(1), collective(2)}, {collective(1), collective(2)}};
  EXPECT_TRUE(stuck_ranks(ordered, grouped(ordered), both).empty());
}

struct RankStreams {
  std::vector<std::vector<StreamOp>> ops;
  std::map<int, std::vector<int>> members;
  std::map<std::pair<int, int>, std::vector<int>> sent_tags, received_tags;  // (from, to) → tags in posting order
};

// A rank's stream as apart run posts it over NCCL (everything on the device world): the schedule's sends and
// receives; each forward or backward pass of a TP stage runs its shards' collectives over its replica's TP group; a
// receive from a stage of the same degree is followed by the all-gather of the TP parts; the stage's replicas of this
// TP rank reduce their gradients after the last pass that completes them (ZeRO-0/1's buckets; ZeRO-2/3 reduce-scatter
// after every such pass, and ZeRO-3 gathers params in every pass); the step ends with the world's all-reduce of the norm, loss and flags, the last op (posted
// after the deferred sends are: stream_items).
RankStreams streams_of(const PlanDocument& plan, int zero) {
  RankStreams s;
  const int world = plan_devices(plan);
  s.ops.resize(static_cast<size_t>(world));
  constexpr int kWorld = 1 << 30;
  // In an interleaved plan each chunk (an action's `stage`) has its communicators; the stage's devices hold them all.
  const bool interleaved = !plan.virtual_stages.empty();
  auto stage_of = [&](int id) { return interleaved ? plan.virtual_stages[static_cast<size_t>(id)].stage : id; };
  auto replicas_group = [](int chunk, const RankRole& role) { return 2 * (chunk * 1000 + role.tp_rank); };
  auto tp_group = [](int chunk, const RankRole& role) { return 2 * (chunk * 1000 + role.replica) + 1; };
  for (int r = 0; r < world; ++r) {
    const RankRole role = rank_role(plan, r);
    const PlanStageRecord& stage = plan.stages[static_cast<size_t>(role.stage)];
    const bool replicated = stage.replicas > 1, sharded = stage.tp > 1;
    std::vector<StreamOp>& ops = s.ops[static_cast<size_t>(r)];
    const std::vector<Action> actions = rank_actions(plan, r);
    auto chunk_of = [&](const Action& a) { return a.stage >= 0 ? a.stage : role.stage; };
    std::map<int, size_t> last_gradient;  // by chunk
    for (size_t i = 0; i < actions.size(); ++i)
      if (actions[i].kind == ActionKind::kBackward || actions[i].kind == ActionKind::kBackwardWeight)
        last_gradient[chunk_of(actions[i])] = i;
    for (const auto& [chunk, i] : last_gradient) {
      if (replicated) s.members[replicas_group(chunk, role)].push_back(r);
      if (sharded) s.members[tp_group(chunk, role)].push_back(r);
    }
    s.members[kWorld].push_back(r);
    for (size_t i = 0; i < actions.size(); ++i) {
      const Action& a = actions[i];
      const int chunk = chunk_of(a);
      const bool pass = a.kind == ActionKind::kForward || a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight;
      const bool gradients = a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight;
      if (pass && replicated && zero >= 3) ops.push_back(collective(replicas_group(chunk, role)));
      if (pass && sharded) ops.push_back(collective(tp_group(chunk, role)));
      if (a.kind == ActionKind::kSend) {
        ops.push_back(send_to(a.peer));
        s.sent_tags[{r, a.peer}].push_back(action_tag(a, plan));
      } else if (a.kind == ActionKind::kRecv) {
        ops.push_back(recv_from(a.peer));
        s.received_tags[{a.peer, r}].push_back(action_tag(a, plan));
        const int mine = a.gradient ? a.from_stage : a.to_stage, other = a.gradient ? a.to_stage : a.from_stage;
        if (sharded && plan.stages[static_cast<size_t>(stage_of(other))].tp == stage.tp)
          ops.push_back(collective(tp_group(mine, role)));
      }
      if (replicated && gradients && (zero >= 2 || i == last_gradient[chunk])) ops.push_back(collective(replicas_group(chunk, role)));
    }
    ops.push_back(collective(kWorld));  // the step (apart run posts every deferred send and waits for it first)
  }
  return s;
}

// The stream items of streams_of's ranks: the step's ops grouped, the sends deferred to its end posted in one last
// group (MessageTransport::finish), then the world's all-reduce alone.
std::vector<std::vector<StreamItem>> stream_items(const std::vector<std::vector<StreamOp>>& ops) {
  std::vector<std::vector<StreamItem>> items;
  for (const auto& rank : ops) {
    items.push_back(group_stream_ops(std::vector<StreamOp>(rank.begin(), rank.end() - 1)));
    items.back().push_back({{rank.size() - 1}});
  }
  return items;
}

TEST(GroupedStageBoundaries, FinishEveryScheduleApartRunExecutesAndMatchInPostingOrder) {
  const std::vector<std::vector<int>> shapes{{1, 1}, {1, 1, 1}, {1, 1, 1, 1}, {2, 1}, {1, 2}, {2, 2}, {2, 1, 3}};
  int one_by_one_deadlocks = 0, plans = 0;
  for (const Schedule schedule : {Schedule::kGPipe, Schedule::k1F1B, Schedule::kZbH1})
    for (const auto& replicas : shapes)
      for (const int64_t m : {1, 2, 3, 4, 8}) {
        const PlanDocument plan = testing::pipeline_plan(replicas, m, schedule);
        const std::string what = std::string(schedule_name(schedule)) + " m " + std::to_string(m) + " stages " +
                                 std::to_string(replicas.size()) + " replicas " + std::to_string(replicas[0]) + "," +
                                 std::to_string(replicas[1]);
        const RankStreams s = streams_of(plan, 0);
        EXPECT_TRUE(stuck_ranks(s.ops, stream_items(s.ops), s.members).empty()) << what;
        // NCCL has no tags: the messages of a channel must be received in the order they are sent.
        EXPECT_EQ(s.sent_tags, s.received_tags) << what;
        std::vector<std::vector<StreamItem>> alone;
        for (const auto& ops : s.ops) alone.push_back(one_by_one(ops));
        one_by_one_deadlocks += stuck_ranks(s.ops, alone, s.members).empty() ? 0 : 1;
        ++plans;
      }
  // Posting each message alone deadlocks 1F1B's steady state (the model sees it): grouping is what the test checks.
  EXPECT_GT(one_by_one_deadlocks, 0) << "of " << plans;
}

// `plan` with stage k at TP degree degrees[k], its devices renumbered in stage order (replica by replica).
PlanDocument with_degrees(PlanDocument plan, const std::vector<int>& degrees) {
  int device = 0;
  for (size_t k = 0; k < plan.stages.size(); ++k) {
    PlanStageRecord& stage = plan.stages[k];
    stage.tp = degrees[k];
    stage.devices.clear();
    for (int d = 0; d < stage.replicas * stage.tp; ++d) stage.devices.push_back(device++);
  }
  return plan;
}

TEST(GroupedStageBoundariesWithTensorParallelAndZeroCollectives, FinishEveryScheduleApartRunExecutes) {
  const std::vector<std::pair<std::vector<int>, std::vector<int>>> shapes{  // (replicas, TP degrees) per stage
      {{1}, {2}},       {{2}, {2}},       {{1, 1}, {2, 2}}, {{2, 2}, {2, 2}}, {{1, 1}, {2, 1}},
      {{1, 2}, {1, 2}}, {{2, 1}, {4, 2}}, {{1, 1, 1}, {2, 2, 2}}, {{2, 1, 1}, {2, 1, 4}}};
  int plans = 0;
  for (const Schedule schedule : {Schedule::kGPipe, Schedule::k1F1B, Schedule::kZbH1})
    for (const auto& [replicas, degrees] : shapes)
      for (const int64_t m : {1, 2, 4})
        for (const int zero : {0, 2, 3}) {
          const PlanDocument plan = with_degrees(testing::pipeline_plan(replicas, m, schedule), degrees);
          const std::string what = std::string(schedule_name(schedule)) + " m " + std::to_string(m) + " stages " +
                                   std::to_string(replicas.size()) + " first tp " + std::to_string(degrees[0]) +
                                   " zero " + std::to_string(zero);
          const RankStreams s = streams_of(plan, zero);
          EXPECT_TRUE(stuck_ranks(s.ops, stream_items(s.ops), s.members).empty()) << what;
          EXPECT_EQ(s.sent_tags, s.received_tags) << what;
          ++plans;
        }
  EXPECT_EQ(plans, 3 * 9 * 3 * 3);
}

// Why interleaved plans keep their stage boundaries on the host (docs/runtime.md): posted on one NCCL stream with each
// send grouped with the rank's next receive, whichever chunk posts it, their steady state deadlocks once there are
// more micro-batches than stages, and so does grouping the sends and receives between two passes (the model found
// both); Megatron-LM batches an interleaved step's sends and receives of both directions in an order of its own
// (send_forward_backward_recv_forward_backward), which apart run's action lists would have to follow. The rule
// finishes every m = P plan; tags still arrive in posting order.
TEST(GroupedStageBoundariesOfInterleavedPlans, DeadlockUnderTheNextReceiveRuleBeyondOneMicroBatchPerStage) {
  int stuck = 0, stuck_at_m_equal_p = 0, plans = 0;
  for (const std::vector<int>& replicas : std::vector<std::vector<int>>{{1, 1}, {1, 1, 1}, {2, 1}, {1, 2}, {2, 2}})
    for (const int v : {2, 3})
      for (const int64_t m : {2, 3, 4, 6, 8})
        for (const int tp : {1, 2}) {
          if (m % static_cast<int64_t>(replicas.size()) != 0) continue;  // Megatron's interleaving: m a multiple of P
          const PlanDocument plan =
              with_degrees(testing::interleaved_plan(replicas, v, m), std::vector<int>(replicas.size(), tp));
          const RankStreams s = streams_of(plan, 0);
          const bool deadlocks = !stuck_ranks(s.ops, stream_items(s.ops), s.members).empty();
          stuck += deadlocks;
          stuck_at_m_equal_p += deadlocks && m == static_cast<int64_t>(replicas.size());
          EXPECT_EQ(s.sent_tags, s.received_tags);
          ++plans;
        }
  EXPECT_GT(stuck, plans / 2) << "of " << plans;
  EXPECT_EQ(stuck_at_m_equal_p, 0);
}

}  // namespace
}  // namespace apart::nccl
