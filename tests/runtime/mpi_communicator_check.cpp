// Run under `mpirun -np 3`: the MPI Communicator passes the in-process one's checks (mpi_communicator_test.cpp runs it).
// No arguments: every check, exit 0 when all pass. --exit-mid-run: rank 1 exits(3) while the others wait on it.
// --abort: rank 2 calls abort() while the others wait on it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/communicator.h"

namespace apart {
namespace {

int failures = 0;
int my_rank = -1;

void expect(bool condition, const std::string& what) {
  if (condition) return;
  std::fprintf(stderr, "mpi_communicator_check: rank %d: FAIL: %s\n", my_rank, what.c_str());
  ++failures;
}

std::vector<std::byte> pattern(size_t bytes, int salt) {
  std::vector<std::byte> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<std::byte>((i * 131 + salt * 17 + (i >> 8)) & 0xff);
  return v;
}

template <class T>
std::vector<T> contribution(int rank, size_t count, bool integers) {
  std::vector<T> v(count);
  uint64_t state = 0x9e3779b97f4a7c15ull * (rank + 1);
  for (size_t i = 0; i < count; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const double unit = static_cast<double>(state >> 11) / static_cast<double>(1ull << 53);
    v[i] = integers ? static_cast<T>(static_cast<int>(unit * 1000) - 500)
                    : static_cast<T>((unit - 0.5) * (i % 3 == 0 ? 1e6 : i % 3 == 1 ? 1.0 : 1e-6));
  }
  return v;
}

// Every rank sends to the next and receives from the previous, at sizes from 0 bytes to 8 MiB, one tag per size;
// the receives are posted in the reverse order of the sends.
void check_point_to_point(Communicator& world) {
  const int n = world.size(), r = world.rank();
  const std::vector<size_t> sizes = {0, 1, 7, 4096, 1 << 20, 8 << 20};
  std::vector<std::vector<std::byte>> out(sizes.size()), in(sizes.size());
  std::vector<Pending> receives(sizes.size()), sends;
  for (size_t i = sizes.size(); i-- > 0;) {
    in[i].assign(sizes[i], std::byte{0});
    receives[i] = world.recv(in[i], (r + n - 1) % n, static_cast<int>(i));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    out[i] = pattern(sizes[i], r * 10 + static_cast<int>(i));
    sends.push_back(world.send(out[i], (r + 1) % n, static_cast<int>(i)));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    receives[i]->wait();
    expect(in[i] == pattern(sizes[i], ((r + n - 1) % n) * 10 + static_cast<int>(i)),
           "message of " + std::to_string(sizes[i]) + " bytes arrived changed");
  }
  for (auto& s : sends) s->wait();
}

// The group's result must be the same bits on every member: each sends its result to the group's rank 0.
template <class T>
void expect_same_bits_in_group(Communicator& group, const std::vector<T>& result, const std::string& what) {
  const size_t bytes = result.size() * sizeof(T);
  if (group.rank() != 0) {
    group.send(std::as_bytes(std::span<const T>(result)), 0, 100)->wait();
    return;
  }
  for (int p = 1; p < group.size(); ++p) {
    std::vector<T> theirs(result.size());
    group.recv(std::as_writable_bytes(std::span<T>(theirs)), p, 100)->wait();
    expect(std::memcmp(theirs.data(), result.data(), bytes) == 0, what + ": group rank " + std::to_string(p) +
                                                                      " holds other bits than group rank 0");
  }
}

// Split by parity ({0,2} and {1} on 3 ranks): integer-valued sums equal the serial sum exactly; sums of mixed
// magnitudes are the same bits on every member and in a second run.
template <class T>
void check_allreduce(Communicator& world, const char* type) {
  const int r = world.rank();
  std::unique_ptr<Communicator> group = world.split(r % 2, r);
  std::vector<int> members;
  for (int p = r % 2; p < world.size(); p += 2) members.push_back(p);
  expect(group->size() == static_cast<int>(members.size()), std::string(type) + ": split group size");
  constexpr size_t kCount = 100003;

  std::vector<T> exact = contribution<T>(r, kCount, true);
  group->allreduce_sum(std::span<T>(exact))->wait();
  std::vector<T> serial(kCount, T{0});
  for (int p : members) {
    const std::vector<T> x = contribution<T>(p, kCount, true);
    for (size_t i = 0; i < kCount; ++i) serial[i] += x[i];
  }
  expect(exact == serial, std::string(type) + ": the integer-valued sum differs from the serial sum");

  std::vector<T> first = contribution<T>(r, kCount, false), second = first;
  Pending a = group->allreduce_sum(std::span<T>(first));
  Pending b = group->allreduce_sum(std::span<T>(second));  // two in flight at once
  b->wait();
  a->wait();
  expect(std::memcmp(first.data(), second.data(), kCount * sizeof(T)) == 0,
         std::string(type) + ": the same all-reduce gave other bits the second time");
  expect_same_bits_in_group(*group, first, type);
  world.barrier();
}

// ZeRO's pair over the same parity groups: the reduce-scattered shard is the serial sum of integer-valued
// contributions, and the all-gather hands every member every member's shard.
void check_reduce_scatter_and_allgather(Communicator& world) {
  const int r = world.rank();
  std::unique_ptr<Communicator> group = world.split(r % 2, r);
  std::vector<int> members;
  for (int p = r % 2; p < world.size(); p += 2) members.push_back(p);
  const size_t shard = 25001, count = shard * members.size();
  std::vector<float> data = contribution<float>(r, count, true);
  group->reduce_scatter_sum(std::span<float>(data))->wait();
  std::vector<float> serial(count, 0.0f);
  for (int p : members) {
    const std::vector<float> x = contribution<float>(p, count, true);
    for (size_t i = 0; i < count; ++i) serial[i] += x[i];
  }
  const size_t at = static_cast<size_t>(group->rank()) * shard;
  expect(std::equal(serial.begin() + at, serial.begin() + at + shard, data.begin() + at),
         "reduce_scatter_sum: this rank's shard is not the serial sum");
  std::vector<float> gathered = contribution<float>(r + 50, count, false);
  group->allgather(std::span<float>(gathered))->wait();
  for (size_t m = 0; m < members.size(); ++m) {
    const std::vector<float> theirs = contribution<float>(members[m] + 50, count, false);
    expect(std::memcmp(gathered.data() + m * shard, theirs.data() + m * shard, shard * sizeof(float)) == 0,
           "allgather: shard " + std::to_string(m) + " is not its owner's");
  }
  world.barrier();
}

void check_errors(Communicator& world) {
  const int r = world.rank();
  std::unique_ptr<Communicator> quick = make_mpi_communicator({.timeout_s = 0.3});
  std::vector<std::byte> buffer(16);
  if (r == 0) {
    try {
      quick->recv(buffer, 1, 77)->wait();  // rank 1 never sends on tag 77
      expect(false, "a recv with no sender returned");
    } catch (const CommError& e) {
      expect(std::string(e.what()).find("timed out") != std::string::npos, std::string("timeout: ") + e.what());
      expect(std::string(e.what()).find("tag 77") != std::string::npos, std::string("timeout: ") + e.what());
    }
    try {
      quick->recv(buffer, 1, 5)->wait();  // rank 1 sends 8 bytes
      expect(false, "a 16-byte recv of an 8-byte message returned");
    } catch (const CommError& e) {
      expect(std::string(e.what()).find("has 8 bytes") != std::string::npos, std::string("smaller: ") + e.what());
    }
    std::vector<std::byte> small(8);
    try {
      quick->recv(small, 1, 6)->wait();  // rank 1 sends 16 bytes
      expect(false, "an 8-byte recv of a 16-byte message returned");
    } catch (const CommError& e) {
      expect(std::string(e.what()).find("larger than the 8 bytes") != std::string::npos,
             std::string("larger: ") + e.what());
    }
  } else if (r == 1) {
    const auto eight = pattern(8, 0), sixteen = pattern(16, 0);
    quick->send(eight, 0, 5)->wait();
    quick->send(sixteen, 0, 6)->wait();
  }
  bool refused = false;
  try {
    quick->send(buffer, 0, Communicator::kMaxTag + 1);
  } catch (const InvalidArgument&) {
    refused = true;
  }
  expect(refused, "tag kMaxTag + 1 was accepted");
  world.barrier();   // rank 0 spent its timeouts; the others must not spend theirs waiting for it
  quick->barrier();  // the communicator still works after the errors
}

int run_checks() {
  std::unique_ptr<Communicator> world = make_mpi_communicator({.timeout_s = 60});
  my_rank = world->rank();
  expect(mpi_available(), "mpi_available() is false");
  expect(launched_by_mpi(), "launched_by_mpi() is false under mpirun");
  check_point_to_point(*world);
  check_allreduce<float>(*world, "float");
  check_allreduce<double>(*world, "double");
  check_reduce_scatter_and_allgather(*world);
  check_errors(*world);
  world->barrier();
  const char* algorithm = std::getenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm");
  std::printf("mpi_communicator_check: rank %d/%d: iallreduce algorithm %s\n", world->rank(), world->size(),
              algorithm ? algorithm : "(unset)");
  std::printf("mpi_communicator_check: rank %d/%d: %s\n", world->rank(), world->size(),
              failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}

// A rank that leaves or aborts while the others wait on it: the others must not hang (mpirun ends them).
int run_fault(bool exit_mid_run) {
  std::unique_ptr<Communicator> world = make_mpi_communicator({.timeout_s = 50});
  const int faulty = exit_mid_run ? 1 : 2;
  world->barrier();
  if (world->rank() == faulty) {
    if (exit_mid_run) std::exit(3);
    world->abort("check: rank 2 aborts on purpose", 1);
  }
  std::vector<std::byte> buffer(8);
  try {
    world->recv(buffer, faulty, 1)->wait();
  } catch (const CommError& e) {
    std::fprintf(stderr, "mpi_communicator_check: rank %d: %s\n", world->rank(), e.what());
    return 4;  // reached only if mpirun did not end this rank first: the timeout still bounds it
  }
  return 0;
}

}  // namespace
}  // namespace apart

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "--exit-mid-run") return apart::run_fault(true);
    if (mode == "--abort") return apart::run_fault(false);
    return apart::run_checks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_communicator_check: rank %d: %s\n", apart::my_rank, e.what());
    return 2;
  }
}
