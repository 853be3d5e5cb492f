// The in-process Communicator: one thread per rank, all ranks sharing one Transport (mailboxes, collectives, abort).
#include "runtime/communicator.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "graph/units.h"

namespace apart {
namespace {

using Clock = std::chrono::steady_clock;

// A receive posted before its message arrived; the matching send copies straight into `buffer`.
struct RecvSlot {
  std::span<std::byte> buffer;
  bool done = false;
  std::string error;  // set instead of `done` data when the message's size differs from the buffer's
};

// Messages from one rank to another with one tag on one communicator, matched in posting order (MPI's rule).
struct Channel {
  std::deque<std::vector<std::byte>> unmatched;  // sends no receive has taken yet (buffered copies)
  std::deque<std::shared_ptr<RecvSlot>> posted;  // receives waiting for a send
};
struct ChannelKey {
  int comm = 0, src = 0, dst = 0, tag = 0;
  auto operator<=>(const ChannelKey&) const = default;
};

enum class CollectiveKind { kAllreduceFloat, kAllreduceDouble, kReduceScatterFloat, kAllgatherFloat, kBarrier, kSplit };

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduceFloat: return "allreduce_sum(float)";
    case CollectiveKind::kAllreduceDouble: return "allreduce_sum(double)";
    case CollectiveKind::kReduceScatterFloat: return "reduce_scatter_sum(float)";
    case CollectiveKind::kAllgatherFloat: return "allgather(float)";
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kSplit: return "split";
  }
  return "?";
}

// What split() hands one rank: the new communicator's id, the rank's place in it and its members' world ranks.
struct SplitPlace {
  int comm = -1;  // -1: the rank passed a negative color
  int rank = -1;
  std::vector<int> world_ranks;
};

// The n-th collective call of one communicator. Every rank contributes at its call; the last to arrive computes
// the result under the lock, in rank order, so it does not depend on which thread came last.
struct Collective {
  CollectiveKind kind{};
  size_t count = 0;  // elements (allreduce), 0 otherwise
  int first_rank = -1;
  std::vector<std::vector<std::byte>> contributions;  // by rank (allreduce)
  std::vector<std::pair<int, int>> color_key;         // by rank (split)
  std::vector<bool> arrived;
  int arrived_count = 0;
  int released = 0;  // requests destroyed; the entry goes when every rank's is
  std::string error;
  std::vector<std::byte> sum;       // allreduce, reduce-scatter (every shard) and all-gather result
  std::vector<SplitPlace> places;   // split result, by rank
};

template <class T>
void sum_in_rank_order(const std::vector<std::vector<std::byte>>& contributions, size_t count,
                       std::vector<std::byte>& out) {
  out = contributions[0];
  T* acc = reinterpret_cast<T*>(out.data());
  for (size_t r = 1; r < contributions.size(); ++r) {
    const T* x = reinterpret_cast<const T*>(contributions[r].data());
    for (size_t i = 0; i < count; ++i) acc[i] += x[i];
  }
}

struct Transport {
  Transport(int world_size, const CommOptions& options) : world_size(world_size), options(options) {}
  const int world_size;
  const CommOptions options;
  std::mutex mutex;
  std::condition_variable changed;  // any message, collective arrival or abort: waiters re-check their condition
  bool aborted = false;
  std::string abort_reason;
  std::map<ChannelKey, Channel> channels;
  std::map<std::pair<int, uint64_t>, Collective> collectives;  // (communicator id, sequence number)
  int next_comm_id = 1;                                        // 0 is the world

  void throw_if_aborted(const std::string& what) const {
    if (aborted) throw CommError(what + ": the run was aborted: " + abort_reason);
  }

  // Waits under `lock` until `done()`: CommError on abort, or once options.timeout_s have passed.
  void wait_for(std::unique_lock<std::mutex>& lock, const std::function<bool()>& done, const std::string& what) {
    const double limit_s = std::min(options.timeout_s, 1e7);  // keeps the deadline representable
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(limit_s));
    while (!done()) {
      throw_if_aborted(what);
      if (changed.wait_until(lock, deadline) == std::cv_status::timeout && !done()) {
        throw_if_aborted(what);
        throw CommError(what + " timed out after " + format_seconds(options.timeout_s) +
                        " (CommOptions::timeout_s)");
      }
    }
  }
};

