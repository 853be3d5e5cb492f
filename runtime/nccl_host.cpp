// The NCCL communicator's host-side logic: id frames, the polling wait, request states, the self mailbox.
#include "runtime/nccl_host.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

#include "graph/units.h"

namespace apart::nccl {
namespace {

constexpr char kFrameMagic[16] = "apart-nccl-id";  // 13 characters, zero-padded to 16
constexpr uint32_t kFrameVersion = 1;

uint64_t fnv1a(std::span<const std::byte> bytes) {
  uint64_t hash = 1469598103934665603ull;
  for (std::byte b : bytes) {
    hash ^= static_cast<uint8_t>(b);
    hash *= 1099511628211ull;
  }
  return hash;
}

// Little-endian fields, so that the frame's layout does not depend on the host.
void put_u32(std::byte* at, uint32_t v) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}
void put_u64(std::byte* at, uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}
uint32_t get_u32(const std::byte* at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(at[i])) << (8 * i);
  return v;
}
uint64_t get_u64(const std::byte* at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(at[i])) << (8 * i);
  return v;
}

constexpr size_t kVersionAt = 16, kNcclAt = 20, kSizeAt = 24, kIdAt = 28, kChecksumAt = kIdAt + kUniqueIdBytes;
static_assert(kChecksumAt + 8 == kUniqueIdFrameBytes);

}  // namespace

std::string nccl_version_name(int version) {
  // NCCL_VERSION(X, Y, Z): X*1000 + Y*100 + Z before 2.9, X*10000 + Y*100 + Z since.
  const bool new_code = version >= 10000;
  const int major = new_code ? version / 10000 : version / 1000;
  const int minor = new_code ? version / 100 % 100 : version / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(version % 100);
}

std::vector<std::byte> encode_unique_id_frame(const UniqueId& id, int nccl_version, int size) {
  std::vector<std::byte> frame(kUniqueIdFrameBytes);
  std::memcpy(frame.data(), kFrameMagic, sizeof kFrameMagic);
  put_u32(frame.data() + kVersionAt, kFrameVersion);
  put_u32(frame.data() + kNcclAt, static_cast<uint32_t>(nccl_version));
  put_u32(frame.data() + kSizeAt, static_cast<uint32_t>(size));
  std::memcpy(frame.data() + kIdAt, id.data(), kUniqueIdBytes);
  put_u64(frame.data() + kChecksumAt, fnv1a(std::span(frame).first(kChecksumAt)));
  return frame;
}

UniqueId decode_unique_id_frame(std::span<const std::byte> frame, int nccl_version, int size, int rank) {
  const std::string who = "NCCL communicator, rank " + std::to_string(rank) + ": the unique id from rank 0 ";
  if (frame.size() != kUniqueIdFrameBytes)
    throw CommError(who + "has " + std::to_string(frame.size()) + " bytes, not " +
                    std::to_string(kUniqueIdFrameBytes));
  if (std::memcmp(frame.data(), kFrameMagic, sizeof kFrameMagic) != 0 ||
      get_u32(frame.data() + kVersionAt) != kFrameVersion)
    throw CommError(who + "is not an apart NCCL id frame (another program on the bootstrap's tag " +
                    std::to_string(kUniqueIdTag) + "?)");
  if (get_u64(frame.data() + kChecksumAt) != fnv1a(frame.first(kChecksumAt)))
    throw CommError(who + "fails its checksum (corrupted in transit)");
  const int root_version = static_cast<int>(get_u32(frame.data() + kNcclAt));
  if (root_version != nccl_version)
    throw CommError(who + "was made by NCCL " + nccl_version_name(root_version) + ", this rank runs NCCL " +
                    nccl_version_name(nccl_version) + ": every rank must load the same libnccl");
  const int root_size = static_cast<int>(get_u32(frame.data() + kSizeAt));
  if (root_size != size)
    throw CommError(who + "is for " + std::to_string(root_size) + " ranks, this rank's bootstrap has " +
                    std::to_string(size));
  UniqueId id;
  std::memcpy(id.data(), frame.data() + kIdAt, kUniqueIdBytes);
  return id;
}

UniqueId broadcast_unique_id(Communicator& bootstrap, const std::function<UniqueId()>& make_id, int nccl_version) {
  const int size = bootstrap.size();
  if (bootstrap.rank() == 0) {
    const UniqueId id = make_id();
    const std::vector<std::byte> frame = encode_unique_id_frame(id, nccl_version, size);
    std::vector<Pending> sends;
    for (int peer = 1; peer < size; ++peer) sends.push_back(bootstrap.send(frame, peer, kUniqueIdTag));
    for (Pending& s : sends) s->wait();
    return id;
  }
  std::vector<std::byte> frame(kUniqueIdFrameBytes);
  bootstrap.recv(frame, 0, kUniqueIdTag)->wait();
  return decode_unique_id_frame(frame, nccl_version, size, bootstrap.rank());
}

