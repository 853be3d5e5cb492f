// Per-device op orders of the three schedules and, from them, each rank's actions and their abstract check.
#include "schedule/schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "graph/error.h"

namespace apart {

namespace {

std::vector<ComputeOp> interleaved_order(int device, int devices, int chunks, int64_t microbatches) {
  const int64_t p = devices;
  const int64_t v = chunks;
  if (microbatches % p != 0)
    throw Unsupported("interleaved 1F1B needs the micro-batch count (" + std::to_string(microbatches) +
                      ") to be a multiple of the pipeline depth (" + std::to_string(p) +
                      "), as in Megatron-LM; use --schedule 1f1b or re-plan with a multiple");
  const int64_t total = microbatches * v;
  // Megatron-LM schedules.py: the k-th forward (backward) of a device runs chunk (k mod P·v) / P
  // (reversed for backward) on micro-batch (k / P·v)·P + k mod P.
  auto forward = [&](int64_t k) {
    const int64_t chunk = (k % (p * v)) / p;
    return ComputeOp{OpKind::kForward, static_cast<int>(chunk * p + device), (k / (p * v)) * p + k % p};
  };
  auto backward = [&](int64_t k) {
    const int64_t chunk = v - 1 - (k % (p * v)) / p;
    return ComputeOp{OpKind::kBackward, static_cast<int>(chunk * p + device), (k / (p * v)) * p + k % p};
  };
  const int64_t warmup = std::min(total, (p - device - 1) * 2 + (v - 1) * p);
  std::vector<ComputeOp> ops;
  ops.reserve(static_cast<size_t>(2 * total));
  for (int64_t k = 0; k < warmup; ++k) ops.push_back(forward(k));
  for (int64_t k = 0; k < total - warmup; ++k) {
    ops.push_back(forward(warmup + k));
    ops.push_back(backward(k));
  }
  for (int64_t k = total - warmup; k < total; ++k) ops.push_back(backward(k));
  return ops;
}

}  // namespace

std::vector<ComputeOp> device_op_order(Schedule schedule, int device, int devices, int chunks, int64_t microbatches) {
  APART_CHECK(device >= 0 && device < devices && chunks >= 1 && microbatches >= 1, "bad schedule arguments");
  std::vector<ComputeOp> ops;
  switch (schedule) {
    case Schedule::kGPipe:
      APART_CHECK(chunks == 1, "GPipe has one chunk per device");
      for (int64_t mb = 0; mb < microbatches; ++mb) ops.push_back({OpKind::kForward, device, mb});
      for (int64_t mb = 0; mb < microbatches; ++mb) ops.push_back({OpKind::kBackward, device, mb});
      break;
    case Schedule::k1F1B: {
      APART_CHECK(chunks == 1, "1F1B has one chunk per device");
      // PipeDream-Flush: the warm-up fills the pipeline below this device, so device d holds
      // at most min(P − d, m) micro-batches' activations.
      const int64_t warmup = std::min<int64_t>(devices - device, microbatches);
      for (int64_t mb = 0; mb < warmup; ++mb) ops.push_back({OpKind::kForward, device, mb});
      for (int64_t mb = 0; mb < microbatches; ++mb) {
        ops.push_back({OpKind::kBackward, device, mb});
        if (warmup + mb < microbatches) ops.push_back({OpKind::kForward, device, warmup + mb});
      }
      break;
    }
    case Schedule::kInterleaved:
      ops = interleaved_order(device, devices, chunks, microbatches);
      break;
    case Schedule::kZbH1: {
      APART_CHECK(chunks == 1, "ZB-H1 has one chunk per device");
      // Device d defers its W passes by d micro-batches: the B passes that the devices before it wait for run
      // back to back with the forwards, and the deferred W passes fill the drain where 1F1B idles.
      const int64_t warmup = std::min<int64_t>(devices - device, microbatches);
      const int64_t lag = device;
      for (int64_t mb = 0; mb < warmup; ++mb) ops.push_back({OpKind::kForward, device, mb});
      for (int64_t mb = 0; mb < microbatches; ++mb) {
        ops.push_back({OpKind::kBackward, device, mb});
        if (mb >= lag) ops.push_back({OpKind::kBackwardWeight, device, mb - lag});
        if (warmup + mb < microbatches) ops.push_back({OpKind::kForward, device, warmup + mb});
      }
      for (int64_t mb = std::max<int64_t>(0, microbatches - lag); mb < microbatches; ++mb)
        ops.push_back({OpKind::kBackwardWeight, device, mb});
      break;
    }
  }
  return ops;
}


// --- Ranks, sample ranges, edges ------------------------------------------------------------------------------

RankRole rank_role(const PlanDocument& plan, int rank) {
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const std::vector<int>& devices = plan.stages[s].devices;
    const int tp = std::max(1, plan.stages[s].tp);
    for (size_t j = 0; j < devices.size(); ++j)
      if (devices[j] == rank) return {static_cast<int>(s), static_cast<int>(j) / tp, static_cast<int>(j) % tp};
  }
  throw InvalidArgument("rank " + std::to_string(rank) + " is not one of the plan's devices (" +
                        std::to_string(plan.stages.size()) + " stages); run with as many ranks as the plan has devices");
}

