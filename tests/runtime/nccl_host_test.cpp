// The NCCL communicator's host-side logic on the CPU: the unique id's frame and broadcast, the polling wait's
// deadline, a request's states and the self mailbox's matching.
#include "runtime/nccl_host.h"

#include <gtest/gtest.h>

#include <thread>

namespace apart::nccl {
namespace {

UniqueId sample_id(uint8_t seed) {
  UniqueId id;
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::byte>(seed + 7 * i);
  return id;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CommError& e) {
    return e.what();
  }
  return "";
}

TEST(AUniqueIdFrame, DecodesToTheIdItWasMadeOf) {
  const UniqueId id = sample_id(3);
  const auto frame = encode_unique_id_frame(id, 22809, 4);
  EXPECT_EQ(frame.size(), kUniqueIdFrameBytes);
  EXPECT_EQ(decode_unique_id_frame(frame, 22809, 4, 2), id);
}

TEST(AUniqueIdFrame, FromAnotherNcclVersionIsRefusedNamingBothVersions) {
  const auto frame = encode_unique_id_frame(sample_id(1), 22809, 2);
  const std::string error = error_of([&] { decode_unique_id_frame(frame, 22703, 2, 1); });
  EXPECT_NE(error.find("NCCL 2.28.9"), std::string::npos) << error;
  EXPECT_NE(error.find("NCCL 2.27.3"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
}

TEST(AUniqueIdFrame, ForAnotherCommunicatorSizeIsRefused) {
  const auto frame = encode_unique_id_frame(sample_id(1), 22809, 8);
  const std::string error = error_of([&] { decode_unique_id_frame(frame, 22809, 4, 3); });
  EXPECT_NE(error.find("for 8 ranks"), std::string::npos) << error;
}

TEST(AUniqueIdFrame, ThatIsCorruptedOrTruncatedOrForeignIsRefused) {
  auto frame = encode_unique_id_frame(sample_id(9), 22809, 2);
  auto corrupted = frame;
  corrupted[40] ^= std::byte{1};
  EXPECT_NE(error_of([&] { decode_unique_id_frame(corrupted, 22809, 2, 1); }).find("checksum"), std::string::npos);
  EXPECT_NE(error_of([&] { decode_unique_id_frame(std::span(frame).first(100), 22809, 2, 1); }).find("100 bytes"),
            std::string::npos);
  auto foreign = frame;
  foreign[0] = std::byte{'X'};
  EXPECT_NE(error_of([&] { decode_unique_id_frame(foreign, 22809, 2, 1); }).find("not an apart NCCL id frame"),
            std::string::npos);
}

TEST(ANcclVersionName, ReadsBothEncodingsOfNcclVersionCode) {
  EXPECT_EQ(nccl_version_name(22809), "2.28.9");
  EXPECT_EQ(nccl_version_name(2307), "2.3.7");
}

TEST(AUniqueIdBroadcast, GivesEveryRankRankZerosIdAndCallsMakeIdOnlyThere) {
  constexpr int kRanks = 4;
  auto comms = make_in_process_communicators(kRanks);
  std::vector<UniqueId> got(kRanks);
  std::vector<int> made(kRanks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      got[r] = broadcast_unique_id(*comms[r], [&] { ++made[r]; return sample_id(42); }, 22809);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(got[r], sample_id(42)) << "rank " << r;
    EXPECT_EQ(made[r], r == 0 ? 1 : 0) << "rank " << r;
  }
}

TEST(AUniqueIdBroadcast, OverOneRankNeedsNoMessage) {
  auto comms = make_in_process_communicators(1);
  EXPECT_EQ(broadcast_unique_id(*comms[0], [] { return sample_id(5); }, 22809), sample_id(5));
}

// A clock that only moves when the wait sleeps, recording the sleeps.
struct FakeClock {
  double now = 100;
  std::vector<double> sleeps;
  PollClock clock() {
    return PollClock{[this] { return now; }, [this](double s) { sleeps.push_back(s); now += s; }};
  }
};

TEST(APollingWait, ReturnsAsSoonAsTheOperationIsDone) {
  FakeClock fake;
  int polls = 0;
  EXPECT_TRUE(poll_until([&] { return ++polls == 200; }, 10, fake.clock()));
  EXPECT_EQ(polls, 200);
  EXPECT_LT(fake.now - 100, 0.2);
}

TEST(APollingWait, GivesUpAtItsDeadlineWithoutSleepingPastIt) {
  FakeClock fake;
  EXPECT_FALSE(poll_until([] { return false; }, 2.5, fake.clock()));
  EXPECT_DOUBLE_EQ(fake.now, 102.5);
  for (double s : fake.sleeps) EXPECT_LE(s, kMaxPollSleep_s);
}

TEST(APollingWait, SeesAnOperationThatFinishesAtTheDeadline) {
  FakeClock fake;
  EXPECT_TRUE(poll_until([&] { return fake.now >= 101; }, 1, fake.clock()));
}

TEST(APollingWait, PassesOnTheProbesException) {
  FakeClock fake;
  EXPECT_THROW(poll_until([]() -> bool { throw CommError("peer died"); }, 1, fake.clock()), CommError);
}

TEST(ARequestTracker, CompletesOnceTheProbeSaysDoneAndStaysComplete) {
  RequestTracker tracker("send to rank 1", 5);
  int probes = 0;
  auto probe = [&] { return ++probes < 3 ? Probe::pending() : Probe::done(); };
  EXPECT_FALSE(tracker.test(probe));
  tracker.wait(probe, [] { FAIL() << "no abort expected"; }, FakeClock().clock());
  EXPECT_EQ(tracker.phase(), RequestTracker::Phase::kComplete);
  EXPECT_TRUE(tracker.test([]() -> Probe { throw std::logic_error("a complete request probes no more"); }));
  EXPECT_EQ(tracker.on_destroy(false), OnDestroy::kNothing);
}

TEST(ARequestTracker, ThatTimesOutAbortsTheCommunicatorOnceAndNamesTheOperation) {
  RequestTracker tracker("recv from rank 3 (tag 7, 64 bytes)", 0.5);
  FakeClock fake;
  int aborts = 0;
  const std::string error =
      error_of([&] { tracker.wait([] { return Probe::pending(); }, [&] { ++aborts; }, fake.clock()); });
  EXPECT_EQ(aborts, 1);
  EXPECT_NE(error.find("recv from rank 3 (tag 7, 64 bytes) timed out"), std::string::npos) << error;
  EXPECT_NE(error.find("aborted"), std::string::npos) << error;
  // Failed for good: the same error again, without another abort or probe.
  EXPECT_EQ(error_of([&] { tracker.wait([] { return Probe::done(); }, [&] { ++aborts; }, fake.clock()); }), error);
  EXPECT_EQ(error_of([&] { tracker.test([] { return Probe::done(); }); }), error);
  EXPECT_EQ(aborts, 1);
  EXPECT_EQ(tracker.on_destroy(true), OnDestroy::kNothing);
}

TEST(ARequestTracker, ThatFailsCarriesTheLibrarysError) {
  RequestTracker tracker("allreduce_sum(float) of 10 elements", 5);
  const std::string error = error_of([&] { tracker.test([] { return Probe::failed("remote process exited"); }); });
  EXPECT_NE(error.find("allreduce_sum(float) of 10 elements failed: remote process exited"), std::string::npos);
  EXPECT_EQ(tracker.phase(), RequestTracker::Phase::kFailed);
}

TEST(ARequestTracker, StillPendingWaitsWhenDestroyedAndAbortsWhenAnExceptionUnwinds) {
  RequestTracker tracker("barrier", 5);
  EXPECT_EQ(tracker.on_destroy(false), OnDestroy::kWait);
  EXPECT_EQ(tracker.on_destroy(true), OnDestroy::kAbortCommunicator);
}

TEST(ASelfMailbox, MatchesByTagInPostingOrder) {
  SelfMailbox box;
  EXPECT_FALSE(box.post_send(3, 1, 10));
  EXPECT_FALSE(box.post_send(5, 2, 20));
  EXPECT_FALSE(box.post_send(3, 3, 30));
  const auto a = box.post_recv(3, 4, 10);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->send_id, 1u);
  EXPECT_EQ(a->recv_id, 4u);
  const auto b = box.post_recv(5, 5, 20);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->send_id, 2u);
  EXPECT_EQ(box.unmatched(), 1u);
}

TEST(ASelfMailbox, MatchesAReceivePostedFirstAndReportsBothSizes) {
  SelfMailbox box;
  EXPECT_FALSE(box.post_recv(0, 7, 16));
  const auto m = box.post_send(0, 8, 12);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->recv_id, 7u);
  EXPECT_EQ(m->send_bytes, 12u);
  EXPECT_EQ(m->recv_bytes, 16u);
  EXPECT_EQ(box.unmatched(), 0u);
}

TEST(ASelfMailbox, ForgetsAWithdrawnRequest) {
  SelfMailbox box;
  EXPECT_FALSE(box.post_send(1, 1, 4));
  EXPECT_FALSE(box.post_send(1, 2, 4));
  box.withdraw(1);
  const auto m = box.post_recv(1, 3, 4);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->send_id, 2u);
}

}  // namespace
}  // namespace apart::nccl
