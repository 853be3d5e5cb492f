// The cluster's link rules and the communication-time rules against hand-computed figures.
#include "profiler/collectives.h"

#include <gtest/gtest.h>

#include <vector>

namespace apart {
namespace {

// 16 devices, 8 a node, round link figures.
Cluster two_nodes() {
  Cluster c = make_cluster(device_preset("a100-80gb"), 16, 8);
  c.intra_node = {100e9, 2e-6};
  c.inter_node = {10e9, 10e-6};
  return c;
}

TEST(ACluster, PutsDevicesOfOneNodeOnTheIntraNodeLink) {
  const Cluster c = two_nodes();
  EXPECT_TRUE(c.same_node(0, 7));
  EXPECT_FALSE(c.same_node(7, 8));
  EXPECT_EQ(&c.link_between(0, 7), &c.intra_node);
  EXPECT_EQ(&c.link_between(7, 8), &c.inter_node);
  EXPECT_FALSE(c.fits_one_node());
  EXPECT_TRUE(make_cluster(device_preset("a100-80gb"), 8, 8).fits_one_node());
}

TEST(ACluster, KeepsATransferBetweenGroupsInsideANodeOnlyWhenEveryReplicaPairIs) {
  const Cluster c = two_nodes();
  using G = std::vector<int>;
  EXPECT_EQ(&c.link_between_groups(G{0, 1}, G{2, 3}), &c.intra_node);
  EXPECT_EQ(&c.link_between_groups(G{6, 7}, G{8, 9}), &c.inter_node);
  // Replica i talks to replica i modulo the group's size: 0→2, 1→10 crosses.
  EXPECT_EQ(&c.link_between_groups(G{0, 1}, G{2, 10}), &c.inter_node);
  // One device feeding two: 3→4 and 3→5, both in node 0.
  EXPECT_EQ(&c.link_between_groups(G{3}, G{4, 5}), &c.intra_node);
  EXPECT_EQ(&c.link_between_groups(G{3}, G{4, 12}), &c.inter_node);
  EXPECT_EQ(&c.link_between_groups(G{}, G{4}), &c.inter_node);
}

TEST(ACluster, RingsAmongAGroupInsideANodeOnlyWhenAllOfItIs) {
  const Cluster c = two_nodes();
  using G = std::vector<int>;
  EXPECT_EQ(&c.link_among(G{0, 1, 2, 3, 4, 5, 6, 7}), &c.intra_node);
  EXPECT_EQ(&c.link_among(G{4, 5, 6, 7, 8, 9, 10, 11}), &c.inter_node);
  EXPECT_EQ(&c.link_among(G{0, 8}), &c.inter_node);
  EXPECT_EQ(&c.link_among(G{5}), &c.intra_node);
  EXPECT_EQ(&c.link_among(G{}), &c.inter_node);
  // Every stride-th device (each tensor-parallel group's first): the others do not count.
  EXPECT_EQ(&c.link_among(G{0, 9, 1, 10}, 2), &c.intra_node);
  EXPECT_EQ(&c.link_among(G{0, 1, 9, 10}, 2), &c.inter_node);
  EXPECT_EQ(&c.link_among(G{0, 1, 2, 3, 8, 9, 10, 11}, 4), &c.inter_node);
  EXPECT_EQ(&c.link_among(G{0, 1, 2, 3, 8, 9, 10, 11}, 8), &c.intra_node);
}

TEST(ANamedCluster, TakesAPresetsLinksOrDocumentedDefaultsForAnUnknownDevice) {
  const NamedCluster preset = cluster_for_device_name("h100-80gb", 16, 8);
  EXPECT_EQ(preset.cluster.device.name, "h100-80gb");
  EXPECT_DOUBLE_EQ(preset.cluster.intra_node.bandwidth, device_preset("h100-80gb").intra_node.bandwidth);
  EXPECT_DOUBLE_EQ(preset.cluster.inter_node.bandwidth, device_preset("h100-80gb").inter_node.bandwidth);
  EXPECT_EQ(preset.links_source, "profiler preset h100-80gb");
  const NamedCluster unknown = cluster_for_device_name("tpu-v9", 4, 2);
  EXPECT_EQ(unknown.cluster.device.name, "tpu-v9");
  EXPECT_EQ(unknown.cluster.devices, 4);
  EXPECT_EQ(unknown.cluster.devices_per_node, 2);
  EXPECT_DOUBLE_EQ(unknown.cluster.intra_node.bandwidth, 300e9);
  EXPECT_DOUBLE_EQ(unknown.cluster.intra_node.latency_s, 3e-6);
  EXPECT_DOUBLE_EQ(unknown.cluster.inter_node.bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(unknown.cluster.inter_node.latency_s, 10e-6);
  EXPECT_NE(unknown.links_source.find("unknown device 'tpu-v9'"), std::string::npos);
}

TEST(ATransfer, IsLatencyPlusBytesOverTheSharedLink) {
  const Cluster c = two_nodes();
  EXPECT_DOUBLE_EQ(transfer_time(c.intra_node, 1e9), 2e-6 + 0.01);
  EXPECT_DOUBLE_EQ(p2p_time(c, 0, 7, 1e9), 2e-6 + 0.01);
  EXPECT_DOUBLE_EQ(p2p_time(c, 7, 8, 1e9), 10e-6 + 0.1);
  EXPECT_DOUBLE_EQ(p2p_time(c, 3, 3, 1e9), 0);
}

// Ring all-reduce of B bytes among r ranks: reduce-scatter and all-gather, r − 1 steps each of B / r per rank.
TEST(ARingAllReduce, TakesTwoRMinusOneStepsOfBOverR) {
  const Link l{10e9, 5e-6};
  EXPECT_DOUBLE_EQ(ring_allreduce_time(1, 1e9, l), 0);  // nothing to exchange
  // r = 2: 2 steps of 0.5 GB at 10 GB/s = 0.1 s, plus 2 latencies.
  EXPECT_DOUBLE_EQ(ring_allreduce_time(2, 1e9, l), 0.1 + 10e-6);
  // r = 8: 14 steps of 0.125 GB = 1.75 GB at 10 GB/s = 0.175 s, plus 14 latencies.
  EXPECT_DOUBLE_EQ(ring_allreduce_time(8, 1e9, l), 0.175 + 70e-6);
  const Cluster c = two_nodes();
  const std::vector<int> node0{0, 1, 2, 3, 4, 5, 6, 7}, straddling{4, 5, 6, 7, 8, 9, 10, 11}, spread{0, 8};
  EXPECT_DOUBLE_EQ(allreduce_time(c, node0, 1e9), ring_allreduce_time(8, 1e9, c.intra_node));
  EXPECT_DOUBLE_EQ(allreduce_time(c, straddling, 1e9), ring_allreduce_time(8, 1e9, c.inter_node));
  EXPECT_DOUBLE_EQ(allreduce_time(c, spread, 1e9), ring_allreduce_time(2, 1e9, c.inter_node));
}

// ZeRO's collectives: a ring reduce-scatter or all-gather of B bytes among r ranks is r − 1 steps of B / r.
TEST(ARingReduceScatterAndAllGather, EachTakeRMinusOneStepsOfBOverRAndTogetherAnAllReduce) {
  const Link l{10e9, 5e-6};
  EXPECT_DOUBLE_EQ(ring_reduce_scatter_time(1, 1e9, l), 0);
  EXPECT_DOUBLE_EQ(ring_allgather_time(1, 1e9, l), 0);
  // r = 2: one step of 0.5 GB at 10 GB/s = 0.05 s plus one latency.
  EXPECT_DOUBLE_EQ(ring_reduce_scatter_time(2, 1e9, l), 0.05 + 5e-6);
  // r = 8: 7 steps of 0.125 GB = 0.0875 s plus 7 latencies.
  EXPECT_DOUBLE_EQ(ring_reduce_scatter_time(8, 1e9, l), 0.0875 + 35e-6);
  EXPECT_DOUBLE_EQ(ring_allgather_time(8, 1e9, l), 0.0875 + 35e-6);
  for (int r : {2, 3, 5, 8, 64})
    EXPECT_EQ(ring_reduce_scatter_time(r, 3e8, l) + ring_allgather_time(r, 3e8, l), ring_allreduce_time(r, 3e8, l));
}

TEST(AnOverlappedAllReduce, ExposesWhatBackwardDoesNotHideButAtLeastTheLastBucket) {
  // 100 MB of gradients in four 25 MB buckets taking 1 s in all: the last bucket's quarter is always exposed.
  EXPECT_DOUBLE_EQ(exposed_allreduce_time(1.0, 100e6, 10.0), 0.25);
  // Backward hides 0.4 s of it: 0.6 s remain.
  EXPECT_DOUBLE_EQ(exposed_allreduce_time(1.0, 100e6, 0.4), 0.6);
  // Less than one bucket of gradients: all of it follows the backward.
  EXPECT_DOUBLE_EQ(exposed_allreduce_time(1.0, 10e6, 10.0), 1.0);
}

}  // namespace
}  // namespace apart
