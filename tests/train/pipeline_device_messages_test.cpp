// apart run with a device communicator (RunOptions::device_world, what NCCL is under --backend cuda), proven on the
// CPU: every rank on a device in host memory (host_device_backend.h) and a second in-process communicator that moves
// its buffers. The stage boundaries are packed and unpacked on the device and each send is grouped with the next
// receive, the buckets are all-reduced on device buffers; the run must be bitwise the host path's, with fewer copies
// to the host.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "train/pipeline.h"
#include "tests/train/device_memory_communicator.h"
#include "tests/runtime/forwarding_communicator.h"
#include "tests/runtime/host_device_backend.h"
#include "tests/train/pipeline_fixture.h"

namespace apart::testing {
namespace {

struct DeviceRun {
  std::vector<double> losses;
  Weights weights;
  int64_t to_host_copies = 0;
  int64_t device_collectives = 0;  // all-reduces, reduce-scatters and all-gathers over the device world and its splits
};

// The plan's ranks on threads, each on its own host-memory device; `device_messages`: with a device world that moves
// only its device's memory, as NCCL does (DeviceMemoryCommunicator).
DeviceRun run_on_devices(const fs::path& plan, int64_t steps, const fs::path& dir, bool device_messages) {
  const int world = plan_world(plan);
  RunOptions o = run_options_like_reference(plan, steps, Optimizer::kAdamW, 1e-3);
  fs::create_directories(dir);
  o.save_model = (dir / "run.onnx").string();
  std::vector<std::unique_ptr<HostDeviceBackend>> devices;
  for (int r = 0; r < world; ++r) devices.push_back(std::make_unique<HostDeviceBackend>());
  auto device_worlds = make_in_process_communicators(world, CommOptions{60});
  std::atomic<int64_t> collectives{0};
  std::vector<RunResult> ranks(static_cast<size_t>(world));
  const auto errors = run_ranks(world, CommOptions{60}, [&](int r, Communicator& comm) {
    RunOptions mine = o;
    mine.backend = devices[static_cast<size_t>(r)].get();
    DeviceMemoryCommunicator device_world(*device_worlds[static_cast<size_t>(r)], *devices[static_cast<size_t>(r)], collectives);
    if (device_messages) mine.device_world = &device_world;
    ranks[static_cast<size_t>(r)] = run_plan(mine, comm);
  });
  DeviceRun out;
  out.device_collectives = collectives;
  for (int r = 0; r < world; ++r) EXPECT_EQ(error_message(errors[static_cast<size_t>(r)]), "") << "rank " << r;
  if (errors[0]) return out;
  for (const StepRecord& s : ranks[0].steps) out.losses.push_back(s.loss);
  out.weights = read_weights(o.save_model);
  for (const auto& d : devices) out.to_host_copies += d->to_host_copies;
  return out;
}

// Trains `plan` 3 steps with and without the device world; the device run must be bitwise the host path's, with
// fewer copies to the host.
DeviceRun expect_device_run_equals_host_path(const fs::path& plan, const fs::path& dir, const std::string& name) {
  const DeviceRun host = run_on_devices(plan, 3, dir / "host", false);
  const DeviceRun device = run_on_devices(plan, 3, dir / "device", true);
  EXPECT_EQ(device.losses.size(), 3u) << name;
  EXPECT_EQ(device.losses, host.losses) << name;
  EXPECT_TRUE(bitwise_equal(device.weights, host.weights)) << name;
  EXPECT_LT(device.to_host_copies, host.to_host_copies) << name << ": the messages still went through the host";
  return device;
}

void expect_device_messages_equal_host_path(const Shape& shape, const std::string& name) {
  const fs::path dir = scratch("device_messages", name);
  expect_device_run_equals_host_path(make_plan(gpt_tiny(), shape, 8, dir / "plan"), dir, name);
}


TEST(ApartRunWithADeviceCommunicator, TrainsBitwiseAsTheHostPathUnder1F1BWithReplicas) {
  expect_device_messages_equal_host_path({{2, 1}, 2, Schedule::k1F1B, {}}, "1f1b_2_1");
}

TEST(ApartRunWithADeviceCommunicator, TrainsBitwiseAsTheHostPathThroughThreeStagesInSteadyState) {
  expect_device_messages_equal_host_path({{1, 1, 1}, 4, Schedule::k1F1B, {}}, "1f1b_1_1_1");
}

TEST(ApartRunWithADeviceCommunicator, TrainsBitwiseAsTheHostPathUnderGPipeAndZbH1) {
  expect_device_messages_equal_host_path({{1, 2}, 2, Schedule::kGPipe, {}}, "gpipe_1_2");
  expect_device_messages_equal_host_path({{1, 1}, 2, Schedule::kZbH1, {}}, "zbh1_1_1");
}

// ZeRO's reduce-scatters and all-gathers run over the device replicas on device buffers (NCCL's ncclReduceScatter
// and ncclAllGather under --backend cuda), ZeRO-3's per-task gathers included.
TEST(ApartRunWithADeviceCommunicator, RunsZeroOneTwoAndThreeOnDeviceBuffersBitwiseAsTheHostPath) {
  for (int zero : {1, 2, 3}) {
    Shape shape{{2, 1}, 2, Schedule::k1F1B, {}};
    shape.zero = zero;
    expect_device_messages_equal_host_path(shape, "zero" + std::to_string(zero) + "_2_1");
  }
}

// Under TP the shards' collectives (TpAllReduce, and under sequence parallelism TpAllGather and TpReduceScatter) and
// the TP parts of the boundary messages' all-gather run over the device world's TP groups on device tensors, as NCCL
// runs them under --backend cuda: no host buffer reaches the device communicator (it refuses one), and the run is
// bitwise the host path's.
TEST(ApartRunWithADeviceCommunicator, RunsTheTensorParallelCollectivesOnDeviceTensorsBitwiseAsTheHostPath) {
  for (const auto& [pp, sequence_parallel] : {std::pair{1, false}, std::pair{2, true}}) {
    const std::string name = "tp2_pp" + std::to_string(pp) + (sequence_parallel ? "_sp" : "");
    const fs::path dir = scratch("device_messages", name);
    TpShape shape;
    shape.stages = pp;
    shape.sequence_parallel = sequence_parallel;
    const DeviceRun device = expect_device_run_equals_host_path(make_tp_plan(shape, 8, dir / "plan"), dir, name);
    EXPECT_GT(device.device_collectives, 0) << name;
  }
}

TEST(ApartRunWithADeviceCommunicator, RunsATensorParallelZeroTwoPlanOnDeviceTensorsBitwiseAsTheHostPath) {
  const fs::path dir = scratch("device_messages", "tp2_dp2_zero2");
  TpShape shape;
  shape.replicas = 2;
  shape.zero = 2;
  expect_device_run_equals_host_path(make_tp_plan(shape, 8, dir / "plan"), dir, "tp2_dp2_zero2");
}

// Stages of TP degrees 2 and 1 share the tied embedding: its gradient is summed in whole-size buffers over every
// holder (RankTies::split), here in device tensors over the device world's tie communicator.
TEST(ApartRunWithADeviceCommunicator, SumsATieAcrossStagesOfDifferentTpDegreesOnDeviceTensorsBitwiseAsTheHostPath) {
  const fs::path dir = scratch("device_messages", "tp2_then_tp1");
  TpShape shape;
  shape.stages = 2;
  expect_device_run_equals_host_path(with_stage_degrees(make_tp_plan(shape, 8, dir / "plan"), {2, 1}), dir, "tp2_then_tp1");
}

// An interleaved plan keeps its boundaries on the host (nccl_groups_test: the next-receive rule deadlocks them), but its
// chunks' collectives — ZeRO-1 over 2 replicas, and TP 2 — run on device tensors.
TEST(ApartRunWithADeviceCommunicator, RunsAnInterleavedPlansCollectivesOnDeviceTensorsBitwiseAsTheHostPath) {
  Shape zero{{2, 2}, 2, Schedule::kInterleaved, {}};
  zero.zero = 1;
  const fs::path dir = scratch("device_messages", "interleaved_zero1");
  expect_device_run_equals_host_path(make_plan(gpt_tiny(), zero, 8, dir / "plan"), dir, "interleaved_zero1");
  TpShape tp;
  tp.stages = 2;
  tp.schedule = Schedule::kInterleaved;
  const fs::path tp_dir = scratch("device_messages", "interleaved_tp2");
  const DeviceRun device = expect_device_run_equals_host_path(make_tp_plan(tp, 8, tp_dir / "plan"), tp_dir, "interleaved_tp2");
  EXPECT_GT(device.device_collectives, 0);
}

// A rank whose device send fails aborts the device world as well as the world: the ranks waiting on it in a device
// receive end with CommError carrying its reason at once, not after --comm-timeout.
TEST(ApartRunWithADeviceCommunicator, EndsEveryRankAtOnceWhenOneRanksDeviceSendFails) {
  const fs::path dir = scratch("device_messages", "fails");
  const fs::path plan = make_plan(gpt_tiny(), {{2, 1}, 2, Schedule::k1F1B, {}}, 8, dir / "plan");
  const RunOptions o = run_options_like_reference(plan, 1000);
  std::vector<std::unique_ptr<HostDeviceBackend>> devices;
  for (int r = 0; r < 3; ++r) devices.push_back(std::make_unique<HostDeviceBackend>());
  constexpr double kTimeout = 120;
  auto device_worlds = make_in_process_communicators(3, CommOptions{kTimeout});
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(3, CommOptions{kTimeout}, [&](int r, Communicator& comm) {
    RunOptions mine = o;
    mine.backend = devices[static_cast<size_t>(r)].get();
    FailingCommunicator failing(*device_worlds[static_cast<size_t>(r)], r == 2 ? 5 : 0);  // rank 2: step 2's first send
    mine.device_world = &failing;
    run_plan(mine, comm);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(errors[2]);
  EXPECT_NE(error_message(errors[2]).find("injected"), std::string::npos) << error_message(errors[2]);
  for (int r : {0, 1}) {
    ASSERT_TRUE(errors[static_cast<size_t>(r)]) << "rank " << r << " finished a run whose rank 2 failed";
    EXPECT_THROW(std::rethrow_exception(errors[static_cast<size_t>(r)]), CommError) << "rank " << r;
    EXPECT_NE(error_message(errors[static_cast<size_t>(r)]).find("injected"), std::string::npos)
        << error_message(errors[static_cast<size_t>(r)]);
  }
  EXPECT_LT(seconds, kTimeout / 2) << "the other ranks waited for the timeout";
}

}  // namespace
}  // namespace apart::testing