int max_tp_degree(const PlanDocument& plan) {
  int tp = 1;
  for (const PlanStageRecord& stage : plan.stages) tp = std::max(tp, stage.tp);
  return tp;
}

std::vector<int> tp_send_targets(int degree, int tp_rank, int to_degree) {
  std::vector<int> targets;
  for (int k = 0; k < to_degree; ++k)
    if (k % degree == tp_rank) targets.push_back(k);
  return targets;
}

PlanDocument tensor_parallel_view(const PlanDocument& plan, int tp_rank) {
  const int tp = max_tp_degree(plan);
  if (tp == 1) return plan;
  if (tp_rank < 0 || tp_rank >= tp) throw InvalidArgument("TP rank " + std::to_string(tp_rank) + " of degree " + std::to_string(tp));
  PlanDocument view = plan;
  for (PlanStageRecord& stage : view.stages) {
    const int degree = std::max(1, stage.tp);
    if (static_cast<int>(stage.devices.size()) != stage.replicas * degree)
      throw InvalidArgument("stages[" + std::to_string(stage.id) + "] lists " + std::to_string(stage.devices.size()) +
                            " devices for " + std::to_string(stage.replicas) + " replicas of " + std::to_string(degree));
    std::vector<int> devices;
    for (int j = 0; j < stage.replicas; ++j) devices.push_back(stage.devices[static_cast<size_t>(j * degree + tp_rank % degree)]);
    stage.devices = std::move(devices);
    stage.tp = 1;
  }
  return view;
}

SampleRange replica_samples(int64_t microbatch_samples, int replicas, int replica) {
  if (replicas < 1 || replica < 0 || replica >= replicas)
    throw InvalidArgument("replica " + std::to_string(replica) + " of " + std::to_string(replicas) +
                          " replicas does not exist");
  if (microbatch_samples < replicas)
    throw InvalidArgument("a micro-batch of " + std::to_string(microbatch_samples) + " samples leaves some of " +
                          std::to_string(replicas) + " replicas without a sample");
  // The first n mod r replicas take one sample more: the planner costs every replica at ceil(n / r).
  const int64_t slice = microbatch_samples / replicas, larger = microbatch_samples % replicas;
  const int64_t begin = replica * slice + std::min<int64_t>(replica, larger);
  return {begin, begin + slice + (replica < larger ? 1 : 0)};
}

int64_t microbatch_samples(const PlanDocument& plan) {
  const PlanTraining& t = plan.training;
  if (t.microbatches < 1) throw InvalidArgument("training.microbatches is " + std::to_string(t.microbatches) + ", less than 1");
  if (t.global_batch) {
    if (*t.global_batch % t.microbatches != 0)
      throw InvalidArgument("training.global_batch " + std::to_string(*t.global_batch) + " does not divide into " +
                            std::to_string(t.microbatches) + " equal micro-batches (training.microbatches)");
    return *t.global_batch / t.microbatches;
  }
  if (t.microbatch_size && *t.microbatch_size > 0) return *t.microbatch_size;
  std::optional<int64_t> samples;
  for (const PlanStageRecord& stage : plan.stages) {
    if (!stage.microbatch_size || *stage.microbatch_size < 1)
      throw InvalidArgument("the plan gives no micro-batch size: neither training.global_batch, training.microbatch_size"
                            " nor stages[" + std::to_string(stage.id) + "].microbatch_size");
    const int64_t whole = *stage.microbatch_size * stage.replicas;
    if (samples && *samples != whole)
      throw InvalidArgument("stages[" + std::to_string(stage.id) + "].microbatch_size × replicas is " +
                            std::to_string(whole) + " samples, but an earlier stage's is " + std::to_string(*samples) +
                            " (every stage runs the whole micro-batch)");
    samples = whole;
  }
  if (!samples) throw InvalidArgument("the plan has no stages");
  return *samples;
}

