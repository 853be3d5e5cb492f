// The NCCL communicator on one GPU, one rank over the in-process bootstrap: all-reduce of one rank is the identity,
// sends to self arrive (matched by tag), split, and a peer that never joins ends in CommError at the timeout.
// Skipped where the build has no CUDA or the machine no GPU; multi-rank logic is covered by the CPU/MPI tests.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "runtime/backend.h"
#include "runtime/communicator.h"
#include "runtime/cuda/cuda_entry.h"

namespace apart {
namespace {

class ANcclCommunicator : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_built()) GTEST_SKIP() << "built without CUDA (cmake --preset gpu)";
    if (cuda_device_count() == 0) {
      std::string reason = "no GPU visible";
      try {
        make_backend(BackendKind::kCuda);
      } catch (const Error& e) {
        reason = e.what();
      }
      GTEST_SKIP() << "no CUDA device: " << reason;
    }
    backend_ = make_backend(BackendKind::kCuda);
    bootstrap_ = std::move(make_in_process_communicators(1, CommOptions{.timeout_s = 30})[0]);
    nccl_ = cuda::make_nccl_communicator(*bootstrap_, *backend_, CommOptions{.timeout_s = 30});
  }

  // A device tensor of `n` random floats (seeded), and its host copy.
  std::pair<Tensor, Tensor> random_floats(int64_t n, uint32_t seed) {
    Tensor host(DType::kFloat32, {n});
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-3, 3);
    for (float& v : host.span<float>()) v = dist(rng);
    return {backend_->to_device(host), host};
  }
  std::vector<std::byte> bytes_of(const Tensor& device) {
    const Tensor host = backend_->to_host(device);
    return std::vector<std::byte>(host.raw(), host.raw() + host.bytes());
  }
  static std::span<std::byte> device_bytes(Tensor& t) { return {t.raw(), static_cast<size_t>(t.bytes())}; }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Communicator> bootstrap_;
  std::unique_ptr<Communicator> nccl_;
};

TEST_F(ANcclCommunicator, OfOneRankAllReducesToTheInputBitForBit) {
  EXPECT_EQ(nccl_->rank(), 0);
  EXPECT_EQ(nccl_->size(), 1);
  // An odd size, over a million elements: several NCCL chunks and a ragged tail.
  auto [device, host] = random_floats(1'000'003, 7);
  nccl_->allreduce_sum(std::span(device.data<float>(), static_cast<size_t>(device.elements())))->wait();
  const auto after = bytes_of(device);
  ASSERT_EQ(after.size(), static_cast<size_t>(host.bytes()));
  EXPECT_EQ(std::memcmp(after.data(), host.raw(), after.size()), 0);

  Tensor doubles_host(DType::kFloat64, {1001});
  for (int64_t i = 0; i < 1001; ++i) doubles_host.data<double>()[i] = 1.0 / (i + 1);
  Tensor doubles = backend_->to_device(doubles_host);
  Pending pending = nccl_->allreduce_sum(std::span(doubles.data<double>(), 1001));
  while (!pending->test()) std::this_thread::yield();
  const auto doubles_after = bytes_of(doubles);
  EXPECT_EQ(std::memcmp(doubles_after.data(), doubles_host.raw(), doubles_after.size()), 0);
}

TEST_F(ANcclCommunicator, DeliversSendsToSelfMatchedByTag) {
  auto [first, first_host] = random_floats(4099, 1);
  auto [second, second_host] = random_floats(4099, 2);
  Tensor into_second = backend_->empty(DType::kFloat32, {4099});
  Tensor into_first = backend_->empty(DType::kFloat32, {4099});
  Pending send_first = nccl_->send(device_bytes(first), 0, 1);
  Pending send_second = nccl_->send(device_bytes(second), 0, 2);
  // Received in the other order: the tag, not the posting order across tags, decides.
  Pending recv_second = nccl_->recv(device_bytes(into_second), 0, 2);
  Pending recv_first = nccl_->recv(device_bytes(into_first), 0, 1);
  for (Pending* p : {&send_first, &send_second, &recv_second, &recv_first}) (*p)->wait();
  const auto got_first = bytes_of(into_first), got_second = bytes_of(into_second);
  EXPECT_EQ(std::memcmp(got_first.data(), first_host.raw(), got_first.size()), 0);
  EXPECT_EQ(std::memcmp(got_second.data(), second_host.raw(), got_second.size()), 0);
}

