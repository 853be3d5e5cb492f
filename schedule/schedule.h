// What each rank of a plan does in one training step, in order: the one schedule library the simulator replays
// and the runtime executes, so that simulated and executed schedules cannot diverge.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "plan/training.h"

namespace apart {

// kBackward: the whole backward, except under ZB-H1, where it is the input-gradient pass (B) and
// kBackwardWeight the weight-gradient pass (W) that follows it later.
enum class OpKind { kForward, kBackward, kBackwardWeight };

// One compute op of a pipeline position: the forward, backward or weight-gradient pass of virtual stage
// `virtual_stage` on micro-batch `microbatch`.
struct ComputeOp {
  OpKind kind = OpKind::kForward;
  int virtual_stage = 0;
  int64_t microbatch = 0;
  bool operator==(const ComputeOp&) const = default;
};

// The order in which pipeline position `device` of `devices` runs its ops. With `chunks` = v virtual stages per
// device, device d holds virtual stages d, d + P, …, d + (v−1)·P (Megatron's layout).
//   GPipe:       all forwards, then all backwards (v = 1).
//   1F1B:        min(P − d, m) warm-up forwards, then alternate backward/forward, then the remaining backwards.
//   Interleaved: Megatron-LM's order: warm-up (P − d − 1)·2 + (v − 1)·P forwards (capped at m·v), then
//                forward/backward pairs, then backwards; micro-batches go in rounds of P per chunk.
//                Needs m to be a multiple of P (Megatron-LM's constraint); throws Unsupported otherwise.
//   ZB-H1:       1F1B's warm-up, min(P − d, m) forwards; then per micro-batch k its input-gradient pass B, from
//                k = d on the weight-gradient pass W of micro-batch k − d, and the next forward; the d deferred W
//                passes end the order, filling the drain (Qi et al., ICLR 2024 §3.1). F < B < W per micro-batch;
//                at most min(P, m) micro-batches between their forward and their W (v = 1).
std::vector<ComputeOp> device_op_order(Schedule schedule, int device, int devices, int chunks, int64_t microbatches);

// Where a rank sits in the plan: stage `stage`'s replica `replica`, and within a tensor-parallel stage the rank
// `tp_rank` of its TP group (plan.stages[stage].devices[replica · tp + tp_rank] == rank).
struct RankRole {
  int stage = 0;
  int replica = 0;
  int tp_rank = 0;
};
// InvalidArgument when `rank` is not one of the plan's devices.
RankRole rank_role(const PlanDocument& plan, int rank);

// The pipeline TP rank `tp_rank` runs: each stage with tp 1 and, per replica, the device of its TP rank
// tp_rank mod its degree (a stage of one degree: that TP rank's). The TP ranks of a replica then run the same actions,
// each with its own counterparts in the neighbouring stages (every boundary value is whole on every TP rank). The plan
// itself when no stage is TP. Between stages of different degrees t and t' (docs/runtime.md "Stages of different TP
// degrees"), TP rank k of the receiving stage takes a value (activation or gradient) from TP rank k mod t of the
// sending one, which is what the view's receives name; rank_actions spreads each send over tp_send_targets.
PlanDocument tensor_parallel_view(const PlanDocument& plan, int tp_rank);
// The largest TP degree of any stage (1 without TP).
int max_tp_degree(const PlanDocument& plan);
// The TP ranks of a stage of degree `to_degree` that TP rank `tp_rank` of a stage of degree `degree` sends a
// boundary value to: every k with k mod degree == tp_rank (its own rank between equal degrees; none from a rank at or
// above the other's degree when the sender's is larger, as rank 0 has already sent the same whole value).
std::vector<int> tp_send_targets(int degree, int tp_rank, int to_degree);

// The samples [begin, end) of a micro-batch (0-based within it) that replica `replica` of a stage with `replicas`
// replicas holds: contiguous slices, equal but for one sample (the first n mod r replicas take ⌈n/r⌉, the others
// ⌊n/r⌋; the planner costs each at ⌈n/r⌉). InvalidArgument when a replica would get no sample (n < r).
struct SampleRange {
  int64_t begin = 0;
  int64_t end = 0;
  bool operator==(const SampleRange&) const = default;
};
SampleRange replica_samples(int64_t microbatch_samples, int replicas, int replica);

// Samples in one micro-batch of the whole pipeline (each stage splits them over its replicas): training.global_batch
// / training.microbatches, else training.microbatch_size, else stages[s].microbatch_size × replicas when every stage
// agrees. InvalidArgument naming the fields when the plan gives none or they do not divide.
int64_t microbatch_samples(const PlanDocument& plan);

enum class ActionKind {
  kForward,       // run the stage's forward on micro-batch `microbatch`
  kBackward,      // run its backward on micro-batch `microbatch` (ZB-H1: its input-gradient pass B)
  kBackwardWeight,  // ZB-H1: run its weight-gradient pass W on micro-batch `microbatch` (no messages)
  kSend,          // send to `peer` the part `samples` of micro-batch `microbatch` of what flows from stage `from_stage`
  kRecv,          //   to stage `to_stage`: activations (`gradient` false) or their gradients (`gradient` true)
  kAllReduce,     // wait for the stage's gradient all-reduce over its replicas (started bucket by bucket during the
                  //   last backward; `apart partition --overlap-allreduce`)
  kStep,          // clip across all stages and replicas, step the optimizer
};

struct Action {
  ActionKind kind = ActionKind::kForward;
  int64_t microbatch = 0;
  // kSend/kRecv: the other rank, the two stages the values flow between (activations from_stage → to_stage;
  // gradients go back to_stage → from_stage), and which samples of the micro-batch.
  int peer = -1;
  int from_stage = -1;
  int to_stage = -1;
  bool gradient = false;
  SampleRange samples;
  // Interleaved plans (their virtual-stage view, plan/plan.h virtual_stage_view): the virtual stage (chunk) a compute
  // op or kAllReduce is for; -1 in every other plan, where a rank holds one stage. Sends and receives name their
  // chunks in from_stage/to_stage.
  int stage = -1;
  bool operator==(const Action&) const = default;
};

// A tag that tells two messages between the same ranks apart: unique per (microbatch, from_stage, to_stage,
// gradient) within a step, in [0, kMaxActionTag]. (mb · E + e) · 2 + gradient for the plan's E stage edges (from,
// to) in order, e the edge's index; InvalidArgument when `action` is no send/recv along an edge of the plan.
// kMaxActionTag is MPI's guaranteed MPI_TAG_UB (Communicator::kMaxTag); rank_actions refuses a plan whose tags would
// exceed it (Unsupported), so action_tag of its actions never does.
inline constexpr int kMaxActionTag = 32767;
int action_tag(const Action& action, const PlanDocument& plan);

// The actions of `rank` in one step, in order. Compute ops follow device_op_order for the rank's stage; before a
// forward come the receives of its inputs from earlier stages, after it the sends of its outputs; before a backward
// the receives of its output gradients, after it the sends of its input gradients. A stage with r replicas
// exchanges with a stage of r' replicas the overlapping sample ranges of each micro-batch. Replicated stages end
// with kAllReduce, every rank with kStep. Sends are non-blocking and receives blocking: check_schedule proves that
// this never deadlocks. Receives before an op go by from_stage (gradients: to_stage), then peer rank; sends after it
// likewise. InvalidArgument when `rank` is not in the plan or a stage has more replicas than a micro-batch has samples
// (microbatch_samples); Unsupported for plans whose tags would pass kMaxActionTag. ZB-H1's W passes are
// kBackwardWeight actions, with no messages around them. A TP rank's list is that of its TP view (an interleaved
// plan's too: the view keeps the chunks, each on its stage's devices of that TP rank), each send spread over the
// tp_send_targets of a stage of another degree.
// Interleaved plans run as their virtual-stage view (plan/plan.h): the rank holds chunks d, d + P, … of its stage d
// and runs them in Megatron-LM's order (device_op_order), each op's messages going to and from the chunks its chunk
// exchanges with (chunk c + 1 of the next device, and across the wrap from the last device to the first: chunk
// c + 1 = (j + 1)·P of device 0 after chunk j·P + P − 1); compute ops and kAllReduce name their chunk in
// Action::stage, and a replicated stage ends with one kAllReduce per chunk, in chunk order.
std::vector<Action> rank_actions(const PlanDocument& plan, int rank);
// What of a plan the runtime cannot execute yet, as rank_actions refuses it: Unsupported naming a selectively
// recomputing stage; InvalidModel for an interleaved plan that lists no virtual_stages
// (re-run apart partition); nothing otherwise.
void check_executable(const PlanDocument& plan);

// Runs every rank's action list abstractly (actions[r]: rank r's; ranks the plan does not use must have none):
// sends post a message on a (src, dst, tag) queue, receives block until one is there and must match it exactly
// (micro-batch, stages, direction, samples); compute is immediate; kAllReduce completes when every replica of the
// rank's stage has reached its kAllReduce, kStep (the clip norm is global) when every rank has reached its kStep.
// Throws Internal naming the stuck ranks and their next actions when it cannot finish, when a message goes to or
// from the wrong stage, or when a send has no matching receive. An interleaved plan is checked as its virtual-stage
// view: a rank holds several chunks, and its n-th kAllReduce meets the n-th of every replica of its stage.
void check_schedule(const PlanDocument& plan, const std::vector<std::vector<Action>>& actions);

std::string to_string(const Action& action);  // "fwd mb=3", "fwd chunk 2 mb=3", "send act 0→1 mb=2 [0,4) to rank 2"

}  // namespace apart
