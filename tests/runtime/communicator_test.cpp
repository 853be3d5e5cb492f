// The in-process Communicator (one thread per rank): messages, all-reduce over split groups, barrier, abort, timeouts.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/communicator.h"
#include "tests/runtime/forwarding_communicator.h"

namespace apart {
namespace {

// Runs `body` on one thread per rank; returns each rank's exception message ("" when it returned normally).
std::vector<std::string> run_ranks(std::vector<std::unique_ptr<Communicator>>& comms,
                                   const std::function<void(Communicator&)>& body) {
  std::vector<std::string> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        body(*comms[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "(empty message)";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

std::vector<std::byte> pattern(size_t bytes, int salt) {
  std::vector<std::byte> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<std::byte>((i * 131 + salt * 17 + (i >> 8)) & 0xff);
  return v;
}

// Values of mixed magnitude whose sum depends on the order of addition (so a wrong order shows in the bits).
template <class T>
std::vector<T> contribution(int rank, size_t count) {
  std::vector<T> v(count);
  uint64_t state = 0x9e3779b97f4a7c15ull * (rank + 1);
  for (size_t i = 0; i < count; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const double unit = static_cast<double>(state >> 11) / static_cast<double>(1ull << 53);
    v[i] = static_cast<T>((unit - 0.5) * (i % 3 == 0 ? 1e6 : i % 3 == 1 ? 1.0 : 1e-6));
  }
  return v;
}

TEST(APointToPointMessage, ArrivesIntactAtEverySizeIncludingZeroBytes) {
  auto comms = make_in_process_communicators(2, {.timeout_s = 30});
  const std::vector<size_t> sizes = {0, 1, 7, 4096, 1 << 20};
  std::vector<std::vector<std::byte>> received(sizes.size());
  auto errors = run_ranks(comms, [&](Communicator& c) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (c.rank() == 0) {
        const auto data = pattern(sizes[i], static_cast<int>(i));
        c.send(data, 1, static_cast<int>(i))->wait();
      } else {
        received[i].assign(sizes[i], std::byte{0});
        c.recv(received[i], 0, static_cast<int>(i))->wait();
      }
    }
  });
  expect_no_errors(errors);
  for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(received[i], pattern(sizes[i], static_cast<int>(i))) << sizes[i];
}

TEST(APointToPointMessage, IsMatchedByTagNotByArrivalOrderAndInPostingOrderWithinATag) {
  auto comms = make_in_process_communicators(2, {.timeout_s = 30});
  std::vector<std::byte> tag5_first(8), tag5_second(8), tag2(8);
  auto errors = run_ranks(comms, [&](Communicator& c) {
    if (c.rank() == 0) {
      const auto a = pattern(8, 1), b = pattern(8, 2), d = pattern(8, 3);
      c.send(a, 1, 5)->wait();
      c.send(b, 1, 5)->wait();
      c.send(d, 1, 2)->wait();
    } else {
      Pending last = c.recv(tag2, 0, 2);  // the last message sent, received first
      last->wait();
      Pending first = c.recv(tag5_first, 0, 5);
      Pending second = c.recv(tag5_second, 0, 5);
      second->wait();
      first->wait();
    }
  });
  expect_no_errors(errors);
  EXPECT_EQ(tag2, pattern(8, 3));
  EXPECT_EQ(tag5_first, pattern(8, 1));
  EXPECT_EQ(tag5_second, pattern(8, 2));
}

TEST(APostedRecv, IsIncompleteUntilItsMessageIsSentAndCompleteAfter) {
  auto comms = make_in_process_communicators(2, {.timeout_s = 30});
  std::vector<std::byte> buffer(16);
  Pending r = comms[1]->recv(buffer, 0, 3);
  EXPECT_FALSE(r->test());
  const auto data = pattern(16, 9);
  comms[0]->send(data, 1, 3)->wait();
  EXPECT_TRUE(r->test());
  r->wait();
  EXPECT_EQ(buffer, data);
}

TEST(ASizeMismatch, IsACommErrorNamingBothSizes) {
  auto comms = make_in_process_communicators(2, {.timeout_s = 30});
  const auto data = pattern(16, 0);
  std::vector<std::byte> small(8);
  comms[0]->send(data, 1, 0);
  try {
    comms[1]->recv(small, 0, 0)->wait();
    FAIL() << "no CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("16 bytes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expects 8"), std::string::npos) << e.what();
  }
  // The receive posted first, the larger message after: the same error.
  std::vector<std::byte> large(32);
  Pending r = comms[1]->recv(large, 0, 1);
  comms[0]->send(data, 1, 1);
  EXPECT_THROW(r->wait(), CommError);
}

TEST(APeerOrTagOutOfRange, IsAnInvalidArgument) {
  auto comms = make_in_process_communicators(3, {.timeout_s = 30});
  std::vector<std::byte> buffer(4);
  EXPECT_THROW(comms[0]->send(buffer, 3, 0), InvalidArgument);
  EXPECT_THROW(comms[0]->recv(buffer, -1, 0), InvalidArgument);
  EXPECT_THROW(comms[0]->send(buffer, 1, Communicator::kMaxTag + 1), InvalidArgument);
  EXPECT_THROW(comms[0]->recv(buffer, 1, -1), InvalidArgument);
  EXPECT_NO_THROW(comms[0]->send(buffer, 1, Communicator::kMaxTag));
  EXPECT_THROW(make_in_process_communicators(0), InvalidArgument);
  EXPECT_THROW(make_in_process_communicators(2, {.timeout_s = 0}), InvalidArgument);
}

TEST(ARecvWithNoSender, TimesOutWithACommErrorNamingTheOperationPeerAndTag) {
  auto comms = make_in_process_communicators(2, {.timeout_s = 0.2});
  std::vector<std::byte> buffer(4);
  try {
    comms[1]->recv(buffer, 0, 9)->wait();
    FAIL() << "no CommError";
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("recv from rank 0"), std::string::npos) << m;
    EXPECT_NE(m.find("tag 9"), std::string::npos) << m;
    EXPECT_NE(m.find("timed out"), std::string::npos) << m;
  }
  // The timed-out receive was withdrawn: the next message on that tag goes to the next receive.
  const auto data = pattern(4, 4);
  comms[0]->send(data, 1, 9);
  std::vector<std::byte> again(4);
  comms[1]->recv(again, 0, 9)->wait();
  EXPECT_EQ(again, data);
}

TEST(ARecvAbandonedByAnException, IsWithdrawnSoALaterSendDoesNotWriteIntoItsBuffer) {
  auto comms = make_in_process_communicators(2, {.timeout_s = 300});
  try {
    std::vector<std::byte> doomed(64);
    Pending r = comms[1]->recv(doomed, 0, 4);
    throw std::runtime_error("a stage failed");  // unwinding must neither wait 300 s nor leave the receive posted
  } catch (const std::runtime_error&) {
  }
  const auto data = pattern(64, 5);
  comms[0]->send(data, 1, 4);  // AddressSanitizer would catch a write into the freed buffer
  std::vector<std::byte> fresh(64);
  comms[1]->recv(fresh, 0, 4)->wait();
  EXPECT_EQ(fresh, data);
}

// 5 ranks split into {0,2,4} and {1,3}; each group all-reduces and every member must hold the serial sum, in group
// rank order, bit for bit.
template <class T>
std::vector<std::vector<T>> allreduce_over_split_groups(size_t count) {
  auto comms = make_in_process_communicators(5, {.timeout_s = 30});
  std::vector<std::vector<T>> results(5);
  std::vector<int> group_rank(5, -1), group_size(5, -1);
  auto errors = run_ranks(comms, [&](Communicator& world) {
    const int r = world.rank();
    std::unique_ptr<Communicator> group = world.split(r % 2, r);
    group_rank[r] = group->rank();
    group_size[r] = group->size();
    results[r] = contribution<T>(r, count);
    group->allreduce_sum(std::span<T>(results[r]))->wait();
  });
  expect_no_errors(errors);
  EXPECT_EQ(group_rank, (std::vector<int>{0, 0, 1, 1, 2}));
  EXPECT_EQ(group_size, (std::vector<int>{3, 2, 3, 2, 3}));
  return results;
}

template <class T>
void expect_serial_sums_on_every_member(const std::vector<std::vector<T>>& results, size_t count) {
  for (const std::vector<int>& members : {std::vector<int>{0, 2, 4}, std::vector<int>{1, 3}}) {
    std::vector<T> serial = contribution<T>(members[0], count);
    for (size_t m = 1; m < members.size(); ++m) {
      const std::vector<T> x = contribution<T>(members[m], count);
      for (size_t i = 0; i < count; ++i) serial[i] += x[i];
    }
    for (int r : members) {
      ASSERT_EQ(results[r].size(), count);
      EXPECT_EQ(std::memcmp(results[r].data(), serial.data(), count * sizeof(T)), 0) << "rank " << r;
    }
  }
}

TEST(AnAllreduceOverSplitGroups, EqualsTheSerialSumBitwiseOnEveryRankInFloatAndDouble) {
  constexpr size_t kCount = 10007;
  expect_serial_sums_on_every_member(allreduce_over_split_groups<float>(kCount), kCount);
  expect_serial_sums_on_every_member(allreduce_over_split_groups<double>(kCount), kCount);
}

TEST(AnAllreduceOverSplitGroups, GivesTheSameBitsWhenRunTwice) {
  constexpr size_t kCount = 4096;
  const auto first = allreduce_over_split_groups<float>(kCount);
  const auto second = allreduce_over_split_groups<float>(kCount);
  for (int r = 0; r < 5; ++r)
    EXPECT_EQ(std::memcmp(first[r].data(), second[r].data(), kCount * sizeof(float)), 0) << "rank " << r;
}

// A transport with only the required collectives: Communicator's default reduce_scatter_sum and allgather.
class AllreduceOnly final : public testing::ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  Pending reduce_scatter_sum(std::span<float> d) override { return Communicator::reduce_scatter_sum(d); }
  Pending allgather(std::span<float> d) override { return Communicator::allgather(d); }
};

// ZeRO's pair over the split groups {0,2,4} and {1,3}: each member's reduce-scattered shard is the group's serial
// sum of that shard bit for bit (the all-reduce's bits), and the all-gather hands every member every shard.
void expect_reduce_scatter_and_allgather_over_split_groups(bool default_collectives) {
  constexpr size_t kCount = 6006;  // a multiple of both group sizes
  auto comms = make_in_process_communicators(5, {.timeout_s = 30});
  std::vector<std::vector<float>> scattered(5), gathered(5);
  std::vector<int> group_rank(5), group_size(5);
  auto errors = run_ranks(comms, [&](Communicator& world) {
    const int r = world.rank();
    std::unique_ptr<Communicator> split = world.split(r % 2, r);
    AllreduceOnly plain(*split);
    Communicator& group = default_collectives ? static_cast<Communicator&>(plain) : *split;
    group_rank[r] = group.rank();
    group_size[r] = group.size();
    scattered[r] = contribution<float>(r, kCount);
    group.reduce_scatter_sum(std::span<float>(scattered[r]))->wait();
    gathered[r] = contribution<float>(r + 100, kCount);
    group.allgather(std::span<float>(gathered[r]))->wait();
  });
  expect_no_errors(errors);
  for (const std::vector<int>& members : {std::vector<int>{0, 2, 4}, std::vector<int>{1, 3}}) {
    const size_t shard = kCount / members.size();
    std::vector<float> serial = contribution<float>(members[0], kCount);
    for (size_t m = 1; m < members.size(); ++m) {
      const std::vector<float> x = contribution<float>(members[m], kCount);
      for (size_t i = 0; i < kCount; ++i) serial[i] += x[i];
    }
    for (int r : members) {
      const size_t at = static_cast<size_t>(group_rank[r]) * shard;
      EXPECT_EQ(std::memcmp(scattered[r].data() + at, serial.data() + at, shard * sizeof(float)), 0) << "rank " << r;
      for (int owner : members) {
        const size_t from = static_cast<size_t>(group_rank[owner]) * shard;
        const std::vector<float> theirs = contribution<float>(owner + 100, kCount);
        EXPECT_EQ(std::memcmp(gathered[r].data() + from, theirs.data() + from, shard * sizeof(float)), 0)
            << "rank " << r << " holds another shard of rank " << owner;
      }
    }
  }
}

TEST(AReduceScatterAndAnAllgather, GiveEachShardItsSumAndEveryRankEveryShardOverSplitGroups) {
  expect_reduce_scatter_and_allgather_over_split_groups(false);
}

TEST(AReduceScatterAndAnAllgather, GiveTheSameResultThroughTheDefaultsAnyTransportInherits) {
  expect_reduce_scatter_and_allgather_over_split_groups(true);
}

TEST(AReduceScatterOrAnAllgather, OfACountThatDoesNotShardEvenlyIsAnInvalidArgument) {
  auto comms = make_in_process_communicators(2, {.timeout_s = 30});
  std::vector<float> data(5, 1.0f);
  EXPECT_THROW(comms[0]->reduce_scatter_sum(std::span<float>(data)), InvalidArgument);
  EXPECT_THROW(comms[0]->allgather(std::span<float>(data)), InvalidArgument);
}

TEST(AnAllreduce, OverlapsWithPointToPointAndLaterCollectivesKeepTheirOrder) {
  auto comms = make_in_process_communicators(3, {.timeout_s = 30});
  std::vector<std::vector<float>> first(3), second(3);
  auto errors = run_ranks(comms, [&](Communicator& c) {
    const int r = c.rank();
    first[r] = {1.0f * (r + 1), 2.0f};
    second[r] = {10.0f * (r + 1)};
    Pending a = c.allreduce_sum(std::span<float>(first[r]));  // in flight while messages move
    std::vector<std::byte> token(4), got(4);
    c.send(token, (r + 1) % 3, 0);
    c.recv(got, (r + 2) % 3, 0)->wait();
    Pending b = c.allreduce_sum(std::span<float>(second[r]));
    b->wait();
    a->wait();
  });
  expect_no_errors(errors);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(first[r], (std::vector<float>{6.0f, 6.0f})) << r;
    EXPECT_EQ(second[r], (std::vector<float>{60.0f})) << r;
  }
}

