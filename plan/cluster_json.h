// The apart.cluster/1 file (docs/cost-model.md §5): the one reader and writer of profiler's Cluster as JSON, what
// `--cluster` reads.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "profiler/device.h"

namespace apart {

// Throws InvalidArgument naming `source` and the field with its range (devices and devices_per_node integers in
// [1, 2^20], rates in (0, 1e18], times in [0, 3.2e7] s, memory in (0, 2^60] bytes), or SystemError.
Cluster load_cluster_json(const std::filesystem::path& path);
Cluster cluster_from_json(const nlohmann::json& j, const std::string& source = "cluster JSON");
nlohmann::json cluster_to_json(const Cluster& c);
nlohmann::json device_to_json(const Device& d);

}  // namespace apart