// A send: buffered, so complete as soon as it is posted.
class CompletedRequest final : public CommRequest {
 public:
  void wait() override {}
  bool test() override { return true; }
};

class RecvRequest final : public CommRequest {
 public:
  RecvRequest(std::shared_ptr<Transport> transport, ChannelKey key, std::shared_ptr<RecvSlot> slot, std::string what)
      : transport_(std::move(transport)), key_(key), slot_(std::move(slot)), what_(std::move(what)) {}

  // Destroying it waits (the header's contract), except while an exception unwinds or after an abort: then the
  // receive is withdrawn, so no later send writes into a buffer that is gone.
  ~RecvRequest() override {
    try {
      if (!finished_ && std::uncaught_exceptions() == 0) wait();
    } catch (const std::exception&) {
    }
    std::lock_guard lock(transport_->mutex);
    withdraw();
  }

  void wait() override {
    if (finished_) return;
    if (!failure_.empty()) throw CommError(failure_);
    std::unique_lock lock(transport_->mutex);
    try {
      transport_->wait_for(lock, [&] { return slot_->done; }, what_);
    } catch (const CommError& e) {
      withdraw();
      failure_ = e.what();
      throw;
    }
    finish();
  }

  bool test() override {
    if (finished_) return true;
    if (!failure_.empty()) throw CommError(failure_);
    std::unique_lock lock(transport_->mutex);
    if (!slot_->done) {
      try {
        transport_->throw_if_aborted(what_);
      } catch (const CommError& e) {
        withdraw();
        failure_ = e.what();
        throw;
      }
      return false;
    }
    finish();
    return true;
  }

 private:
  void finish() {
    if (!slot_->error.empty()) {
      failure_ = slot_->error;
      throw CommError(failure_);
    }
    finished_ = true;
  }
  void withdraw() {  // under the lock
    auto it = transport_->channels.find(key_);
    if (it == transport_->channels.end()) return;
    auto& posted = it->second.posted;
    posted.erase(std::remove(posted.begin(), posted.end(), slot_), posted.end());
  }

  std::shared_ptr<Transport> transport_;
  ChannelKey key_;
  std::shared_ptr<RecvSlot> slot_;
  std::string what_;
  bool finished_ = false;
  std::string failure_;
};

// One rank's side of a collective. wait() copies the result into the rank's own buffer, so an abandoned request
// (destroyed while an exception unwinds) leaves no writer behind.
class CollectiveRequest final : public CommRequest {
 public:
  // On completion `result` receives the collective's result from byte `result_offset` on.
  CollectiveRequest(std::shared_ptr<Transport> transport, std::pair<int, uint64_t> key, int rank, int size,
                    std::span<std::byte> result, size_t result_offset, std::string what)
      : transport_(std::move(transport)), key_(key), rank_(rank), size_(size), result_(result),
        result_offset_(result_offset), what_(std::move(what)) {}

  ~CollectiveRequest() override {
    try {
      if (!finished_ && std::uncaught_exceptions() == 0) wait();
    } catch (const std::exception&) {
    }
    std::lock_guard lock(transport_->mutex);
    auto it = transport_->collectives.find(key_);
    if (it != transport_->collectives.end() && ++it->second.released == size_) transport_->collectives.erase(it);
  }

  void wait() override {
    if (finished_) return;
    if (!failure_.empty()) throw CommError(failure_);
    std::unique_lock lock(transport_->mutex);
    Collective& c = transport_->collectives.at(key_);
    try {
      transport_->wait_for(lock, [&] { return c.arrived_count == size_ || !c.error.empty(); }, what_);
    } catch (const CommError& e) {
      failure_ = e.what();
      throw;
    }
    finish(c);
  }

  bool test() override {
    if (finished_) return true;
    if (!failure_.empty()) throw CommError(failure_);
    std::unique_lock lock(transport_->mutex);
    Collective& c = transport_->collectives.at(key_);
    if (c.arrived_count < size_ && c.error.empty()) {
      try {
        transport_->throw_if_aborted(what_);
      } catch (const CommError& e) {
        failure_ = e.what();
        throw;
      }
      return false;
    }
    finish(c);
    return true;
  }

