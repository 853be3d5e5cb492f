// The event engine. Devices run their schedule's op order strictly in order; an op starts when the device is
// free and its inputs have arrived. A transfer starts when its producer has finished and both the sender's send
// channel and the receiver's recv channel are free (one transfer per direction per device at a time).
#include "simulator/simulate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <queue>

#include "graph/checked.h"
#include "graph/error.h"
#include "plan/trace.h"
#include "profiler/collectives.h"
#include "profiler/memory_model.h"
#include "plan/training.h"

namespace apart::sim {

std::string SimEvent::name() const {
  const TimelineKind k = kind == EventKind::kForward ? TimelineKind::kForward : kind == EventKind::kBackward ? TimelineKind::kBackward
                         : kind == EventKind::kBackwardWeight ? TimelineKind::kBackwardWeight
                         : kind == EventKind::kTransfer ? TimelineKind::kSend : kind == EventKind::kAllReduce ? TimelineKind::kAllReduce
                         : TimelineKind::kStep;
  return action_name(k, stage, virtual_stage, microbatch, gradient);
}

std::string SimEvent::receive_name() const {
  return action_name(TimelineKind::kRecv, peer_stage, peer_virtual_stage, microbatch, gradient);
}

namespace {

// A virtual stage: one chunk of one plan stage (the whole stage unless interleaved).
struct VirtualStage {
  int group = 0;  // pipeline position that runs it
  double forward_s = 0;
  double backward_s = 0;  // including recomputation; under ZB-H1 without the weight-gradient pass
  double weight_s = 0;    // ZB-H1's weight-gradient pass W
  double activation_bytes = 0;  // saved per micro-batch
  std::vector<std::pair<int, double>> preds;  // (virtual stage, bytes per micro-batch)
  std::vector<std::pair<int, double>> succs;
};

// Bytes crossing the cut between plan stages k and k+1: everything produced at or before k and read after k.
double cut_bytes(const SimPlan& plan, int k) {
  double bytes = 0;
  for (size_t b = static_cast<size_t>(k) + 1; b < plan.stages.size(); ++b)
    for (const SimInput& in : plan.stages[b].inputs)
      if (in.from_stage >= 0 && in.from_stage <= k) bytes += in.bytes;
  return bytes;
}

// Chunks per device a plan was made for under interleaving: training.virtual_stages, else the default.
int plan_chunks(const SimPlan& plan) {
  return plan.training.virtual_stages > 1 ? plan.training.virtual_stages : kDefaultVirtualStages;
}

// Activation memory per stage: see docs/simulator.md §Memory for the approximation.
void estimate_memory(const SimPlan& plan, Schedule plan_schedule, std::vector<StageStats>& stats, std::string& note) {
  const Optimizer optimizer = plan.training.optimizer;
  const Precision precision = plan.training.precision;
  const int stages = static_cast<int>(plan.stages.size());
  std::map<std::string, int> methods;
  for (int s = 0; s < stages; ++s) {
    const SimStage& st = plan.stages[static_cast<size_t>(s)];
    // The activations the plan's own schedule counted into memory_bytes (interleaved: its chunks, each 1/v).
    const double planned = stage_in_flight_activations(plan_schedule, s, stages, plan.training.microbatches,
                                                       plan_schedule == Schedule::kInterleaved ? plan_chunks(plan) : 1);
    const double total = static_cast<double>(st.memory_bytes);
    double fixed = 0, per_mb = 0;
    if (st.memory_static_bytes && st.activation_bytes_per_microbatch) {
      fixed = *st.memory_static_bytes;
      per_mb = *st.activation_bytes_per_microbatch;
      ++methods["plan fields"];
    } else if (st.recompute) {
      for (const SimInput& in : st.inputs) per_mb += in.bytes;  // only stage inputs stay per micro-batch
      fixed = std::max(0.0, total - planned * per_mb);
      ++methods["recompute: stage inputs"];
    } else if (st.param_bytes) {
      fixed = std::min(total, static_cast<double>(*st.param_bytes) *
                                  state_bytes_per_param_byte(optimizer, precision, st.zero, st.replicas));
      per_mb = std::max(0.0, total - fixed) / planned;
      ++methods["(memory_bytes - param state) / planned in-flight"];
    } else {
      per_mb = total / planned;
      ++methods["memory_bytes / planned in-flight"];
    }
    stats[static_cast<size_t>(s)].memory_static_bytes = fixed;
    stats[static_cast<size_t>(s)].activation_bytes_per_microbatch = per_mb;
  }
  for (const auto& [method, count] : methods)
    note += (note.empty() ? "" : "; ") + method + " (" + std::to_string(count) + " stages)";
}

class Engine {
 public:
  Engine(const SimPlan& plan, const SimOptions& options, Schedule schedule, int chunks, SimResult& result)
      : plan_(plan), options_(options), result_(result), groups_(static_cast<int>(plan.stages.size())),
        chunks_(chunks), m_(plan.training.microbatches) {
    build_virtual_stages(schedule);
    order_.resize(static_cast<size_t>(groups_));
    for (int g = 0; g < groups_; ++g) order_[static_cast<size_t>(g)] = device_op_order(schedule, g, groups_, chunks_, m_);
    const size_t ops = vstages_.size() * static_cast<size_t>(m_) * kOpKinds;
    need_.assign(ops, 0);
    got_.assign(ops, 0);
    last_arrival_.assign(ops, 0.0);
    last_arrival_event_.assign(ops, -1);
    for (size_t c = 0; c < vstages_.size(); ++c)
      for (int64_t mb = 0; mb < m_; ++mb) {
        need_[op_index(static_cast<int>(c), mb, OpKind::kForward)] = static_cast<int>(vstages_[c].preds.size());
        need_[op_index(static_cast<int>(c), mb, OpKind::kBackward)] = static_cast<int>(vstages_[c].succs.size()) + 1;
        need_[op_index(static_cast<int>(c), mb, OpKind::kBackwardWeight)] = 1;  // its own B
      }
    const size_t g = static_cast<size_t>(groups_);
    next_.assign(g, 0);
    phase_.assign(g, 0);
    busy_.assign(g, false);
    device_free_.assign(g, 0.0);
    device_last_event_.assign(g, -1);
    send_free_.assign(g, 0.0);
    recv_free_.assign(g, 0.0);
    last_send_event_.assign(g, -1);
    last_recv_event_.assign(g, -1);
    in_flight_.assign(g, 0);
    activation_bytes_.assign(g, 0.0);
  }

