// The NCCL communicator's host-side logic, free of CUDA headers so that every preset builds it and the CPU tests
// cover it: the unique id's broadcast frame, the polling wait with its deadline, a request's states, and the
// matching of the sends and receives a rank posts to itself. runtime/cuda/nccl_communicator.cpp drives them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/communicator.h"

namespace apart::nccl {

// --- The unique id: made by rank 0, sent to every other rank over the bootstrap communicator ---

inline constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES (nccl_communicator.cpp static_asserts it)
using UniqueId = std::array<std::byte, kUniqueIdBytes>;
// The bootstrap tag of the id's message. Communicator construction is collective, so no other message of the
// bootstrap is in flight with it.
inline constexpr int kUniqueIdTag = Communicator::kMaxTag;

// A fixed-size frame, so that a receiver knows its size before it arrives: "apart-nccl-id" magic, frame version,
// rank 0's NCCL version and communicator size, the id, and an FNV-1a checksum of all that.
inline constexpr size_t kUniqueIdFrameBytes = 16 + 4 + 4 + 4 + kUniqueIdBytes + 8;
std::vector<std::byte> encode_unique_id_frame(const UniqueId& id, int nccl_version, int size);
// The id of a frame from rank 0. CommError naming what differs when the frame is not one (magic, length,
// checksum), or when rank 0 runs another NCCL version or counts another communicator size than this rank.
UniqueId decode_unique_id_frame(std::span<const std::byte> frame, int nccl_version, int size, int rank);

// Rank 0 calls `make_id` and sends the frame to ranks 1..size-1 (tag kUniqueIdTag); the others receive it. Every
// rank returns the id. Waits as the bootstrap's own requests wait (its CommOptions::timeout_s).
UniqueId broadcast_unique_id(Communicator& bootstrap, const std::function<UniqueId()>& make_id, int nccl_version);

// "2.28.9" of NCCL_VERSION_CODE 22809 (and 2.3.7 of the pre-2.9 code 2307).
std::string nccl_version_name(int version);

// --- Waiting with a deadline ---

// The clock a wait reads and the sleep between polls; the default is steady_clock and this_thread::sleep_for.
// Tests pass a fake one.
struct PollClock {
  std::function<double()> now_s;
  std::function<void(double)> sleep_s;
  static PollClock steady();
};

// Calls `done` until it returns true (then true), or until `timeout_s` have passed since the call (then false,
// after one last poll). Exceptions from `done` propagate. Polls back to back at first, then sleeps between polls,
// doubling from 1 µs to at most kMaxPollSleep_s, so a finished operation is seen within a millisecond and a long
// wait costs little CPU.
inline constexpr double kMaxPollSleep_s = 1e-3;
bool poll_until(const std::function<bool()>& done, double timeout_s, const PollClock& clock = PollClock::steady());

// --- One request's states ---

// What a probe of an operation found: still running, finished, or failed (`error`: NCCL's or CUDA's string).
struct Probe {
  enum class State : uint8_t { kPending, kDone, kFailed };
  State state = State::kPending;
  std::string error;
  static Probe pending() { return {}; }
  static Probe done() { return {State::kDone, {}}; }
  static Probe failed(std::string error) { return {State::kFailed, std::move(error)}; }
};

// What destroying a request must do (the Communicator contract: an incomplete request waits, except while an
// exception unwinds; NCCL cannot withdraw one operation, so then the communicator is aborted: no kernel writes
// into a buffer that may be freed, and later calls throw CommError).
enum class OnDestroy : uint8_t { kNothing, kWait, kAbortCommunicator };

// The pure part of an NCCL request: pending → complete, or pending → failed (for good: every later wait() or
// test() rethrows the same CommError). A timeout calls `abort_communicator` once and fails naming the operation.
class RequestTracker {
 public:
  enum class Phase : uint8_t { kPending, kComplete, kFailed };
  RequestTracker(std::string what, double timeout_s) : what_(std::move(what)), timeout_s_(timeout_s) {}