PollClock PollClock::steady() {
  using Clock = std::chrono::steady_clock;
  return PollClock{
      [] { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); },
      [](double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }};
}

bool poll_until(const std::function<bool()>& done, double timeout_s, const PollClock& clock) {
  constexpr int kSpinPolls = 64;  // a collective that is about to finish is seen without a sleep's latency
  const double start_s = clock.now_s();
  double sleep_s = 1e-6;
  for (int poll = 0;; ++poll) {
    if (done()) return true;
    const double waited_s = clock.now_s() - start_s;
    if (waited_s >= timeout_s) return done();
    if (poll < kSpinPolls) continue;
    clock.sleep_s(std::min(sleep_s, timeout_s - waited_s));
    sleep_s = std::min(sleep_s * 2, kMaxPollSleep_s);
  }
}

void RequestTracker::throw_if_failed() const {
  if (phase_ == Phase::kFailed) throw CommError(failure_);
}

void RequestTracker::fail(std::string message) {
  phase_ = Phase::kFailed;
  failure_ = std::move(message);
  throw CommError(failure_);
}

void RequestTracker::wait(const std::function<Probe()>& probe, const std::function<void()>& abort_communicator,
                          const PollClock& clock) {
  if (phase_ == Phase::kComplete) return;
  throw_if_failed();
  Probe last;
  const bool finished = poll_until([&] { return (last = probe()).state != Probe::State::kPending; }, timeout_s_, clock);
  if (!finished) {
    // A peer that never posts its side would keep the kernel spinning: abort, so the stream and the peer's wait end.
    abort_communicator();
    fail(what_ + " timed out after " + format_seconds(timeout_s_) +
         " (CommOptions::timeout_s); the NCCL communicator was aborted");
  }
  if (last.state == Probe::State::kFailed) fail(what_ + " failed: " + last.error);
  phase_ = Phase::kComplete;
}

bool RequestTracker::test(const std::function<Probe()>& probe) {
  if (phase_ == Phase::kComplete) return true;
  throw_if_failed();
  const Probe now = probe();
  if (now.state == Probe::State::kFailed) fail(what_ + " failed: " + now.error);
  if (now.state == Probe::State::kPending) return false;
  phase_ = Phase::kComplete;
  return true;
}

OnDestroy RequestTracker::on_destroy(bool unwinding) const {
  if (phase_ != Phase::kPending) return OnDestroy::kNothing;
  return unwinding ? OnDestroy::kAbortCommunicator : OnDestroy::kWait;
}

std::optional<SelfMailbox::Match> SelfMailbox::post_send(int tag, uint64_t id, size_t bytes) {
  auto& waiting = recvs_[tag];
  if (waiting.empty()) {
    sends_[tag].push_back({id, bytes});
    return std::nullopt;
  }
  const Posted recv = waiting.front();
  waiting.pop_front();
  return Match{id, recv.id, bytes, recv.bytes};
}

std::optional<SelfMailbox::Match> SelfMailbox::post_recv(int tag, uint64_t id, size_t bytes) {
  auto& waiting = sends_[tag];
  if (waiting.empty()) {
    recvs_[tag].push_back({id, bytes});
    return std::nullopt;
  }
  const Posted send = waiting.front();
  waiting.pop_front();
  return Match{send.id, id, send.bytes, bytes};
}

void SelfMailbox::withdraw(uint64_t id) {
  for (auto* queues : {&sends_, &recvs_})
    for (auto& [tag, posted] : *queues)
      posted.erase(std::remove_if(posted.begin(), posted.end(), [&](const Posted& p) { return p.id == id; }),
                   posted.end());
}

size_t SelfMailbox::unmatched() const {
  size_t n = 0;
  for (const auto* queues : {&sends_, &recvs_})
    for (const auto& [tag, posted] : *queues) n += posted.size();
  return n;
}

std::vector<StreamItem> group_stream_ops(const std::vector<StreamOp>& ops) {
  std::vector<StreamItem> items;
  std::vector<size_t> deferred;  // sends waiting for the next receive
  for (size_t i = 0; i < ops.size(); ++i) {
    switch (ops[i].kind) {
      case StreamOp::Kind::kSend: deferred.push_back(i); break;
      case StreamOp::Kind::kRecv: {
        StreamItem& group = items.emplace_back();
        group.ops = std::move(deferred);
        deferred.clear();
        group.ops.push_back(i);
        break;
      }
      case StreamOp::Kind::kCollective: items.push_back({{i}}); break;
    }
  }
  if (!deferred.empty()) items.push_back({std::move(deferred)});
  return items;
}

