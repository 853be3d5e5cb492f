// The timeline of training steps, simulated or measured, and its one file format: the Chrome trace that
// `apart simulate --trace` and `apart run --trace` write and `apart simulate --compare` reads (docs/simulator.md §Trace).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace apart {

// kBackwardWeight: ZB-H1's weight-gradient pass ("W" in torch.distributed.pipelining's action names).
enum class TimelineKind { kForward, kBackward, kSend, kRecv, kAllReduce, kStep, kBackwardWeight };

// One timed action of one process. A transfer is two events: the sender's kSend and the receiver's kRecv (the
// simulator gives both the transfer's time; the runtime measures posting the send and waiting for the receive).
struct TimelineEvent {
  TimelineKind kind = TimelineKind::kForward;
  int process = 0;         // the trace's pid: the runtime's rank; the simulator's stage's first device
  int stage = 0;
  int replica = -1;        // -1: the event stands for every replica of the stage (the simulator replays a stage once)
  int virtual_stage = 0;   // = stage unless interleaved
  int64_t microbatch = -1; // -1: none (all-reduce, step)
  int64_t step = 0;        // 1-based step of a measured run, as its log prints it; 0: the simulator's one iteration
  double start_s = 0;      // from the timeline's origin (the runtime: a world barrier before the first step)
  double end_s = 0;
  // kSend/kRecv only: bytes moved, the stage/virtual stage/process at the other end, gradients (going back) or
  // activations (going forward).
  double bytes = 0;
  int peer_stage = -1;
  int peer_virtual_stage = -1;
  int peer_process = -1;
  bool gradient = false;
  bool operator==(const TimelineEvent&) const = default;
};

struct TimelineProcess {
  int pid = 0;
  std::string name;  // "stage 1 (device 2)", "stage 0 replica 1 (rank 1)"
  int sort_index = 0;
  bool operator==(const TimelineProcess&) const = default;
};

struct MemorySample {
  int process = 0;
  double time_s = 0;
  double bytes = 0;
  bool operator==(const MemorySample&) const = default;
};

struct Timeline {
  std::string generator;  // "apart simulate", "apart run"
  std::string plan;
  std::string schedule;
  double iteration_s = 0;  // the simulated iteration; a run: its last recorded step
  std::vector<TimelineProcess> processes;
  std::vector<TimelineEvent> events;  // in any order; the writer keeps it
  std::vector<MemorySample> memory;   // the simulator's memory counter per stage; a run has none
  bool operator==(const Timeline&) const = default;
};

// torch.distributed.pipelining's action names, one rule for the simulator and the runtime: "2F0", "3B1",
// "1SEND_F0", "2RECV_B0" (the virtual stage of the process the event is on), "2REDUCE_GRAD", "2STEP".
std::string action_name(TimelineKind kind, int stage, int virtual_stage, int64_t microbatch, bool gradient);
std::string action_name(const TimelineEvent& event);

// The Chrome trace event format (opens in https://ui.perfetto.dev): per process its name and sort index and threads
// compute (tid 0: forward, backward, all-reduce, step), send (1) and recv (2); one complete ("X") event per timeline
// event, in µs rounded to whole ns (monotone, so events that touch never overlap), cat forward/backward/allreduce/
// step/p2p, args stage, [replica], virtual_stage, [microbatch], [step], and for p2p bytes, to_stage (a send) or
// from_stage (a receive), peer_virtual_stage and peer_pid; a flow arrow from each send to the receive that matches
// it (same processes, stages, virtual stages, micro-batch, direction and step), right after the later of the two;
// "C" events "memory"; otherData generator, plan, schedule, iteration_s.
nlohmann::ordered_json timeline_to_chrome_trace(const Timeline& timeline);
// Writes the trace through a temporary file and a rename; SystemError naming the file.
void write_timeline(const std::filesystem::path& path, const Timeline& timeline);

// The one reader: what timeline_to_chrome_trace wrote (other phases and categories are skipped, so a trace that a
// viewer re-saved still reads). Throws InvalidArgument naming `source` and the field when the document is not a
// trace, or a field is of the wrong type or out of range (pids and stages in [0, 2^20], micro-batches in [0, 2^24],
// times in [0, a year] µs ≥ 0, bytes in [0, 2^60]), or it holds no event; SystemError when the file is unreadable.
Timeline timeline_from_chrome_trace(const nlohmann::json& trace, const std::string& source = "trace");
Timeline read_timeline(const std::filesystem::path& path);

}  // namespace apart