  void run() {
    for (int g = 0; g < groups_; ++g) {
      StageStats& st = result_.stages[static_cast<size_t>(g)];
      st.memory_timeline.push_back({0.0, st.memory_static_bytes});
      st.peak_memory_bytes = st.memory_static_bytes;
    }
    for (int g = 0; g < groups_; ++g) try_start_device(g, 0.0);
    while (!queue_.empty()) {
      const QueueItem item = queue_.top();
      queue_.pop();
      const SimEvent& e = result_.events[static_cast<size_t>(item.event)];
      if (e.kind == EventKind::kTransfer) transfer_done(item.event, item.time);
      else device_done(item.event, item.time);
    }
    for (int g = 0; g < groups_; ++g)
      APART_CHECK(phase_[static_cast<size_t>(g)] == 3,
                  "simulation deadlocked: stage " + std::to_string(g) + " stopped after " +
                      std::to_string(next_[static_cast<size_t>(g)]) + " of " +
                      std::to_string(order_[static_cast<size_t>(g)].size()) + " ops");
  }

 private:
  struct QueueItem {
    double time;
    int64_t seq;
    int event;
    bool operator<(const QueueItem& o) const {  // min-heap on (time, seq)
      return time != o.time ? time > o.time : seq > o.seq;
    }
  };
  struct PendingTransfer {
    int from_vs, to_vs;
    int64_t microbatch;
    bool gradient;
    double bytes, duration, ready;
    int ready_event;
    size_t target_op;
  };

  static constexpr size_t kOpKinds = 3;  // forward, backward, weight-gradient pass
  size_t op_index(int vs, int64_t mb, OpKind kind) const {
    return (static_cast<size_t>(vs) * static_cast<size_t>(m_) + static_cast<size_t>(mb)) * kOpKinds +
           static_cast<size_t>(kind);
  }

