// Test communicators that wrap a real one: a pass-through base, and a rank whose `fail_at`-th send fails (a link or
// memory giving out mid-step); tests override the one call they perturb.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "graph/error.h"
#include "runtime/communicator.h"

namespace apart::testing {

class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Pending send(std::span<const std::byte> data, int peer, int tag) override { return inner_.send(data, peer, tag); }
  Pending recv(std::span<std::byte> data, int peer, int tag) override { return inner_.recv(data, peer, tag); }
  Pending allreduce_sum(std::span<float> data) override { return inner_.allreduce_sum(data); }
  Pending allreduce_sum(std::span<double> data) override { return inner_.allreduce_sum(data); }
  Pending reduce_scatter_sum(std::span<float> data) override { return inner_.reduce_scatter_sum(data); }
  Pending allgather(std::span<float> data) override { return inner_.allgather(data); }
  void barrier() override { inner_.barrier(); }
  std::unique_ptr<Communicator> split(int color, int key) override { return inner_.split(color, key); }
  void abort(const std::string& reason, int exit_code) override { inner_.abort(reason, exit_code); }

 protected:
  Communicator& inner_;
};

// Fails its `fail_at`-th send (SystemError "injected: …"; 0: none), raised inside run_plan on this rank alone.
class FailingCommunicator final : public ForwardingCommunicator {
 public:
  FailingCommunicator(Communicator& inner, int fail_at) : ForwardingCommunicator(inner), sends_left_(fail_at) {}
  Pending send(std::span<const std::byte> data, int peer, int tag) override {
    if (--sends_left_ == 0) throw SystemError("injected: this rank's send to rank " + std::to_string(peer) + " failed");
    return inner_.send(data, peer, tag);
  }

 private:
  int sends_left_;
};

}  // namespace apart::testing
