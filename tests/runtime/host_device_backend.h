// A test-only device backend in host memory: what the executor, the optimizer and the trainer do on a GPU, proven on
// the CPU. Its tensors are separate malloc'd buffers from a DevicePool that report on_host() false (so a CPU kernel
// or a clone that touched one would fail), its copies are real memcpys that it counts, its kernels are the CPU
// kernels of a subset of ops (so the executor falls back for the others, in both directions), and its vector ops and
// optimizer step are the CPU backend's arithmetic on host views of its buffers (so training on it is bitwise the CPU's).
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "graph/error.h"
#include "runtime/backend.h"
#include "runtime/device_pool.h"

namespace apart::testing {

class HostDeviceBackend final : public Backend {
 public:
  // Ops whose CPU kernel is not this backend's: the ones the executor must run on the host. Reshape, Gather and
  // Shape by choice (a host shape op between device kernels, and an embedding lookup that reads a device param);
  // the others because their CPU kernels read a data input on the host (to_int64s, scalar_as_double, clone), which a
  // device tensor refuses: a real device kernel reads those on the device.
  static const std::set<std::string>& host_only_ops() {
    static const std::set<std::string> ops{"Reshape", "Gather", "Shape", "Pow", "Sum", "Min", "Max", "Mean",
                                           "ScatterND", "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss",
                                           "ai.apart.VocabParallelCrossEntropy", "ai.apart.VocabParallelCrossEntropyGrad"};
    return ops;
  }

  HostDeviceBackend()
      : pool_(
            [](size_t bytes, void* self) -> void* {
              // Not zeroed: garbage, so an output a kernel relied on being zero would show.
              void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
              if (p) std::memset(p, 0xA5, bytes);
              if (p) static_cast<HostDeviceBackend*>(self)->record(p, bytes);
              return p;
            },
            [](void* p, void* self) {
              static_cast<HostDeviceBackend*>(self)->forget(p);
              std::free(p);
            },
            this) {}

  BackendKind kind() const override { return BackendKind::kCuda; }  // a device, as far as callers can tell
  std::string describe() const override { return "host-device (test)"; }
  bool host_memory() const override { return false; }
  std::shared_ptr<std::byte> allocate(int64_t bytes) override { return pool_.allocate(bytes); }
  KernelFn find_kernel(std::string_view op) const override {
    if (host_only_ops().count(std::string(op))) return nullptr;
    return apart::find_kernel(op);
  }

  void copy_to_device(const std::byte* host, std::byte* device, int64_t bytes) override {
    ++to_device_copies;
    copy(host, device, bytes);
  }
  void copy_to_host(const std::byte* device, std::byte* host, int64_t bytes) override {
    ++to_host_copies;
    copy(device, host, bytes);
  }
  void copy_on_device(const std::byte* from, std::byte* to, int64_t bytes) override { copy(from, to, bytes); }
  void synchronize() override { ++synchronizations; }
  void fill_zero_bytes(Tensor& t) override {
    if (t.bytes() > 0) std::memset(t.raw(), 0, static_cast<size_t>(t.bytes()));
  }

  void fill_zero(Tensor& x) override {
    Tensor h = host_view(x);
    cpu_backend().fill_zero(h);
  }
  void add_into(Tensor& accumulator, const Tensor& x) override {
    Tensor a = host_view(accumulator);
    cpu_backend().add_into(a, host_view(x));
  }
  void scale(Tensor& x, double factor) override {
    Tensor h = host_view(x);
    cpu_backend().scale(h, factor);
  }
  double sum_of_squares(std::span<const Tensor* const> xs) override {
    std::vector<Tensor> views = host_views(xs);
    std::vector<const Tensor*> refs;
    for (const Tensor& v : views) refs.push_back(&v);
    return cpu_backend().sum_of_squares(refs);
  }
  bool all_finite(std::span<const Tensor* const> xs) override {
    std::vector<Tensor> views = host_views(xs);
    std::vector<const Tensor*> refs;
    for (const Tensor& v : views) refs.push_back(&v);
    return cpu_backend().all_finite(refs);
  }
  void optimizer_step(const OptimizerUpdate& update, std::span<Tensor* const> params, std::span<Tensor* const> grads,
                      std::span<Tensor* const> states) override {
    ++optimizer_steps;
    std::vector<Tensor> p, g, s;
    for (Tensor* t : params) p.push_back(host_view(*t));
    for (Tensor* t : grads) g.push_back(host_view(*t));
    for (Tensor* t : states) s.push_back(host_view(*t));
    std::vector<Tensor*> pp, gp, sp;
    for (Tensor& t : p) pp.push_back(&t);
    for (Tensor& t : g) gp.push_back(&t);
    for (Tensor& t : s) sp.push_back(&t);
    cpu_backend().optimizer_step(update, pp, gp, sp);
  }

  // Whether [data, data + bytes) lies in one block of this device's memory (what NCCL checks of a buffer).
  bool owns(const void* data, size_t bytes) const {
    const auto* p = static_cast<const std::byte*>(data);
    std::lock_guard lock(blocks_mutex_);
    auto it = blocks_.upper_bound(p);
    if (it == blocks_.begin()) return false;
    --it;
    return p + bytes <= it->first + it->second;
  }

  DevicePool& pool() { return pool_; }
  std::atomic<int64_t> to_device_copies{0}, to_host_copies{0}, synchronizations{0}, optimizer_steps{0};

 private:
  // The same bytes as a host tensor, for the CPU arithmetic; refuses a host tensor, which is not this device's.
  static Tensor host_view(const Tensor& t) {
    APART_CHECK(!t.on_host(), "host-device backend: a host tensor where a device tensor belongs");
    return Tensor::over(t.dtype(), t.shape(), std::shared_ptr<std::byte>(std::shared_ptr<std::byte>(), const_cast<std::byte*>(t.raw())));
  }
  static std::vector<Tensor> host_views(std::span<const Tensor* const> xs) {
    std::vector<Tensor> views;
    for (const Tensor* x : xs) views.push_back(host_view(*x));
    return views;
  }
  static void copy(const std::byte* from, std::byte* to, int64_t bytes) {
    if (bytes > 0 && from != to) std::memcpy(to, from, static_cast<size_t>(bytes));
  }

  void record(void* p, size_t bytes) {
    std::lock_guard lock(blocks_mutex_);
    blocks_[static_cast<const std::byte*>(p)] = bytes;
  }
  void forget(void* p) {
    std::lock_guard lock(blocks_mutex_);
    blocks_.erase(static_cast<const std::byte*>(p));
  }

  mutable std::mutex blocks_mutex_;
  std::map<const std::byte*, size_t> blocks_;  // the raw blocks: start → bytes
  DevicePool pool_;  // after the blocks: its cached blocks are freed (forgotten) before the map goes
};

}  // namespace apart::testing
