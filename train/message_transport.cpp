// apart run's stage-boundary messages in host or device memory, grouped for NCCL (message_transport.h).
#include "train/message_transport.h"

#include "graph/error.h"

namespace apart {

std::vector<ByteRun> row_runs(int64_t outer, int64_t dim, int64_t row0, int64_t rows, int64_t row_bytes) {
  std::vector<ByteRun> runs;
  runs.reserve(static_cast<size_t>(outer));
  for (int64_t o = 0; o < outer; ++o) runs.push_back({(o * dim + row0) * row_bytes, rows * row_bytes});
  return runs;
}

int64_t MessageTransport::pack(const Tensor& from, const std::vector<ByteRun>& runs, Tensor& message, int64_t at) {
  for (const ByteRun& run : runs) {
    APART_CHECK(run.offset + run.bytes <= from.bytes() && at + run.bytes <= message.bytes(),
                "pack: a run past its tensor");
    memory_.copy_on_device(from.raw() + run.offset, message.raw() + at, run.bytes);
    at += run.bytes;
  }
  return at;
}

int64_t MessageTransport::unpack(const Tensor& message, int64_t at, const std::vector<ByteRun>& runs, Tensor& to,
                                 bool add) {
  for (const ByteRun& run : runs) {
    APART_CHECK(run.offset + run.bytes <= to.bytes() && at + run.bytes <= message.bytes(),
                "unpack: a run past its tensor");
    if (!add) {
      memory_.copy_on_device(message.raw() + at, to.raw() + run.offset, run.bytes);
    } else {  // float32 gradients from several readers: summed where the message is
      APART_CHECK(
          to.dtype() == DType::kFloat32 && message.dtype() == DType::kFloat32 && run.offset % 4 == 0 && at % 4 == 0,
          "unpack: sums float32 runs only");
      Tensor into = to.flat_range(run.offset / 4, (run.offset + run.bytes) / 4);
      memory_.add_into(into, message.flat_range(at / 4, (at + run.bytes) / 4));
    }
    at += run.bytes;
  }
  return at;
}

void MessageTransport::send(Tensor message, int peer, int tag) {
  if (posting_ == Posting::kGroupedWithNextReceive) {
    deferred_.push_back({std::move(message), peer, tag});
    return;
  }
  Pending request =
      comm_.send(std::span<const std::byte>(message.raw(), static_cast<size_t>(message.bytes())), peer, tag);
  in_flight_.emplace_back(std::move(message), std::move(request));
}

void MessageTransport::post(const Communicator::RecvPart* receive) {
  std::vector<Communicator::SendPart> sends;
  for (const Deferred& d : deferred_)
    sends.push_back(
        {std::span<const std::byte>(d.message.raw(), static_cast<size_t>(d.message.bytes())), d.peer, d.tag});
  std::vector<Pending> requests =
      comm_.post_group(sends, std::span<const Communicator::RecvPart>(receive, receive ? 1 : 0));
  for (size_t i = 0; i < deferred_.size(); ++i)
    in_flight_.emplace_back(std::move(deferred_[i].message), std::move(requests[i]));
  deferred_.clear();
  if (receive) requests.back()->wait();
}

void MessageTransport::recv(Tensor& message, int peer, int tag) {
  const std::span<std::byte> bytes(message.raw(), static_cast<size_t>(message.bytes()));
  if (posting_ == Posting::kAtOnce) {
    comm_.recv(bytes, peer, tag)->wait();
    return;
  }
  const Communicator::RecvPart receive{bytes, peer, tag};
  post(&receive);
}

void MessageTransport::finish() {
  if (!deferred_.empty()) post(nullptr);
  for (auto& [message, request] : in_flight_) request->wait();
  in_flight_.clear();
}

}  // namespace apart