// apart run's grouped posting (MessageTransport): a group of sends and a receive, here all to self on one GPU.
TEST_F(ANcclCommunicator, DeliversAGroupOfSendsAndAReceive) {
  auto [first, first_host] = random_floats(1025, 3);
  Tensor into = backend_->empty(DType::kFloat32, {1025});
  const Communicator::SendPart send{device_bytes(first), 0, 9};
  const Communicator::RecvPart recv{device_bytes(into), 0, 9};
  std::vector<Pending> requests = nccl_->post_group(std::span(&send, 1), std::span(&recv, 1));
  ASSERT_EQ(requests.size(), 2u);
  for (Pending& p : requests) p->wait();
  const auto got = bytes_of(into);
  EXPECT_EQ(std::memcmp(got.data(), first_host.raw(), got.size()), 0);
}

TEST_F(ANcclCommunicator, RefusesASelfMessageOfTheWrongSizeOnBothSides) {
  Tensor small = backend_->empty(DType::kFloat32, {8});
  Tensor large = backend_->empty(DType::kFloat32, {16});
  Pending send = nccl_->send(device_bytes(small), 0, 5);
  Pending recv = nccl_->recv(device_bytes(large), 0, 5);
  EXPECT_THROW(recv->wait(), CommError);
  EXPECT_THROW(send->wait(), CommError);
  nccl_->barrier();  // the communicator is still usable: nothing was issued
}

TEST_F(ANcclCommunicator, SplitsIntoAWorkingCommunicatorOrNoneForANegativeColor) {
  std::unique_ptr<Communicator> child = nccl_->split(3, 0);
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->rank(), 0);
  EXPECT_EQ(child->size(), 1);
  auto [device, host] = random_floats(513, 9);
  child->allreduce_sum(std::span(device.data<float>(), 513))->wait();
  const auto after = bytes_of(device);
  EXPECT_EQ(std::memcmp(after.data(), host.raw(), after.size()), 0);
  child->barrier();
  EXPECT_EQ(nccl_->split(-1, 0), nullptr);
}

TEST_F(ANcclCommunicator, RefusesHostMemory) {
  std::vector<float> host(16, 1.0f);
  EXPECT_THROW(nccl_->allreduce_sum(std::span(host)), InvalidArgument);
  EXPECT_THROW(nccl_->send(std::as_bytes(std::span(host)), 0, 0), InvalidArgument);
}

TEST_F(ANcclCommunicator, ThatWasAbortedThrowsCommErrorOnEveryLaterCall) {
  nccl_->abort("test abort", 6);
  Tensor t = backend_->empty(DType::kFloat32, {4});
  EXPECT_THROW(nccl_->allreduce_sum(std::span(t.data<float>(), 4)), CommError);
  EXPECT_THROW(nccl_->barrier(), CommError);
}

TEST_F(ANcclCommunicator, ThatWaitsForAReceiveNoOneSendsTimesOutNamingIt) {
  auto bootstrap = std::move(make_in_process_communicators(1)[0]);
  auto nccl = cuda::make_nccl_communicator(*bootstrap, *backend_, CommOptions{.timeout_s = 0.5});
  Tensor t = backend_->empty(DType::kFloat32, {4});
  Pending recv = nccl->recv(device_bytes(t), 0, 9);
  try {
    recv->wait();
    FAIL() << "a receive with no send completed";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("recv from rank 0 (tag 9, 16 bytes) timed out"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(nccl->barrier(), CommError);  // the timeout aborted the communicator
}

TEST_F(ANcclCommunicator, WhosePeerNeverJoinsThrowsCommErrorAtTheTimeoutInsteadOfHanging) {
  // Two bootstrap ranks, but only rank 0 makes its NCCL communicator: ncclCommInitRankConfig waits for rank 1.
  auto bootstrap = make_in_process_communicators(2, CommOptions{.timeout_s = 30});
  try {
    cuda::make_nccl_communicator(*bootstrap[0], *backend_, CommOptions{.timeout_s = 3});
    FAIL() << "an NCCL communicator of 2 ranks came up with 1";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("ncclCommInitRankConfig"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
  }
}

TEST(ANcclCommunicatorFactory, RefusesTheCpuBackend) {
  auto bootstrap = std::move(make_in_process_communicators(1)[0]);
  if (cuda_built()) {
    EXPECT_THROW(cuda::make_nccl_communicator(*bootstrap, cpu_backend(), {}), InvalidArgument);
  } else {
    EXPECT_THROW(cuda::make_nccl_communicator(*bootstrap, cpu_backend(), {}), Unsupported);
  }
}

}  // namespace
}  // namespace apart