  void build_virtual_stages(Schedule schedule) {
    const bool interleaved = schedule == Schedule::kInterleaved;
    zb_h1_ = schedule == Schedule::kZbH1;
    const int v = interleaved ? chunks_ : 1;
    vstages_.resize(static_cast<size_t>(groups_ * v));
    for (int c = 0; c < groups_ * v; ++c) {
      const int g = c % groups_;
      const SimStage& st = plan_.stages[static_cast<size_t>(g)];
      VirtualStage& vs = vstages_[static_cast<size_t>(c)];
      vs.group = g;
      // A plan stage split into v chunks: each chunk gets 1/v of its times and activation bytes.
      vs.forward_s = st.forward_s / v;
      vs.backward_s = (st.backward_s + st.recompute_s) / v;
      vs.activation_bytes = result_.stages[static_cast<size_t>(g)].activation_bytes_per_microbatch / v;
      if (zb_h1_) {  // the weight-gradient part runs as its own pass (v = 1)
        vs.weight_s = std::min(st.backward_weight_s, vs.backward_s);
        vs.backward_s -= vs.weight_s;
      }
    }
    if (interleaved) {
      // Chain of P·v chunks; chunk c on device c mod P sends to c + 1. The wrap from the last device to the first
      // carries the last stage boundary's bytes (the plan has no boundary there to read).
      for (int c = 0; c + 1 < groups_ * v; ++c) {
        const int g = c % groups_;
        const double bytes = groups_ == 1 ? 0.0 : cut_bytes(plan_, g + 1 < groups_ ? g : groups_ - 2);
        vstages_[static_cast<size_t>(c)].succs.push_back({c + 1, bytes});
        vstages_[static_cast<size_t>(c) + 1].preds.push_back({c, bytes});
      }
      return;
    }
    // The plan's stage DAG: one transfer per (from, to, micro-batch) carrying all values between the two stages.
    std::map<std::pair<int, int>, double> edges;
    for (const SimStage& st : plan_.stages)
      for (const SimInput& in : st.inputs)
        if (in.from_stage >= 0) edges[{in.from_stage, st.id}] += in.bytes;
    for (const SimStage& st : plan_.stages)
      for (const SimOutput& out : st.outputs)
        for (int to : out.to_stages)
          if (!edges.count({st.id, to})) edges[{st.id, to}] = out.bytes;  // outputs without a matching input entry
    for (const auto& [edge, bytes] : edges) {
      vstages_[static_cast<size_t>(edge.first)].succs.push_back({edge.second, bytes});
      vstages_[static_cast<size_t>(edge.second)].preds.push_back({edge.first, bytes});
    }
  }

  int add_event(SimEvent e) {
    result_.events.push_back(e);
    const int id = static_cast<int>(result_.events.size()) - 1;
    queue_.push({e.end_s, seq_++, id});
    return id;
  }

  void set_memory(int g, double now, int delta_in_flight, double delta_bytes) {
    StageStats& st = result_.stages[static_cast<size_t>(g)];
    in_flight_[static_cast<size_t>(g)] += delta_in_flight;
    activation_bytes_[static_cast<size_t>(g)] += delta_bytes;
    st.peak_in_flight = std::max(st.peak_in_flight, in_flight_[static_cast<size_t>(g)]);
    const double bytes = st.memory_static_bytes + std::max(0.0, activation_bytes_[static_cast<size_t>(g)]);
    st.peak_memory_bytes = std::max(st.peak_memory_bytes, bytes);
    if (!st.memory_timeline.empty() && st.memory_timeline.back().first == now) st.memory_timeline.back().second = bytes;
    else st.memory_timeline.push_back({now, bytes});
  }

