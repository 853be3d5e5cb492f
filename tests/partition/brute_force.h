// The brute-force oracle the stage DP and the partition pipeline are checked against (paper §IV-C).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "partition/stage_dp.h"

namespace apart::testing {

// A stage's h when it fits in device memory, else infinity.
inline double fitting_h(const StageEvaluator& ev, const StageCost& cost) {
  return cost.memory_bytes <= ev.cluster().usable_memory_bytes() ? cost.h : std::numeric_limits<double>::infinity();
}

// h of stage `stage` as blocks [first, last) with `replicas` replicas; infinity when it fits in no variant.
using StageH = std::function<double(int stage, uint32_t first, uint32_t last, int replicas)>;
// The same with each replica a tensor-parallel group of `tp` devices.
using StageHAtDegree = std::function<double(int stage, uint32_t first, uint32_t last, int replicas, int tp)>;

// Least max_i h over every split of ev's blocks into `stages` contiguous stages × every per-stage (replicas sd,
// degree t of `degrees`) with Σ sd·t ≤ devices and each sd ≤ the samples of a micro-batch (B / m); infinity when no
// stage assignment fits.
inline double brute_force_bottleneck(const StageEvaluator& ev, int stages, int64_t m, const std::vector<int>& degrees,
                                     const StageHAtDegree& stage_h) {
  const int k = static_cast<int>(ev.blocks());
  const int devices = ev.cluster().devices;
  const int64_t per_microbatch = ev.training().global_batch / m;
  double best = std::numeric_limits<double>::infinity();
  std::vector<uint32_t> bounds{0};
  std::vector<int> replicas, tps;
  std::function<void(int, int)> place_replicas = [&](int s, int used) {
    if (s == stages) {
      double worst = 0;
      for (int i = 0; i < stages; ++i) {
        const double h = stage_h(i, bounds[i], bounds[i + 1], replicas[i], tps[i]);
        if (std::isinf(h)) return;
        worst = std::max(worst, h);
      }
      best = std::min(best, worst);
      return;
    }
    for (int t : degrees)
      for (int sd = 1; used + sd * t + (stages - s - 1) <= devices && sd <= per_microbatch; ++sd) {
        replicas.push_back(sd);
        tps.push_back(t);
        place_replicas(s + 1, used + sd * t);
        replicas.pop_back();
        tps.pop_back();
      }
  };
  std::function<void(int)> split = [&](int s) {
    if (s == stages - 1) {
      bounds.push_back(static_cast<uint32_t>(k));
      place_replicas(0, 0);
      bounds.pop_back();
      return;
    }
    for (int b = static_cast<int>(bounds.back()) + 1; b + (stages - s - 1) <= k; ++b) {
      bounds.push_back(static_cast<uint32_t>(b));
      split(s + 1);
      bounds.pop_back();
    }
  };
  split(0);
  return best;
}

// Every replica one device (degree 1).
inline double brute_force_bottleneck(const StageEvaluator& ev, int stages, int64_t m, const StageH& stage_h) {
  return brute_force_bottleneck(ev, stages, m, {1}, [&](int s, uint32_t first, uint32_t last, int replicas, int) {
    return stage_h(s, first, last, replicas);
  });
}

// Two DPs' solutions are the same plan: split, replicas, per-stage choices, schedule and figures, bit for bit.
inline void expect_same_solution(const StageSolution& got, const StageSolution& expected, const std::string& where) {
  EXPECT_EQ(got.schedule, expected.schedule) << where;
  EXPECT_EQ(got.virtual_stages, expected.virtual_stages) << where;
  EXPECT_EQ(got.boundaries, expected.boundaries) << where;
  EXPECT_EQ(got.replicas, expected.replicas) << where;
  EXPECT_EQ(got.stage_tp, expected.stage_tp) << where;
  EXPECT_EQ(got.recompute, expected.recompute) << where;
  EXPECT_EQ(got.stage_recompute, expected.stage_recompute) << where;
  EXPECT_EQ(got.stage_zero, expected.stage_zero) << where;
  EXPECT_EQ(got.bottleneck_h, expected.bottleneck_h) << where;
  EXPECT_EQ(got.estimate.iteration_s, expected.estimate.iteration_s) << where;
}

}  // namespace apart::testing
