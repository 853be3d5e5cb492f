// A test communicator that moves only one HostDeviceBackend's memory, as NCCL moves only its GPU's: every buffer it
// is handed must lie in that device's blocks, else the call throws InvalidArgument (NcclCommunicator refuses host
// memory the same way). Its splits check the same, and every one of them counts its collectives into one counter, so
// that a test sees which collectives went over the device transport.
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string>

#include "graph/error.h"
#include "tests/runtime/forwarding_communicator.h"
#include "tests/runtime/host_device_backend.h"

namespace apart::testing {

class DeviceMemoryCommunicator final : public ForwardingCommunicator {
 public:
  // `inner` moves the bytes; `owned`: inner itself when this is a split's child (kept alive here).
  DeviceMemoryCommunicator(Communicator& inner, const HostDeviceBackend& device, std::atomic<int64_t>& collectives,
                           std::unique_ptr<Communicator> owned = nullptr)
      : ForwardingCommunicator(inner), device_(device), collectives_(collectives), owned_(std::move(owned)) {}

  Pending send(std::span<const std::byte> data, int peer, int tag) override {
    check("send", data.data(), data.size());
    return inner_.send(data, peer, tag);
  }
  Pending recv(std::span<std::byte> data, int peer, int tag) override {
    check("recv", data.data(), data.size());
    return inner_.recv(data, peer, tag);
  }
  Pending allreduce_sum(std::span<float> data) override { return collective("allreduce_sum", data, [&] { return inner_.allreduce_sum(data); }); }
  Pending allreduce_sum(std::span<double> data) override { return collective("allreduce_sum", data, [&] { return inner_.allreduce_sum(data); }); }
  Pending reduce_scatter_sum(std::span<float> data) override {
    return collective("reduce_scatter_sum", data, [&] { return inner_.reduce_scatter_sum(data); });
  }
  Pending allgather(std::span<float> data) override { return collective("allgather", data, [&] { return inner_.allgather(data); }); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> child = inner_.split(color, key);
    if (!child) return nullptr;
    Communicator& moved = *child;
    return std::make_unique<DeviceMemoryCommunicator>(moved, device_, collectives_, std::move(child));
  }

 private:
  void check(const char* what, const void* data, size_t bytes) const {
    if (bytes > 0 && !device_.owns(data, bytes))
      throw InvalidArgument(std::string(what) + ": the buffer is not this device's memory (a device communicator moves "
                            "device memory only, as NCCL does)");
  }
  template <class T, class Post>
  Pending collective(const char* what, std::span<T> data, const Post& post) {
    check(what, data.data(), data.size_bytes());
    ++collectives_;
    return post();
  }

  const HostDeviceBackend& device_;
  std::atomic<int64_t>& collectives_;
  std::unique_ptr<Communicator> owned_;
};

}  // namespace apart::testing
