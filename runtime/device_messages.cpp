// apart run's stage-boundary messages in device memory, grouped for NCCL (device_messages.h).
#include "runtime/device_messages.h"

#include "graph/error.h"

namespace apart {

std::vector<ByteRun> row_runs(int64_t outer, int64_t dim, int64_t row0, int64_t rows, int64_t row_bytes) {
  std::vector<ByteRun> runs;
  runs.reserve(static_cast<size_t>(outer));
  for (int64_t o = 0; o < outer; ++o) runs.push_back({(o * dim + row0) * row_bytes, rows * row_bytes});
  return runs;
}

int64_t DeviceMessages::pack(const Tensor& from, const std::vector<ByteRun>& runs, Tensor& message, int64_t at) {
  for (const ByteRun& run : runs) {
    APART_CHECK(run.offset + run.bytes <= from.bytes() && at + run.bytes <= message.bytes(), "pack: a run past its tensor");
    backend_.copy_on_device(from.raw() + run.offset, message.raw() + at, run.bytes);
    at += run.bytes;
  }
  return at;
}

int64_t DeviceMessages::unpack(const Tensor& message, int64_t at, const std::vector<ByteRun>& runs, Tensor& to, bool add) {
  for (const ByteRun& run : runs) {
    APART_CHECK(run.offset + run.bytes <= to.bytes() && at + run.bytes <= message.bytes(), "unpack: a run past its tensor");
    if (!add) {
      backend_.copy_on_device(message.raw() + at, to.raw() + run.offset, run.bytes);
    } else {  // float32 gradients from several readers: summed on the device
      APART_CHECK(to.dtype() == DType::kFloat32 && message.dtype() == DType::kFloat32 && run.offset % 4 == 0 && at % 4 == 0,
                  "unpack: sums float32 runs only");
      Tensor into = to.flat_range(run.offset / 4, (run.offset + run.bytes) / 4);
      backend_.add_into(into, message.flat_range(at / 4, (at + run.bytes) / 4));
    }
    at += run.bytes;
  }
  return at;
}

void DeviceMessages::send(Tensor message, int peer, int tag) { deferred_.push_back({std::move(message), peer, tag}); }

void DeviceMessages::post(const Communicator::RecvPart* receive) {
  std::vector<Communicator::SendPart> sends;
  for (const Deferred& d : deferred_)
    sends.push_back({std::span<const std::byte>(d.message.raw(), static_cast<size_t>(d.message.bytes())), d.peer, d.tag});
  std::vector<Pending> requests =
      comm_.post_group(sends, std::span<const Communicator::RecvPart>(receive, receive ? 1 : 0));
  for (size_t i = 0; i < deferred_.size(); ++i) in_flight_.emplace_back(std::move(deferred_[i].message), std::move(requests[i]));
  deferred_.clear();
  if (receive) requests.back()->wait();
}

void DeviceMessages::recv(Tensor& message, int peer, int tag) {
  const Communicator::RecvPart receive{std::span<std::byte>(message.raw(), static_cast<size_t>(message.bytes())), peer, tag};
  post(&receive);
}

void DeviceMessages::finish() {
  if (!deferred_.empty()) post(nullptr);
  for (auto& [message, request] : in_flight_) request->wait();
  in_flight_.clear();
}

}  // namespace apart