std::vector<int> stuck_ranks(const std::vector<std::vector<StreamOp>>& ops,
                             const std::vector<std::vector<StreamItem>>& items,
                             const std::map<int, std::vector<int>>& members) {
  const size_t ranks = ops.size();
  // Each op's partner: (rank, op index) of the matching receive/send, and each collective's position in its group.
  struct Where {
    int rank = -1;
    size_t op = 0;
  };
  std::vector<std::vector<Where>> partner(ranks);
  std::vector<std::vector<int64_t>> collective_index(ranks);
  std::map<std::pair<int, int>, std::vector<size_t>> sends, recvs;  // (from, to) → ops in order
  for (size_t r = 0; r < ranks; ++r) {
    partner[r].resize(ops[r].size());
    collective_index[r].assign(ops[r].size(), -1);
    std::map<int, int64_t> posted;  // by group
    for (size_t i = 0; i < ops[r].size(); ++i) {
      const StreamOp& op = ops[r][i];
      if (op.kind == StreamOp::Kind::kSend) sends[{static_cast<int>(r), op.peer}].push_back(i);
      if (op.kind == StreamOp::Kind::kRecv) recvs[{op.peer, static_cast<int>(r)}].push_back(i);
      if (op.kind == StreamOp::Kind::kCollective) collective_index[r][i] = posted[op.group]++;
    }
  }
  for (const auto& [channel, sent] : sends) {
    const std::vector<size_t>& received = recvs[channel];
    for (size_t k = 0; k < std::min(sent.size(), received.size()); ++k) {
      partner[static_cast<size_t>(channel.first)][sent[k]] = {channel.second, received[k]};
      partner[static_cast<size_t>(channel.second)][received[k]] = {channel.first, sent[k]};
    }
  }
  // Which item holds each op, each rank's current item, and the ops done.
  std::vector<std::vector<size_t>> item_of(ranks);
  for (size_t r = 0; r < ranks; ++r) {
    item_of[r].assign(ops[r].size(), SIZE_MAX);
    for (size_t k = 0; k < items[r].size(); ++k)
      for (size_t i : items[r][k].ops) item_of[r][i] = k;
  }
  std::vector<size_t> current(ranks, 0);
  std::vector<std::vector<bool>> done(ranks);
  for (size_t r = 0; r < ranks; ++r) done[r].assign(ops[r].size(), false);
  auto is_current = [&](int rank, size_t op) {
    const size_t r = static_cast<size_t>(rank);
    return current[r] < items[r].size() && item_of[r][op] == current[r];
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t r = 0; r < ranks; ++r) {
      if (current[r] >= items[r].size()) continue;
      for (size_t i : items[r][current[r]].ops) {
        if (done[r][i]) continue;
        const StreamOp& op = ops[r][i];
        if (op.kind == StreamOp::Kind::kCollective) {
          const auto it = members.find(op.group);
          bool all_here = it != members.end();
          std::vector<std::pair<size_t, size_t>> theirs;  // (member, its op) of this collective
          for (int m : it != members.end() ? it->second : std::vector<int>{}) {
            const size_t mr = static_cast<size_t>(m);
            bool found = false;
            if (current[mr] < items[mr].size())
              for (size_t j : items[mr][current[mr]].ops)
                if (ops[mr][j].kind == StreamOp::Kind::kCollective && ops[mr][j].group == op.group &&
                    collective_index[mr][j] == collective_index[r][i]) {
                  theirs.emplace_back(mr, j);
                  found = true;
                }
            all_here = all_here && found;
          }
          if (!all_here) continue;
          for (const auto& [mr, j] : theirs) done[mr][j] = true;
          moved = true;
          continue;
        }
        const Where p = partner[r][i];
        if (p.rank < 0 || !is_current(p.rank, p.op)) continue;
        done[r][i] = true;
        done[static_cast<size_t>(p.rank)][p.op] = true;
        moved = true;
      }
    }
    for (size_t r = 0; r < ranks; ++r)
      while (current[r] < items[r].size() &&
             std::all_of(items[r][current[r]].ops.begin(), items[r][current[r]].ops.end(),
                         [&](size_t i) { return done[r][i]; })) {
        ++current[r];
        moved = true;
      }
  }
  std::vector<int> stuck;
  for (size_t r = 0; r < ranks; ++r)
    if (current[r] < items[r].size()) stuck.push_back(static_cast<int>(r));
  return stuck;
}

}  // namespace apart::nccl
