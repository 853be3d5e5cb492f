// The caching allocator: free lists by size class behind one mutex; a block's deleter returns it to its class.
#include "runtime/device_pool.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/units.h"

namespace apart {

struct DevicePool::State {
  RawAlloc raw_alloc;
  RawFree raw_free;
  void* user;
  std::mutex mutex;
  std::map<int64_t, std::vector<void*>> free_blocks;  // by size class
  int64_t in_use = 0, cached = 0, peak = 0, raw_calls = 0;
  bool closed = false;  // the pool is gone: returning blocks go straight to raw_free

  void release_locked() {
    for (auto& [size, blocks] : free_blocks)
      for (void* p : blocks) raw_free(p, user);
    free_blocks.clear();
    cached = 0;
  }
};

DevicePool::DevicePool(RawAlloc alloc, RawFree free, void* user) : state_(std::make_shared<State>()) {
  state_->raw_alloc = alloc;
  state_->raw_free = free;
  state_->user = user;
}

DevicePool::~DevicePool() {
  std::lock_guard lock(state_->mutex);
  state_->release_locked();
  state_->closed = true;
}

int64_t DevicePool::size_class(int64_t bytes) {
  constexpr int64_t kSmall = 512, kLarge = 2ll << 20, kSmallLimit = 1ll << 20;
  if (bytes <= 0) return kSmall;
  if (bytes < kSmallLimit) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

std::shared_ptr<std::byte> DevicePool::allocate(int64_t bytes) {
  APART_CHECK(bytes >= 0, "DevicePool::allocate of a negative size");
  const int64_t size = size_class(bytes);
  std::shared_ptr<State> state = state_;
  void* block = nullptr;
  {
    std::lock_guard lock(state->mutex);
    auto it = state->free_blocks.find(size);
    if (it != state->free_blocks.end() && !it->second.empty()) {
      block = it->second.back();
      it->second.pop_back();
      state->cached -= size;
    } else {
      ++state->raw_calls;
      block = state->raw_alloc(static_cast<size_t>(size), state->user);
      if (!block) {  // give the cache back and try once more
        state->release_locked();
        ++state->raw_calls;
        block = state->raw_alloc(static_cast<size_t>(size), state->user);
      }
      if (!block)
        throw Infeasible("device memory: cannot allocate " + format_bytes(static_cast<double>(size)) + " (" +
                         format_bytes(static_cast<double>(state->in_use)) +
                         " in use by apart); use a plan with more stages or fewer micro-batches in flight");
    }
    state->in_use += size;
    state->peak = std::max(state->peak, state->in_use);
  }
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(block), [state, size](std::byte* p) {
    std::lock_guard lock(state->mutex);
    state->in_use -= size;
    if (state->closed) {
      state->raw_free(p, state->user);
      return;
    }
    state->free_blocks[size].push_back(p);
    state->cached += size;
  });
}

int64_t DevicePool::bytes_in_use() const {
  std::lock_guard lock(state_->mutex);
  return state_->in_use;
}
int64_t DevicePool::bytes_cached() const {
  std::lock_guard lock(state_->mutex);
  return state_->cached;
}
int64_t DevicePool::peak_bytes_in_use() const {
  std::lock_guard lock(state_->mutex);
  return state_->peak;
}
int64_t DevicePool::raw_allocations() const {
  std::lock_guard lock(state_->mutex);
  return state_->raw_calls;
}
void DevicePool::release_cached() {
  std::lock_guard lock(state_->mutex);
  state_->release_locked();
}

}  // namespace apart
