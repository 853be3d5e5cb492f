// The Communicator over NCCL: one GPU per rank, buffers in the CUDA backend's device memory, operations on the
// backend's communication stream, a non-blocking NCCL communicator so that a failed peer ends in CommError, not a
// hang. Made through make_nccl_communicator (runtime/cuda/cuda_entry.h), which code without CUDA headers calls.
//
// What differs from the MPI communicator (runtime/communicator.h):
// - Every span passed in is device memory of the communicator's GPU (a Tensor of the CUDA backend); host memory is
//   refused with InvalidArgument before NCCL sees it.
// - An operation starts after the kernels already launched on the backend's compute stream (it reads or writes
//   their buffers) and runs on the communication stream; its request completes on a CUDA event, so after wait()
//   the buffer is ready for any stream and for the host.
// - NCCL has no tags: messages between two different ranks match in posting order whatever their tags (the tag is
//   still range-checked). Both ranks must post the messages between them in the same order and with the same sizes
//   (a mismatch is NCCL's undefined behaviour, ended by the timeout), and a send waits for its receive
//   (rendezvous): two ranks that both send first on a large message wait on each other until the timeout.
// - A send to self is matched with its receive by tag in posting order (nccl_host.h's SelfMailbox); it completes
//   when both are posted, so wait on it after posting the receive.
// - Timeouts: every wait polls its CUDA event and ncclCommGetAsyncError until CommOptions::timeout_s, then aborts
//   the NCCL communicator (ncclCommAbort) and throws CommError naming the operation and the peer; so do init,
//   split and the enqueueing of a call. Destroying an incomplete request while an exception unwinds aborts the
//   communicator too (NCCL cannot withdraw one operation, and its buffer may be freed next). abort() aborts NCCL,
//   then the bootstrap, which ends the run everywhere.
// - split() splits the bootstrap as well (the child keeps its own), so the child's abort reaches its ranks.
#pragma once

#include <nccl.h>

#include <memory>

#include "runtime/communicator.h"
#include "runtime/cuda/cuda_backend.h"

namespace apart::cuda {

struct NcclState;  // the NCCL handle, abort flag, event pool and self mailbox, shared with requests

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap`: rank 0 makes the unique id and sends it to the others; every rank then joins.
  NcclCommunicator(Communicator& bootstrap, CudaBackend& backend, const CommOptions& options);
  ~NcclCommunicator() override;

  int rank() const override;
  int size() const override;
  Pending send(std::span<const std::byte> data, int peer, int tag) override;
  Pending recv(std::span<std::byte> data, int peer, int tag) override;
  // One ncclGroupStart … ncclGroupEnd around every send and receive to another rank (one event completes them all);
  // those to self go through the mailbox, as send/recv post them.
  std::vector<Pending> post_group(std::span<const SendPart> sends, std::span<const RecvPart> recvs) override;
  Pending allreduce_sum(std::span<float> data) override;
  Pending allreduce_sum(std::span<double> data) override;
  Pending reduce_scatter_sum(std::span<float> data) override;  // ncclReduceScatter / ncclAllGather, in place
  Pending allgather(std::span<float> data) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  void abort(const std::string& reason, int exit_code) override;

 private:
  // A split's child: adopts `comm` and the bootstrap's child.
  NcclCommunicator(ncclComm_t comm, std::unique_ptr<Communicator> bootstrap, CudaBackend& backend,
                   const CommOptions& options);
  void set_up_buffers();
  Pending post_allreduce(void* data, size_t count, ncclDataType_t type, const char* type_name);
  Pending post_self(bool is_send, std::byte* data, size_t bytes, int tag, const std::string& what);
  std::string who() const;

  std::unique_ptr<Communicator> owned_bootstrap_;  // a split's; the world's belongs to the caller
  Communicator& bootstrap_;
  CudaBackend& backend_;
  CommOptions options_;
  std::shared_ptr<NcclState> state_;
  std::shared_ptr<std::byte> barrier_scratch_;  // one float on the device
  cudaEvent_t compute_done_ = nullptr;           // recorded on the compute stream before each operation
  uint64_t next_self_id_ = 1;
};

}  // namespace apart::cuda