  void try_start_device(int g, double now) {
    const size_t gi = static_cast<size_t>(g);
    if (busy_[gi] || phase_[gi] == 3) return;
    SimEvent e;
    e.stage = g;
    e.virtual_stage = g;
    e.start_s = now;
    e.critical_predecessor = device_last_event_[gi];
    if (phase_[gi] == 0 && next_[gi] < order_[gi].size()) {
      const ComputeOp& op = order_[gi][next_[gi]];
      const size_t id = op_index(op.virtual_stage, op.microbatch, op.kind);
      if (got_[id] < need_[id]) return;
      const VirtualStage& vs = vstages_[static_cast<size_t>(op.virtual_stage)];
      e.kind = op.kind == OpKind::kForward    ? EventKind::kForward
               : op.kind == OpKind::kBackward ? EventKind::kBackward
                                              : EventKind::kBackwardWeight;
      e.virtual_stage = op.virtual_stage;
      e.microbatch = op.microbatch;
      e.end_s = now + (op.kind == OpKind::kForward    ? vs.forward_s
                       : op.kind == OpKind::kBackward ? vs.backward_s
                                                      : vs.weight_s);
      // Data or the device: whichever was ready last (ties go to the data dependency, the pipeline's chain).
      if (last_arrival_event_[id] >= 0 && last_arrival_[id] >= device_free_[gi]) e.critical_predecessor = last_arrival_event_[id];
      ++next_[gi];
      if (op.kind == OpKind::kForward) set_memory(g, now, 1, vs.activation_bytes);
    } else if (phase_[gi] == 0) {
      phase_[gi] = 1;
      e.kind = EventKind::kAllReduce;
      // Overlapped all-reduce: only its exposed part runs after the last backward.
      const SimStage& st = plan_.stages[gi];
      e.end_s = now + st.allreduce_exposed_s.value_or(st.allreduce_s);
    } else if (phase_[gi] == 1) {
      phase_[gi] = 2;
      e.kind = EventKind::kStep;
      e.end_s = now + options_.optimizer_step_s.value_or(plan_.stages[gi].optimizer_s);
    } else {
      phase_[gi] = 3;
      return;
    }
    busy_[gi] = true;
    add_event(e);
  }

  void deliver(size_t op, double now, int event) {
    ++got_[op];
    if (now >= last_arrival_[op]) {
      last_arrival_[op] = now;
      last_arrival_event_[op] = event;
    }
    const int vs = static_cast<int>(op / kOpKinds / static_cast<size_t>(m_));
    try_start_device(vstages_[static_cast<size_t>(vs)].group, now);
  }

  void send(int from_vs, int to_vs, int64_t mb, bool gradient, double bytes, double now, int event) {
    const OpKind target = gradient ? OpKind::kBackward : OpKind::kForward;
    const size_t op = op_index(to_vs, mb, target);
    const int from = vstages_[static_cast<size_t>(from_vs)].group, to = vstages_[static_cast<size_t>(to_vs)].group;
    if (from == to) {  // chunks on one device hand over in memory
      deliver(op, now, event);
      return;
    }
    const Link& link = plan_.cluster.link_between_groups(plan_.stages[static_cast<size_t>(from)].devices,
                                                         plan_.stages[static_cast<size_t>(to)].devices);
    const double duration = options_.communication ? transfer_time(link, bytes) : 0.0;
    pending_.push_back({from_vs, to_vs, mb, gradient, bytes, duration, now, event, op});
  }

  void try_start_transfers(double now) {
    for (size_t i = 0; i < pending_.size();) {
      const PendingTransfer& p = pending_[i];
      const int from = vstages_[static_cast<size_t>(p.from_vs)].group, to = vstages_[static_cast<size_t>(p.to_vs)].group;
      const size_t fi = static_cast<size_t>(from), ti = static_cast<size_t>(to);
      if (send_free_[fi] > now || recv_free_[ti] > now) {
        ++i;
        continue;
      }
      SimEvent e;
      e.kind = EventKind::kTransfer;
      e.stage = from;
      e.virtual_stage = p.from_vs;
      e.peer_stage = to;
      e.peer_virtual_stage = p.to_vs;
      e.microbatch = p.microbatch;
      e.gradient = p.gradient;
      e.bytes = p.bytes;
      e.start_s = now;
      e.end_s = now + p.duration;
      e.critical_predecessor = p.ready_event;
      double latest = p.ready;
      for (int channel_event : {last_send_event_[fi], last_recv_event_[ti]})
        if (channel_event >= 0 && result_.events[static_cast<size_t>(channel_event)].end_s > latest) {
          latest = result_.events[static_cast<size_t>(channel_event)].end_s;
          e.critical_predecessor = channel_event;
        }
      send_free_[fi] = recv_free_[ti] = e.end_s;
      const size_t target = p.target_op;
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
      const int id = add_event(e);
      last_send_event_[fi] = last_recv_event_[ti] = id;
      transfer_target_[id] = target;
    }
  }

