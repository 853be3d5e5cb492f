// Host-side planning of a cuDNN convolution: how ONNX's possibly asymmetric pads split into cuDNN's symmetric ones
// plus an explicit zero border, which of cudnnFind*'s measured algorithms to run, and the process-wide cache that
// runs cudnnFind* once per (direction, shapes, attributes, dtype, math mode, device). No CUDA header: the dev preset
// unit-tests it (tests/runtime/cuda/conv_plan_test.cpp).
#pragma once

#include <algorithm>
#include <compare>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace apart::cuda {

// cuDNN pads both sides of a spatial dim alike; ONNX may not (SAME_UPPER with an even kernel, explicit pads). The
// common part goes to cuDNN, the rest becomes a zero border copied around the input (extra_begin/extra_end).
struct ConvPadding {
  std::vector<int64_t> symmetric, extra_begin, extra_end;
  bool needs_border() const {
    return std::any_of(extra_begin.begin(), extra_begin.end(), [](int64_t p) { return p != 0; }) ||
           std::any_of(extra_end.begin(), extra_end.end(), [](int64_t p) { return p != 0; });
  }
};
inline ConvPadding split_pads(const std::vector<int64_t>& begin, const std::vector<int64_t>& end) {
  ConvPadding p;
  for (size_t i = 0; i < begin.size() && i < end.size(); ++i) {
    const int64_t common = std::min(begin[i], end[i]);
    p.symmetric.push_back(common);
    p.extra_begin.push_back(begin[i] - common);
    p.extra_end.push_back(end[i] - common);
  }
  return p;
}

enum class ConvDirection : uint8_t { kForward, kBackwardData, kBackwardFilter };

// What one cudnnFind* call depends on. Dims are as cuDNN sees them (1-D convolutions as 2-D with a height of 1; x
// with its explicit border), so two ONNX nodes that reach cuDNN alike share an entry.
struct ConvAlgoKey {
  ConvDirection direction = ConvDirection::kForward;
  int device = 0;
  int data_type = 0;  // cudnnDataType_t
  int math = 0;       // the cudnnMathType_t asked for (fp32: FMA only; tf32/mixed: tensor cores allowed)
  std::vector<int64_t> x, w, pads, strides, dilations;
  int64_t group = 1;
  auto operator<=>(const ConvAlgoKey&) const = default;

  // "backward-filter x=[8,3,32,32] w=[16,3,3,3] pads=[1,1] strides=[1,1] dilations=[1,1] group=1 dtype=0 math=3
  // device 0", for errors and logs.
  std::string describe() const {
    auto dims = [](const std::vector<int64_t>& v) {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
      return s + "]";
    };
    const char* names[] = {"forward", "backward-data", "backward-filter"};
    return std::string(names[static_cast<int>(direction)]) + " x=" + dims(x) + " w=" + dims(w) + " pads=" +
           dims(pads) + " strides=" + dims(strides) + " dilations=" + dims(dilations) + " group=" +
           std::to_string(group) + " dtype=" + std::to_string(data_type) + " math=" + std::to_string(math) +
           " device " + std::to_string(device);
  }
};

// One measured algorithm of cudnnFind* (its perf struct without the CUDA types).
struct ConvAlgoCandidate {
  int algo = 0;
  bool ok = false;  // status == CUDNN_STATUS_SUCCESS
  float time_ms = 0;
  int64_t workspace_bytes = 0;
  bool deterministic = false;
  int math = 0;
};
struct ConvAlgoChoice {
  int algo = 0;
  int math = 0;
  int64_t workspace_bytes = 0;
};

// The fastest deterministic candidate that ran and fits `workspace_limit` (training runs then repeat bit for bit,
// as on the CPU), else the fastest that ran and fits; nullopt when none did. cudnnFind* lists candidates fastest first
// but the choice does not rely on it.
inline std::optional<ConvAlgoChoice> pick_conv_algo(const std::vector<ConvAlgoCandidate>& candidates,
                                                    int64_t workspace_limit) {
  const ConvAlgoCandidate* best[2] = {nullptr, nullptr};  // [0]: deterministic, [1]: any
  for (const auto& c : candidates) {
    if (!c.ok || c.workspace_bytes > workspace_limit) continue;
    if (c.deterministic && (!best[0] || c.time_ms < best[0]->time_ms)) best[0] = &c;
    if (!best[1] || c.time_ms < best[1]->time_ms) best[1] = &c;
  }
  const ConvAlgoCandidate* chosen = best[0] ? best[0] : best[1];
  if (!chosen) return std::nullopt;
  return ConvAlgoChoice{chosen->algo, chosen->math, chosen->workspace_bytes};
}

// The process-wide cache of choices. get() runs find(key) once per new key, under the lock (so two threads asking for
// one new key measure once; finds are rare, one per shape).
class ConvAlgoCache {
 public:
  template <class Find>
  ConvAlgoChoice get(const ConvAlgoKey& key, Find&& find) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = choices_.find(key);
    if (it != choices_.end()) return it->second;
    const ConvAlgoChoice choice = find(key);
    choices_.emplace(key, choice);
    return choice;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return choices_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::map<ConvAlgoKey, ConvAlgoChoice> choices_;
};

}  // namespace apart::cuda
