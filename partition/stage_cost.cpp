// Stage costs (paper §IV-C, h(b_{i-1}, b_i, sd_i)) and the analytic pipeline-time estimate.
#include "partition/stage_cost.h"

#include <algorithm>
#include <cmath>

#include "graph/checked.h"
#include "graph/error.h"

namespace apart {

double state_bytes_per_param_byte(Optimizer optimizer, Precision precision) {
  // Relative to fp32 parameter bytes as stored in the model. fp32: weights + grads (+ momentum) (+ Adam's
  // two moments). Mixed (Micikevicius et al.): fp16 weights and grads (0.5 + 0.5) + fp32 master copy (1)
  // + fp32 optimizer state.
  // Both come to 2 + state per fp32 parameter byte.
  (void)precision;
  const bool adam = optimizer == Optimizer::kAdam || optimizer == Optimizer::kAdamW;
  const double state = adam ? 2.0 : optimizer == Optimizer::kMomentum ? 1.0 : 0.0;
  return 2.0 + state;
}
// tf32 stores fp32; only mixed precision halves gradients and activations.
double grad_bytes_per_param_byte(Precision precision) { return precision == Precision::kMixed ? 0.5 : 1.0; }
double activation_bytes_factor(Precision precision) { return precision == Precision::kMixed ? 0.5 : 1.0; }

std::string_view layout_name(Layout layout) {
  return layout == Layout::kPipelineMajor ? "pipeline-major" : "stage-major";
}

StageEvaluator::StageEvaluator(const BlockSequence& seq, const ClusterSpec& cluster, const TrainingSpec& training,
                               Layout layout)
    : k_(seq.size()), cluster_(cluster), training_(training), layout_(layout) {
  const size_t n = k_ + 1;
  fwd_fixed_.assign(n, 0);
  fwd_ps_.assign(n, 0);
  bwd_fixed_.assign(n, 0);
  bwd_ps_.assign(n, 0);
  saved_ps_.assign(n, 0);
  for (size_t b = 0; b < k_; ++b) {
    const BlockCost& c = seq.blocks[b];
    fwd_fixed_[b + 1] = fwd_fixed_[b] + c.forward.fixed_s;
    fwd_ps_[b + 1] = fwd_ps_[b] + c.forward.per_sample_s;
    bwd_fixed_[b + 1] = bwd_fixed_[b] + c.backward.fixed_s;
    bwd_ps_[b + 1] = bwd_ps_[b] + c.backward.per_sample_s;
    saved_ps_[b + 1] = saved_ps_[b] + c.saved_per_sample;
  }
  // Distinct weights per range: a weight counts in [first, last) when its first reader at or after
  // `first` lies before `last` — a difference along the row at that reader, prefix-summed below.
  params_.assign(n * n, 0);
  auto add_param = [&](int64_t bytes, const std::vector<uint32_t>& readers) {
    size_t ri = 0;
    for (uint32_t first = 0; first <= readers.back(); ++first) {
      while (readers[ri] < first) ++ri;
      params_[first * n + readers[ri] + 1] += bytes;
    }
  };
  if (seq.params.empty()) {
    for (uint32_t b = 0; b < k_; ++b)
      if (seq.blocks[b].param_bytes > 0) add_param(seq.blocks[b].param_bytes, {b});
  } else {
    for (const ParamUse& p : seq.params) {
      APART_CHECK(!p.readers.empty() && p.readers.back() < k_, "malformed param use");
      add_param(p.bytes, p.readers);
    }
  }
  for (size_t first = 0; first < n; ++first)
    for (size_t last = first + 1; last < n; ++last) params_[first * n + last] += params_[first * n + last - 1];
  in_.assign(n * n, 0);
  out_.assign(n * n, 0);
  // Difference arrays along each row (first), prefix-summed over columns (last) below.
  for (const Transfer& t : seq.transfers) {
    APART_CHECK(!t.consumers.empty() && t.producer < k_, "malformed transfer");
    const uint32_t last_consumer = t.consumers.back();
    APART_CHECK(last_consumer < k_ && t.consumers.front() > t.producer, "transfer must go forward");
    // in(first, last): producer < first and a consumer in [first, last).
    size_t ci = 0;
    for (uint32_t first = t.producer + 1; first <= last_consumer; ++first) {
      while (t.consumers[ci] < first) ++ci;
      in_[first * n + t.consumers[ci] + 1] += t.bytes_per_sample;
    }
    // out(first, last): producer in [first, last) and a consumer ≥ last, i.e. last in (producer, last_consumer].
    for (uint32_t first = 0; first <= t.producer; ++first) {
      out_[first * n + t.producer + 1] += t.bytes_per_sample;
      if (last_consumer + 1 < n) out_[first * n + last_consumer + 1] -= t.bytes_per_sample;
    }
  }
  for (size_t first = 0; first < n; ++first)
    for (size_t last = 1; last < n; ++last) {
      in_[first * n + last] += in_[first * n + last - 1];
      out_[first * n + last] += out_[first * n + last - 1];
    }
  ws_ps_max_.assign(n * n, 0);
  ws_fixed_max_.assign(n * n, 0);
  for (size_t first = 0; first < k_; ++first) {
    double ps = 0, fx = 0;
    for (size_t last = first + 1; last < n; ++last) {
      ps = std::max(ps, seq.blocks[last - 1].workspace_per_sample);
      fx = std::max(fx, seq.blocks[last - 1].workspace_fixed);
      ws_ps_max_[first * n + last] = ps;
      ws_fixed_max_[first * n + last] = fx;
    }
  }
}

StageLinks StageEvaluator::assumed_links(int replicas) const {
  const LinkSpec intra{cluster_.intra_node_bandwidth, cluster_.intra_node_latency_s};
  const LinkSpec inter{cluster_.inter_node_bandwidth, cluster_.inter_node_latency_s};
  const bool one_node = cluster_.devices <= cluster_.devices_per_node;
  StageLinks l;
  if (layout_ == Layout::kPipelineMajor) {
    l.previous = l.next = intra;
    l.replicas = one_node ? intra : inter;
  } else {
    l.previous = l.next = one_node ? intra : inter;
    l.replicas = replicas <= cluster_.devices_per_node ? intra : inter;
  }
  return l;
}

int64_t StageEvaluator::microbatch_size(int64_t microbatches, int replicas) const {
  const int64_t per_microbatch = training_.global_batch / microbatches;
  return (per_microbatch + replicas - 1) / replicas;
}

double StageEvaluator::total_per_sample_s() const { return fwd_ps_[k_] + bwd_ps_[k_]; }

StageCost StageEvaluator::evaluate(uint32_t first, uint32_t last, int replicas, int64_t microbatches,
                                   int64_t in_flight, bool recompute, const StageLinks* placed) const {
  const size_t n = k_ + 1;
  const StageLinks links = placed ? *placed : assumed_links(replicas);
  StageCost c;
  const int64_t u = microbatch_size(microbatches, replicas);
  c.microbatch = u;
  c.forward_s = (fwd_fixed_[last] - fwd_fixed_[first]) + (fwd_ps_[last] - fwd_ps_[first]) * static_cast<double>(u);
  c.backward_s = (bwd_fixed_[last] - bwd_fixed_[first]) + (bwd_ps_[last] - bwd_ps_[first]) * static_cast<double>(u);
  if (recompute) c.backward_s += c.forward_s;  // the forward runs again before backward
  c.compute_s = c.forward_s + c.backward_s;
  // Boundary values as the graph stores them (fp32), halved under mixed precision.
  const double act = activation_bytes_factor(training_.precision);
  c.in_bytes = in_[first * n + last] * static_cast<double>(u) * act;
  c.out_bytes = out_[first * n + last] * static_cast<double>(u) * act;
  // Forward receives inputs and sends outputs; backward sends and receives their gradients.
  if (c.in_bytes > 0) c.comm_s += 2 * (c.in_bytes / links.previous.bandwidth + links.previous.latency_s);
  if (c.out_bytes > 0) c.comm_s += 2 * (c.out_bytes / links.next.bandwidth + links.next.latency_s);
  c.param_bytes = params_[first * n + last];
  if (replicas > 1 && c.param_bytes > 0) {
    // Ring all-reduce: 2(sd−1)/sd of the gradient bytes over the slowest link of the ring.
    const double bw = links.replicas.bandwidth, lat = links.replicas.latency_s;
    const double grad_bytes = static_cast<double>(c.param_bytes) * grad_bytes_per_param_byte(training_.precision);
    c.allreduce_s = 2.0 * (replicas - 1) / replicas * grad_bytes / bw + 2.0 * (replicas - 1) * lat;
    c.allreduce_exposed_s = c.allreduce_s;
    if (training_.overlap_allreduce) {
      // Buckets go out as the last backward produces them; the last bucket can only start when it ends.
      const double last_bucket = c.allreduce_s * std::min(1.0, kAllreduceBucketBytes / grad_bytes);
      const double backward_only = c.backward_s - (recompute ? c.forward_s : 0.0);
      c.allreduce_exposed_s = std::max(last_bucket, c.allreduce_s - backward_only);
    }
  }
  c.step_s = c.compute_s + c.comm_s;
  c.h = c.step_s + c.allreduce_exposed_s / static_cast<double>(microbatches);
  // Memory (DESIGN.md "Cost model"): state + in-flight activations + the largest working set.
  // The cost table's saved bytes are already at the run's precision; boundary values are stored fp32.
  const double saved = (saved_ps_[last] - saved_ps_[first]) * static_cast<double>(u);
  const double workspace = ws_fixed_max_[first * n + last] + ws_ps_max_[first * n + last] * static_cast<double>(u);
  const double state = static_cast<double>(c.param_bytes) *
                       state_bytes_per_param_byte(training_.optimizer, training_.precision);
  // With recomputation only the stage's inputs stay per micro-batch; one micro-batch is rebuilt at a time.
  c.memory_static = state + workspace + (recompute ? saved : 0.0);
  c.memory_per_in_flight = recompute ? c.in_bytes : saved;
  c.memory_bytes = saturated_bytes(c.memory_static + static_cast<double>(in_flight) * c.memory_per_in_flight);
  return c;
}

int64_t in_flight_microbatches(Schedule schedule, int64_t microbatches, int stage, int stages) {
  if (schedule == Schedule::kGPipe) return microbatches;
  return std::min<int64_t>(microbatches, stages - stage);
}

PipelineEstimate estimate_iteration_time(std::span<const StageCost> stages, int64_t microbatches,
                                         Schedule schedule) {
  // GPipe and 1F1B have the same critical path in this model: fill (Σ steps) + (m − 1) bottleneck
  // steps; they differ in memory only. A discrete-event simulator can replace this function.
  PipelineEstimate e;
  double max_step = 0, sum_steps = 0, max_allreduce = 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    sum_steps += stages[s].step_s;
    max_allreduce = std::max(max_allreduce, stages[s].allreduce_exposed_s);
    if (stages[s].step_s > max_step) {
      max_step = stages[s].step_s;
      e.bottleneck_stage = static_cast<int>(s);
    }
  }
  e.pipeline_s = static_cast<double>(microbatches - 1) * max_step + sum_steps;
  e.iteration_s = e.pipeline_s + max_allreduce;
  const double busy = static_cast<double>(microbatches) * max_step;
  e.bubble_fraction = e.pipeline_s > 0 ? 1.0 - busy / e.pipeline_s : 0.0;
  (void)schedule;
  return e;
}

}  // namespace apart
