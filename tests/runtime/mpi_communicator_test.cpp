// The MPI Communicator under `mpirun -np 3`: mpi_communicator_check's checks pass, and a failing rank ends the run.
#include <gtest/gtest.h>

#include <string>

#include "runtime/communicator.h"
#include "tests/support/run_apart.h"

namespace apart {
namespace {

using testing::run_command;

bool have_mpirun() { return run_command("command -v mpirun >/dev/null 2>&1").code == 0; }

// Open MPI refuses root without the two variables; LeakSanitizer would fail every rank on Open MPI's own
// allocations that live until exit.
testing::CommandRun mpirun3(const std::string& args) {
#ifdef APART_MPI_CHECK_BINARY
  return run_command(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 "
      "mpirun --timeout 60 --oversubscribe -np 3 " APART_MPI_CHECK_BINARY " " + args + " 2>&1");
#else
  return {};
#endif
}

#define SKIP_WITHOUT_MPI()                                                   \
  do {                                                                       \
    if (!mpi_available()) GTEST_SKIP() << "this build has no MPI";           \
    if (!have_mpirun()) GTEST_SKIP() << "mpirun is not on PATH";             \
  } while (0)

TEST(AnMpiRunOfThreeRanks, PassesEveryCommunicatorCheck) {
  SKIP_WITHOUT_MPI();
  const auto run = mpirun3("");
  EXPECT_EQ(run.code, 0) << run.out;
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(run.out.find("rank " + std::to_string(r) + "/3: ok"), std::string::npos) << run.out;
}

// Open MPI's non-blocking all-reduce (the gradient buckets') runs the ring algorithm unless the user chose one.
TEST(AnMpiRunOfThreeRanks, ReducesBucketsWithTheRingAlgorithmUnlessTheUserChoseAnother) {
  SKIP_WITHOUT_MPI();
  const auto run = mpirun3("");
  EXPECT_NE(run.out.find("rank 0/3: iallreduce algorithm 1"), std::string::npos) << run.out;
#ifdef APART_MPI_CHECK_BINARY
  const auto chosen = run_command(
      "OMPI_MCA_coll_libnbc_iallreduce_algorithm=3 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "ASAN_OPTIONS=detect_leaks=0 mpirun --timeout 60 --oversubscribe -np 3 " APART_MPI_CHECK_BINARY " 2>&1");
  EXPECT_EQ(chosen.code, 0) << chosen.out;
  EXPECT_NE(chosen.out.find("rank 0/3: iallreduce algorithm 3"), std::string::npos) << chosen.out;
#endif
}

TEST(AnMpiRankThatExitsMidRun, EndsTheWholeRunWithANonZeroStatus) {
  SKIP_WITHOUT_MPI();
  const auto run = mpirun3("--exit-mid-run");
  EXPECT_NE(run.code, 0) << run.out;
  EXPECT_EQ(run.out.find("timed out"), std::string::npos) << "the others waited for their timeout:\n" << run.out;
}

TEST(AnMpiAbort, EndsEveryRankWithANonZeroStatusAndPrintsTheReason) {
  SKIP_WITHOUT_MPI();
  const auto run = mpirun3("--abort");
  EXPECT_NE(run.code, 0) << run.out;
  EXPECT_NE(run.out.find("check: rank 2 aborts on purpose"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("timed out"), std::string::npos) << run.out;
}

TEST(ABuildWithoutMpi, SaysSoWhenAskedForAnMpiCommunicator) {
  if (mpi_available()) GTEST_SKIP() << "this build has MPI";
  EXPECT_THROW(make_mpi_communicator(), Unsupported);
}

}  // namespace
}  // namespace apart