  // Polls `probe` until done (returns), failed or timed out (throw CommError).
  void wait(const std::function<Probe()>& probe, const std::function<void()>& abort_communicator,
            const PollClock& clock = PollClock::steady());
  // One probe: whether complete; throws CommError when it failed.
  bool test(const std::function<Probe()>& probe);
  OnDestroy on_destroy(bool unwinding) const;

  Phase phase() const { return phase_; }
  const std::string& what() const { return what_; }

 private:
  [[noreturn]] void fail(std::string message);
  void throw_if_failed() const;

  std::string what_;
  double timeout_s_;
  Phase phase_ = Phase::kPending;
  std::string failure_;
};

// --- Messages a rank sends to itself ---

// NCCL pairs a send to self with its receive only inside one group (ncclGroupStart … ncclGroupEnd), while the
// Communicator interface posts them one at a time. The mailbox holds each until its match is posted, matched by
// tag in posting order (MPI's rule, as the in-process communicator does); the communicator then issues the pair.
class SelfMailbox {
 public:
  struct Match {
    uint64_t send_id = 0, recv_id = 0;
    size_t send_bytes = 0, recv_bytes = 0;
  };
  // `id` names the request; the result is the match when the other side was waiting.
  std::optional<Match> post_send(int tag, uint64_t id, size_t bytes);
  std::optional<Match> post_recv(int tag, uint64_t id, size_t bytes);
  // Takes back an unmatched send or receive (its request is destroyed while unwinding); no-op when matched.
  void withdraw(uint64_t id);
  size_t unmatched() const;

 private:
  struct Posted {
    uint64_t id = 0;
    size_t bytes = 0;
  };
  std::map<int, std::deque<Posted>> sends_, recvs_;  // by tag, in posting order
};

// --- Point-to-point on one serialized stream (apart run's stage boundaries over NCCL) ---

// NCCL runs a rank's operations one after another on its communication stream, and a send waits for its receive
// (rendezvous). Posted one at a time, two neighbours deadlock: in 1F1B's steady state stage s sends micro-batch k+1's
// activation and then waits for k's gradient, while s+1 sends k's gradient and then waits for k+1's activation; each
// send sits in front of the receive that would release the other. So apart run defers each send and posts it in one
// group (ncclGroupStart … ncclGroupEnd) with the rank's next receive, as Megatron-LM's send_forward_recv_backward
// pairs them; a collective (a bucket's all-reduce over the stage's replicas) keeps its place between groups.
struct StreamOp {
  enum class Kind : uint8_t { kSend, kRecv, kCollective };
  Kind kind = Kind::kSend;
  int peer = -1;   // kSend/kRecv: the other rank
  int group = -1;  // kCollective: the communicator (every member posts its collectives in one order)
};
// One launch on the stream: a group of sends and receives, or one collective (indices into the rank's ops).
struct StreamItem {
  std::vector<size_t> ops;
};
// A rank's ops, in the order it reaches them, as stream items: each receive in one group with every send deferred
// since the previous group (sends first); a collective alone, where it is (deferred sends stay deferred); the sends
// after the last receive in one last group (the step's end posts them).
std::vector<StreamItem> group_stream_ops(const std::vector<StreamOp>& ops);
// The ranks that never finish when rank r runs items[r] (of ops[r]) in order on one stream, under rendezvous: the k-th
// send from a to b matches b's k-th receive from a and moves only while both their items are current; a collective
// of group g moves only while it is the current item of every member of g (members[g]; matched by order). A current
// item ends when all its ops moved. Empty: every rank finishes (no deadlock). An unmatched send or receive, or a
// collective a member never posts, leaves its ranks stuck too.
std::vector<int> stuck_ranks(const std::vector<std::vector<StreamOp>>& ops,
                             const std::vector<std::vector<StreamItem>>& items,
                             const std::map<int, std::vector<int>>& members);

}  // namespace apart::nccl
