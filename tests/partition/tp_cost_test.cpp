// Tensor parallelism in the stage cost model: what the atomic level records per component (the split tasks' work,
// the regions' collectives, the degrees they refuse) against the detection itself, and stage_cost's arithmetic
// at a degree t against the definitions (docs/cost-model.md "Tensor parallelism").
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <string>

#include "graph/error.h"
#include "importer/importer.h"
#include "models/zoo.h"
#include "partition/atomic.h"
#include "partition/stage_cost.h"
#include "partition/tensor_parallel.h"
#include "profiler/collectives.h"
#include "profiler/cost_model.h"
#include "profiler/device.h"
#include "test_cluster.h"

namespace apart {
namespace {

ImportedModel zoo_gpt(int64_t layers, int64_t batch) {
  models::ZooOptions o;
  o.family = models::Family::kGpt;
  o.name = "gpt";
  o.layers = layers;
  o.hidden = 64;
  o.heads = 4;  // attention allows 1, 2, 4: degree 8 is refused there
  o.seq = 16;
  o.vocab = 96;
  o.weights = models::WeightsMode::kNone;
  ImportOptions io;
  io.batch = batch;
  return import_model_bytes(models::build_zoo_model(o).SerializeAsString(), ".", "gpt.onnx", io);
}

TEST(TheAtomicLevel, RecordsEachSplitTasksWorkAndEachRegionsCollectivesOnceAsTheDetectionFindsThem) {
  const ImportedModel m = zoo_gpt(2, 2);
  CostOptions at_two;
  at_two.reference_batch = m.bound_samples();  // the graph is bound at 2 samples
  const CostTable costs = estimate_costs(m.graph, device_preset("a100-80gb"), at_two);
  const AtomicGraph atomic = build_atomic_graph(m.graph, costs, {});
  ASSERT_EQ(atomic.graph_batch, 2);
  const TensorParallelRegions found = find_tensor_parallel_regions(m.graph, atomic.graph_batch);
  double split_forward = 0, recorded_forward = 0, recorded_saved = 0, split_saved = 0;
  double forward_bytes = 0, backward_bytes = 0;
  int64_t forward_count = 0, backward_count = 0;
  bool refuses_eight = false, refuses_two = false;
  for (const AtomicComponent& c : atomic.components) {
    const bool split = found.roles[c.batch_task.value()] != TpRole::kReplicated;
    if (split) split_forward += c.cost.forward.per_sample_s, split_saved += c.cost.saved_per_sample;
    else EXPECT_EQ(c.cost.tp.forward.per_sample_s, 0) << m.graph.task(c.batch_task).name;
    recorded_forward += c.cost.tp.forward.per_sample_s;
    recorded_saved += c.cost.tp.saved_per_sample;
    forward_bytes += c.cost.tp.forward_collective_per_sample;
    backward_bytes += c.cost.tp.backward_collective_per_sample;
    forward_count += c.cost.tp.forward_collectives;
    backward_count += c.cost.tp.backward_collectives;
    refuses_eight |= (c.cost.tp.refused & 4u) != 0;
    refuses_two |= (c.cost.tp.refused & 1u) != 0;
  }
  EXPECT_GT(split_forward, 0);
  EXPECT_DOUBLE_EQ(recorded_forward, split_forward);
  EXPECT_DOUBLE_EQ(recorded_saved, split_saved);
  // One closing collective per region, one backward all-reduce per region input.
  double ends = 0, inputs = 0;
  int64_t input_count = 0;
  for (const TpRegion& r : found.regions) {
    ends += r.closing == TpClosing::kAllGather ? r.end_bytes_per_sample / 2 : r.end_bytes_per_sample;
    for (ValueId v : r.inputs) inputs += static_cast<double>(m.graph.value(v).bytes) / 2, ++input_count;
  }
  EXPECT_EQ(forward_count, static_cast<int64_t>(found.regions.size()));
  EXPECT_EQ(backward_count, input_count);
  EXPECT_DOUBLE_EQ(forward_bytes, ends);
  EXPECT_DOUBLE_EQ(backward_bytes, inputs);
  EXPECT_TRUE(refuses_eight) << "4 heads refuse degree 8";
  EXPECT_FALSE(refuses_two);
}

// A hand-made range: 10 ms of forward per sample of which 6 split, 20 of backward of which 12, 1 MB saved per
// sample of which 0.5 split, 100 MB of weights of which 80 split, two forward and two backward collectives.
StageRange range_with_tp() {
  StageRange r;
  r.forward = {0.001, 0.010};
  r.backward = {0.002, 0.020};
  r.saved_per_sample = 1e6;
  r.param_bytes = 100'000'000;
  r.tp.forward = {0.0, 0.006};
  r.tp.backward = {0.0, 0.012};
  r.tp.saved_per_sample = 0.5e6;
  r.tp.param_bytes = 80'000'000;
  r.tp.forward_collective_per_sample = 2 * 32768.0;
  r.tp.backward_collective_per_sample = 2 * 32768.0;
  r.tp.forward_collectives = 2;
  r.tp.backward_collectives = 2;
  return r;
}

TrainingSpec training(int64_t batch) {
  TrainingSpec t;
  t.global_batch = batch;
  t.optimizer = Optimizer::kAdam;
  t.precision = Precision::kFp32;
  return t;
}

TEST(AStageCostAtATensorParallelDegree, DividesTheSplitWorkWeightsAndSavedBytesAndAddsTheGroupsAllReduces) {
  const Cluster cluster = testing::test_cluster(8);
  const StageLinks links = assumed_links(cluster, Layout::kStageMajor, 1);
  const StageRange r = range_with_tp();
  const TrainingSpec t = training(8);
  const StageCost one = stage_cost(r, 1, 1, 1, RecomputeScope::kNone, links, t, 0, 1);
  const StageCost four = stage_cost(r, 1, 1, 1, RecomputeScope::kNone, links, t, 0, 4);
  const double u = 8;
  // Degree 1 is the range as it stands.
  EXPECT_DOUBLE_EQ(one.forward_s, 0.001 + 0.010 * u);
  EXPECT_DOUBLE_EQ(one.backward_s, 0.002 + 0.020 * u);
  EXPECT_EQ(one.param_bytes, 100'000'000);
  // Degree 4 (sequence parallel, TrainingSpec's default): 3/4 of the split part goes; each of the two collectives
  // carries half the bytes over the node's link, a reduce-scatter and an all-gather (an all-reduce's time); the
  // backward all-gathers the two region inputs once more for the weight gradients.
  ASSERT_TRUE(four.sequence_parallel);
  const double collective = 2 * ring_allreduce_time(4, 32768.0 * u, links.tensor);
  const double regather = 2 * ring_allgather_time(4, 32768.0 * u, links.tensor);
  EXPECT_NEAR(four.forward_s, 0.001 + 0.010 * u - 0.75 * 0.006 * u + collective, 1e-15);
  EXPECT_NEAR(four.backward_s, 0.002 + 0.020 * u - 0.75 * 0.012 * u + collective + regather, 1e-15);
  EXPECT_EQ(four.param_bytes, 100'000'000 - 60'000'000);
  const double state = state_bytes_per_param_byte(t.optimizer, t.precision);
  EXPECT_NEAR(four.memory_static, 40e6 * state + 0.0, 1.0);  // no workspace in this range
  EXPECT_NEAR(four.memory_per_in_flight, (1e6 - 0.75 * 0.5e6) * u, 1e-6);
  EXPECT_LT(four.optimizer_s, one.optimizer_s);
  // With recomputation the forward, its collectives too, runs again before the backward.
  const StageCost recomputed = stage_cost(r, 1, 1, 1, RecomputeScope::kFull, links, t, 0, 4);
  EXPECT_NEAR(recomputed.backward_s, four.backward_s + four.forward_s, 1e-15);
}

TEST(AStageCostAtATensorParallelDegree, ShardsTheWorkBetweenRegionsAndTheBoundariesUnderSequenceParallelism) {
  const Cluster cluster = testing::test_cluster(8);
  const StageLinks links = assumed_links(cluster, Layout::kStageMajor, 4);
  StageRange r = range_with_tp();
  r.tp.sp_forward = {0.0, 0.002};
  r.tp.sp_backward = {0.0, 0.003};
  r.tp.sp_saved_per_sample = 0.2e6;
  r.in_per_sample = 4096;
  r.out_per_sample = 4096;
  TrainingSpec t = training(8);
  t.sequence_parallel = false;
  const StageCost off = stage_cost(r, 1, 1, 1, RecomputeScope::kNone, links, t, 0, 4);
  t.sequence_parallel = true;
  const StageCost on = stage_cost(r, 1, 1, 1, RecomputeScope::kNone, links, t, 0, 4);
  const double u = 8;
  EXPECT_FALSE(off.sequence_parallel);
  EXPECT_TRUE(on.sequence_parallel);
  // The work between regions divides by the degree; the two all-reduces become a reduce-scatter and an all-gather.
  const double all_reduces = 2 * ring_allreduce_time(4, 32768.0 * u, links.tensor);
  // Forward: each region's closing reduce-scatter and each input's all-gather (2 + 2 here); backward the reverse.
  const double rs_ag = 2 * (ring_reduce_scatter_time(4, 32768.0 * u, links.tensor) +
                            ring_allgather_time(4, 32768.0 * u, links.tensor));
  // Under SP the backward all-gathers the two region inputs again (the weight gradients read them whole).
  const double regather = 2 * ring_allgather_time(4, 32768.0 * u, links.tensor);
  // Without SP the group all-gathers the boundary slices it receives: the inputs before the forward, the outputs'
  // gradients before the backward (4096 bytes per sample each, fp32).
  const double gather = ring_allgather_time(4, 4096.0 * u, links.tensor);
  EXPECT_NEAR(off.forward_s - all_reduces - gather, on.forward_s - rs_ag + 0.75 * 0.002 * u, 1e-12);
  EXPECT_NEAR(off.backward_s - all_reduces - gather, on.backward_s - rs_ag - regather + 0.75 * 0.003 * u, 1e-12);
  EXPECT_NEAR(off.memory_per_in_flight - on.memory_per_in_flight, 0.75 * 0.2e6 * u, 1e-6);
  // Degree 1 has nothing to shard: the same cost either way.
  const StageCost one_on = stage_cost(r, 1, 1, 1, RecomputeScope::kNone, links, t, 0, 1);
  t.sequence_parallel = false;
  const StageCost one_off = stage_cost(r, 1, 1, 1, RecomputeScope::kNone, links, t, 0, 1);
  EXPECT_EQ(one_on.h, one_off.h);
  EXPECT_FALSE(one_on.sequence_parallel);
  EXPECT_DOUBLE_EQ(one_on.in_bytes, 4096.0 * u);
  // Each device of the group sends and receives its quarter of the boundaries, with SP or without (Megatron-LM's
  // scatter/gather), so the pipeline transfers cost the same.
  for (const StageCost* c : {&on, &off}) {
    EXPECT_EQ(c->boundary_parts, 4);
    EXPECT_NEAR(c->in_bytes, one_off.in_bytes / 4, 1e-9);
    EXPECT_NEAR(c->out_bytes, one_off.out_bytes / 4, 1e-9);
  }
  EXPECT_EQ(on.comm_s, off.comm_s);
  EXPECT_LT(on.comm_s, one_off.comm_s);
  // A full recomputation keeps the gathered input whole per micro-batch (SP: its shard) and gathers it once.
  t.sequence_parallel = false;
  const StageCost full_off = stage_cost(r, 1, 1, 1, RecomputeScope::kFull, links, t, 0, 4);
  EXPECT_DOUBLE_EQ(full_off.memory_per_in_flight, 4096.0 * u);
  EXPECT_NEAR(full_off.recompute_s, off.forward_s - gather, 1e-15);
  t.sequence_parallel = true;
  const StageCost full_on = stage_cost(r, 1, 1, 1, RecomputeScope::kFull, links, t, 0, 4);
  EXPECT_DOUBLE_EQ(full_on.memory_per_in_flight, 4096.0 * u / 4);
}

// A sequence of 5 positions at degree 4: the busiest rank holds 2 of them (tp_sequence_share 2/5), so the work and
// saved bytes between regions cost 2/5 of themselves, not 1/4; one of 3 positions gets no sequence parallelism (a rank
// would hold none) and costs as SP off; 8 positions (or an unknown length) cost 1/4 as before.
TEST(AStageCostAtATensorParallelDegree, PricesAnUnevenSequenceAtItsLargestPartAndNoneShorterThanTheDegree) {
  const Cluster cluster = testing::test_cluster(8);
  const StageLinks links = assumed_links(cluster, Layout::kStageMajor, 4);
  StageRange r = range_with_tp();
  r.tp.sp_forward = {0.0, 0.002};
  r.tp.sp_backward = {0.0, 0.003};
  r.tp.sp_saved_per_sample = 0.2e6;
  const TrainingSpec t = training(8);
  const double u = 8;
  auto at = [&](int64_t sequence) {
    r.tp.sequence = sequence;
    return stage_cost(r, 1, 1, 1, RecomputeScope::kNone, links, t, 0, 4);
  };
  const StageCost even = at(8), unknown = at(0), uneven = at(5), short_one = at(3);
  EXPECT_EQ(even.h, unknown.h);
  ASSERT_TRUE(uneven.sequence_parallel);
  EXPECT_NEAR(uneven.forward_s - even.forward_s, (0.4 - 0.25) * 0.002 * u, 1e-12);
  EXPECT_NEAR(uneven.backward_s - even.backward_s, (0.4 - 0.25) * 0.003 * u, 1e-12);
  EXPECT_NEAR(uneven.memory_per_in_flight - even.memory_per_in_flight, (0.4 - 0.25) * 0.2e6 * u, 1e-6);
  EXPECT_FALSE(short_one.sequence_parallel);
  TrainingSpec off = t;
  off.sequence_parallel = false;
  EXPECT_EQ(short_one.h, stage_cost(r, 1, 1, 1, RecomputeScope::kNone, links, off, 0, 4).h);
}

TEST(AStageCostAtATensorParallelDegree, KeepsTheBoundariesWholeWhereTheGroupSplitsNoWork) {
  const Cluster cluster = testing::test_cluster(8);
  const StageLinks links = assumed_links(cluster, Layout::kStageMajor, 4);
  StageRange r = range_with_tp();
  r.tp = {};  // nothing to split: every device of a group would run the whole range
  r.in_per_sample = 4096;
  r.out_per_sample = 4096;
  TrainingSpec t = training(8);
  t.sequence_parallel = false;
  const StageCost one = stage_cost(r, 1, 1, 1, RecomputeScope::kNone, links, t, 0, 1);
  const StageCost four = stage_cost(r, 1, 1, 1, RecomputeScope::kNone, links, t, 0, 4);
  EXPECT_EQ(four.boundary_parts, 1);
  EXPECT_EQ(four.in_bytes, one.in_bytes);
  EXPECT_EQ(four.forward_s, one.forward_s);  // no slices to gather
  EXPECT_EQ(four.backward_s, one.backward_s);
}

TEST(AStageCostUnderSelectiveRecomputation, RerunsOnlyTheAttentionCoresAndKeepsNoneOfTheirActivations) {
  const Cluster cluster = testing::test_cluster(8);
  const StageLinks links = assumed_links(cluster, Layout::kStageMajor, 2);
  StageRange r = range_with_tp();
  r.tp.core_forward = {0.0, 0.001};
  r.tp.core_saved_per_sample = 0.3e6;
  const TrainingSpec t = training(8);
  const double u = 8;
  for (int tp : {1, 2}) {
    SCOPED_TRACE(tp);
    const StageCost none = stage_cost(r, 1, 1, 1, RecomputeScope::kNone, links, t, 0, tp);
    const StageCost selective = stage_cost(r, 1, 1, 1, RecomputeScope::kSelective, links, t, 0, tp);
    const StageCost full = stage_cost(r, 1, 1, 1, RecomputeScope::kFull, links, t, 0, tp);
    EXPECT_DOUBLE_EQ(selective.recompute_s, 0.001 * u / tp);
    EXPECT_NEAR(selective.backward_s, none.backward_s + 0.001 * u / tp, 1e-15);
    EXPECT_DOUBLE_EQ(selective.forward_s, none.forward_s);
    EXPECT_NEAR(none.memory_per_in_flight - selective.memory_per_in_flight, 0.3e6 * u / tp, 1e-6);
    // One micro-batch's cores are rebuilt at a time; full recomputation keeps only the stage inputs.
    EXPECT_NEAR(selective.memory_static - none.memory_static, 0.3e6 * u / tp, 1e-6);
    EXPECT_LT(selective.recompute_s, full.recompute_s);
    EXPECT_LT(full.memory_per_in_flight, selective.memory_per_in_flight);
    EXPECT_LE(none.h, selective.h);
    EXPECT_LE(selective.h, full.h);
  }
}

TEST(AStageCostAtATensorParallelDegree, IsRefusedForADegreeARegionDoesNotDivideOrOutsideOneTwoFourEight) {
  const Cluster cluster = testing::test_cluster(8);
  const StageLinks links = assumed_links(cluster, Layout::kStageMajor, 1);
  StageRange r = range_with_tp();
  r.tp.refused = 4;  // degree 8
  EXPECT_TRUE(tp_allows(r, 1));
  EXPECT_TRUE(tp_allows(r, 4));
  EXPECT_FALSE(tp_allows(r, 8));
  EXPECT_FALSE(tp_allows(r, 3));
  EXPECT_THROW(stage_cost(r, 1, 1, 1, RecomputeScope::kNone, links, training(8), 0, 8), InvalidArgument);
  EXPECT_THROW(stage_cost(r, 1, 1, 1, RecomputeScope::kNone, links, training(8), 0, 16), InvalidArgument);
  EXPECT_NO_THROW(stage_cost(r, 1, 1, 1, RecomputeScope::kNone, links, training(8), 0, 2));
}

// The evaluator's ranges sum the blocks' TP shares and OR their refusals.
TEST(AStageEvaluator, SumsTheBlocksTensorParallelSharesOverARange) {
  BlockSequence seq;
  for (int b = 0; b < 3; ++b) {
    BlockCost c;
    c.forward = {0, 0.001 * (b + 1)};
    c.backward = {0, 0.002 * (b + 1)};
    c.tp.forward = {0, 0.0005 * (b + 1)};
    c.tp.forward_collectives = b;
    c.tp.refused = b == 2 ? 2 : 0;  // the last block refuses degree 4
    seq.blocks.push_back(c);
  }
  const StageEvaluator ev(seq, testing::test_cluster(8), training(8));
  const StageRange ab = ev.range(0, 2), abc = ev.range(0, 3), c = ev.range(2, 3);
  EXPECT_DOUBLE_EQ(ab.tp.forward.per_sample_s, 0.0015);
  EXPECT_EQ(ab.tp.forward_collectives, 1);
  EXPECT_TRUE(tp_allows(ab, 4));
  EXPECT_FALSE(tp_allows(abc, 4));
  EXPECT_FALSE(tp_allows(c, 4));
  EXPECT_EQ(abc.tp.forward_collectives, 3);
}

}  // namespace
}  // namespace apart
