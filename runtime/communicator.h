// How ranks talk: point-to-point messages, all-reduce over a group, barrier and abort, behind one interface with
// two implementations: in-process (one thread per rank, for tests without mpirun) and MPI (`mpirun -np N`).
// Only runtime/ touches MPI; the GPU backend adds NCCL behind the same interface (issue 14).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graph/error.h"

namespace apart {

// A peer failed, the communicator was aborted, or a wait ran past CommOptions::timeout_s. Every rank's pending
// and later calls throw it once any rank aborts, so a failure anywhere ends the run everywhere.
class CommError : public Error {
 public:
  explicit CommError(const std::string& m) : Error(ErrorKind::kSystemError, m) {}
};

struct CommOptions {
  double timeout_s = 300;  // a wait longer than this throws CommError naming the operation and the peer
};

// A non-blocking operation in flight. wait() returns when it is complete (the buffer may be reused or read);
// test() says whether it is, and advances progress. Destroying an incomplete request waits for it, except while
// an exception unwinds: then a receive is cancelled and a send or collective abandoned (no later write into the
// buffer in-process; over MPI only abort() is safe after that), so an error path cannot hang on a dead peer.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};
using Pending = std::unique_ptr<CommRequest>;

// One thread at a time uses a communicator (MPI: MPI_THREAD_FUNNELED, the thread that made it).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // in this communicator
  virtual int size() const = 0;

  // Non-blocking point-to-point, matched by (peer, tag) in posting order (MPI semantics). The buffer must stay
  // alive and untouched until the request completes. `tag` in [0, kMaxTag].
  static constexpr int kMaxTag = 32767;
  virtual Pending send(std::span<const std::byte> data, int peer, int tag) = 0;
  virtual Pending recv(std::span<std::byte> data, int peer, int tag) = 0;
  // Sends and receives posted as one group: a transport that runs its operations one after another and makes a send
  // wait for its receive (NCCL: ncclGroupStart … ncclGroupEnd) runs them together, so that two ranks that each send
  // to the other before receiving do not wait on each other (runtime/nccl_host.h group_stream_ops). The requests:
  // the sends', then the receives', in order. The default posts each alone (MPI and in-process sends never wait).
  struct SendPart {
    std::span<const std::byte> data;
    int peer = -1, tag = 0;
  };
  struct RecvPart {
    std::span<std::byte> data;
    int peer = -1, tag = 0;
  };
  virtual std::vector<Pending> post_group(std::span<const SendPart> sends, std::span<const RecvPart> recvs);

  // Non-blocking sum of `data` over every rank of this communicator, in place. Every rank calls the collectives
  // of a communicator in the same order with the same sizes. The result is bitwise the same on every rank.
  virtual Pending allreduce_sum(std::span<float> data) = 0;
  virtual Pending allreduce_sum(std::span<double> data) = 0;
  // ZeRO's two halves of an all-reduce, in place over `data` cut into size() equal shards (data.size() a multiple of
  // size(); InvalidArgument otherwise), shard r at [r·n/size, (r+1)·n/size):
  //   reduce_scatter_sum: this rank's shard becomes the sum of every rank's shard r; the other shards are left
  //                       unspecified (overwritten);
  //   allgather:          every rank's shard r becomes rank r's shard r (each contributes its own).
  // The result is bitwise what allreduce_sum gives for the same shard. The defaults run one allreduce_sum (the
  // all-gather over zeroed other shards, so `data` must be host memory); the in-process, MPI and NCCL transports
  // override them with the real collectives.
  virtual Pending reduce_scatter_sum(std::span<float> data);
  virtual Pending allgather(std::span<float> data);
  virtual void barrier() = 0;

  // Collective over this communicator (MPI_Comm_split): ranks passing the same `color` form a new communicator,
  // ordered by `key`. color < 0: this rank joins none and gets nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Ends the run on every rank: their pending and later calls throw CommError carrying `reason` (MPI: MPI_Abort with
  // `exit_code`, which mpirun ends every process with and returns: the failing rank's error's code, README "Exit
  // codes"). In-process the caller rethrows its own error; the others' CommError is exit code 6.
  virtual void abort(const std::string& reason, int exit_code) = 0;

 protected:
  // InvalidArgument unless `peer` is a rank of this communicator and `tag` is in [0, kMaxTag] (both transports).
  void check_peer_and_tag(const char* operation, int peer, int tag) const;
  // InvalidArgument unless `elements` is a multiple of size(); returns the shard's length.
  size_t shard_length(const char* operation, size_t elements) const;
};

// `size` communicators over one shared in-process transport, one per rank (run each on its own thread).
std::vector<std::unique_ptr<Communicator>> make_in_process_communicators(int size, const CommOptions& options = {});

// Whether this build has the MPI communicator, and whether this process was started by an MPI launcher
// (mpirun/mpiexec: OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK in the environment).
bool mpi_available();
bool launched_by_mpi();
// MPI_COMM_WORLD (MPI_Init_thread on first use, MPI_Finalize at exit). Throws Unsupported when the build has no MPI.
std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions& options = {});

}  // namespace apart
