// A caching allocator in front of a device's raw allocator (cudaMalloc): allocate() rounds up to a size class and
// hands back a freed block of that class when one is cached, else calls the raw allocator; a block returns to the
// cache when its last reference goes. After the first training step no allocation reaches the raw allocator.
// Host-side bookkeeping only (no CUDA header), so it is built and unit-tested without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace apart {

class DevicePool {
 public:
  using RawAlloc = void* (*)(size_t bytes, void* user);  // returns nullptr when out of memory
  using RawFree = void (*)(void* ptr, void* user);
  DevicePool(RawAlloc alloc, RawFree free, void* user);
  // Frees every cached block now; blocks still referenced are freed when their last reference goes.
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // A block of at least `bytes` (0 allowed), aligned as the raw allocator aligns. When the raw allocator fails,
  // frees the cache and retries once, then throws Infeasible naming the bytes asked, in use and cached.
  std::shared_ptr<std::byte> allocate(int64_t bytes);
  // The size class of a request: a multiple of 512 B below 1 MiB, of 2 MiB above (so a block is reused for any
  // request of its class and at most ~2 MiB or 2× is lost to rounding).
  static int64_t size_class(int64_t bytes);

  int64_t bytes_in_use() const;     // in blocks handed out and not yet returned (size classes)
  int64_t bytes_cached() const;     // in free blocks held for reuse
  int64_t peak_bytes_in_use() const;
  int64_t raw_allocations() const;  // calls that reached the raw allocator
  void release_cached();            // gives every free block back to the raw allocator

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace apart
