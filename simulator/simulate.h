// Discrete-event replay of one training iteration of a plan: compute, point-to-point transfers on
// send/receive channels, gradient all-reduce and optimizer step; busy/idle, bubble, memory, critical path.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "schedule/schedule.h"
#include "simulator/sim_plan.h"

namespace apart::sim {

struct SimOptions {
  std::optional<Schedule> schedule;  // default: the plan's training.schedule
  int virtual_stages = 0;            // chunks per device for interleaved; 0: the plan's, or 2
  std::optional<bool> recompute;     // default: each stage's plan value
  // The optimizer step after the all-reduce, on every stage; default: each stage's optimizer_s (0 where the plan
  // has none).
  std::optional<double> optimizer_step_s;
  bool communication = true;         // false: transfers take no time (for what-if comparisons)
};

// kBackward is the whole backward, or ZB-H1's input-gradient pass B, whose weight-gradient pass is kBackwardWeight.
enum class EventKind { kForward, kBackward, kTransfer, kAllReduce, kStep, kBackwardWeight };

// One timed event. A transfer occupies the sender's send channel and the receiver's recv channel together.
struct SimEvent {
  EventKind kind = EventKind::kForward;
  int stage = 0;          // pipeline position (plan stage; the device group that runs it)
  int virtual_stage = 0;  // = stage unless interleaved
  int64_t microbatch = -1;
  // Transfers only: receiving pipeline position / virtual stage; gradient = a backward transfer.
  int peer_stage = -1;
  int peer_virtual_stage = -1;
  bool gradient = false;
  double bytes = 0;
  double start_s = 0;
  double end_s = 0;
  int critical_predecessor = -1;  // the event whose end fixed this one's start; -1: started at 0

  // torch.distributed.pipelining action names: "2F0", "3B1", "3W1", "1SEND_F0", "2RECV_F0", "2REDUCE_GRAD", "2STEP".
  std::string name() const;
  std::string receive_name() const;  // transfers: the receiver's side
};

struct StageStats {
  int stage = 0;
  std::vector<int> devices;
  double forward_s = 0;  // per micro-batch, all chunks together
  double backward_s = 0; // per micro-batch, including recomputation
  double busy_s = 0;     // Σ forward + backward over the iteration
  double allreduce_s = 0;
  double step_s = 0;
  double idle_s = 0;     // iteration − busy − all-reduce − step
  double send_s = 0;     // time its send channel was busy
  double recv_s = 0;
  int64_t peak_in_flight = 0;  // micro-batches (× chunks when interleaved) whose activations are held at once
  double memory_static_bytes = 0;
  double activation_bytes_per_microbatch = 0;  // per micro-batch of the whole stage (all chunks)
  double peak_memory_bytes = 0;
  std::vector<std::pair<double, double>> memory_timeline;  // (time s, bytes) after each change
};

struct SimResult {
  Schedule schedule = Schedule::k1F1B;
  int virtual_stages = 1;
  int64_t microbatches = 0;
  bool recompute = false;  // any stage recomputes
  double iteration_s = 0;
  double pipeline_s = 0;        // end of the last backward (before all-reduce and step)
  double bubble_fraction = 0;   // 1 − Σ busy / (stages · pipeline_s)
  std::vector<StageStats> stages;
  std::vector<SimEvent> events;  // in start order
  std::vector<int> critical_path;  // event indices from the first to the one that ends last
  std::string memory_note;         // how activation bytes per micro-batch were obtained
  std::string links_source;
};

// Forward and backward operations one replay runs (2 × micro-batches × stages × chunks); simulate() refuses a plan
// above limits::kMaxSimulatedOps with Infeasible, saying what it would need, before it allocates anything.
int64_t simulated_operations(const SimPlan& plan, int chunks);
void check_simulation_size(const SimPlan& plan, int chunks);

SimResult simulate(const SimPlan& plan, const SimOptions& options = {});

}  // namespace apart::sim
