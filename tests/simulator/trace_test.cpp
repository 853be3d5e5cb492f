// The Chrome/Perfetto trace: metadata names, µs complete events nested per thread, matching flow arrows.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "graph/error.h"
#include "simulator/sim_report.h"
#include "simulator/simulate.h"
#include "tests/simulator/sim_test_util.h"

namespace apart::sim {
namespace {

using json = nlohmann::json;

json trace_of(Schedule s, int v) {
  SimPlan p = testing::chain_plan(4, 8, 1.5e-3, 3.1e-3, 2e5);
  p.stages[3].devices = {3};
  SimOptions o;
  o.schedule = s;
  o.virtual_stages = v;
  const SimResult r = simulate(p, o);
  // Round-trip through text, as a viewer would read it.
  return json::parse(simulation_trace(p, r).dump());
}

int64_t ns(const json& micros) { return std::llround(micros.get<double>() * 1e3); }

TEST(ATrace, NamesEveryProcessAndThread) {
  const json t = trace_of(Schedule::k1F1B, 0);
  std::set<int> named_processes;
  std::set<std::pair<int, int>> named_threads, used_threads;
  for (const json& e : t["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") named_processes.insert(e["pid"].get<int>());
    if (e["ph"] == "M" && e["name"] == "thread_name") named_threads.insert({e["pid"].get<int>(), e["tid"].get<int>()});
    if (e["ph"] == "X") used_threads.insert({e["pid"].get<int>(), e["tid"].get<int>()});
  }
  EXPECT_EQ(named_processes, (std::set<int>{0, 1, 2, 3}));
  for (const auto& th : used_threads) EXPECT_TRUE(named_threads.count(th)) << th.first << "/" << th.second;
}

TEST(ATrace, UsesPipeliningActionNames) {
  const std::regex action(R"(^\d+(F\d+|B\d+|SEND_F\d+|SEND_B\d+|RECV_F\d+|RECV_B\d+|REDUCE_GRAD|STEP)$)");
  std::set<std::string> names;
  const json t = trace_of(Schedule::k1F1B, 0);
  for (const json& e : t["traceEvents"])
    if (e["ph"] == "X") {
      const std::string n = e["name"];
      EXPECT_TRUE(std::regex_match(n, action)) << n;
      names.insert(n);
    }
  for (const char* n : {"0F0", "3B7", "0SEND_F0", "1RECV_F0", "3SEND_B0", "2RECV_B0", "0REDUCE_GRAD", "0STEP"})
    EXPECT_TRUE(names.count(n)) << n;
}

TEST(ATrace, NestsCompleteEventsOnEveryThreadInMicroseconds) {
  for (auto [s, v] : {std::pair{Schedule::kGPipe, 0}, std::pair{Schedule::k1F1B, 0}, std::pair{Schedule::kInterleaved, 2}}) {
    const json t = trace_of(s, v);
    std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>> spans;
    int64_t end = 0;
    for (const json& e : t["traceEvents"])
      if (e["ph"] == "X") {
        ASSERT_GE(e["dur"].get<double>(), 0.0);
        spans[{e["pid"].get<int>(), e["tid"].get<int>()}].push_back({ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])});
        end = std::max(end, ns(e["ts"]) + ns(e["dur"]));
      }
    for (auto& [thread, list] : spans) {
      std::sort(list.begin(), list.end());
      for (size_t i = 1; i < list.size(); ++i) {
        // Either disjoint or fully nested; the simulator's threads never nest, so disjoint.
        EXPECT_LE(list[i - 1].second, list[i].first) << "overlap on pid " << thread.first << " tid " << thread.second;
      }
    }
    // µs: the last event ends at the iteration time × 1e6.
    EXPECT_NEAR(static_cast<double>(end) / 1e3, t["otherData"]["iteration_s"].get<double>() * 1e6, 1e-3);
  }
}

TEST(ATrace, LinksEverySendToItsReceiveWithAFlow) {
  const json t = trace_of(Schedule::kInterleaved, 2);
  std::map<int64_t, json> starts, finishes;
  std::set<std::tuple<int, int, int64_t>> send_slices, recv_slices;
  for (const json& e : t["traceEvents"]) {
    if (e["ph"] == "s") {
      EXPECT_TRUE(starts.emplace(e["id"].get<int64_t>(), e).second) << "duplicate flow id";
    }
    if (e["ph"] == "f") {
      EXPECT_EQ(e["bp"], "e");
      EXPECT_TRUE(finishes.emplace(e["id"].get<int64_t>(), e).second) << "duplicate flow id";
    }
    if (e["ph"] == "X" && e["cat"] == "p2p") {
      const std::string n = e["name"];
      auto& set = n.find("SEND") != std::string::npos ? send_slices : recv_slices;
      set.insert({e["pid"].get<int>(), e["tid"].get<int>(), ns(e["ts"])});
    }
  }
  EXPECT_FALSE(starts.empty());
  EXPECT_EQ(starts.size(), send_slices.size());
  for (const auto& [id, s] : starts) {
    ASSERT_TRUE(finishes.count(id)) << "flow " << id << " never finishes";
    const json& f = finishes[id];
    EXPECT_TRUE(send_slices.count({s["pid"].get<int>(), s["tid"].get<int>(), ns(s["ts"])}));
    EXPECT_TRUE(recv_slices.count({f["pid"].get<int>(), f["tid"].get<int>(), ns(f["ts"])}));
    EXPECT_NE(s["pid"], f["pid"]);
  }
  EXPECT_EQ(finishes.size(), starts.size());
}

TEST(ATrace, IsWrittenThroughATemporaryFile) {
  const auto dir = std::filesystem::temp_directory_path() / ("apart_sim_trace_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  write_file_atomically(dir / "trace.json", "{}\n");
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    ++files;
    EXPECT_EQ(e.path().filename(), "trace.json");
  }
  EXPECT_EQ(files, 1u);
  EXPECT_THROW(write_file_atomically(dir / "no" / "such" / "dir.json", "{}"), SystemError);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace apart::sim
