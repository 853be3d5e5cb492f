// Choosing the plan by simulation: candidates placed, turned into the simulator's plan, pruned by a lower bound.
#include "partition/select.h"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>

#include "graph/checked.h"
#include "graph/error.h"
#include "graph/threads.h"
#include "profiler/collectives.h"

namespace apart {

Candidate place_candidate(StageSolution solution, std::shared_ptr<const BlockSequence> sequence,
                          std::shared_ptr<const BlockAssignment> assignment,
                          std::shared_ptr<const StageEvaluator> evaluator, std::string source) {
  Candidate c;
  c.solution = std::move(solution);
  c.sequence = std::move(sequence);
  c.assignment = std::move(assignment);
  c.evaluator = std::move(evaluator);
  c.source = std::move(source);
  c.links = placed_links(c.placement(), c.evaluator->cluster());
  APART_CHECK(evaluate_solution(*c.evaluator, c.solution, c.links), "placing a stage changed whether it fits memory");
  return c;
}

Placement Candidate::placement() const {
  return place_stages(solution.replicas, evaluator->cluster(), evaluator->layout(), solution.stage_tp);
}

sim::SimPlan candidate_sim_plan(const Candidate& candidate, bool devices) {
  const StageSolution& sol = candidate.solution;
  const StageEvaluator& ev = *candidate.evaluator;
  const TrainingSpec& training = ev.training();
  sim::SimPlan plan;
  plan.source = "candidate (" + candidate.source + ")";
  plan.cluster = ev.cluster();
  plan.links_source = "partition's cluster";
  plan.training.microbatches = sol.microbatches;
  plan.training.schedule = sol.schedule;
  plan.training.virtual_stages = sol.virtual_stages;
  plan.training.optimizer = training.optimizer;
  plan.training.precision = training.precision;
  std::vector<int> stage_of_block(ev.blocks(), 0);
  for (int s = 0; s < sol.stages; ++s)
    for (uint32_t b = sol.boundaries[s]; b < sol.boundaries[s + 1]; ++b) stage_of_block[b] = s;
  const Placement placement = devices ? candidate.placement() : Placement{};
  for (int s = 0; s < sol.stages; ++s) {
    const StageCost& c = sol.costs[s];
    sim::SimStage st;
    st.id = s;
    st.replicas = sol.replicas[s];
    st.tp = sol.tp_of(s);
    if (devices) st.devices = placement.devices[s];
    st.forward_s = c.forward_s;
    st.backward_s = c.backward_s - c.recompute_s;
    st.recompute = sol.recomputes(s);
    st.recompute_s = c.recompute_s;
    st.backward_weight_s = c.backward_weight_s;
    st.zero = c.zero;
    st.allreduce_s = c.allreduce_s;
    st.allreduce_exposed_s = c.allreduce_exposed_s;
    st.optimizer_s = c.optimizer_s;
    st.memory_bytes = c.memory_bytes;
    st.param_bytes = c.param_bytes;
    st.memory_static_bytes = c.memory_static;
    st.activation_bytes_per_microbatch = c.memory_per_in_flight;
    plan.stages.push_back(std::move(st));
  }
  // Boundary bytes per (sender, receiver) pair; the simulator sends one message per pair and micro-batch.
  const double act = activation_bytes_factor(training.precision);
  std::map<std::pair<int, int>, double> per_sample;
  for (const Transfer& t : candidate.sequence->transfers) {
    const int from = stage_of_block[t.producer];
    int previous = -1;
    for (uint32_t consumer : t.consumers) {  // sorted, so stages come in ascending order
      const int to = stage_of_block[consumer];
      if (to == from || to == previous) continue;
      previous = to;
      per_sample[{from, to}] += t.bytes_per_sample;
    }
  }
  for (const auto& [edge, bytes] : per_sample) {
    const auto [from, to] = edge;
    const std::string name = "stage " + std::to_string(from) + " → " + std::to_string(to);
    plan.stages[to].inputs.push_back({name, from, bytes * act * boundary_samples(sol.costs[to])});
    plan.stages[from].outputs.push_back({name, {to}, bytes * act * boundary_samples(sol.costs[from])});
  }
  return plan;
}

namespace {

// Lower bounds on the simulator's iteration time. Every stage runs its m forwards and m backwards in series and
// then its exposed all-reduce and its optimizer step. When the stages form a chain (each reads from the one
// before) the schedule's op order gives more: stage s does w warm-up forwards (1F1B: min(S − s, m); GPipe: m) and then cannot start its
// first backward before micro-batch 0 has gone down the whole pipeline and back up to it; after its last backward
// the gradient still has to travel back to stage 0, whose all-reduce and step follow.
// `links`: per stage, the placed links (Candidate::links); the transfer from stage s − 1 to s runs on links[s].previous,
// Cluster::link_between_groups of their devices, which the plan then need not list.
double lower_bound(const sim::SimPlan& plan, std::span<const StageLinks> links) {
  const int64_t m = plan.training.microbatches;
  const size_t stages = plan.stages.size();
  std::vector<double> f(stages), b(stages), exposed(stages), d(stages, 0.0);  // d[s]: transfer s−1 → s
  double bound = 0;
  for (size_t s = 0; s < stages; ++s) {
    const sim::SimStage& st = plan.stages[s];
    f[s] = st.forward_s;
    b[s] = st.backward_s + st.recompute_s;
    exposed[s] = st.allreduce_exposed_s.value_or(st.allreduce_s) + st.optimizer_s;  // what follows the last backward
    bound = std::max(bound, static_cast<double>(m) * (f[s] + b[s]) + exposed[s]);
  }
  for (size_t s = 1; s < stages; ++s) {
    const sim::SimInput* from_previous = nullptr;
    for (const sim::SimInput& in : plan.stages[s].inputs)
      if (in.from_stage == static_cast<int>(s) - 1) from_previous = &in;
    if (!from_previous) return bound;
    d[s] = transfer_time(links[s].previous, from_previous->bytes);
  }
  // Interleaved: each device's first op is chunk 0 of micro-batch 0 and its last the backward of chunk 0 of the
  // last micro-batch (schedule.cpp), each chunk 1/v of the stage; so device s starts no earlier than micro-batch 0's
  // chunk 0 arrives, works m·(f + b), and after its last backward that gradient still goes down chunk 0 of every
  // device before it to stage 0. ZB-H1 may end on a weight pass, so it keeps only the start and its own work.
  const Schedule schedule = plan.training.schedule;
  const double v = schedule == Schedule::kInterleaved ? static_cast<double>(std::max(1, plan.training.virtual_stages)) : 1.0;
  std::vector<double> first_forward(stages, 0.0);  // earliest start of micro-batch 0's (first chunk's) forward at s
  for (size_t s = 1; s < stages; ++s) first_forward[s] = first_forward[s - 1] + f[s - 1] / v + d[s];
  if (schedule == Schedule::kInterleaved || schedule == Schedule::kZbH1) {
    double back_to_first = 0;  // Σ_{i<s} (b_i / v + d_{i+1}): the last chunk-0 gradient from s to stage 0
    for (size_t s = 0; s < stages; ++s) {
      const double tail = schedule == Schedule::kInterleaved ? std::max(exposed[s], back_to_first + exposed[0]) : exposed[s];
      bound = std::max(bound, first_forward[s] + static_cast<double>(m) * (f[s] + b[s]) + tail);
      if (s + 1 < stages) back_to_first += b[s] / v + d[s + 1];
    }
    return bound;
  }
  const double bottom = first_forward[stages - 1] + f[stages - 1];  // micro-batch 0 leaves the last forward
  // The chain bound below follows GPipe's and 1F1B's op orders.
  const bool gpipe = plan.training.schedule == Schedule::kGPipe;
  double returning = 0;  // Σ_{i>s} (b_i + d_i): micro-batch 0's gradient from the last stage back to s
  std::vector<double> back_to_first(stages, 0.0);  // Σ_{i<s} (b_i + d_{i+1}): the last gradient from s to stage 0
  for (size_t s = 1; s < stages; ++s) back_to_first[s] = back_to_first[s - 1] + b[s - 1] + d[s];
  for (size_t s = stages; s-- > 0;) {
    const double w = gpipe ? static_cast<double>(m) : static_cast<double>(std::min<int64_t>(m, static_cast<int64_t>(stages - s)));
    const double first_backward = std::max(bottom + returning, first_forward[s] + w * f[s]);
    const double last_backward_end = first_backward + static_cast<double>(m) * b[s] + (static_cast<double>(m) - w) * f[s];
    bound = std::max(bound, last_backward_end + std::max(exposed[s], back_to_first[s] + exposed[0]));
    returning += b[s] + d[s];
  }
  return bound;
}

}  // namespace

double simulated_lower_bound(const Candidate& candidate) {
  return lower_bound(candidate_sim_plan(candidate, false), candidate.links);
}

Selection select_by_simulation(const std::vector<Candidate>& candidates, int max_simulations,
                               std::chrono::steady_clock::time_point deadline, int threads) {
  APART_CHECK(!candidates.empty(), "no candidate to select from");
  // The bounds of all, on `threads`; the simulator's plans (with every device listed) only of those replayed.
  std::vector<double> bounds(candidates.size());
  run_indexed(candidates.size(), threads, [&](size_t i) { bounds[i] = simulated_lower_bound(candidates[i]); });
  // Best first by lower bound (ties by estimate, then by index): every candidate whose bound is below the least
  // simulated time has to be replayed in any order, and this order replays no other but for the second of a batch.
  std::vector<size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const double ea = candidates[a].solution.estimate.iteration_s, eb = candidates[b].solution.estimate.iteration_s;
    return std::tie(bounds[a], ea, a) < std::tie(bounds[b], eb, b);
  });
  // Replayed in batches of up to kSelectionBatch, each formed in that order against the best so far and run on
  // `threads`: the batches, and so the choice and its statistics, are the same for every thread count.
  Selection best;
  double best_s = std::numeric_limits<double>::infinity();
  for (size_t next = 0; next < order.size();) {
    std::vector<size_t> batch;
    for (; next < order.size() && batch.size() < kSelectionBatch; ++next) {
      const size_t i = order[next];
      // Strictly below the best by a margin, so float noise cannot make the pick depend on the order.
      if (bounds[i] >= best_s * (1 - 1e-12)) {
        ++best.stats.pruned;
        continue;
      }
      const int started = best.stats.simulated + static_cast<int>(batch.size());
      const bool capped = max_simulations > 0 && started >= max_simulations;
      // A candidate too big to replay (simulate.h) keeps its analytic estimate once another one was replayed.
      const bool too_big = sim::simulated_operations(candidate_sim_plan(candidates[i], false), 1) > limits::kMaxSimulatedOps;
      if (started > 0 && (capped || too_big || std::chrono::steady_clock::now() > deadline)) {
        ++best.stats.not_simulated;
        continue;
      }
      batch.push_back(i);
    }
    std::vector<sim::SimResult> results(batch.size());
    run_indexed(batch.size(), threads, [&](size_t k) { results[k] = sim::simulate(candidate_sim_plan(candidates[batch[k]])); });
    for (size_t k = 0; k < batch.size(); ++k) {
      ++best.stats.simulated;
      if (results[k].iteration_s < best_s * (1 - 1e-12)) {
        best_s = results[k].iteration_s;
        best.index = batch[k];
        best.result = std::move(results[k]);
      }
    }
  }
  return best;
}

}  // namespace apart