TEST(AnAllreduce, OfDifferentSizesOnTwoRanksIsACommErrorOnEveryRank) {
  auto comms = make_in_process_communicators(2, {.timeout_s = 30});
  auto errors = run_ranks(comms, [&](Communicator& c) {
    std::vector<float> data(c.rank() == 0 ? 4 : 5, 1.0f);
    c.allreduce_sum(std::span<float>(data))->wait();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find(" but rank "), std::string::npos) << errors[r];  // whichever arrived first
    EXPECT_NE(errors[r].find("of 4"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("of 5"), std::string::npos) << errors[r];
  }
}

TEST(ASplit, OrdersRanksByKeyAndLeavesOutNegativeColors) {
  auto comms = make_in_process_communicators(4, {.timeout_s = 30});
  std::vector<int> new_rank(4, -2);
  std::vector<std::vector<float>> sums(4);
  auto errors = run_ranks(comms, [&](Communicator& world) {
    const int r = world.rank();
    auto group = world.split(r == 3 ? -1 : 0, -r);  // ranks 0..2, reversed; rank 3 joins none
    if (!group) {
      new_rank[r] = -1;
      return;
    }
    new_rank[r] = group->rank();
    sums[r] = {static_cast<float>(r)};
    group->allreduce_sum(std::span<float>(sums[r]))->wait();
  });
  expect_no_errors(errors);
  EXPECT_EQ(new_rank, (std::vector<int>{2, 1, 0, -1}));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(sums[r], (std::vector<float>{3.0f})) << r;
}

TEST(ABarrier, HoldsEveryRankUntilAllHaveArrived) {
  auto comms = make_in_process_communicators(4, {.timeout_s = 30});
  std::atomic<int> arrived{0};
  std::vector<int> seen(4, -1);
  auto errors = run_ranks(comms, [&](Communicator& c) {
    if (c.rank() == 3) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the straggler
    ++arrived;
    c.barrier();
    seen[c.rank()] = arrived.load();
  });
  expect_no_errors(errors);
  EXPECT_EQ(seen, (std::vector<int>{4, 4, 4, 4}));
}

TEST(AnAbort, MakesEveryOtherRanksPendingRecvAndLaterCallsThrowCommErrorCarryingTheReason) {
  auto comms = make_in_process_communicators(4, {.timeout_s = 120});  // far longer than the test takes
  std::vector<std::string> later(4);
  auto errors = run_ranks(comms, [&](Communicator& c) {
    if (c.rank() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the others post their receives
      c.abort("NaN in the loss at step 3", 5);
      return;
    }
    std::vector<std::byte> buffer(8);
    try {
      c.recv(buffer, 0, 1)->wait();  // posted before the abort, or refused at once after it
    } catch (const CommError&) {
      try {
        c.barrier();
      } catch (const CommError& again) {
        later[c.rank()] = again.what();
      }
      throw;
    }
  });
  EXPECT_EQ(errors[0], "");
  for (int r = 1; r < 4; ++r) {
    EXPECT_NE(errors[r].find("rank 0 aborted: NaN in the loss at step 3"), std::string::npos) << errors[r];
    EXPECT_NE(later[r].find("aborted"), std::string::npos) << later[r];
  }
}

TEST(AnAbort, EndsAPendingAllreduceOnTheOtherRanks) {
  auto comms = make_in_process_communicators(3, {.timeout_s = 120});
  auto errors = run_ranks(comms, [&](Communicator& c) {
    if (c.rank() == 2) {
      c.abort("rank 2 gave up", 1);
      return;
    }
    std::vector<double> data(16, 1.0);
    c.allreduce_sum(std::span<double>(data))->wait();
  });
  EXPECT_NE(errors[0].find("gave up"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("gave up"), std::string::npos) << errors[1];
}

}  // namespace
}  // namespace apart
