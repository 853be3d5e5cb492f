// The NCCL Communicator: unique id over the bootstrap, a non-blocking ncclComm, operations on the communication
// stream completing on CUDA events, every wait bounded by CommOptions::timeout_s (nccl_host.h holds the host logic).
#include "runtime/cuda/nccl_communicator.h"

#include <cstring>
#include <exception>
#include <map>
#include <vector>

#include "graph/units.h"
#include "runtime/nccl_host.h"

namespace apart::cuda {

static_assert(sizeof(ncclUniqueId) == nccl::kUniqueIdBytes, "nccl_host.h's kUniqueIdBytes is NCCL_UNIQUE_ID_BYTES");

struct SelfCompletion;

// What a communicator and its requests share: a request may outlive its communicator (the handle is released
// with the last of them), and an abort seen by one is seen by all.
struct NcclState {
  ncclComm_t comm = nullptr;
  int device = 0;
  cudaStream_t stream = nullptr;
  double timeout_s = 300;
  bool aborted = false;
  std::string abort_reason;
  std::vector<cudaEvent_t> free_events;
  // Sends and receives to self, unmatched yet (nccl_host.h): their buffers, and where the pair's event goes.
  struct SelfOp {
    std::byte* buffer = nullptr;
    size_t bytes = 0;
    std::shared_ptr<SelfCompletion> completion;
  };
  nccl::SelfMailbox mailbox;
  std::map<uint64_t, SelfOp> self_ops;

  ~NcclState();

  // ncclCommAbort, once: the kernels of the communicator exit, and every later call and wait throws CommError.
  void abort_comm(const std::string& reason) noexcept {
    if (aborted) return;
    aborted = true;
    abort_reason = reason;
    if (comm != nullptr) (void)ncclCommAbort(comm);  // the handle is gone either way; nothing more to report
    comm = nullptr;
  }
  void throw_if_aborted(const std::string& what) const {
    if (aborted) throw CommError(what + ": the NCCL communicator was aborted: " + abort_reason);
  }
  // The communicator's asynchronous state as a probe (kPending while NCCL still enqueues a call).
  nccl::Probe probe_comm() const {
    if (aborted) return nccl::Probe::failed("the NCCL communicator was aborted: " + abort_reason);
    ncclResult_t async = ncclSuccess;
    const ncclResult_t got = ncclCommGetAsyncError(comm, &async);
    if (got != ncclSuccess) return nccl::Probe::failed(std::string("ncclCommGetAsyncError: ") + ncclGetErrorString(got));
    if (async == ncclInProgress) return nccl::Probe::pending();
    if (async != ncclSuccess)
      return nccl::Probe::failed(std::string(ncclGetErrorString(async)) + " (" + ncclGetLastError(comm) + ")");
    return nccl::Probe::done();
  }
  // A non-blocking communicator may return from a call (init, split, ncclGroupEnd, a collective) before the call
  // is enqueued; nothing else may be called on it until then. Waits for that within the timeout.
  void wait_enqueued(const std::string& what) {
    nccl::RequestTracker tracker(what, timeout_s);
    tracker.wait([&] { return probe_comm(); }, [&] { abort_comm(what + " timed out"); });
  }

