// The MPI Communicator (`mpirun -np N apart run`): non-blocking MPI calls polled against a timeout, errors as CommError.
#include "runtime/communicator.h"

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "graph/units.h"

#if APART_HAVE_MPI
#include <mpi.h>
#endif

namespace apart {

bool launched_by_mpi() {
  // Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE; MPICH/Hydra PMI_SIZE; PMIx launchers (srun, prte) PMIX_RANK.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

#if APART_HAVE_MPI

namespace {

using Clock = std::chrono::steady_clock;

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, length);
}

void check_mpi(int code, const std::string& what) {
  if (code != MPI_SUCCESS) throw CommError(what + " failed: " + mpi_error_text(code));
}

// MPI_Finalize at a clean exit only. Open MPI's MPI_Finalize waits for every rank to reach it, so a rank leaving
// with a failure status (exit(3) mid-run) would sit there until its peers time out; without it, mpirun sees a rank
// end non-zero and ends the job at once. A run stopped by a signal (kExitStoppedBySignal) stops every rank after the
// same step, all past their last message: they finalize too.
void finalize_at_exit(int status, void*) {
  if (status != 0 && status != kExitStoppedBySignal) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void initialize_mpi_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;  // the embedding program owns MPI's lifetime
#ifdef OPEN_MPI
    // The gradient buckets reduce with MPI_Iallreduce (overlapped with the backward). Open MPI's libnbc picks
    // binomial for it, which reached 0.34–0.73× of the blocking MPI_Allreduce's bandwidth from 4 KiB up on 2 ranks
    // here; its ring 0.89–1.06× from 64 KiB up (bench_comm, bench/RESULTS.md). Ring, unless the user chose.
    ::setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0);
#endif
    // FUNNELED: the runtime calls MPI from the thread that runs the schedule only.
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
#ifdef __GLIBC__
    ::on_exit(finalize_at_exit, nullptr);  // glibc passes the exit status; atexit would not
#else
    std::atexit([] { finalize_at_exit(0, nullptr); });
#endif
  });
}

// A count MPI's int arguments can carry.
int mpi_count(size_t count, const std::string& what) {
  if (count > static_cast<size_t>(INT_MAX))
    throw Unsupported(what + ": " + std::to_string(count) + " elements exceed MPI's int count (" +
                      std::to_string(INT_MAX) + ")");
  return static_cast<int>(count);
}

enum class OperationKind { kSend, kRecv, kCollective };

class MpiRequest final : public CommRequest {
 public:
  // `on_complete` runs once the operation has completed (a collective's copy out of its staging buffer).
  MpiRequest(MPI_Request request, OperationKind kind, size_t expected_bytes, std::string what, double timeout_s,
             std::function<void()> on_complete = {})
      : request_(request), kind_(kind), expected_bytes_(expected_bytes), what_(std::move(what)),
        timeout_s_(timeout_s), on_complete_(std::move(on_complete)) {}

  ~MpiRequest() override {
    if (done_) return;
    if (std::uncaught_exceptions() == 0) {
      try {
        wait();
      } catch (const std::exception&) {
      }
    } else if (kind_ == OperationKind::kRecv) {
      cancel();
    }
    // else abandoned: an unwinding error path ends in abort(), and freeing an active collective is erroneous.
  }

