// The timeline's Chrome trace: the one writer and the one reader (see trace.h).
#include "plan/trace.h"

#include <cmath>
#include <fstream>
#include <map>
#include <tuple>

#include "graph/atomic_file.h"
#include "graph/checked.h"
#include "graph/error.h"
#include "graph/json_reader.h"

namespace apart {
namespace {

constexpr int kComputeThread = 0, kSendThread = 1, kRecvThread = 2;

// Microseconds rounded to whole nanoseconds: rounding is monotone, so events that touch in seconds never
// overlap after conversion (well-nested threads in the trace).
double micros(double seconds) { return static_cast<double>(std::llround(seconds * 1e9)) / 1e3; }

const char* category(TimelineKind k) {
  switch (k) {
    case TimelineKind::kForward: return "forward";
    case TimelineKind::kBackward: return "backward";
    case TimelineKind::kBackwardWeight: return "backward_weight";
    case TimelineKind::kSend:
    case TimelineKind::kRecv: return "p2p";
    case TimelineKind::kAllReduce: return "allreduce";
    case TimelineKind::kStep: return "step";
  }
  return "?";
}

bool is_transfer(TimelineKind k) { return k == TimelineKind::kSend || k == TimelineKind::kRecv; }

// What a send and its receive share, seen from the sender: (sender, receiver, sending stage, its virtual stage,
// receiving virtual stage, micro-batch, direction, step).
using TransferKey = std::tuple<int, int, int, int, int, int64_t, bool, int64_t>;
TransferKey transfer_key(const TimelineEvent& e) {
  if (e.kind == TimelineKind::kSend)
    return {e.process, e.peer_process, e.stage, e.virtual_stage, e.peer_virtual_stage, e.microbatch, e.gradient, e.step};
  return {e.peer_process, e.process, e.peer_stage, e.peer_virtual_stage, e.virtual_stage, e.microbatch, e.gradient, e.step};
}

}  // namespace

std::string action_name(TimelineKind kind, int stage, int virtual_stage, int64_t microbatch, bool gradient) {
  const std::string mb = std::to_string(microbatch), v = std::to_string(virtual_stage);
  switch (kind) {
    case TimelineKind::kForward: return v + "F" + mb;
    case TimelineKind::kBackward: return v + "B" + mb;
    case TimelineKind::kBackwardWeight: return v + "W" + mb;
    case TimelineKind::kSend: return v + (gradient ? "SEND_B" : "SEND_F") + mb;
    case TimelineKind::kRecv: return v + (gradient ? "RECV_B" : "RECV_F") + mb;
    case TimelineKind::kAllReduce: return std::to_string(stage) + "REDUCE_GRAD";
    case TimelineKind::kStep: return std::to_string(stage) + "STEP";
  }
  return "?";
}

std::string action_name(const TimelineEvent& e) {
  return action_name(e.kind, e.stage, e.virtual_stage, e.microbatch, e.gradient);
}

nlohmann::ordered_json timeline_to_chrome_trace(const Timeline& t) {
  using json = nlohmann::ordered_json;
  json events = json::array();
  for (const TimelineProcess& p : t.processes) {
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", p.pid}, {"tid", 0}, {"args", {{"name", p.name}}}});
    events.push_back(
        {{"ph", "M"}, {"name", "process_sort_index"}, {"pid", p.pid}, {"tid", 0}, {"args", {{"sort_index", p.sort_index}}}});
    const char* threads[] = {"compute", "send", "recv"};
    for (int th = 0; th < 3; ++th)
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", p.pid}, {"tid", th}, {"args", {{"name", threads[th]}}}});
  }
  // Transfers whose other side has not been written yet, by their shared key.
  std::map<TransferKey, const TimelineEvent*> unmatched;
  int flow_id = 0;
  for (const TimelineEvent& e : t.events) {
    const double ts = micros(e.start_s);
    const double dur = micros(e.end_s) - ts;
    json args = {{"stage", e.stage}};
    if (e.replica >= 0) args["replica"] = e.replica;
    args["virtual_stage"] = e.virtual_stage;
    if (e.microbatch >= 0) args["microbatch"] = e.microbatch;
    if (e.step > 0) args["step"] = e.step;
    const int tid = e.kind == TimelineKind::kSend ? kSendThread : e.kind == TimelineKind::kRecv ? kRecvThread : kComputeThread;
    if (is_transfer(e.kind)) {
      args["bytes"] = e.bytes;
      args[e.kind == TimelineKind::kSend ? "to_stage" : "from_stage"] = e.peer_stage;
      args["peer_virtual_stage"] = e.peer_virtual_stage;
      args["peer_pid"] = e.peer_process;
    }
    events.push_back({{"ph", "X"}, {"name", action_name(e)}, {"cat", category(e.kind)}, {"pid", e.process}, {"tid", tid},
                      {"ts", ts}, {"dur", dur}, {"args", args}});
    if (!is_transfer(e.kind)) continue;
    const TransferKey key = transfer_key(e);
    auto [it, inserted] = unmatched.emplace(key, &e);
    if (inserted || it->second->kind == e.kind) continue;  // the first side, or a repeat of the same side
    const TimelineEvent& send = e.kind == TimelineKind::kSend ? e : *it->second;
    const TimelineEvent& recv = e.kind == TimelineKind::kRecv ? e : *it->second;
    unmatched.erase(it);
    const int id = ++flow_id;
    const char* name = e.gradient ? "grad" : "act";
    events.push_back({{"ph", "s"}, {"name", name}, {"cat", "p2p"}, {"id", id}, {"pid", send.process}, {"tid", kSendThread},
                      {"ts", micros(send.start_s)}});
    events.push_back({{"ph", "f"}, {"bp", "e"}, {"name", name}, {"cat", "p2p"}, {"id", id}, {"pid", recv.process},
                      {"tid", kRecvThread}, {"ts", micros(recv.start_s)}});
  }
  for (const MemorySample& m : t.memory)
    events.push_back({{"ph", "C"}, {"name", "memory"}, {"pid", m.process}, {"ts", micros(m.time_s)}, {"args", {{"bytes", m.bytes}}}});
  json trace;
  trace["displayTimeUnit"] = "ms";
  trace["traceEvents"] = events;
  trace["otherData"] = {{"generator", t.generator}, {"plan", t.plan}, {"schedule", t.schedule}, {"iteration_s", t.iteration_s}};
  return trace;
}

void write_timeline(const std::filesystem::path& path, const Timeline& timeline) {
  write_file_atomically(path, timeline_to_chrome_trace(timeline).dump() + "\n");
}

Timeline timeline_from_chrome_trace(const nlohmann::json& j, const std::string& source) {
  const JsonReader r(source, "Chrome trace of apart simulate/run --trace", "docs/simulator.md", JsonReader::Null::kInvalid,
                     ErrorKind::kInvalidArgument,
                     "pass a trace that `apart run --trace` or `apart simulate --trace` wrote");
  if (!j.is_object()) r.fail("the document", "must be a JSON object with traceEvents");
  const nlohmann::json& list = r.array(j, "", "traceEvents");
  constexpr double kMaxMicros = limits::kMaxSeconds * 1e6;
  const int64_t kMaxId = limits::kMaxDevices;
  Timeline t;
  std::map<int, size_t> process_at;  // pid → index in t.processes
  auto process = [&](int pid) -> TimelineProcess& {
    auto [it, inserted] = process_at.emplace(pid, t.processes.size());
    if (inserted) t.processes.push_back({pid, "", 0});
    return t.processes[it->second];
  };
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& e = list[i];
    const std::string path = "traceEvents[" + std::to_string(i) + "].";
    if (!e.is_object()) r.fail(path.substr(0, path.size() - 1), "must be an object");
    const std::string ph = r.optional_string(e, path, "ph").value_or("");
    if (ph == "M") {
      const std::string name = r.string(e, path, "name");
      if (name != "process_name" && name != "process_sort_index") continue;
      TimelineProcess& p = process(static_cast<int>(r.integer(e, path, "pid", 0, kMaxId)));
      const nlohmann::json& args = r.object(e, path, "args");
      if (name == "process_name") p.name = r.string(args, path + "args.", "name");
      else p.sort_index = static_cast<int>(r.integer(args, path + "args.", "sort_index", 0, kMaxId));
      continue;
    }
    if (ph == "C") {
      if (r.optional_string(e, path, "name").value_or("") != "memory") continue;
      MemorySample m;
      m.process = static_cast<int>(r.integer(e, path, "pid", 0, kMaxId));
      m.time_s = r.number(e, path, "ts", kMaxMicros) / 1e6;
      m.bytes = r.optional_bytes(r.object(e, path, "args"), path + "args.", "bytes").value_or(0);
      t.memory.push_back(m);
      continue;
    }
    if (ph != "X") continue;  // flows and whatever a viewer added
    const std::string cat = r.optional_string(e, path, "cat").value_or("");
    TimelineEvent ev;
    if (cat == "forward") ev.kind = TimelineKind::kForward;
    else if (cat == "backward") ev.kind = TimelineKind::kBackward;
    else if (cat == "backward_weight") ev.kind = TimelineKind::kBackwardWeight;
    else if (cat == "allreduce") ev.kind = TimelineKind::kAllReduce;
    else if (cat == "step") ev.kind = TimelineKind::kStep;
    else if (cat == "p2p") ev.kind = TimelineKind::kSend;  // or kRecv: by the thread below
    else continue;
    ev.process = static_cast<int>(r.integer(e, path, "pid", 0, kMaxId));
    const double ts = r.number(e, path, "ts", kMaxMicros);
    const double dur = r.number(e, path, "dur", kMaxMicros);
    ev.start_s = ts / 1e6;
    ev.end_s = (ts + dur) / 1e6;
    const nlohmann::json& args = r.object(e, path, "args");
    const std::string apath = path + "args.";
    ev.stage = static_cast<int>(r.integer(args, apath, "stage", 0, kMaxId));
    ev.replica = static_cast<int>(r.optional_integer(args, apath, "replica", 0, kMaxId).value_or(-1));
    ev.virtual_stage = static_cast<int>(r.optional_integer(args, apath, "virtual_stage", 0, kMaxId).value_or(ev.stage));
    ev.microbatch = r.optional_integer(args, apath, "microbatch", 0, limits::kMaxBatch).value_or(-1);
    ev.step = r.optional_integer(args, apath, "step", 1, limits::kMaxSteps).value_or(0);
    if (cat == "p2p") {
      const int64_t tid = r.integer(e, path, "tid", kSendThread, kRecvThread);
      ev.kind = tid == kSendThread ? TimelineKind::kSend : TimelineKind::kRecv;
      if (ev.microbatch < 0) r.fail(apath + "microbatch", "is missing (a transfer belongs to a micro-batch)");
      ev.bytes = r.optional_bytes(args, apath, "bytes").value_or(0);
      ev.peer_stage = static_cast<int>(
          r.integer(args, apath, ev.kind == TimelineKind::kSend ? "to_stage" : "from_stage", 0, kMaxId));
      ev.peer_virtual_stage =
          static_cast<int>(r.optional_integer(args, apath, "peer_virtual_stage", 0, kMaxId).value_or(ev.peer_stage));
      ev.peer_process = static_cast<int>(r.optional_integer(args, apath, "peer_pid", 0, kMaxId).value_or(-1));
      const std::string name = r.string(e, path, "name");
      ev.gradient = name.find("_B") != std::string::npos;
    } else if ((ev.kind == TimelineKind::kForward || ev.kind == TimelineKind::kBackward ||
                ev.kind == TimelineKind::kBackwardWeight) && ev.microbatch < 0) {
      r.fail(apath + "microbatch", "is missing (a forward or backward runs one micro-batch)");
    }
    t.events.push_back(ev);
  }
  if (t.events.empty())
    r.fail("traceEvents", "holds no forward, backward, transfer, all-reduce or step event");
  if (j.contains("otherData")) {
    const nlohmann::json& other = r.object(j, "", "otherData");
    t.generator = r.optional_string(other, "otherData.", "generator").value_or("");
    t.plan = r.optional_string(other, "otherData.", "plan").value_or("");
    t.schedule = r.optional_string(other, "otherData.", "schedule").value_or("");
    t.iteration_s = r.optional_seconds(other, "otherData.", "iteration_s").value_or(0);
  }
  return t;
}

Timeline read_timeline(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw SystemError("cannot read the trace " + path.string() + ": check the path");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw InvalidArgument(path.string() + " is not JSON: pass a trace that `apart run --trace` or `apart simulate --trace` wrote");
  return timeline_from_chrome_trace(j, path.string());
}

}  // namespace apart