  void device_done(int event, double now) {
    const SimEvent e = result_.events[static_cast<size_t>(event)];
    const size_t gi = static_cast<size_t>(e.stage);
    busy_[gi] = false;
    device_free_[gi] = now;
    device_last_event_[gi] = event;
    if (e.kind == EventKind::kForward) {
      const VirtualStage& vs = vstages_[static_cast<size_t>(e.virtual_stage)];
      deliver(op_index(e.virtual_stage, e.microbatch, OpKind::kBackward), now, event);
      for (const auto& [to, bytes] : vs.succs) send(e.virtual_stage, to, e.microbatch, false, bytes, now, event);
    } else if (e.kind == EventKind::kBackward) {
      const VirtualStage& vs = vstages_[static_cast<size_t>(e.virtual_stage)];
      // ZB-H1 keeps the activations until the W pass has read them.
      if (zb_h1_) deliver(op_index(e.virtual_stage, e.microbatch, OpKind::kBackwardWeight), now, event);
      else set_memory(e.stage, now, -1, -vs.activation_bytes);
      for (const auto& [from, bytes] : vs.preds) send(e.virtual_stage, from, e.microbatch, true, bytes, now, event);
    } else if (e.kind == EventKind::kBackwardWeight) {
      set_memory(e.stage, now, -1, -vstages_[static_cast<size_t>(e.virtual_stage)].activation_bytes);
    }
    try_start_transfers(now);
    try_start_device(e.stage, now);
  }

  void transfer_done(int event, double now) {
    const auto it = transfer_target_.find(event);
    APART_CHECK(it != transfer_target_.end(), "transfer without a target");
    deliver(it->second, now, event);
    try_start_transfers(now);
  }

  const SimPlan& plan_;
  const SimOptions& options_;
  SimResult& result_;
  int groups_;
  int chunks_;
  int64_t m_;
  bool zb_h1_ = false;
  std::vector<VirtualStage> vstages_;
  std::vector<std::vector<ComputeOp>> order_;
  std::vector<int> need_, got_;
  std::vector<double> last_arrival_;
  std::vector<int> last_arrival_event_;
  std::vector<size_t> next_;
  std::vector<int> phase_;  // 0 compute, 1 all-reduce running, 2 step running, 3 done
  std::vector<bool> busy_;
  std::vector<double> device_free_;
  std::vector<int> device_last_event_;
  std::vector<double> send_free_, recv_free_;
  std::vector<int> last_send_event_, last_recv_event_;
  std::vector<int64_t> in_flight_;
  std::vector<double> activation_bytes_;
  std::vector<PendingTransfer> pending_;
  std::map<int, size_t> transfer_target_;
  std::priority_queue<QueueItem> queue_;
  int64_t seq_ = 0;
};

}  // namespace

int64_t simulated_operations(const SimPlan& plan, int chunks) {
  // Each factor is capped where the plan is read (micro-batches ≤ 2^24, stages ≤ 2^20, chunks ≤ 64): no overflow.
  return 2 * plan.training.microbatches * static_cast<int64_t>(plan.stages.size()) * std::max(chunks, 1);
}

void check_simulation_size(const SimPlan& plan, int chunks) {
  const int64_t ops = simulated_operations(plan, chunks);
  if (ops <= limits::kMaxSimulatedOps) return;
  // About three events per operation (compute, send, receive) of ~150 bytes each, with the queue and orders.
  const double gb = static_cast<double>(ops) * 500 / 1e9;
  char need[64];
  std::snprintf(need, sizeof need, "%.3g GB", gb);
  throw Infeasible(plan.source + ": replaying " + std::to_string(plan.training.microbatches) + " micro-batches × " +
                   std::to_string(plan.stages.size()) + " stages × " + std::to_string(chunks) + " chunk(s) is " +
                   std::to_string(ops) + " forward/backward operations, about " + need +
                   " of memory; apart replays at most " + std::to_string(limits::kMaxSimulatedOps) +
                   " (README, Limits): plan fewer micro-batches or stages");
}

SimResult simulate(const SimPlan& plan_in, const SimOptions& options) {
  SimPlan plan = plan_in;
  const Schedule plan_schedule = plan.training.schedule;
  const Schedule schedule = options.schedule.value_or(plan_schedule);
  if (options.virtual_stages < 0) throw InvalidArgument("--virtual-stages must be at least 1");
  int chunks = 1;
  if (schedule == Schedule::kInterleaved) {
    chunks = options.virtual_stages > 0 ? options.virtual_stages : plan_chunks(plan);
  } else if (options.virtual_stages > 1) {
    throw InvalidArgument("--virtual-stages " + std::to_string(options.virtual_stages) +
                          " needs --schedule interleaved (GPipe and 1F1B run one chunk per device)");
  }
  if (chunks > 1) {
    // A chunk runs at least one task of every stage, and more chunks than kMaxVirtualStages only add bubbles.
    int64_t fewest = limits::kMaxVirtualStages;
    for (const SimStage& st : plan.stages)
      if (st.tasks > 0) fewest = std::min(fewest, st.tasks);
    checked_integer(chunks, 1, fewest,
                    "--virtual-stages (chunks per device; at most " + std::to_string(limits::kMaxVirtualStages) +
                        " and at most the tasks of the smallest stage)");
  }
  check_simulation_size(plan, chunks);
  if (options.optimizer_step_s)
    checked_number(*options.optimizer_step_s, 0, limits::kMaxSeconds, "the optimizer step time (s)");
  if (options.recompute)
    for (SimStage& st : plan.stages) {  // on: the whole forward again (full recomputation)
      st.recompute = *options.recompute;
      st.recompute_s = st.recompute ? st.forward_s : 0.0;
    }

  SimResult result;
  result.schedule = schedule;
  result.virtual_stages = chunks;
  result.microbatches = plan.training.microbatches;
  result.links_source = plan.links_source;
  result.stages.resize(plan.stages.size());
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    StageStats& st = result.stages[s];
    st.stage = static_cast<int>(s);
    st.devices = plan.stages[s].devices;
    st.forward_s = plan.stages[s].forward_s;
    st.backward_s = plan.stages[s].backward_s + plan.stages[s].recompute_s;
    result.recompute |= plan.stages[s].recompute;
  }
  estimate_memory(plan_in, plan_schedule, result.stages, result.memory_note);

