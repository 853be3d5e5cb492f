// Stage costs (paper §IV-C, h(b_{i-1}, b_i, sd_i)) and the analytic pipeline-time estimate.
#include "partition/stage_cost.h"

#include <algorithm>
#include <cmath>

#include "graph/checked.h"
#include "graph/error.h"
#include "profiler/collectives.h"

namespace apart {

std::string_view layout_name(Layout layout) {
  return layout == Layout::kPipelineMajor ? "pipeline-major" : "stage-major";
}

StageEvaluator::StageEvaluator(const BlockSequence& seq, const Cluster& cluster, const TrainingSpec& training,
                               Layout layout)
    : k_(seq.size()), cluster_(cluster), training_(training), layout_(layout) {
  const size_t n = k_ + 1;
  fwd_fixed_.assign(n, 0);
  fwd_ps_.assign(n, 0);
  bwd_fixed_.assign(n, 0);
  bwd_ps_.assign(n, 0);
  saved_ps_.assign(n, 0);
  bwd_weight_.assign(n, WorkCurve{});
  for (size_t b = 0; b < k_; ++b) {
    const BlockCost& c = seq.blocks[b];
    tp_.push_back(c.tp);
    fwd_fixed_[b + 1] = fwd_fixed_[b] + c.forward.fixed_s;
    fwd_ps_[b + 1] = fwd_ps_[b] + c.forward.per_sample_s;
    bwd_fixed_[b + 1] = bwd_fixed_[b] + c.backward.fixed_s;
    bwd_ps_[b + 1] = bwd_ps_[b] + c.backward.per_sample_s;
    saved_ps_[b + 1] = saved_ps_[b] + c.saved_per_sample;
    bwd_weight_[b + 1] = bwd_weight_[b];
    bwd_weight_[b + 1] += c.backward_weight;
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
  largest_task_params_max_.assign(n * n, 0);
  for (size_t first = 0; first < k_; ++first) {
    double ps = 0, fx = 0;
    int64_t task_params = 0;
    for (size_t last = first + 1; last < n; ++last) {
      ps = std::max(ps, seq.blocks[last - 1].workspace_per_sample);
      fx = std::max(fx, seq.blocks[last - 1].workspace_fixed);
      task_params = std::max(task_params, seq.blocks[last - 1].largest_task_param_bytes);
      ws_ps_max_[first * n + last] = ps;
      ws_fixed_max_[first * n + last] = fx;
      largest_task_params_max_[first * n + last] = task_params;
    }
  }
}

double tp_device_time(double total_s, double split_s, int tp) { return total_s - (1.0 - 1.0 / tp) * split_s; }

namespace {
// Whether degree `tp` is one of kTpDegrees and not among the `refused` bits (TpWork::refused).
bool degree_allowed(uint8_t refused, int tp) {
  const int i = tp_degree_index(tp);
  return i == 0 || (i > 0 && !((refused >> (i - 1)) & 1u));
}
}  // namespace

bool tp_allows(const StageRange& range, int tp) { return degree_allowed(range.tp.refused, tp); }

StageLinks assumed_links(const Cluster& cluster, Layout layout, int devices) {
  const Link& intra = cluster.intra_node;
  const Link& inter = cluster.inter_node;
  const bool one_node = cluster.fits_one_node();
  StageLinks l;
  l.memory_bandwidth = cluster.device.memory_bandwidth;
  l.tensor = intra;
  if (layout == Layout::kPipelineMajor) {
    l.previous = l.next = intra;
    l.replicas = one_node ? intra : inter;
  } else {
    l.previous = l.next = one_node ? intra : inter;
    l.replicas = devices <= cluster.devices_per_node ? intra : inter;
  }
  return l;
}

StageLinks StageEvaluator::assumed_links(int devices) const { return apart::assumed_links(cluster_, layout_, devices); }

int64_t microbatch_size(int64_t global_batch, int64_t microbatches, int replicas) {
  const int64_t per_microbatch = global_batch / microbatches;
  return (per_microbatch + replicas - 1) / replicas;
}

int64_t StageEvaluator::microbatch_size(int64_t microbatches, int replicas) const {
  return apart::microbatch_size(training_.global_batch, microbatches, replicas);
}

double StageEvaluator::total_per_sample_s() const { return fwd_ps_[k_] + bwd_ps_[k_]; }

StageRange StageEvaluator::range(uint32_t first, uint32_t last) const {
  const size_t n = k_ + 1;
  StageRange r;
  r.forward = {fwd_fixed_[last] - fwd_fixed_[first], fwd_ps_[last] - fwd_ps_[first]};
  r.backward = {bwd_fixed_[last] - bwd_fixed_[first], bwd_ps_[last] - bwd_ps_[first]};
  r.saved_per_sample = saved_ps_[last] - saved_ps_[first];
  r.backward_weight = {bwd_weight_[last].fixed_s - bwd_weight_[first].fixed_s,
                       bwd_weight_[last].per_sample_s - bwd_weight_[first].per_sample_s};
  r.in_per_sample = in_[first * n + last];
  r.out_per_sample = out_[first * n + last];
  r.param_bytes = params_[first * n + last];
  r.workspace_per_sample = ws_ps_max_[first * n + last];
  r.workspace_fixed = ws_fixed_max_[first * n + last];
  r.largest_task_param_bytes = largest_task_params_max_[first * n + last];
  r.tp = tp_.range(first, last);
  return r;
}

StageCost StageEvaluator::evaluate(uint32_t first, uint32_t last, int replicas, int64_t microbatches,
                                   double in_flight, RecomputeScope recompute, const StageLinks* placed, int zero,
                                   int tp) const {
  return stage_cost(range(first, last), replicas, microbatches, in_flight, recompute,
                    placed ? *placed : assumed_links(replicas * tp), training_, zero, tp);
}

StageCost StageEvaluator::evaluate(const StageRange& range, int replicas, int64_t microbatches, double in_flight,
                                   RecomputeScope recompute, int zero, int tp) const {
  return stage_cost(range, replicas, microbatches, in_flight, recompute, assumed_links(replicas * tp), training_, zero, tp);
}

bool StageEvaluator::allows_tp(uint32_t first, uint32_t last, int tp) const {
  return degree_allowed(tp_.refused(first, last), tp);
}

StageCost stage_cost(const StageRange& range, int replicas, int64_t microbatches, double in_flight,
                     RecomputeScope recompute, const StageLinks& links, const TrainingSpec& training, int zero, int tp) {
  if (!tp_allows(range, tp))
    throw InvalidArgument("tensor-parallel degree " + std::to_string(tp) + " is not one the stage's regions allow "
                          "(1, 2, 4 or 8 dividing every region's heads and features)");
  StageCost c;
  c.zero = effective_zero(zero, replicas);
  c.tp = tp;
  c.recompute = recompute;
  // Sequence parallelism shards the replicated work between the regions (and the boundaries) across the TP group,
  // where the stage has regions to split.
  const bool split = tp > 1 && range.tp.splits_work();
  // Not on a sequence shorter than the degree (a rank would hold no position: the shard pass refuses it).
  const bool sp = training.sequence_parallel && split && tp_sequence_fits(range.tp.sequence, tp);
  c.sequence_parallel = sp;
  c.boundary_parts = split ? tp : 1;
  const int64_t u = microbatch_size(training.global_batch, microbatches, replicas);
  const double ud = static_cast<double>(u);
  c.microbatch = u;
  // Of the split tasks' part (and under sequence parallelism the part between regions), each device runs 1/tp.
  const double kept = 1.0 - 1.0 / tp;
  c.forward_s = tp_device_time(range.forward.at(ud), range.tp.forward.at(ud) + (sp ? range.tp.sp_forward.at(ud) : 0.0), tp);
  c.backward_s =
      tp_device_time(range.backward.at(ud), range.tp.backward.at(ud) + (sp ? range.tp.sp_backward.at(ud) : 0.0), tp);
  // A sequence the degree does not divide: the busiest rank holds ⌈L/t⌉ of its L positions, not L/t.
  const double sp_excess = sp ? tp_sequence_share(range.tp.sequence, tp) - 1.0 / tp : 0.0;
  c.forward_s += sp_excess * range.tp.sp_forward.at(ud);
  c.backward_s += sp_excess * range.tp.sp_backward.at(ud);
  // The weight gradients keep their share of what each device of a TP group runs.
  const double whole_backward = range.backward.at(ud);
  c.backward_weight_s = whole_backward > 0 ? range.backward_weight.at(ud) * (c.backward_s / whole_backward) : 0.0;
  // Boundary values as the graph stores them (fp32), halved under mixed precision.
  const double act = activation_bytes_factor(training.precision);
  // The regions' collectives inside the TP group, on the critical path of the forward and the backward: each region's
  // closing all-reduce forward and its inputs' gradient all-reduce backward. Under sequence parallelism each becomes
  // a reduce-scatter and an all-gather of the same bytes: the closing one reduce-scatters forward and all-gathers the
  // gradient backward, the inputs all-gather forward and reduce-scatter their gradients backward.
  auto tp_collective = [&](double bytes_per_sample, int64_t count, auto&& time) {
    if (tp == 1 || count == 0) return 0.0;
    return static_cast<double>(count) * time(tp, bytes_per_sample * ud * act / static_cast<double>(count), links.tensor);
  };
  const double closing_bytes = range.tp.forward_collective_per_sample, input_bytes = range.tp.backward_collective_per_sample;
  const int64_t closings = range.tp.forward_collectives, inputs = range.tp.backward_collectives;
  if (sp) {
    c.forward_s += tp_collective(closing_bytes, closings, ring_reduce_scatter_time) +
                   tp_collective(input_bytes, inputs, ring_allgather_time);
    c.backward_s += tp_collective(closing_bytes, closings, ring_allgather_time) +
                    tp_collective(input_bytes, inputs, ring_reduce_scatter_time);
  } else {
    c.forward_s += tp_collective(closing_bytes, closings, ring_allreduce_time);
    c.backward_s += tp_collective(input_bytes, inputs, ring_allreduce_time);
  }
  // Sequence parallelism keeps no gathered region input for backward: the weight gradients all-gather it again
  // (Megatron-LM re-gathers each column-parallel linear's input).
  if (sp) c.backward_s += tp_collective(input_bytes, inputs, ring_allgather_time);
  // The forward work run again before backward: all of it, or the attention cores (split tasks: 1/tp each).
  if (recompute == RecomputeScope::kFull) c.recompute_s = c.forward_s;
  if (recompute == RecomputeScope::kSelective) c.recompute_s = range.tp.core_forward.at(ud) / tp;
  c.backward_s += c.recompute_s;
  // Each device of a TP group sends and receives its share of the boundary (boundary_share). Without sequence
  // parallelism the stage needs the values whole: the received slices are all-gathered inside the group, the
  // inputs before the forward and the outputs' gradients before the backward (a full recomputation reruns the
  // forward from the gathered input it kept). Under sequence parallelism the slices are the shards it runs on.
  const double whole_in = range.in_per_sample * ud * act, whole_out = range.out_per_sample * ud * act;
  c.in_bytes = whole_in * boundary_share(c);
  c.out_bytes = whole_out * boundary_share(c);
  if (split && !sp) {
    if (whole_in > 0) c.forward_s += ring_allgather_time(tp, whole_in, links.tensor);
    if (whole_out > 0) c.backward_s += ring_allgather_time(tp, whole_out, links.tensor);
  }
  c.compute_s = c.forward_s + c.backward_s;
  // Forward receives inputs and sends outputs; backward sends and receives their gradients.
  if (c.in_bytes > 0) c.comm_s += 2 * transfer_time(links.previous, c.in_bytes);
  if (c.out_bytes > 0) c.comm_s += 2 * transfer_time(links.next, c.out_bytes);
  // A device of a TP group holds 1/tp of the split tasks' weights (a tied table split twice counts once).
  c.param_bytes = range.param_bytes -
                  std::llround(kept * static_cast<double>(std::min(range.tp.param_bytes, range.param_bytes)));
  if (replicas > 1 && c.param_bytes > 0) {
    const double grad_bytes = static_cast<double>(c.param_bytes) * gradient_bytes_per_param_byte(training.precision);
    // The working copy of the weights, which ZeRO all-gathers (mixed: 16-bit, as many bytes as the gradients).
    const double weight_bytes =
        static_cast<double>(c.param_bytes) * working_weight_bytes_per_param_byte(training.precision);
    // Buckets go out as the last backward (without its recomputed forward) produces them.
    const double backward_only = c.backward_s - c.recompute_s;
    auto exposed = [&](double collective_s, double bytes, double behind_s) {
      return training.overlap_allreduce ? exposed_allreduce_time(collective_s, bytes, behind_s) : collective_s;
    };
    if (c.zero == 0) {
      // The replicas' ring all-reduce of the gradients, over the ring's link.
      c.allreduce_s = ring_allreduce_time(replicas, grad_bytes, links.replicas);
      c.allreduce_exposed_s = exposed(c.allreduce_s, grad_bytes, backward_only);
    } else if (c.zero == 1) {
      // Gradients accumulate whole over the micro-batches; after the last backward they reduce-scatter (bucketed
      // behind it, as the all-reduce is), each replica steps its shard, then the updated weights all-gather: the
      // all-reduce's ring volume, but the all-gather waits for the step and is all exposed.
      const double reduce_scatter = ring_reduce_scatter_time(replicas, grad_bytes, links.replicas);
      const double allgather = ring_allgather_time(replicas, weight_bytes, links.replicas);
      c.allreduce_s = reduce_scatter + allgather;
      c.allreduce_exposed_s = exposed(reduce_scatter, grad_bytes, backward_only) + allgather;
    } else {
      // Sharded gradients cannot accumulate whole: every micro-batch's backward reduce-scatters its gradients into
      // the shards, bucketed behind that backward. ZeRO-3 keeps no whole weights either: every micro-batch
      // all-gathers them before its forward and again before its backward (none kept across micro-batches), each
      // prefetched behind the compute it feeds. With one micro-batch that is ZeRO's 1.5× the all-reduce volume.
      // The exposed parts lengthen the forward and backward themselves; what the simulator replays.
      double forward_collective = 0, backward_collective = ring_reduce_scatter_time(replicas, grad_bytes, links.replicas);
      double backward_bytes = grad_bytes;
      if (c.zero == 3) {
        forward_collective = ring_allgather_time(replicas, weight_bytes, links.replicas);
        backward_collective += forward_collective;
        backward_bytes += weight_bytes;
      }
      c.zero_collective_s = forward_collective + backward_collective;
      const double forward_exposed = forward_collective > 0 ? exposed(forward_collective, weight_bytes, c.forward_s) : 0;
      const double backward_exposed = exposed(backward_collective, backward_bytes, backward_only);
      // A fully recomputed forward reads the backward's gathered weights (attention cores read none).
      if (recompute == RecomputeScope::kFull) {
        c.backward_s += forward_exposed;
        c.recompute_s += forward_exposed;  // = the forward_s below
      }
      c.forward_s += forward_exposed;
      c.backward_s += backward_exposed;
      c.compute_s = c.forward_s + c.backward_s;
      // ZeRO-2 then all-gathers the updated weights after the step; ZeRO-3 leaves them sharded for the next forward.
      if (c.zero == 2) c.allreduce_s = c.allreduce_exposed_s = ring_allgather_time(replicas, weight_bytes, links.replicas);
    }
  }
  c.step_s = c.compute_s + c.comm_s;
  c.optimizer_s = optimizer_step_time(c.param_bytes, training.optimizer, training.precision, links.memory_bandwidth,
                                      c.zero, replicas);
  c.h = c.step_s + (c.allreduce_exposed_s + c.optimizer_s) / static_cast<double>(microbatches);
  // Memory (DESIGN.md "Cost model"): state + in-flight activations + the largest working set.
  // The cost table's saved bytes are already at the run's precision; boundary values are stored fp32.
  const double saved =
      (range.saved_per_sample - kept * (range.tp.saved_per_sample + (sp ? range.tp.sp_saved_per_sample : 0.0)) +
       sp_excess * range.tp.sp_saved_per_sample) *
      ud;
  const double workspace = range.workspace_fixed + range.workspace_per_sample * static_cast<double>(u);
  const double state = static_cast<double>(c.param_bytes) *
                       state_bytes_per_param_byte(training.optimizer, training.precision, c.zero, replicas);
  const double workspace_gathered = zero_gathered_bytes(static_cast<double>(range.largest_task_param_bytes),
                                                        training.precision, c.zero, replicas);
  // With full recomputation only the stage's inputs stay per micro-batch, with selective all but the attention
  // cores' own activations; one micro-batch's recomputed part is rebuilt at a time.
  const double core_saved = recompute == RecomputeScope::kSelective
                                ? std::min(saved, range.tp.core_saved_per_sample * ud / tp) : 0.0;
  const double rebuilt = recompute == RecomputeScope::kFull ? saved : core_saved;
  c.memory_static = state + workspace + workspace_gathered + rebuilt;
  c.memory_per_in_flight = recompute == RecomputeScope::kFull ? (sp ? c.in_bytes : whole_in) : saved - core_saved;
  c.memory_bytes = saturated_bytes(c.memory_static + in_flight * c.memory_per_in_flight);
  return c;
}

PipelineEstimate estimate_iteration_time(std::span<const StageCost> stages, int64_t microbatches,
                                         Schedule schedule, int chunks) {
  // GPipe and 1F1B have the same critical path in this model: fill (Σ steps) + (m − 1) bottleneck
  // steps; they differ in memory only. A discrete-event simulator can replace this function.
  APART_CHECK(chunks >= 1 && (chunks == 1 || schedule == Schedule::kInterleaved), "only interleaving runs chunks");
  const bool interleaved = schedule == Schedule::kInterleaved;
  const size_t count = stages.size();
  // Interleaved: the wrap from the last device to the first carries the last boundary (simulate.cpp's rule), both
  // ways, as the last stage's own input transfers do.
  const double wrap_s = interleaved && count > 1 ? stages[count - 1].comm_s : 0.0;
  auto device_step = [&](size_t s) {
    if (!interleaved) return stages[s].step_s;
    const double more = static_cast<double>(chunks - 1);
    return stages[s].step_s + more * stages[s].comm_s + ((s == 0 || s + 1 == count) ? more * wrap_s : 0.0);
  };
  PipelineEstimate e;
  double max_step = 0, sum_steps = 0, max_allreduce = 0, max_optimizer = 0;
  for (size_t s = 0; s < count; ++s) {
    const double step = device_step(s);
    sum_steps += step;
    max_allreduce = std::max(max_allreduce, stages[s].allreduce_exposed_s);
    max_optimizer = std::max(max_optimizer, stages[s].optimizer_s);
    if (step > max_step) {
      max_step = step;
      e.bottleneck_stage = static_cast<int>(s);
    }
  }
  const double busy = static_cast<double>(microbatches) * max_step;
  // Interleaving (Narayanan et al., SC'21 §2.2): the fill and drain run chunks of 1/v of each stage. ZB-H1: every
  // stage but the bottleneck adds its step less its W pass and less what a deferred W fills of each drain gap,
  // which is a forward and an input-gradient pass long: min(W, F, B).
  if (interleaved) {
    e.pipeline_s = busy + (sum_steps - max_step) / static_cast<double>(chunks);
  } else if (schedule == Schedule::kZbH1) {
    e.pipeline_s = busy;
    for (size_t s = 0; s < count; ++s)
      if (static_cast<int>(s) != e.bottleneck_stage)
        e.pipeline_s += std::max(0.0, stages[s].step_s - stages[s].backward_weight_s -
                                          std::min({stages[s].backward_weight_s, stages[s].forward_s,
                                                    stages[s].backward_s - stages[s].backward_weight_s}));
  } else {
    e.pipeline_s = static_cast<double>(microbatches - 1) * max_step + sum_steps;
  }
  e.iteration_s = e.pipeline_s + max_allreduce + max_optimizer;
  e.bubble_fraction = e.pipeline_s > 0 ? 1.0 - busy / e.pipeline_s : 0.0;
  return e;
}

void StageReplacementEstimate::TopTwo::add(double value, size_t index) {
  if (index == 0 || value > first) {
    second = index == 0 ? 0.0 : first;
    first = value;
    at = index;
  } else if (value > second) {
    second = value;
  }
}

StageReplacementEstimate::StageReplacementEstimate(std::span<const StageCost> stages, int64_t microbatches,
                                                   Schedule schedule, int chunks)
    : microbatches_(microbatches), schedule_(schedule), chunks_(chunks),
      closed_form_(schedule == Schedule::kGPipe || schedule == Schedule::k1F1B) {
  reset(stages);
}

void StageReplacementEstimate::reset(std::span<const StageCost> stages) {
  if (!closed_form_) {
    scratch_.assign(stages.begin(), stages.end());
    return;
  }
  steps_.resize(stages.size());
  allreduces_.resize(stages.size());
  optimizers_.resize(stages.size());
  for (size_t s = 0; s < stages.size(); ++s) {
    steps_[s] = stages[s].step_s;
    allreduces_[s] = stages[s].allreduce_exposed_s;
    optimizers_[s] = stages[s].optimizer_s;
  }
  sum_steps_ = sum_in_stage_order(steps_);
  step_ = TopTwo::of(steps_);
  allreduce_ = TopTwo::of(allreduces_);
  optimizer_ = TopTwo::of(optimizers_);
}

double StageReplacementEstimate::sum_in_stage_order(const std::vector<double>& values) {
  double sum = 0;  // estimate_iteration_time's order: the bits current_iteration_s() promises
  for (double v : values) sum += v;
  return sum;
}

StageReplacementEstimate::TopTwo StageReplacementEstimate::TopTwo::of(const std::vector<double>& values) {
  TopTwo top;
  for (size_t s = 0; s < values.size(); ++s) top.add(values[s], s);
  return top;
}

void StageReplacementEstimate::TopTwo::replace(std::vector<double>& values, size_t index, double value) {
  // first: the largest value, at: its first index; second: the largest at any other index (0 without one).
  const double old = values[index];
  values[index] = value;
  bool again = false;
  if (index == at) {
    if (value >= old || value > second) first = value; else again = true;  // equal to second: which index is first?
  } else if (value > first) {
    second = first;
    first = value;
    at = index;
  } else if (value == first) {
    second = first;
    at = std::min(at, index);
  } else if (value >= old) {
    second = std::max(second, value);
  } else {
    again = old >= second;  // it may have been the second largest
  }
  if (again) *this = of(values);
}

void StageReplacementEstimate::replace(size_t stage, const StageCost& replacement) {
  if (!closed_form_) {
    scratch_[stage] = replacement;
    return;
  }
  step_.replace(steps_, stage, replacement.step_s);
  allreduce_.replace(allreduces_, stage, replacement.allreduce_exposed_s);
  optimizer_.replace(optimizers_, stage, replacement.optimizer_s);
  sum_steps_ = sum_in_stage_order(steps_);
}

std::optional<double> StageReplacementEstimate::current_iteration_s() const {
  if (!closed_form_) return std::nullopt;
  // estimate_iteration_time's lines: its maxima start at 0 and only rise, as TopTwo's firsts (costs are ≥ 0).
  const double pipeline_s = static_cast<double>(microbatches_ - 1) * std::max(0.0, step_.first) + sum_steps_;
  return pipeline_s + std::max(0.0, allreduce_.first) + std::max(0.0, optimizer_.first);
}

double StageReplacementEstimate::iteration_s(size_t stage, const StageCost& replacement) {
  if (!closed_form_) {
    const StageCost kept = scratch_[stage];
    scratch_[stage] = replacement;
    const double t = estimate_iteration_time(scratch_, microbatches_, schedule_, chunks_).iteration_s;
    scratch_[stage] = kept;
    return t;
  }
  // estimate_iteration_time's GPipe/1F1B lines with stage `stage` replaced: (m − 1) · max step + Σ steps + max
  // exposed all-reduce + max optimizer step.
  const double max_step = std::max(step_.without(stage), replacement.step_s);
  const double pipeline =
      static_cast<double>(microbatches_ - 1) * max_step + (sum_steps_ - steps_[stage] + replacement.step_s);
  return pipeline + std::max(allreduce_.without(stage), replacement.allreduce_exposed_s) +
         std::max(optimizer_.without(stage), replacement.optimizer_s);
}

}  // namespace apart
