// The compute-optimal contiguous split of the components' topological order, the oracle partition's plans are held
// to (issue 15): by brute force on small graphs and by an exact DP on real models, and replayed through the simulator
// as the selection replays apart's candidates.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "partition/phases.h"
#include "simulator/simulate.h"

namespace apart::testing {

// Forward + backward seconds of runs [i, j) of the components' index order at micro-batch u, by prefix sums (the
// oracle's own arithmetic, independent of partition/'s).
class ChainCompute {
 public:
  explicit ChainCompute(const AtomicGraph& atomic) : n_(atomic.size()) {
    for (auto* v : {&ff_, &fp_, &bf_, &bp_}) v->assign(n_ + 1, 0);
    for (size_t c = 0; c < n_; ++c) {
      const BlockCost& b = atomic.components[c].cost;
      ff_[c + 1] = ff_[c] + b.forward.fixed_s;
      fp_[c + 1] = fp_[c] + b.forward.per_sample_s;
      bf_[c + 1] = bf_[c] + b.backward.fixed_s;
      bp_[c + 1] = bp_[c] + b.backward.per_sample_s;
    }
  }
  size_t size() const { return n_; }
  double at(size_t i, size_t j, int64_t u) const {
    const double uu = static_cast<double>(u);
    return ((ff_[j] - ff_[i]) + (fp_[j] - fp_[i]) * uu) + ((bf_[j] - bf_[i]) + (bp_[j] - bp_[i]) * uu);
  }

 private:
  size_t n_;
  std::vector<double> ff_, fp_, bf_, bp_;
};

// The exact compute-optimal split into S contiguous runs: its bottleneck, and the latest cuts that reach it.
struct ComputeOptimum {
  double bottleneck = std::numeric_limits<double>::infinity();
  std::vector<size_t> cuts;  // S + 1 positions, 0 … n
};

// Cuts as late as `limit` allows, every run nonempty (componentwise the latest split within it).
inline std::vector<size_t> latest_within(const ChainCompute& chain, int stages, int64_t u, double limit) {
  const size_t n = chain.size();
  std::vector<size_t> cuts{0};
  for (int s = 0; s + 1 < stages; ++s) {
    size_t end = cuts.back();
    while (end + 1 <= n - static_cast<size_t>(stages - s - 1) && chain.at(cuts.back(), end + 1, u) <= limit) ++end;
    if (end == cuts.back()) return {};
    cuts.push_back(end);
  }
  if (chain.at(cuts.back(), n, u) > limit) return {};
  cuts.push_back(n);
  return cuts;
}

// Brute force over every split (small n).
inline ComputeOptimum brute_force_compute_optimum(const ChainCompute& chain, int stages, int64_t u) {
  ComputeOptimum best;
  const size_t n = chain.size();
  std::vector<size_t> cuts{0};
  std::function<void(int)> place = [&](int s) {
    if (s == stages) {
      double worst = 0;
      for (int i = 0; i < stages; ++i) worst = std::max(worst, chain.at(cuts[i], cuts[i + 1], u));
      best.bottleneck = std::min(best.bottleneck, worst);
      return;
    }
    const size_t from = cuts.back() + 1, to = s + 1 == stages ? n : n - static_cast<size_t>(stages - s - 1);
    for (size_t c = s + 1 == stages ? n : from; c <= to; ++c) {
      cuts.push_back(c);
      place(s + 1);
      cuts.pop_back();
    }
  };
  place(0);
  best.cuts = latest_within(chain, stages, u, best.bottleneck);
  return best;
}

// The exact min-max DP, O(S·n²): best[s][j] = min over i of max(best[s−1][i], compute(i, j)).
inline ComputeOptimum dp_compute_optimum(const ChainCompute& chain, int stages, int64_t u) {
  const size_t n = chain.size();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> previous(n + 1, kInf), current(n + 1, kInf);
  previous[0] = 0;
  for (int s = 0; s < stages; ++s) {
    std::fill(current.begin(), current.end(), kInf);
    for (size_t j = static_cast<size_t>(s) + 1; j <= n; ++j)
      for (size_t i = static_cast<size_t>(s); i < j; ++i)
        if (previous[i] < kInf) current[j] = std::min(current[j], std::max(previous[i], chain.at(i, j, u)));
    std::swap(previous, current);
  }
  ComputeOptimum best;
  best.bottleneck = previous[n];
  best.cuts = latest_within(chain, stages, u, best.bottleneck);
  return best;
}

inline BlockAssignment assignment_of_cuts(size_t components, const std::vector<size_t>& cuts) {
  BlockAssignment a;
  a.blocks = static_cast<uint32_t>(cuts.size() - 1);
  a.block_of.resize(components);
  for (size_t s = 0; s + 1 < cuts.size(); ++s)
    for (size_t c = cuts[s]; c < cuts[s + 1]; ++c) a.block_of[c] = BlockId(static_cast<uint32_t>(s));
  return a;
}

// The split as a plan of the given request (its replicas, m, recomputation chosen as the request pins them),
// replayed by the simulator as the selection replays apart's candidates. nullopt when it does not fit memory.
struct Replayed {
  double simulated_s = 0;
  double compute_bottleneck_s = 0;
  double comm_max_s = 0;  // the largest per-stage boundary-transfer time
  double simulated_without_comm_s = 0;  // the same replay with transfers taking no time (sim::SimOptions)
};
inline std::optional<Replayed> replay_split(const AtomicGraph& atomic, const std::vector<size_t>& cuts,
                                     const PartitionOptions& options) {
  const Split split = make_split(atomic, assignment_of_cuts(atomic.size(), cuts), options, "oracle");
  CandidateSet found;
  found.add(solve_stage_dp(*split.evaluator, search_grid(options), {static_cast<int>(cuts.size()) - 1}, options.stage,
                           SearchClock{}),
            split);
  if (found.candidates.empty()) return std::nullopt;
  const Selection chosen = select_by_simulation(found.candidates);
  Replayed r;
  r.simulated_s = chosen.result.iteration_s;
  r.simulated_without_comm_s =
      sim::simulate(candidate_sim_plan(found.candidates[chosen.index]), {.communication = false}).iteration_s;
  for (const StageCost& c : found.candidates[chosen.index].solution.costs) {
    r.compute_bottleneck_s = std::max(r.compute_bottleneck_s, c.compute_s);
    r.comm_max_s = std::max(r.comm_max_s, c.comm_s);
  }
  return r;
}

// The pinned pure pipeline of issue 15: --stages S --replicas 1 --microbatches m on S devices.
inline PartitionOptions pinned_pipeline(PartitionOptions o, int stages, int64_t microbatches) {
  o.stage.stages = stages;
  o.stage.replicas = 1;
  o.stage.microbatches = microbatches;
  return o;
}

}  // namespace apart::testing
