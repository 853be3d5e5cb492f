// apart run's stage-boundary messages as buffers of one memory, host or device, over a communicator that moves that
// memory: each message is packed and unpacked with one copy per contiguous run of rows. On the host (MPI, threads)
// each send is posted at once; over a communicator that moves device buffers (NCCL) each send is deferred and posted
// in one group with the rank's next receive, so that NCCL's one serialized stream cannot deadlock two neighbours that
// each send first (runtime/nccl_host.h group_stream_ops; tested over every schedule apart run runs).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/backend.h"
#include "runtime/communicator.h"
#include "runtime/tensor.h"

namespace apart {

// A contiguous run of bytes of a tensor: where it starts, and how long it is.
struct ByteRun {
  int64_t offset = 0;
  int64_t bytes = 0;
};
// The runs of rows [row0, row0 + rows) along an axis of `dim` rows, under `outer` leading blocks, each row
// `row_bytes` long (a batch slice of a row-major tensor): outer runs of rows · row_bytes.
std::vector<ByteRun> row_runs(int64_t outer, int64_t dim, int64_t row0, int64_t rows, int64_t row_bytes);

// When a send is posted: at once (host messages), or with the next receive as one group (NCCL).
enum class Posting : uint8_t { kAtOnce, kGroupedWithNextReceive };

class MessageTransport {
 public:
  // `comm` moves `memory`'s tensors (the host's: MPI or the in-process world; a device's: an NCCL communicator over
  // the world, in tests any communicator with a device in host memory). Both outlive this.
  MessageTransport(Communicator& comm, Backend& memory, Posting posting)
      : comm_(comm), memory_(memory), posting_(posting) {}

  Backend& memory() const { return memory_; }
  // A zeroed message buffer of `bytes` in `memory`: float32 elements when `bytes` is a multiple of 4 (so that
  // gradients are summed out of it), else bytes.
  Tensor buffer(int64_t bytes) {
    return bytes % 4 == 0 ? memory_.empty(DType::kFloat32, {bytes / 4}) : memory_.empty(DType::kUInt8, {bytes});
  }
  // Appends `runs` of `from` (in `memory`) to `message` at `at`; returns the new end.
  int64_t pack(const Tensor& from, const std::vector<ByteRun>& runs, Tensor& message, int64_t at);
  // Copies (or, `add`, sums as float32) `message` from `at` into `runs` of `to`; returns the new position.
  int64_t unpack(const Tensor& message, int64_t at, const std::vector<ByteRun>& runs, Tensor& to, bool add);

  // Sends `message` (kept alive until it completes) to `peer`: posted now, or deferred (kGroupedWithNextReceive).
  void send(Tensor message, int peer, int tag);
  // Receives `message` from `peer` and waits for it (grouped: posted with the deferred sends).
  void recv(Tensor& message, int peer, int tag);
  // Posts what is deferred and waits for every send (the step's end).
  void finish();

 private:
  // Posts the deferred sends and `receive` (nullptr: none) as one group; waits for the receive.
  void post(const Communicator::RecvPart* receive);
  struct Deferred {
    Tensor message;
    int peer = -1, tag = 0;
  };
  Communicator& comm_;
  Backend& memory_;
  Posting posting_;
  std::vector<Deferred> deferred_;
  std::vector<std::pair<Tensor, Pending>> in_flight_;
};

}  // namespace apart