namespace {

// The plan's stage edges (from, to) in order: what PlanStageRecord::inputs (from_stage ≥ 0) and outputs
// (to_stages) name, each once. One message per edge, micro-batch, direction and pair of ranks carries every value
// between the two stages.
struct StageEdges {
  std::vector<std::pair<int, int>> edges;  // sorted
  std::vector<std::vector<int>> inputs_from;  // per stage: the stages it receives activations from, ascending
  std::vector<std::vector<int>> outputs_to;   // per stage: the stages it sends activations to, ascending

  explicit StageEdges(const PlanDocument& plan) {
    const int stages = static_cast<int>(plan.stages.size());
    std::vector<std::pair<int, int>> found;
    // `list`/`index` name the field for the message only (built when it fails: plans list thousands of values).
    auto add = [&](int from, int to, int s, const char* list, size_t index) {
      if (from < 0 || to >= stages || from >= to)
        throw InvalidArgument("stages[" + std::to_string(s) + "]." + list + "[" + std::to_string(index) +
                              "] names stage edge " + std::to_string(from) + "→" + std::to_string(to) +
                              ", but values flow from earlier to later stages among 0.." + std::to_string(stages - 1));
      found.push_back({from, to});
    };
    for (int s = 0; s < stages; ++s) {
      const PlanStageRecord& stage = plan.stages[static_cast<size_t>(s)];
      for (size_t i = 0; i < stage.inputs.size(); ++i)
        if (stage.inputs[i].from_stage >= 0) add(stage.inputs[i].from_stage, s, s, "inputs", i);
      for (size_t o = 0; o < stage.outputs.size(); ++o)
        for (int to : stage.outputs[o].to_stages) add(s, to, s, "outputs", o);
    }
    std::sort(found.begin(), found.end());
    found.erase(std::unique(found.begin(), found.end()), found.end());
    edges = std::move(found);
    inputs_from.resize(static_cast<size_t>(stages));
    outputs_to.resize(static_cast<size_t>(stages));
    for (const auto& [from, to] : edges) {  // sorted by (from, to): both lists come out ascending
      outputs_to[static_cast<size_t>(from)].push_back(to);
      inputs_from[static_cast<size_t>(to)].push_back(from);
    }
  }

  int index(int from, int to) const {
    const auto it = std::lower_bound(edges.begin(), edges.end(), std::make_pair(from, to));
    return it != edges.end() && *it == std::make_pair(from, to) ? static_cast<int>(it - edges.begin()) : -1;
  }

