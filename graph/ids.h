// Strong integer ids: a TaskId cannot be passed where a ValueId is meant.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>

namespace apart {

template <class Tag>
class StrongId {
 public:
  using underlying = uint32_t;
  static constexpr underlying kInvalidValue = std::numeric_limits<underlying>::max();

  constexpr StrongId() = default;
  constexpr explicit StrongId(underlying v) : v_(v) {}
  static constexpr StrongId invalid() { return StrongId(); }

  constexpr underlying value() const { return v_; }
  constexpr bool valid() const { return v_ != kInvalidValue; }
  constexpr auto operator<=>(const StrongId&) const = default;

 private:
  underlying v_ = kInvalidValue;
};

using TaskId = StrongId<struct TaskTag>;
using ValueId = StrongId<struct ValueTag>;

}  // namespace apart

template <class Tag>
struct std::hash<apart::StrongId<Tag>> {
  size_t operator()(apart::StrongId<Tag> id) const noexcept { return std::hash<uint32_t>{}(id.value()); }
};
