// A tensor-parallel rank's shard of a stage's forward graph (rules in the header).
#include "codegen/tensor_parallel_shard.h"

// The pass itself is one object, tp_shard::Sharder (tensor_parallel/sharder.h), its rules one file each.
#include <algorithm>

#include "graph/error.h"
#include "plan/plan.h"
#include "tensor_parallel/sharder.h"

namespace apart {

std::vector<std::pair<int64_t, int64_t>> tp_shard_ranges(int64_t length, int64_t pieces, int degree, int rank) {
  if (pieces < 1 || degree < 1 || rank < 0 || rank >= degree || length % (pieces * degree) != 0)
    throw InvalidModel("tensor parallelism: an axis of " + std::to_string(length) + " does not cut into " +
                       std::to_string(pieces) + " piece(s) of " + std::to_string(degree) + " equal parts");
  const int64_t piece = length / pieces, part = piece / degree;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t i = 0; i < pieces; ++i) ranges.emplace_back(i * piece + rank * part, i * piece + (rank + 1) * part);
  return ranges;
}

std::pair<int64_t, int64_t> tp_vocabulary_rows(int64_t rows, int degree, int rank) {
  if (degree < 1 || rank < 0 || rank >= degree || rows < 1)
    throw InvalidModel("tensor parallelism: rank " + std::to_string(rank) + " of " + std::to_string(degree) + " of " +
                       std::to_string(rows) + " vocabulary rows");
  const int64_t each = (rows + degree - 1) / degree;
  if ((degree - 1) * each >= rows)
    throw InvalidModel("tensor parallelism: " + std::to_string(rows) + " vocabulary rows in parts of " +
                       std::to_string(each) + " leave a rank of " + std::to_string(degree) + " none");
  return {rank * each, std::min(rows, (rank + 1) * each)};
}

std::vector<std::pair<int64_t, int64_t>> tp_param_ranges(const TpShardedParam& param, int degree, int rank) {
  const int64_t length = param.shape.at(static_cast<size_t>(param.axis));
  if (param.vocabulary) return {tp_vocabulary_rows(length, degree, rank)};
  return tp_shard_ranges(length, param.pieces, degree, rank);
}

TpShard shard_stage_for_tensor_parallel(const onnx::ModelProto& stage, const std::vector<TpShardRegion>& regions,
                                        int degree, int rank, TpWeights weights, TpSequence sequence) {
  if (degree < 1 || rank < 0 || rank >= degree)
    throw InvalidArgument("tensor parallelism: rank " + std::to_string(rank) + " of degree " + std::to_string(degree));
  tp_shard::Sharder sharder(stage, degree, rank, weights, sequence);
  if (degree > 1) {
    sharder.keep_shared_tables_whole(regions);
    for (size_t i = 0; i < regions.size(); ++i)
      if (sharder.present(regions[i])) sharder.shard(regions[i], i);
  }
  return sharder.finish();
}

std::vector<TpShardRegion> tp_shard_regions(const PlanDocument& plan) {
  std::vector<TpShardRegion> regions;
  if (!plan.tensor_parallel) return regions;
  for (const PlanTpRegion& r : plan.tensor_parallel->regions) {
    TpShardRegion& region = regions.emplace_back();
    region.role = r.kind == TpRegionKind::kEmbedding ? TpRegionRole::kEmbedding
                  : r.kind == TpRegionKind::kLmHead  ? TpRegionRole::kLmHead
                                                     : TpRegionRole::kLinears;
    region.name = r.name;
    region.column_tasks = r.column_tasks;
    region.row_tasks = r.row_tasks;
    region.inputs = r.inputs;
    region.sliced_inputs = r.sliced_inputs;
    for (const PlanTpRegion::SplitValue& v : r.split_values) region.split_values.emplace_back(v.value, v.axis);
    region.end_value = r.end_value;
  }
  return regions;
}

}  // namespace apart
