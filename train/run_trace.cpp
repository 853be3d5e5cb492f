// Timeline events of `apart run` and their gather to rank 0 (see run_trace.h).
#include "train/run_trace.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <span>

#include "graph/error.h"

namespace apart {
namespace {

// Tags of the gather, above every action tag (which the steps have finished with) and save_model's 0.
constexpr int kCountTag = Communicator::kMaxTag - 1;
constexpr int kEventsTag = Communicator::kMaxTag;
constexpr size_t kFields = 14;  // doubles per event: every integer field fits one exactly (< 2^53)

void flatten(const TimelineEvent& e, std::vector<double>& out) {
  out.insert(out.end(), {static_cast<double>(e.kind), static_cast<double>(e.process), static_cast<double>(e.stage),
                         static_cast<double>(e.replica), static_cast<double>(e.virtual_stage),
                         static_cast<double>(e.microbatch), static_cast<double>(e.step), e.start_s, e.end_s, e.bytes,
                         static_cast<double>(e.peer_stage), static_cast<double>(e.peer_virtual_stage),
                         static_cast<double>(e.peer_process), e.gradient ? 1.0 : 0.0});
}

TimelineEvent unflatten(const double* f) {
  TimelineEvent e;
  e.kind = static_cast<TimelineKind>(static_cast<int>(f[0]));
  e.process = static_cast<int>(f[1]);
  e.stage = static_cast<int>(f[2]);
  e.replica = static_cast<int>(f[3]);
  e.virtual_stage = static_cast<int>(f[4]);
  e.microbatch = static_cast<int64_t>(f[5]);
  e.step = static_cast<int64_t>(f[6]);
  e.start_s = f[7];
  e.end_s = f[8];
  e.bytes = f[9];
  e.peer_stage = static_cast<int>(f[10]);
  e.peer_virtual_stage = static_cast<int>(f[11]);
  e.peer_process = static_cast<int>(f[12]);
  e.gradient = f[13] != 0.0;
  return e;
}

std::span<const std::byte> bytes_of(const auto& v) { return std::as_bytes(std::span(v)); }
std::span<std::byte> bytes_of(auto& v) { return std::as_writable_bytes(std::span(v)); }

}  // namespace

TimelineEvent action_event(const Action& a, const RankRole& role, int rank, int64_t step, double start_s, double end_s,
                           double bytes, int positions) {
  const bool message = a.kind == ActionKind::kSend || a.kind == ActionKind::kRecv;
  // The stage (chunk) this end of the action is: activations leave from_stage, their gradients leave to_stage.
  const int chunk = a.stage >= 0 ? a.stage
                    : message    ? ((a.kind == ActionKind::kSend) != a.gradient ? a.from_stage : a.to_stage)
                                 : role.stage;
  TimelineEvent e;
  e.process = rank;
  e.stage = role.stage;
  e.replica = role.replica;
  e.virtual_stage = positions > 0 ? chunk : role.stage;
  e.step = step + 1;
  e.start_s = start_s;
  e.end_s = end_s;
  switch (a.kind) {
    case ActionKind::kForward: e.kind = TimelineKind::kForward; break;
    case ActionKind::kBackward: e.kind = TimelineKind::kBackward; break;
    case ActionKind::kBackwardWeight: e.kind = TimelineKind::kBackwardWeight; break;
    case ActionKind::kSend: e.kind = TimelineKind::kSend; break;
    case ActionKind::kRecv: e.kind = TimelineKind::kRecv; break;
    case ActionKind::kAllReduce: e.kind = TimelineKind::kAllReduce; break;
    case ActionKind::kStep: e.kind = TimelineKind::kStep; break;
  }
  if (a.kind != ActionKind::kAllReduce && a.kind != ActionKind::kStep) e.microbatch = a.microbatch;
  if (a.kind == ActionKind::kSend || a.kind == ActionKind::kRecv) {
    // Activations flow from_stage → to_stage, their gradients back: the other end is whichever stage is not ours.
    e.peer_virtual_stage = a.from_stage == chunk ? a.to_stage : a.from_stage;
    e.peer_stage = positions > 0 ? e.peer_virtual_stage % positions : e.peer_virtual_stage;
    e.peer_process = a.peer;
    e.gradient = a.gradient;
    e.bytes = bytes;
  }
  return e;
}

size_t gather_and_write_trace(Communicator& world, const PlanDocument& plan, const std::string& plan_source,
                              const std::vector<TimelineEvent>& mine, const std::string& path) {
  std::vector<double> flat;
  flat.reserve(mine.size() * kFields);
  for (const TimelineEvent& e : mine) flatten(e, flat);
  if (world.rank() != 0) {
    const std::vector<int64_t> count{static_cast<int64_t>(mine.size())};
    Pending c = world.send(bytes_of(count), 0, kCountTag);
    Pending d = world.send(bytes_of(flat), 0, kEventsTag);
    c->wait();
    d->wait();
    return 0;
  }
  Timeline t;
  t.generator = "apart run";
  t.plan = plan_source;
  t.schedule = schedule_name(plan.training.schedule);
  t.events = mine;
  for (int r = 1; r < world.size(); ++r) {
    std::vector<int64_t> count(1);
    world.recv(bytes_of(count), r, kCountTag)->wait();
    APART_CHECK(count[0] >= 0 && count[0] <= int64_t{1} << 40, "rank " + std::to_string(r) + " sent a bad trace event count");
    std::vector<double> theirs(static_cast<size_t>(count[0]) * kFields);
    world.recv(bytes_of(theirs), r, kEventsTag)->wait();
    for (size_t i = 0; i < theirs.size(); i += kFields) t.events.push_back(unflatten(theirs.data() + i));
  }
  for (int r = 0; r < world.size(); ++r) {
    const RankRole role = rank_role(plan, r);
    t.processes.push_back({r, "stage " + std::to_string(role.stage) + " replica " + std::to_string(role.replica) +
                                  (plan.stages[static_cast<size_t>(role.stage)].tp > 1 ? " tp " + std::to_string(role.tp_rank) : "") +
                                  " (rank " + std::to_string(r) + ")",
                           r});
  }
  // The last recorded step's span, from its first action on any rank to its last.
  int64_t last = 0;
  for (const TimelineEvent& e : t.events) last = std::max(last, e.step);
  double begin = std::numeric_limits<double>::infinity(), end = 0;
  for (const TimelineEvent& e : t.events)
    if (e.step == last) {
      begin = std::min(begin, e.start_s);
      end = std::max(end, e.end_s);
    }
  t.iteration_s = t.events.empty() ? 0 : end - begin;
  write_timeline(path, t);
  return t.events.size();
}

}  // namespace apart
