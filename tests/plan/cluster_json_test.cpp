// apart.cluster/1: presets and custom devices read with their links, round trip, every field range-checked.
#include "plan/cluster_json.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "graph/error.h"

namespace apart {
namespace {

TEST(ClusterJson, ReadsPresetAndCustomDevicesWithLinks) {
  const auto j = nlohmann::json::parse(R"({
    "schema": "apart.cluster/1",
    "device": {"base": "a100-80gb", "name": "a100-tuned", "memory_bytes": 80000000000},
    "devices": 32, "devices_per_node": 4,
    "intra_node": {"bandwidth_bytes_per_s": 2e11, "latency_s": 2e-6},
    "inter_node": {"bandwidth_bytes_per_s": 1.25e10, "latency_s": 8e-6}})");
  const Cluster c = cluster_from_json(j);
  EXPECT_EQ(c.device.name, "a100-tuned");
  EXPECT_EQ(c.device.memory_bytes, 80000000000);
  EXPECT_DOUBLE_EQ(c.device.peak_fp16_flops, 312e12);
  EXPECT_EQ(c.devices, 32);
  EXPECT_EQ(c.node_of(5), 1);
  EXPECT_DOUBLE_EQ(c.inter_node.bandwidth, 1.25e10);
  const Cluster round = cluster_from_json(cluster_to_json(c));
  EXPECT_EQ(round.devices_per_node, 4);
  EXPECT_DOUBLE_EQ(round.intra_node.latency_s, 2e-6);
}

std::string cluster_error(const char* text) {
  try {
    cluster_from_json(nlohmann::json::parse(text), "k.json");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

TEST(ClusterJson, FusesOnDatasheetDevicesUnlessTheFileSaysNot) {
  auto device = [](const char* text) { return cluster_from_json(nlohmann::json::parse(text)).device; };
  EXPECT_TRUE(device(R"({"device": "a100-80gb"})").fuses_elementwise);
  EXPECT_TRUE(device(R"({"device": {"base": "h100-80gb"}})").fuses_elementwise);
  EXPECT_TRUE(device(R"({"device": {"name": "x", "peak_flops": {"fp32": 1e13}, "memory_bandwidth_bytes_per_s": 1e12,
                                    "memory_bytes": 1e10},
                         "intra_node": {"bandwidth_bytes_per_s": 1e11}, "inter_node": {"bandwidth_bytes_per_s": 1e10}})")
                  .fuses_elementwise);
  const Cluster unfused = cluster_from_json(nlohmann::json::parse(R"({"device": {"base": "a100-80gb", "fuses_elementwise": false}})"));
  EXPECT_FALSE(unfused.device.fuses_elementwise);
  EXPECT_FALSE(cluster_from_json(cluster_to_json(unfused)).device.fuses_elementwise);
  EXPECT_NE(cluster_error(R"({"device": {"base": "a100-80gb", "fuses_elementwise": 1}})").find("fuses_elementwise"),
            std::string::npos);
}

// Issue 11: devices 7.5 was truncated to 7, a huge count reported "got -2147483648" (undefined conversion), and a
// negative kernel overhead or latency was accepted.
TEST(ClusterJson, RefusesFiguresOutsideTheDocumentedRangesNamingTheField) {
  EXPECT_NE(cluster_error(R"({"device": "a100-80gb", "devices": 7.5})").find("k.json: devices must be an integer in [1, 1048576] (got 7.5)"),
            std::string::npos) << cluster_error(R"({"device": "a100-80gb", "devices": 7.5})");
  EXPECT_NE(cluster_error(R"({"device": "a100-80gb", "devices": 99999999999})").find("(got 99999999999)"), std::string::npos);
  EXPECT_NE(cluster_error(R"({"device": {"base": "a100-80gb", "kernel_overhead_s": -1e-6}})")
                .find("device.kernel_overhead_s must be a finite number in [0, 32000000]"),
            std::string::npos);
  EXPECT_NE(cluster_error(R"({"device": "a100-80gb", "inter_node": {"latency_s": -1}})").find("inter_node.latency_s"),
            std::string::npos);
  EXPECT_NE(cluster_error(R"({"device": {"base": "a100-80gb", "memory_bytes": 1e300}})").find("device.memory_bytes"),
            std::string::npos);
  EXPECT_NE(cluster_error(R"({"device": {"base": 5}})").find("device.base must be a string (got a number)"), std::string::npos)
      << cluster_error(R"({"device": {"base": 5}})");
}

TEST(ClusterJson, RejectsMalformedClusters) {
  EXPECT_THROW(cluster_from_json(nlohmann::json::parse(R"({"devices": 4})")), InvalidArgument);
  EXPECT_THROW(cluster_from_json(nlohmann::json::parse(R"({"device": "a100-80gb", "devices": 0})")), InvalidArgument);
  EXPECT_THROW(cluster_from_json(nlohmann::json::parse(R"({"device": "a100-80gb", "devices": "many"})")), InvalidArgument);
  EXPECT_THROW(cluster_from_json(nlohmann::json::parse(
                   R"({"device": "a100-80gb", "inter_node": {"bandwidth_bytes_per_s": -1}})")),
               InvalidArgument);
  EXPECT_THROW(load_cluster_json("/nonexistent/cluster.json"), SystemError);
}

}  // namespace
}  // namespace apart
