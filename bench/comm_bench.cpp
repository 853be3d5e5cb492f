// Point-to-point and all-reduce bandwidth through apart's MPI Communicator vs a plain MPI loop of the same sizes,
// in one run: `mpirun -np 2 build/release/bench/bench_comm`. Rank 0 prints the table.
// The baseline is plain MPI, so this file includes mpi.h: the one place outside runtime/ that does, because the
// comparison needs it (docs/architecture.md: only runtime/ touches MPI in the product).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "runtime/communicator.h"

namespace {

using Clock = std::chrono::steady_clock;

// Best of `reps` timings of `iterations` calls of `body`, the ranks lined up by a barrier before each.
double best_seconds(int reps, int iterations, const std::function<void()>& body) {
  double best = 1e30;
  body();  // warm-up: connections, registration, first-touch pages
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) body();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count() / iterations);
  }
  double slowest = 0;  // the time of an iteration is the slower rank's
  MPI_Allreduce(&best, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

std::string size_label(size_t bytes) {
  if (bytes >= (1u << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

}  // namespace

int main() {
  std::unique_ptr<apart::Communicator> comm = apart::make_mpi_communicator({.timeout_s = 120});
  const int rank = comm->rank();
  if (comm->size() != 2) {
    if (rank == 0) std::fprintf(stderr, "bench_comm: run it as mpirun -np 2 (got %d ranks)\n", comm->size());
    return 2;
  }
  const int peer = 1 - rank;
  if (rank == 0) {
    std::printf("Bandwidth through apart's Communicator vs plain MPI on the same 2 ranks (best of 3, GB/s = 1e9 B/s)\n");
    std::printf("ping-pong: bytes moved each way / half the round trip; all-reduce (float sum): bytes / time;\n");
    std::printf("apart's all-reduce is MPI_Iallreduce polled by wait(): MPI_I = MPI_Iallreduce + MPI_Wait, MPI =\n");
    std::printf("MPI_Allreduce; p2p MPI = MPI_Send/MPI_Recv; apart/MPI compares with the blocking calls\n\n");
    std::printf("%8s | %10s %10s %9s | %10s %10s %10s %9s\n", "size", "p2p apart", "p2p MPI", "apart/MPI",
                "ar apart", "ar MPI_I", "ar MPI", "apart/MPI");
  }
  for (size_t bytes = 1 << 10; bytes <= (64u << 20); bytes *= 4) {
    std::vector<std::byte> buffer(bytes, std::byte{1});
    std::vector<float> values(bytes / sizeof(float), 0.0f);  // zeros stay zeros: no overflow over the iterations
    const int iterations = static_cast<int>(std::clamp<size_t>((256u << 20) / bytes, 3, 2000));
    const int count = static_cast<int>(bytes);

    const double p2p_apart = best_seconds(3, iterations, [&] {
      if (rank == 0) {
        comm->send(buffer, peer, 0)->wait();
        comm->recv(buffer, peer, 0)->wait();
      } else {
        comm->recv(buffer, peer, 0)->wait();
        comm->send(buffer, peer, 0)->wait();
      }
    });
    const double p2p_mpi = best_seconds(3, iterations, [&] {
      if (rank == 0) {
        MPI_Send(buffer.data(), count, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
        MPI_Recv(buffer.data(), count, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Recv(buffer.data(), count, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(buffer.data(), count, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
      }
    });
    const double ar_apart =
        best_seconds(3, iterations, [&] { comm->allreduce_sum(std::span<float>(values))->wait(); });
    const double ar_mpi = best_seconds(3, iterations, [&] {
      MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    const double ar_mpi_nonblocking = best_seconds(3, iterations, [&] {
      MPI_Request request;
      MPI_Iallreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                     &request);
      MPI_Wait(&request, MPI_STATUS_IGNORE);
    });
    if (rank == 0) {
      const double gb = static_cast<double>(bytes) / 1e9;
      std::printf("%8s | %10.3f %10.3f %9.2f | %10.3f %10.3f %10.3f %9.2f\n", size_label(bytes).c_str(),
                  gb / (p2p_apart / 2), gb / (p2p_mpi / 2), p2p_mpi / p2p_apart, gb / ar_apart,
                  gb / ar_mpi_nonblocking, gb / ar_mpi, ar_mpi / ar_apart);
    }
  }
  return 0;
}