  // The split result (after wait()).
  SplitPlace place() {
    std::lock_guard lock(transport_->mutex);
    return transport_->collectives.at(key_).places.at(rank_);
  }

 private:
  void finish(const Collective& c) {  // under the lock
    if (!c.error.empty()) {
      failure_ = c.error;
      throw CommError(failure_);
    }
    if (!result_.empty()) std::memcpy(result_.data(), c.sum.data() + result_offset_, result_.size());
    finished_ = true;
  }

  std::shared_ptr<Transport> transport_;
  std::pair<int, uint64_t> key_;
  int rank_, size_;
  std::span<std::byte> result_;
  size_t result_offset_;
  std::string what_;
  bool finished_ = false;
  std::string failure_;
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Transport> transport, int comm_id, int rank, std::vector<int> world_ranks)
      : transport_(std::move(transport)), comm_id_(comm_id), rank_(rank), world_ranks_(std::move(world_ranks)) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }

  Pending send(std::span<const std::byte> data, int peer, int tag) override {
    check_peer_and_tag("send to", peer, tag);
    const std::string what = describe("send to", peer, tag, data.size());
    std::unique_lock lock(transport_->mutex);
    transport_->throw_if_aborted(what);
    Channel& channel = transport_->channels[ChannelKey{comm_id_, rank_, peer, tag}];
    if (!channel.posted.empty()) {  // hand off to the oldest posted receive
      std::shared_ptr<RecvSlot> slot = channel.posted.front();
      channel.posted.pop_front();
      if (slot->buffer.size() != data.size()) {
        slot->error = size_mismatch(peer, tag, data.size(), slot->buffer.size());
      } else if (!data.empty()) {
        std::memcpy(slot->buffer.data(), data.data(), data.size());
      }
      slot->done = true;
      transport_->changed.notify_all();
    } else {
      channel.unmatched.emplace_back(data.begin(), data.end());
    }
    return std::make_unique<CompletedRequest>();
  }

  Pending recv(std::span<std::byte> data, int peer, int tag) override {
    check_peer_and_tag("recv from", peer, tag);
    const std::string what = describe("recv from", peer, tag, data.size());
    const ChannelKey key{comm_id_, peer, rank_, tag};
    auto slot = std::make_shared<RecvSlot>();
    slot->buffer = data;
    std::unique_lock lock(transport_->mutex);
    transport_->throw_if_aborted(what);
    Channel& channel = transport_->channels[key];
    if (!channel.unmatched.empty()) {
      std::vector<std::byte> message = std::move(channel.unmatched.front());
      channel.unmatched.pop_front();
      // A receive of the wrong size consumes its message, as MPI's truncation error does.
      if (message.size() != data.size()) {
        slot->error = size_mismatch(peer, tag, message.size(), data.size());
      } else if (!data.empty()) {
        std::memcpy(data.data(), message.data(), data.size());
      }
      slot->done = true;
    } else {
      channel.posted.push_back(slot);
    }
    return std::make_unique<RecvRequest>(transport_, key, slot, what);
  }

  Pending allreduce_sum(std::span<float> data) override {
    return post_collective(CollectiveKind::kAllreduceFloat, std::as_writable_bytes(data), data.size(), {});
  }
  Pending allreduce_sum(std::span<double> data) override {
    return post_collective(CollectiveKind::kAllreduceDouble, std::as_writable_bytes(data), data.size(), {});
  }
  // Every rank contributes all of `data`; the sum (in rank order, as allreduce_sum's) lands in this rank's shard.
  Pending reduce_scatter_sum(std::span<float> data) override {
    const size_t n = shard_length("reduce_scatter_sum", data.size());
    return post_collective(CollectiveKind::kReduceScatterFloat, std::as_writable_bytes(data), data.size(), {},
                           std::as_writable_bytes(data.subspan(static_cast<size_t>(rank_) * n, n)));
  }
  Pending allgather(std::span<float> data) override {
    shard_length("allgather", data.size());
    return post_collective(CollectiveKind::kAllgatherFloat, std::as_writable_bytes(data), data.size(), {});
  }

  void barrier() override { post_collective(CollectiveKind::kBarrier, {}, 0, {})->wait(); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    Pending request = post_collective(CollectiveKind::kSplit, {}, 0, {color, key});
    request->wait();
    SplitPlace place = static_cast<CollectiveRequest&>(*request).place();
    if (place.comm < 0) return nullptr;
    return std::make_unique<InProcessCommunicator>(transport_, place.comm, place.rank, std::move(place.world_ranks));
  }

  void abort(const std::string& reason, int /*exit_code: the aborting thread rethrows its own error*/) override {
    std::lock_guard lock(transport_->mutex);
    if (!transport_->aborted) {
      transport_->aborted = true;
      transport_->abort_reason = "rank " + std::to_string(world_ranks_[rank_]) + " aborted: " + reason;
    }
    transport_->changed.notify_all();
  }

 private:
  std::string who() const {
    return "rank " + std::to_string(rank_) + " of communicator " + std::to_string(comm_id_) + " (world rank " +
           std::to_string(world_ranks_[rank_]) + ")";
  }
  std::string describe(const char* op, int peer, int tag, size_t bytes) const {
    return who() + ": " + op + " rank " + std::to_string(peer) + " (tag " + std::to_string(tag) + ", " +
           std::to_string(bytes) + " bytes)";
  }
  std::string size_mismatch(int peer, int tag, size_t sent, size_t expected) const {
    return "rank " + std::to_string(rank_) + " of communicator " + std::to_string(comm_id_) + ": recv from rank " +
           std::to_string(peer) + " (tag " + std::to_string(tag) + "): the message has " + std::to_string(sent) +
           " bytes, the receive expects " + std::to_string(expected);
  }

  // Contributes this rank's part of the next collective call; the last rank to arrive computes the result.
  // `result`: where the result goes (empty: over `data`), a part of `data` at the same offset in the result.
  Pending post_collective(CollectiveKind kind, std::span<std::byte> data, size_t count, std::pair<int, int> color_key,
                          std::span<std::byte> result = {}) {
    const uint64_t sequence = next_collective_++;
    const std::string what = who() + ": " + collective_name(kind) + " #" + std::to_string(sequence) +
                             (count > 0 ? " of " + std::to_string(count) + " elements" : "");
    const std::pair<int, uint64_t> key{comm_id_, sequence};
    std::unique_lock lock(transport_->mutex);
    transport_->throw_if_aborted(what);
    Collective& c = transport_->collectives[key];
    if (c.arrived.empty()) {
      c.kind = kind;
      c.count = count;
      c.first_rank = rank_;
      c.arrived.assign(size(), false);
      c.contributions.resize(size());
      c.color_key.resize(size());
    } else if (c.error.empty() && (c.kind != kind || c.count != count)) {
      c.error = "collective #" + std::to_string(sequence) + " on communicator " + std::to_string(comm_id_) +
                ": rank " + std::to_string(c.first_rank) + " called " + collective_name(c.kind) + " of " +
                std::to_string(c.count) + " elements but rank " + std::to_string(rank_) + " called " +
                collective_name(kind) + " of " + std::to_string(count);
    }
    c.arrived[rank_] = true;
    ++c.arrived_count;
    c.contributions[rank_].assign(data.begin(), data.end());
    c.color_key[rank_] = color_key;
    if (c.arrived_count == size() && c.error.empty()) complete(c);
    transport_->changed.notify_all();
    if (result.empty()) result = data;
    const auto offset = static_cast<size_t>(result.data() - data.data());
    return std::make_unique<CollectiveRequest>(transport_, key, rank_, size(), result, offset, what);
  }

  void complete(Collective& c) {  // under the lock, once every rank has arrived
    if (c.kind == CollectiveKind::kAllreduceFloat) sum_in_rank_order<float>(c.contributions, c.count, c.sum);
    if (c.kind == CollectiveKind::kAllreduceDouble) sum_in_rank_order<double>(c.contributions, c.count, c.sum);
    if (c.kind == CollectiveKind::kReduceScatterFloat) sum_in_rank_order<float>(c.contributions, c.count, c.sum);
    if (c.kind == CollectiveKind::kAllgatherFloat) {  // shard r from rank r
      c.sum.resize(c.count * sizeof(float));
      const size_t shard = c.sum.size() / static_cast<size_t>(size());
      for (int r = 0; r < size(); ++r)
        std::memcpy(c.sum.data() + r * shard, c.contributions[static_cast<size_t>(r)].data() + r * shard, shard);
    }
    c.contributions.clear();
    if (c.kind != CollectiveKind::kSplit) return;
    // MPI_Comm_split: colors in ascending order get ids in that order; members ordered by (key, old rank).
    c.places.assign(size(), SplitPlace{});
    std::map<int, std::vector<std::pair<int, int>>> members;  // color -> (key, rank)
    for (int r = 0; r < size(); ++r)
      if (c.color_key[r].first >= 0) members[c.color_key[r].first].push_back({c.color_key[r].second, r});
    for (auto& [color, group] : members) {
      std::sort(group.begin(), group.end());
      const int id = transport_->next_comm_id++;
      std::vector<int> world;
      for (const auto& [k, r] : group) world.push_back(world_ranks_[r]);
      for (size_t i = 0; i < group.size(); ++i) c.places[group[i].second] = SplitPlace{id, static_cast<int>(i), world};
    }
  }

  std::shared_ptr<Transport> transport_;
  int comm_id_;
  int rank_;
  std::vector<int> world_ranks_;  // by rank in this communicator
  uint64_t next_collective_ = 0;  // collectives are matched by call order, as MPI matches them
};

}  // namespace