  cudaEvent_t take_event() {
    if (!free_events.empty()) {
      cudaEvent_t e = free_events.back();
      free_events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    APART_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
};

// The event an operation completes on, back to the pool when the last request that waits on it goes.
struct Completion {
  Completion(std::shared_ptr<NcclState> state, cudaEvent_t event) : state(std::move(state)), event(event) {}
  ~Completion() { state->free_events.push_back(event); }
  std::shared_ptr<NcclState> state;
  cudaEvent_t event;
};
// A send or receive to self: no event until its match is posted; a size mismatch fails both sides.
struct SelfCompletion {
  std::shared_ptr<Completion> completion;
  std::string error;
};

NcclState::~NcclState() {
  if (comm != nullptr && !aborted) {
    // Finalize flushes the operations still queued; bounded like every wait, then abort instead.
    const ncclResult_t finalized = ncclCommFinalize(comm);
    bool clean = finalized == ncclSuccess || finalized == ncclInProgress;
    try {
      clean = clean &&
              nccl::poll_until([&] { return probe_comm().state != nccl::Probe::State::kPending; }, timeout_s) &&
              probe_comm().state == nccl::Probe::State::kDone;
    } catch (const std::exception&) {
      clean = false;
    }
    if (clean) (void)ncclCommDestroy(comm);
    else (void)ncclCommAbort(comm);
  }
  for (cudaEvent_t e : free_events) (void)cudaEventDestroy(e);
}

namespace {

// Makes the communicator's GPU current for the calls of a scope (NCCL and events act on the current device).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    APART_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) APART_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { (void)cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

class NcclRequest final : public CommRequest {
 public:
  // `completion` is null for a self message still unmatched (then `self` says when it is).
  NcclRequest(std::shared_ptr<NcclState> state, std::shared_ptr<Completion> completion,
              std::shared_ptr<SelfCompletion> self, uint64_t self_id, std::string what)
      : state_(std::move(state)), completion_(std::move(completion)), self_(std::move(self)), self_id_(self_id),
        tracker_(std::move(what), state_->timeout_s) {}

  ~NcclRequest() override {
    switch (tracker_.on_destroy(std::uncaught_exceptions() > 0)) {
      case nccl::OnDestroy::kNothing: break;
      case nccl::OnDestroy::kWait:
        try {
          wait();
        } catch (const std::exception&) {
        }
        break;
      case nccl::OnDestroy::kAbortCommunicator:
        if (self_ && !self_->completion) {  // never issued: take it back, nothing to abort
          state_->mailbox.withdraw(self_id_);
          state_->self_ops.erase(self_id_);
        } else {
          state_->abort_comm(tracker_.what() + " was abandoned while an error unwound");
        }
        break;
    }
  }

  void wait() override {
    tracker_.wait([&] { return probe(); }, [&] { state_->abort_comm(tracker_.what() + " timed out"); });
  }
  bool test() override { return tracker_.test([&] { return probe(); }); }

 private:
  nccl::Probe probe() {
    if (self_) {
      if (!self_->error.empty()) return nccl::Probe::failed(self_->error);
      if (!self_->completion) return state_->aborted ? state_->probe_comm() : nccl::Probe::pending();
      completion_ = self_->completion;
    }
    nccl::Probe comm = state_->probe_comm();
    if (comm.state == nccl::Probe::State::kFailed) return comm;
    const cudaError_t e = cudaEventQuery(completion_->event);
    if (e == cudaSuccess) return nccl::Probe::done();
    if (e == cudaErrorNotReady) return nccl::Probe::pending();
    return nccl::Probe::failed(std::string(cudaGetErrorString(e)) + " (" + cudaGetErrorName(e) + ")");
  }

  std::shared_ptr<NcclState> state_;
  std::shared_ptr<Completion> completion_;
  std::shared_ptr<SelfCompletion> self_;
  uint64_t self_id_ = 0;
  nccl::RequestTracker tracker_;
};

// InvalidArgument unless `data` is device memory of `device` (NCCL would read host memory as a device address).
void require_device_memory(const void* data, size_t bytes, int device, const std::string& what) {
  if (bytes == 0) return;
  cudaPointerAttributes attributes{};
  APART_CUDA_CHECK(cudaPointerGetAttributes(&attributes, data));
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
    throw InvalidArgument(what + ": the buffer is host memory; the NCCL communicator moves device memory (tensors "
                                 "of the CUDA backend)");
  if (attributes.device != device)
    throw InvalidArgument(what + ": the buffer is on GPU " + std::to_string(attributes.device) +
                          ", the communicator's is GPU " + std::to_string(device));
}

int nccl_version() {
  int version = 0;
  APART_NCCL_CHECK(ncclGetVersion(&version));
  return version;
}

ncclConfig_t non_blocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

}  // namespace

NcclCommunicator::NcclCommunicator(Communicator& bootstrap, CudaBackend& backend, const CommOptions& options)
    : bootstrap_(bootstrap), backend_(backend), options_(options), state_(std::make_shared<NcclState>()) {
  if (!(options.timeout_s > 0))
    throw InvalidArgument("CommOptions::timeout_s " + format_significant(options.timeout_s) + " s is not > 0");
  state_->device = backend.device();
  state_->stream = backend.comm_stream();
  state_->timeout_s = options.timeout_s;
  DeviceScope scope(state_->device);
  const nccl::UniqueId id = nccl::broadcast_unique_id(
      bootstrap,
      [] {
        ncclUniqueId made;
        APART_NCCL_CHECK(ncclGetUniqueId(&made));
        nccl::UniqueId bytes;
        std::memcpy(bytes.data(), made.internal, bytes.size());
        return bytes;
      },
      nccl_version());
  ncclUniqueId unique_id;
  std::memcpy(unique_id.internal, id.data(), id.size());
  ncclConfig_t config = non_blocking_config();
  const std::string what = "rank " + std::to_string(bootstrap.rank()) + " of " + std::to_string(bootstrap.size()) +
                           ": ncclCommInitRankConfig on GPU " + std::to_string(state_->device);
  try {
    APART_NCCL_CHECK(ncclCommInitRankConfig(&state_->comm, bootstrap.size(), unique_id, bootstrap.rank(), &config));
  } catch (const CudaError& e) {
    throw CommError(what + ": " + e.what());
  }
  state_->wait_enqueued(what);  // a peer that never joins ends here, at the timeout
  set_up_buffers();
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, std::unique_ptr<Communicator> bootstrap, CudaBackend& backend,
                                   const CommOptions& options)
    : owned_bootstrap_(std::move(bootstrap)), bootstrap_(*owned_bootstrap_), backend_(backend), options_(options),
      state_(std::make_shared<NcclState>()) {
  state_->comm = comm;
  state_->device = backend.device();
  state_->stream = backend.comm_stream();
  state_->timeout_s = options.timeout_s;
  DeviceScope scope(state_->device);
  state_->wait_enqueued(who() + ": the split's new communicator joining");  // non-blocking: may still be joining
  int nccl_rank = -1;
  APART_NCCL_CHECK(ncclCommUserRank(comm, &nccl_rank));
  if (nccl_rank != bootstrap_.rank())
    throw CommError(who() + ": the NCCL split made this rank " + std::to_string(nccl_rank) +
                    " but the bootstrap's split made it " + std::to_string(bootstrap_.rank()));
  set_up_buffers();
}

void NcclCommunicator::set_up_buffers() {
  APART_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
  barrier_scratch_ = backend_.allocate(sizeof(float));
  APART_CUDA_CHECK(cudaMemset(barrier_scratch_.get(), 0, sizeof(float)));
}

NcclCommunicator::~NcclCommunicator() {
  if (compute_done_ != nullptr) (void)cudaEventDestroy(compute_done_);
}

int NcclCommunicator::rank() const { return bootstrap_.rank(); }
int NcclCommunicator::size() const { return bootstrap_.size(); }

std::string NcclCommunicator::who() const {
  return "rank " + std::to_string(rank()) + " of " + std::to_string(size()) + " (NCCL, GPU " +
         std::to_string(state_->device) + ")";
}

namespace {

// Enqueues `issue` (NCCL calls on the communication stream) after the compute stream's kernels, waits until
// NCCL has taken it, and returns the event it completes on. A library error becomes CommError naming `what`.
template <class Issue>
std::shared_ptr<Completion> enqueue(const std::shared_ptr<NcclState>& state, cudaStream_t compute_stream,
                                    cudaEvent_t compute_done, const std::string& what, Issue&& issue) {
  state->throw_if_aborted(what);
  try {
    // The buffer was written (or is still read) by kernels on the compute stream.
    APART_CUDA_CHECK(cudaEventRecord(compute_done, compute_stream));
    APART_CUDA_CHECK(cudaStreamWaitEvent(state->stream, compute_done, 0));
    issue();
  } catch (const CudaError& e) {
    state->abort_comm(what + " failed");
    throw CommError(what + ": " + e.what());
  }
  state->wait_enqueued(what);
  auto completion = std::make_shared<Completion>(state, state->take_event());
  APART_CUDA_CHECK(cudaEventRecord(completion->event, state->stream));
  return completion;
}

}  // namespace

Pending NcclCommunicator::send(std::span<const std::byte> data, int peer, int tag) {
  check_peer_and_tag("send to", peer, tag);
  const std::string what = who() + ": send to rank " + std::to_string(peer) + " (tag " + std::to_string(tag) + ", " +
                           std::to_string(data.size()) + " bytes)";
  DeviceScope scope(state_->device);
  require_device_memory(data.data(), data.size(), state_->device, what);
  if (peer == rank()) return post_self(true, const_cast<std::byte*>(data.data()), data.size(), tag, what);
  auto completion = enqueue(state_, backend_.compute_stream(), compute_done_, what, [&] {
    APART_NCCL_CHECK(ncclSend(data.data(), data.size(), ncclUint8, peer, state_->comm, state_->stream));
  });
  return std::make_unique<NcclRequest>(state_, std::move(completion), nullptr, 0, what);
}

Pending NcclCommunicator::recv(std::span<std::byte> data, int peer, int tag) {
  check_peer_and_tag("recv from", peer, tag);
  const std::string what = who() + ": recv from rank " + std::to_string(peer) + " (tag " + std::to_string(tag) +
                           ", " + std::to_string(data.size()) + " bytes)";
  DeviceScope scope(state_->device);
  require_device_memory(data.data(), data.size(), state_->device, what);
  if (peer == rank()) return post_self(false, data.data(), data.size(), tag, what);
  auto completion = enqueue(state_, backend_.compute_stream(), compute_done_, what, [&] {
    APART_NCCL_CHECK(ncclRecv(data.data(), data.size(), ncclUint8, peer, state_->comm, state_->stream));
  });
  return std::make_unique<NcclRequest>(state_, std::move(completion), nullptr, 0, what);
}

std::vector<Pending> NcclCommunicator::post_group(std::span<const SendPart> sends, std::span<const RecvPart> recvs) {
  std::string what = who() + ": a group of";
  std::vector<Pending> self;  // to self: paired by the mailbox, outside the group
  for (const SendPart& s : sends) {
    check_peer_and_tag("send to", s.peer, s.tag);
    what += " send to " + std::to_string(s.peer) + " (" + std::to_string(s.data.size()) + " bytes)";
    require_device_memory(s.data.data(), s.data.size(), state_->device, what);
  }
  for (const RecvPart& r : recvs) {
    check_peer_and_tag("recv from", r.peer, r.tag);
    what += " recv from " + std::to_string(r.peer) + " (" + std::to_string(r.data.size()) + " bytes)";
    require_device_memory(r.data.data(), r.data.size(), state_->device, what);
  }
  DeviceScope scope(state_->device);
  size_t others = 0;
  for (const SendPart& s : sends) others += s.peer != rank() ? 1 : 0;
  for (const RecvPart& r : recvs) others += r.peer != rank() ? 1 : 0;
  std::shared_ptr<Completion> completion;
  if (others > 0)
    completion = enqueue(state_, backend_.compute_stream(), compute_done_, what, [&] {
      APART_NCCL_CHECK(ncclGroupStart());
      for (const SendPart& s : sends)
        if (s.peer != rank())
          APART_NCCL_CHECK(ncclSend(s.data.data(), s.data.size(), ncclUint8, s.peer, state_->comm, state_->stream));
      for (const RecvPart& r : recvs)
        if (r.peer != rank())
          APART_NCCL_CHECK(ncclRecv(r.data.data(), r.data.size(), ncclUint8, r.peer, state_->comm, state_->stream));
      APART_NCCL_CHECK(ncclGroupEnd());
    });
  std::vector<Pending> requests;
  for (const SendPart& s : sends)
    requests.push_back(s.peer == rank() ? post_self(true, const_cast<std::byte*>(s.data.data()), s.data.size(), s.tag, what)
                                        : std::make_unique<NcclRequest>(state_, completion, nullptr, 0, what));
  for (const RecvPart& r : recvs)
    requests.push_back(r.peer == rank() ? post_self(false, r.data.data(), r.data.size(), r.tag, what)
                                        : std::make_unique<NcclRequest>(state_, completion, nullptr, 0, what));
  return requests;
}

Pending NcclCommunicator::post_self(bool is_send, std::byte* data, size_t bytes, int tag, const std::string& what) {
  state_->throw_if_aborted(what);
  const uint64_t id = next_self_id_++;
  auto self = std::make_shared<SelfCompletion>();
  const auto match = is_send ? state_->mailbox.post_send(tag, id, bytes) : state_->mailbox.post_recv(tag, id, bytes);
  if (!match) {
    state_->self_ops[id] = NcclState::SelfOp{data, bytes, self};
    return std::make_unique<NcclRequest>(state_, nullptr, self, id, what);
  }
  const uint64_t other_id = is_send ? match->recv_id : match->send_id;
  const NcclState::SelfOp other = state_->self_ops.at(other_id);
  state_->self_ops.erase(other_id);
  if (match->send_bytes != match->recv_bytes) {
    // As MPI's truncation error: both sides fail, nothing is written.
    const std::string error = who() + ": a message to self (tag " + std::to_string(tag) + ") has " +
                              std::to_string(match->send_bytes) + " bytes, its receive expects " +
                              std::to_string(match->recv_bytes);
    self->error = error;
    other.completion->error = error;
    return std::make_unique<NcclRequest>(state_, nullptr, self, id, what);
  }
  const std::byte* from = is_send ? data : other.buffer;
  std::byte* to = is_send ? other.buffer : data;
  // NCCL pairs a send to self with its receive only inside one group.
  auto completion = enqueue(state_, backend_.compute_stream(), compute_done_, what, [&] {
    APART_NCCL_CHECK(ncclGroupStart());
    APART_NCCL_CHECK(ncclSend(from, bytes, ncclUint8, rank(), state_->comm, state_->stream));
    APART_NCCL_CHECK(ncclRecv(to, bytes, ncclUint8, rank(), state_->comm, state_->stream));
    APART_NCCL_CHECK(ncclGroupEnd());
  });
  self->completion = completion;
  other.completion->completion = completion;
  return std::make_unique<NcclRequest>(state_, nullptr, self, id, what);
}

Pending NcclCommunicator::post_allreduce(void* data, size_t count, ncclDataType_t type, const char* type_name) {
  const std::string what = who() + ": allreduce_sum(" + type_name + ") of " + std::to_string(count) + " elements";
  DeviceScope scope(state_->device);
  require_device_memory(data, count, state_->device, what);
  auto completion = enqueue(state_, backend_.compute_stream(), compute_done_, what, [&] {
    APART_NCCL_CHECK(ncclAllReduce(data, data, count, type, ncclSum, state_->comm, state_->stream));
  });
  return std::make_unique<NcclRequest>(state_, std::move(completion), nullptr, 0, what);
}

Pending NcclCommunicator::allreduce_sum(std::span<float> data) {
  return post_allreduce(data.data(), data.size(), ncclFloat32, "float");
}
Pending NcclCommunicator::allreduce_sum(std::span<double> data) {
  return post_allreduce(data.data(), data.size(), ncclFloat64, "double");
}

// In place as NCCL defines it: reduce-scatter into this rank's shard of `data` (recvbuff = sendbuff + rank · n),
// all-gather from it (sendbuff = recvbuff + rank · n).
Pending NcclCommunicator::reduce_scatter_sum(std::span<float> data) {
  const size_t n = shard_length("reduce_scatter_sum", data.size());
  const std::string what = who() + ": reduce_scatter_sum(float) of " + std::to_string(data.size()) + " elements";
  DeviceScope scope(state_->device);
  require_device_memory(data.data(), data.size() * sizeof(float), state_->device, what);
  float* mine = data.data() + static_cast<size_t>(rank()) * n;
  auto completion = enqueue(state_, backend_.compute_stream(), compute_done_, what, [&] {
    APART_NCCL_CHECK(ncclReduceScatter(data.data(), mine, n, ncclFloat32, ncclSum, state_->comm, state_->stream));
  });
  return std::make_unique<NcclRequest>(state_, std::move(completion), nullptr, 0, what);
}

Pending NcclCommunicator::allgather(std::span<float> data) {
  const size_t n = shard_length("allgather", data.size());
  const std::string what = who() + ": allgather(float) of " + std::to_string(data.size()) + " elements";
  DeviceScope scope(state_->device);
  require_device_memory(data.data(), data.size() * sizeof(float), state_->device, what);
  const float* mine = data.data() + static_cast<size_t>(rank()) * n;
  auto completion = enqueue(state_, backend_.compute_stream(), compute_done_, what, [&] {
    APART_NCCL_CHECK(ncclAllGather(mine, data.data(), n, ncclFloat32, state_->comm, state_->stream));
  });
  return std::make_unique<NcclRequest>(state_, std::move(completion), nullptr, 0, what);
}

void NcclCommunicator::barrier() {
  // A one-element all-reduce every rank must join, waited for: NCCL has no barrier of its own.
  post_allreduce(barrier_scratch_.get(), 1, ncclFloat32, "float")->wait();
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  const std::string what = who() + ": split(color " + std::to_string(color) + ", key " + std::to_string(key) + ")";
  state_->throw_if_aborted(what);
  std::unique_ptr<Communicator> child_bootstrap = bootstrap_.split(color, key);  // same members, same order
  DeviceScope scope(state_->device);
  ncclConfig_t config = non_blocking_config();
  ncclComm_t child = nullptr;
  try {
    APART_NCCL_CHECK(ncclCommSplit(state_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config));
  } catch (const CudaError& e) {
    state_->abort_comm(what + " failed");
    throw CommError(what + ": " + e.what());
  }
  state_->wait_enqueued(what);
  if ((child == nullptr) != (child_bootstrap == nullptr)) {
    if (child != nullptr) (void)ncclCommAbort(child);
    throw CommError(what + ": NCCL and the bootstrap disagree on whether this rank is in a new communicator");
  }
  if (child == nullptr) return nullptr;
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(child, std::move(child_bootstrap), backend_, options_));
}

void NcclCommunicator::abort(const std::string& reason, int exit_code) {
  state_->abort_comm(reason);
  bootstrap_.abort(reason, exit_code);
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, Backend& cuda_backend,
                                                     const CommOptions& options) {
  auto* backend = dynamic_cast<CudaBackend*>(&cuda_backend);
  if (backend == nullptr)
    throw InvalidArgument("the NCCL communicator moves device memory of the CUDA backend, not of " +
                          cuda_backend.describe());
  return std::make_unique<NcclCommunicator>(bootstrap, *backend, options);
}

}  // namespace apart::cuda
