// Fuzz target: bytes as an apart.cluster/1 file (--cluster) through its reader (plan/cluster_json.h). What it accepts
// must survive its own writer: read → write → read gives the same JSON.
#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "fuzz_target.h"
#include "plan/cluster_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return apart::fuzz::run_one([&] {
    const apart::Cluster cluster = apart::load_cluster_json(apart::fuzz::write_scratch("cluster.json", data, size));
    const nlohmann::json written = apart::cluster_to_json(cluster);
    if (apart::cluster_to_json(apart::cluster_from_json(written, "rewritten")) != written)
      apart::fuzz::bug("cluster JSON", "a cluster read back from its own writer differs");
  });
}