  int64_t tag(const Action& action) const {
    if (action.kind != ActionKind::kSend && action.kind != ActionKind::kRecv)
      throw InvalidArgument("only sends and receives carry a tag, not '" + to_string(action) + "'");
    const int e = index(action.from_stage, action.to_stage);
    if (e < 0) throw InvalidArgument("'" + to_string(action) + "' is along no stage edge of the plan");
    if (action.microbatch < 0) throw InvalidArgument("'" + to_string(action) + "' names a negative micro-batch");
    return (action.microbatch * static_cast<int64_t>(edges.size()) + e) * 2 + (action.gradient ? 1 : 0);
  }
};

void check_stage_devices(const PlanDocument& plan) {
  if (plan.stages.empty()) throw InvalidArgument("the plan has no stages");
  for (const PlanStageRecord& stage : plan.stages)
    if (stage.devices.empty() || static_cast<int>(stage.devices.size()) != stage.replicas * std::max(1, stage.tp))
      throw InvalidArgument("stages[" + std::to_string(stage.id) + "] lists " + std::to_string(stage.devices.size()) +
                            " devices for " + std::to_string(stage.replicas) + " replicas" +
                            (stage.tp > 1 ? " of tp " + std::to_string(stage.tp) : ""));
}

// The replicas of `stage` whose samples overlap `mine`, with the overlap, ascending by rank.
std::vector<std::pair<int, SampleRange>> overlapping_peers(const PlanStageRecord& stage, int64_t samples,
                                                           SampleRange mine) {
  std::vector<std::pair<int, SampleRange>> peers;
  for (int k = 0; k < stage.replicas; ++k) {
    const SampleRange theirs = replica_samples(samples, stage.replicas, k);
    const SampleRange overlap{std::max(mine.begin, theirs.begin), std::min(mine.end, theirs.end)};
    if (overlap.begin < overlap.end) peers.push_back({stage.devices[static_cast<size_t>(k)], overlap});
  }
  std::sort(peers.begin(), peers.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return peers;
}

// Whether the actions of `plan` name the chunks of its virtual-stage view rather than its stages.
bool needs_view(const PlanDocument& plan) {
  return plan.training.schedule == Schedule::kInterleaved && !is_virtual_stage_view(plan);
}

}  // namespace

int action_tag(const Action& action, const PlanDocument& plan) {
  const int64_t tag = needs_view(plan) ? StageEdges(virtual_stage_view(plan)).tag(action) : StageEdges(plan).tag(action);
  if (tag > kMaxActionTag)
    throw Unsupported("'" + to_string(action) + "' needs message tag " + std::to_string(tag) + ", above MPI's " +
                      std::to_string(kMaxActionTag) + " (plan fewer micro-batches)");
  return static_cast<int>(tag);
}

// --- Each rank's actions ---------------------------------------------------------------------------------------

void check_executable(const PlanDocument& plan) {
  for (const PlanStageRecord& stage : plan.stages)
    if (stage.recompute_scope == RecomputeScope::kSelective)
      throw Unsupported("stage " + std::to_string(stage.id) + " recomputes selectively (its attention cores): the "
                        "runtime recomputes whole stages only yet; re-plan with --recompute on or off");
  if (plan.training.schedule != Schedule::kInterleaved) return;
  virtual_stage_view(plan);  // InvalidModel when plan.json lists no chunks
}

std::vector<Action> rank_actions(const PlanDocument& plan, int rank) {
  check_executable(plan);
  check_stage_devices(plan);
  // A TP rank runs the pipeline of its own TP rank across the stages (tensor_parallel_view), its sends spread over
  // the TP ranks of a stage of another degree that take them from it (tp_send_targets).
  if (max_tp_degree(plan) > 1) {
    const RankRole role = rank_role(plan, rank);
    const PlanDocument view = tensor_parallel_view(plan, role.tp_rank);
    std::vector<Action> actions = rank_actions(view, rank);
    const PlanDocument& stages = needs_view(plan) ? virtual_stage_view(plan) : plan;  // by the actions' stage ids
    const PlanDocument& lanes = needs_view(view) ? virtual_stage_view(view) : view;
    std::vector<Action> spread;
    for (const Action& a : actions) {
      if (a.kind != ActionKind::kSend) {
        spread.push_back(a);
        continue;
      }
      const int mine = a.gradient ? a.to_stage : a.from_stage, theirs = a.gradient ? a.from_stage : a.to_stage;
      const PlanStageRecord& to = stages.stages[static_cast<size_t>(theirs)];
      const std::vector<int>& peers = lanes.stages[static_cast<size_t>(theirs)].devices;
      const int replica = static_cast<int>(std::find(peers.begin(), peers.end(), a.peer) - peers.begin());
      for (int k : tp_send_targets(std::max(1, stages.stages[static_cast<size_t>(mine)].tp), role.tp_rank,
                                   std::max(1, to.tp))) {
        Action copy = a;
        copy.peer = to.devices[static_cast<size_t>(replica * std::max(1, to.tp) + k)];
        spread.push_back(copy);
      }
    }
    return spread;
  }
  // An interleaved plan runs as its chunks (virtual_stage_view): the rank's stage d holds chunks d, d + P, ….
  if (needs_view(plan)) return rank_actions(virtual_stage_view(plan), rank);
  const bool chunked = plan.training.schedule == Schedule::kInterleaved;
  const RankRole role = rank_role(plan, rank);  // in a view: the rank's first chunk, d
  const StageEdges graph(plan);
  const int64_t samples = microbatch_samples(plan);
  const int64_t m = plan.training.microbatches;
  // Every stage, not only this rank's neighbours: each rank then refuses a plan for the same reason.
  for (const PlanStageRecord& stage : plan.stages)
    if (samples < stage.replicas)
      throw InvalidArgument("stages[" + std::to_string(stage.id) + "] has " + std::to_string(stage.replicas) +
                            " replicas, but a micro-batch holds " + std::to_string(samples) +
                            " samples: some replica would get none");
  const int64_t largest_tag = (m * static_cast<int64_t>(graph.edges.size())) * 2 - 1;
  if (largest_tag > kMaxActionTag)
    throw Unsupported(std::to_string(m) + " micro-batches over " + std::to_string(graph.edges.size()) +
                      " stage edges need message tags up to " + std::to_string(largest_tag) + ", above MPI's " +
                      std::to_string(kMaxActionTag) + "; plan at most " +
                      std::to_string((kMaxActionTag + 1) / (2 * std::max<int64_t>(1, graph.edges.size()))) +
                      " micro-batches");

  const int stages = static_cast<int>(plan.stages.size());
  const int chunks = chunked ? std::max(1, plan.training.virtual_stages.value_or(kDefaultVirtualStages)) : 1;
  const int devices = stages / chunks;  // pipeline positions P: a view lists P·v chunks
  const int d = role.stage;             // chunk d is this rank's first: the rank sits at position d
  const PlanStageRecord& stage = plan.stages[static_cast<size_t>(d)];
  const SampleRange mine = replica_samples(samples, stage.replicas, role.replica);
  // Who holds which of my samples, per (my stage, neighbouring stage) (the same for every micro-batch).
  std::map<std::pair<int, int>, std::vector<std::pair<int, SampleRange>>> peers;
  for (int s = d; s < stages; s += devices) {
    for (int f : graph.inputs_from[static_cast<size_t>(s)])
      peers[{s, f}] = overlapping_peers(plan.stages[static_cast<size_t>(f)], samples, mine);
    for (int t : graph.outputs_to[static_cast<size_t>(s)])
      peers[{s, t}] = overlapping_peers(plan.stages[static_cast<size_t>(t)], samples, mine);
  }

  std::vector<Action> actions;
  // An action without a peer: compute, all-reduce, step; in a view it names its chunk.
  auto local = [&](ActionKind kind, int64_t mb, int s) {
    Action a;
    a.kind = kind;
    a.microbatch = mb;
    a.stage = chunked && kind != ActionKind::kStep ? s : -1;
    return a;
  };
  auto exchange = [&](ActionKind kind, int64_t mb, int s, int neighbour, int from, int to, bool gradient) {
    for (const auto& [peer, overlap] : peers[{s, neighbour}]) {
      Action a;
      a.kind = kind;
      a.microbatch = mb;
      a.peer = peer;
      a.from_stage = from;
      a.to_stage = to;
      a.gradient = gradient;
      a.samples = overlap;
      actions.push_back(a);
    }
  };
  for (const ComputeOp& op : device_op_order(plan.training.schedule, d, devices, chunks, m)) {
    const int64_t mb = op.microbatch;
    const int s = op.virtual_stage;  // this rank's stage, or in a view one of its chunks
    const std::vector<int>& from_stages = graph.inputs_from[static_cast<size_t>(s)];
    const std::vector<int>& to_stages = graph.outputs_to[static_cast<size_t>(s)];
    if (op.kind == OpKind::kForward) {
      for (int f : from_stages) exchange(ActionKind::kRecv, mb, s, f, f, s, false);
      actions.push_back(local(ActionKind::kForward, mb, s));
      for (int t : to_stages) exchange(ActionKind::kSend, mb, s, t, s, t, false);
    } else if (op.kind == OpKind::kBackwardWeight) {
      actions.push_back(local(ActionKind::kBackwardWeight, mb, s));
    } else {
      for (int t : to_stages) exchange(ActionKind::kRecv, mb, s, t, s, t, true);
      actions.push_back(local(ActionKind::kBackward, mb, s));
      for (int f : from_stages) exchange(ActionKind::kSend, mb, s, f, f, s, true);
    }
  }
  if (stage.replicas > 1)
    for (int s = d; s < stages; s += devices) actions.push_back(local(ActionKind::kAllReduce, 0, s));
  actions.push_back(local(ActionKind::kStep, 0, -1));
  return actions;
}

// --- The abstract run ------------------------------------------------------------------------------------------

namespace {

// roles[r]: what rank r holds (one stage, or in an interleaved plan's view its chunks; empty: none).
std::string describe_rank(const std::vector<std::vector<RankRole>>& roles, int rank) {
  const auto& held = roles[static_cast<size_t>(rank)];
  if (held.empty()) return "rank " + std::to_string(rank);
  std::string stages;
  for (const RankRole& role : held) stages += (stages.empty() ? "" : "/") + std::to_string(role.stage);
  return "rank " + std::to_string(rank) + " (stage " + stages + " replica " + std::to_string(held.front().replica) + ")";
}

[[noreturn]] void schedule_broken(const std::string& message) {
  throw_error(ErrorKind::kInternal, "schedule check: " + message);
}

}  // namespace

void check_schedule(const PlanDocument& plan, const std::vector<std::vector<Action>>& actions) {
  if (needs_view(plan)) return check_schedule(virtual_stage_view(plan), actions);
  check_stage_devices(plan);
  const StageEdges graph(plan);
  const int world = static_cast<int>(actions.size());
  std::vector<std::vector<RankRole>> roles(actions.size());
  for (size_t s = 0; s < plan.stages.size(); ++s)
    for (size_t j = 0; j < plan.stages[s].devices.size(); ++j) {
      const int device = plan.stages[s].devices[j];
      if (device < 0 || device >= world)
        schedule_broken("stage " + std::to_string(s) + " runs on device " + std::to_string(device) + ", but there are " +
                        "action lists for ranks 0.." + std::to_string(world - 1) + " only");
      roles[static_cast<size_t>(device)].push_back(RankRole{static_cast<int>(s), static_cast<int>(j)});
    }
  auto holds = [&](int rank, int stage) {
    for (const RankRole& role : roles[static_cast<size_t>(rank)])
      if (role.stage == stage) return true;
    return false;
  };
  for (int r = 0; r < world; ++r)
    if (roles[static_cast<size_t>(r)].empty() && !actions[static_cast<size_t>(r)].empty())
      schedule_broken("rank " + std::to_string(r) + " is in no stage but has " +
                      std::to_string(actions[static_cast<size_t>(r)].size()) + " actions");

  // A message's sender and receiver must sit in the stages it flows between (gradients flow back, to → from).
  auto check_endpoints = [&](int rank, const Action& a) {
    auto what = [&] { return describe_rank(roles, rank) + "'s '" + to_string(a) + "'"; };
    // A rank sends to itself only between two of its chunks (a value a chunk reads from one v·P chunks back).
    if (a.peer < 0 || a.peer >= world || (a.peer == rank && roles[static_cast<size_t>(rank)].size() < 2) ||
        roles[static_cast<size_t>(a.peer)].empty())
      schedule_broken(what() + " names a peer that is no other rank of the plan");
    const bool sending = a.kind == ActionKind::kSend;
    const int src = sending ? rank : a.peer, dst = sending ? a.peer : rank;
    const int src_stage = a.gradient ? a.to_stage : a.from_stage, dst_stage = a.gradient ? a.from_stage : a.to_stage;
    if (!holds(src, src_stage) || !holds(dst, dst_stage))
      schedule_broken(what() + " goes from " + describe_rank(roles, src) + " to " + describe_rank(roles, dst) +
                      ", not from stage " + std::to_string(src_stage) + " to stage " + std::to_string(dst_stage));
    if (graph.index(a.from_stage, a.to_stage) < 0) schedule_broken(what() + " is along no stage edge of the plan");
    if (a.samples.begin < 0 || a.samples.begin >= a.samples.end) schedule_broken(what() + " carries no samples");
  };

  std::map<std::tuple<int, int, int64_t>, std::deque<Action>> in_transit;  // (src, dst, tag) → sends, oldest first
  std::vector<size_t> cursor(actions.size(), 0);
  std::vector<int64_t> allreduces_done(actions.size(), 0), steps_done(actions.size(), 0);
  std::vector<int> everyone;
  for (const PlanStageRecord& stage : plan.stages) everyone.insert(everyone.end(), stage.devices.begin(), stage.devices.end());
  // A collective (the n-th of its kind on this rank) completes once every member of `group` has reached its n-th.
  auto collective_ready = [&](const std::vector<int>& group, const std::vector<int64_t>& done, ActionKind kind, int rank) {
    const int64_t n = done[static_cast<size_t>(rank)];
    for (int q : group) {
      const size_t qi = static_cast<size_t>(q);
      if (done[qi] > n) continue;
      if (done[qi] < n || cursor[qi] >= actions[qi].size() || actions[qi][cursor[qi]].kind != kind) return false;
    }
    return true;
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < world; ++r) {
      const size_t ri = static_cast<size_t>(r);
      const std::vector<Action>& list = actions[ri];
      while (cursor[ri] < list.size()) {
        const Action& a = list[cursor[ri]];
        bool done = true;
        switch (a.kind) {
          case ActionKind::kForward:
          case ActionKind::kBackward:
          case ActionKind::kBackwardWeight:
            break;
          case ActionKind::kSend:
            check_endpoints(r, a);
            in_transit[{r, a.peer, graph.tag(a)}].push_back(a);
            break;
          case ActionKind::kRecv: {
            check_endpoints(r, a);
            auto it = in_transit.find({a.peer, r, graph.tag(a)});
            if (it == in_transit.end() || it->second.empty()) {
              done = false;
              break;
            }
            const Action& sent = it->second.front();
            if (sent.microbatch != a.microbatch || sent.from_stage != a.from_stage || sent.to_stage != a.to_stage ||
                sent.gradient != a.gradient || sent.samples != a.samples)
              schedule_broken(describe_rank(roles, r) + "'s '" + to_string(a) + "' meets " +
                              describe_rank(roles, a.peer) + "'s '" + to_string(sent) + "' with the same tag");
            it->second.pop_front();
            break;
          }
          case ActionKind::kAllReduce: {
            // Over the replicas of the chunk it names (in a view; every chunk of a rank has the same replicas).
            const int stage = a.stage >= 0 ? a.stage : roles[ri].front().stage;
            if (!holds(r, stage)) schedule_broken(describe_rank(roles, r) + "'s '" + to_string(a) + "' names a stage it does not hold");
            done = collective_ready(plan.stages[static_cast<size_t>(stage)].devices, allreduces_done,
                                    ActionKind::kAllReduce, r);
            if (done) ++allreduces_done[ri];
            break;
          }
          case ActionKind::kStep:
            done = collective_ready(everyone, steps_done, ActionKind::kStep, r);
            if (done) ++steps_done[ri];
            break;
        }
        if (!done) break;
        ++cursor[ri];
        progress = true;
      }
    }
  }