  // MPI_Test in a loop, yielding the core between tests (Open MPI's own blocking calls spin the same way when
  // oversubscribed): MPI moves a large message in fragments only while it is being tested, so sleeping there
  // would cut the bandwidth. After a second of waiting (a pipeline bubble, a slow peer) it sleeps 1 ms between
  // tests, which costs such a wait under 0.1 %.
  void wait() override {
    const auto start = Clock::now();
    const auto limit = std::chrono::duration<double>(timeout_s_);
    while (!test()) {
      const auto waited = Clock::now() - start;
      if (waited > limit) {
        if (kind_ == OperationKind::kRecv) cancel();
        throw CommError(what_ + " timed out after " + format_seconds(timeout_s_) + " (CommOptions::timeout_s)");
      }
      if (waited > std::chrono::seconds(1))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      else
        std::this_thread::yield();
    }
  }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    MPI_Status status;
    const int code = MPI_Test(&request_, &flag, &status);
    if (code != MPI_SUCCESS) {
      done_ = true;  // an operation that failed is complete
      int error_class = 0;
      MPI_Error_class(code, &error_class);
      if (error_class == MPI_ERR_TRUNCATE)
        throw CommError(what_ + ": the message is larger than the " + std::to_string(expected_bytes_) +
                        " bytes the receive expects (" + mpi_error_text(code) + ")");
      throw CommError(what_ + " failed: " + mpi_error_text(code));
    }
    if (!flag) return false;
    done_ = true;
    if (kind_ == OperationKind::kRecv) {
      int received = 0;
      MPI_Get_count(&status, MPI_BYTE, &received);
      if (static_cast<size_t>(received) != expected_bytes_)
        throw CommError(what_ + ": the message has " + std::to_string(received) + " bytes, the receive expects " +
                        std::to_string(expected_bytes_));
    }
    if (on_complete_) on_complete_();
    return true;
  }

 private:
  void cancel() {  // a receive only: cancelling one completes locally
    MPI_Cancel(&request_);
    MPI_Wait(&request_, MPI_STATUS_IGNORE);
    done_ = true;
  }

  MPI_Request request_;
  OperationKind kind_;
  size_t expected_bytes_;
  std::string what_;
  double timeout_s_;
  std::function<void()> on_complete_;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, const CommOptions& options) : comm_(comm), options_(options) {
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Pending send(std::span<const std::byte> data, int peer, int tag) override {
    check_peer_and_tag("send to", peer, tag);
    const std::string what = describe("send to", peer, tag, data.size());
    MPI_Request request;
    check_mpi(MPI_Isend(data.data(), mpi_count(data.size(), what), MPI_BYTE, peer, tag, comm_, &request),
              what + ": MPI_Isend");
    return std::make_unique<MpiRequest>(request, OperationKind::kSend, data.size(), what, options_.timeout_s);
  }

  Pending recv(std::span<std::byte> data, int peer, int tag) override {
    check_peer_and_tag("recv from", peer, tag);
    const std::string what = describe("recv from", peer, tag, data.size());
    MPI_Request request;
    check_mpi(MPI_Irecv(data.data(), mpi_count(data.size(), what), MPI_BYTE, peer, tag, comm_, &request),
              what + ": MPI_Irecv");
    return std::make_unique<MpiRequest>(request, OperationKind::kRecv, data.size(), what, options_.timeout_s);
  }

  // MPI does not promise that a sum is bitwise the same on every rank (an algorithm may add in another order on
  // each). Open MPI's MPI_Iallreduce (libnbc: ring, recursive doubling, binomial reduce + broadcast) chooses its
  // algorithm from the communicator size and count alone, and either reduces each piece once and sends it on, or
  // adds the same two partial sums on both sides (a + b and b + a are the same bits), so every rank ends with the
  // same bits; tests/runtime/mpi_communicator_check.cpp checks it on every rank.
  Pending allreduce_sum(std::span<float> data) override { return allreduce(data.data(), data.size(), MPI_FLOAT); }
  Pending allreduce_sum(std::span<double> data) override { return allreduce(data.data(), data.size(), MPI_DOUBLE); }

  // MPI_Ireduce_scatter_block into a staging buffer (its send and receive buffers may not overlap), copied into
  // this rank's shard on completion.
  Pending reduce_scatter_sum(std::span<float> data) override {
    const size_t n = shard_length("reduce_scatter_sum", data.size());
    const std::string what = who() + ": reduce_scatter_sum of " + std::to_string(data.size()) + " elements";
    auto staging = std::make_shared<std::vector<float>>(n);
    MPI_Request request;
    check_mpi(MPI_Ireduce_scatter_block(data.data(), staging->data(), mpi_count(n, what), MPI_FLOAT, MPI_SUM, comm_,
                                        &request),
              what + ": MPI_Ireduce_scatter_block");
    std::span<float> mine = data.subspan(static_cast<size_t>(rank_) * n, n);
    return std::make_unique<MpiRequest>(request, OperationKind::kCollective, 0, what, options_.timeout_s,
                                        [staging, mine] { std::copy(staging->begin(), staging->end(), mine.begin()); });
  }

  Pending allgather(std::span<float> data) override {
    const size_t n = shard_length("allgather", data.size());
    const std::string what = who() + ": allgather of " + std::to_string(data.size()) + " elements";
    MPI_Request request;
    check_mpi(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data(), mpi_count(n, what), MPI_FLOAT, comm_,
                             &request),
              what + ": MPI_Iallgather");
    return std::make_unique<MpiRequest>(request, OperationKind::kCollective, 0, what, options_.timeout_s);
  }

  void barrier() override {
    const std::string what = who() + ": barrier";
    MPI_Request request;
    check_mpi(MPI_Ibarrier(comm_, &request), what + ": MPI_Ibarrier");
    MpiRequest(request, OperationKind::kCollective, 0, what, options_.timeout_s).wait();
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), who() + ": MPI_Comm_split");
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(sub, options_);
  }

  // MPI_Abort on the world, not on this communicator: the header promises the end of the run on every rank, and
  // MPI only promises that much for MPI_COMM_WORLD.
  void abort(const std::string& reason, int exit_code) override {
    std::fprintf(stderr, "apart: %s aborts the run: %s\n", who().c_str(), reason.c_str());
    std::fflush(stderr);
    const int code = exit_code > 0 && exit_code < 256 ? exit_code : 1;
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; should it, the process still ends
  }

 private:
  Pending allreduce(void* data, size_t count, MPI_Datatype type) {
    const std::string what = who() + ": allreduce_sum of " + std::to_string(count) + " elements";
    MPI_Request request;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, mpi_count(count, what), type, MPI_SUM, comm_, &request),
              what + ": MPI_Iallreduce");
    return std::make_unique<MpiRequest>(request, OperationKind::kCollective, 0, what, options_.timeout_s);
  }

  std::string who() const {
    return "rank " + std::to_string(rank_) + "/" + std::to_string(size_) + " (world rank " +
           std::to_string(world_rank_) + ")";
  }
  std::string describe(const char* op, int peer, int tag, size_t bytes) const {
    return who() + ": " + op + " rank " + std::to_string(peer) + " (tag " + std::to_string(tag) + ", " +
           std::to_string(bytes) + " bytes)";
  }

  MPI_Comm comm_;
  CommOptions options_;
  int rank_ = -1, size_ = 0, world_rank_ = -1;
};

}  // namespace

bool mpi_available() { return true; }

std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions& options) {
  if (!(options.timeout_s > 0))
    throw InvalidArgument("CommOptions::timeout_s " + format_significant(options.timeout_s) + " s is not > 0");
  initialize_mpi_once();
  // A duplicate of the world: apart's messages cannot match another library's on MPI_COMM_WORLD.
  MPI_Comm world = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup(MPI_COMM_WORLD)");
  return std::make_unique<MpiCommunicator>(world, options);
}

#else  // !APART_HAVE_MPI

bool mpi_available() { return false; }

std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions&) {
  throw Unsupported(
      "this build of apart has no MPI communicator: install Open MPI (scripts/deps.sh installs libopenmpi-dev "
      "openmpi-bin) and configure again");
}

#endif

}  // namespace apart