  Engine engine(plan, options, schedule, chunks, result);
  engine.run();

  // Summary figures.
  std::vector<double> busy(plan.stages.size(), 0.0);
  int last = -1;
  for (size_t i = 0; i < result.events.size(); ++i) {
    const SimEvent& e = result.events[i];
    const double d = e.end_s - e.start_s;
    StageStats& st = result.stages[static_cast<size_t>(e.stage)];
    switch (e.kind) {
      case EventKind::kForward:
      case EventKind::kBackward:
      case EventKind::kBackwardWeight:
        st.busy_s += d;
        if (e.kind != EventKind::kForward) result.pipeline_s = std::max(result.pipeline_s, e.end_s);
        break;
      case EventKind::kTransfer:
        st.send_s += d;
        result.stages[static_cast<size_t>(e.peer_stage)].recv_s += d;
        break;
      case EventKind::kAllReduce: st.allreduce_s = d; break;
      case EventKind::kStep: st.step_s = d; break;
    }
    if (last < 0 || e.end_s >= result.events[static_cast<size_t>(last)].end_s) last = static_cast<int>(i);
  }
  result.iteration_s = last >= 0 ? result.events[static_cast<size_t>(last)].end_s : 0.0;
  double busy_total = 0;
  for (StageStats& st : result.stages) {
    st.idle_s = std::max(0.0, result.iteration_s - st.busy_s - st.allreduce_s - st.step_s);
    busy_total += st.busy_s;
  }
  result.bubble_fraction =
      result.pipeline_s > 0 ? 1.0 - busy_total / (static_cast<double>(plan.stages.size()) * result.pipeline_s) : 0.0;
  for (int e = last; e >= 0; e = result.events[static_cast<size_t>(e)].critical_predecessor) result.critical_path.push_back(e);
  std::reverse(result.critical_path.begin(), result.critical_path.end());
  return result;
}

}  // namespace apart::sim