  std::string stuck;
  int stuck_ranks = 0;
  for (int r = 0; r < world; ++r) {
    const size_t ri = static_cast<size_t>(r);
    if (cursor[ri] >= actions[ri].size()) continue;
    if (++stuck_ranks <= 8)
      stuck += "\n  " + describe_rank(roles, r) + " waits at action " + std::to_string(cursor[ri]) + " of " +
               std::to_string(actions[ri].size()) + ": " + to_string(actions[ri][cursor[ri]]);
  }
  if (stuck_ranks > 0)
    schedule_broken("the action lists deadlock: " + std::to_string(stuck_ranks) + " of " + std::to_string(world) +
                    " ranks cannot go on" + stuck + (stuck_ranks > 8 ? "\n  …" : ""));
  for (const auto& [key, queue] : in_transit)
    if (!queue.empty())
      schedule_broken(std::to_string(queue.size()) + " message(s) from " + describe_rank(roles, std::get<0>(key)) +
                      " to " + describe_rank(roles, std::get<1>(key)) + " are never received, the first '" +
                      to_string(queue.front()) + "'");
}

std::string to_string(const Action& action) {
  const std::string mb = "mb=" + std::to_string(action.microbatch);
  const std::string chunk = action.stage >= 0 ? "chunk " + std::to_string(action.stage) + " " : "";
  switch (action.kind) {
    case ActionKind::kForward: return "fwd " + chunk + mb;
    case ActionKind::kBackward: return "bwd " + chunk + mb;
    case ActionKind::kBackwardWeight: return "bwd-weight " + chunk + mb;
    case ActionKind::kSend:
    case ActionKind::kRecv: {
      const bool send = action.kind == ActionKind::kSend;
      return std::string(send ? "send " : "recv ") + (action.gradient ? "grad " : "act ") +
             std::to_string(action.from_stage) + "→" + std::to_string(action.to_stage) + " " + mb + " [" +
             std::to_string(action.samples.begin) + "," + std::to_string(action.samples.end) + ") " +
             (send ? "to" : "from") + " rank " + std::to_string(action.peer);
    }
    case ActionKind::kAllReduce: return action.stage >= 0 ? "allreduce chunk " + std::to_string(action.stage) : "allreduce";
    case ActionKind::kStep: return "step";
  }
  return "?";
}

}  // namespace apart