void Communicator::check_peer_and_tag(const char* operation, int peer, int tag) const {
  if (peer < 0 || peer >= size())
    throw InvalidArgument(std::string(operation) + " rank " + std::to_string(peer) + ": the communicator has ranks 0.." +
                          std::to_string(size() - 1));
  if (tag < 0 || tag > kMaxTag)
    throw InvalidArgument(std::string(operation) + " rank " + std::to_string(peer) + ": tag " + std::to_string(tag) +
                          " is outside [0, " + std::to_string(kMaxTag) + "]");
}

size_t Communicator::shard_length(const char* operation, size_t elements) const {
  const auto ranks = static_cast<size_t>(size());
  if (elements % ranks != 0)
    throw InvalidArgument(std::string(operation) + " of " + std::to_string(elements) + " elements over " +
                          std::to_string(ranks) + " ranks: the count must be a multiple of the rank count (pad it)");
  return elements / ranks;
}

std::vector<Pending> Communicator::post_group(std::span<const SendPart> sends, std::span<const RecvPart> recvs) {
  std::vector<Pending> requests;
  for (const SendPart& s : sends) requests.push_back(send(s.data, s.peer, s.tag));
  for (const RecvPart& r : recvs) requests.push_back(recv(r.data, r.peer, r.tag));
  return requests;
}

Pending Communicator::reduce_scatter_sum(std::span<float> data) {
  shard_length("reduce_scatter_sum", data.size());
  return allreduce_sum(data);
}

Pending Communicator::allgather(std::span<float> data) {
  const size_t n = shard_length("allgather", data.size());
  const size_t mine = static_cast<size_t>(rank()) * n;
  std::fill(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(mine), 0.0f);
  std::fill(data.begin() + static_cast<std::ptrdiff_t>(mine + n), data.end(), 0.0f);
  return allreduce_sum(data);
}

std::vector<std::unique_ptr<Communicator>> make_in_process_communicators(int size, const CommOptions& options) {
  if (size < 1) throw InvalidArgument("in-process communicators: size " + std::to_string(size) + " is not >= 1");
  if (!(options.timeout_s > 0))
    throw InvalidArgument("CommOptions::timeout_s " + format_significant(options.timeout_s) + " s is not > 0");
  auto transport = std::make_shared<Transport>(size, options);
  std::vector<int> world(size);
  for (int r = 0; r < size; ++r) world[r] = r;
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(std::make_unique<InProcessCommunicator>(transport, 0, r, world));
  return comms;
}

}  // namespace apart
