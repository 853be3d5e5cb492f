// A tensor-parallel rank's shard of a stage's forward graph (rules in the header).
#include "codegen/tensor_parallel_shard.h"

// The pass itself is one object, tp_shard::Sharder (tensor_parallel/sharder.h), its rules one file each.
#include <algorithm>
#include <numeric>
#include <optional>

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
  for (const PlanTpRegion& r : plan.tensor_parallel->regions) regions.push_back(tp_shard_region(r));
  return regions;
}

TpShardRegion tp_shard_region(const PlanTpRegion& r) {
  TpShardRegion region;
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
  return region;
}

namespace {

// `model` without its float weights' bytes: each becomes external data of its own length that is never read, so
// the shard pass (shapes only) cuts its dims and a copy per region costs the graph, not the weights. Other
// initializers (integer shape operands the pass reads and rewrites, masks) and small ones keep their data.
onnx::ModelProto without_weight_data(const onnx::ModelProto& model) {
  onnx::ModelProto m = model;
  for (onnx::TensorProto& t : *m.mutable_graph()->mutable_initializer()) {
    const int32_t type = t.data_type();
    const int64_t size = type == onnx::TensorProto::FLOAT                                            ? 4
                         : type == onnx::TensorProto::DOUBLE                                         ? 8
                         : type == onnx::TensorProto::FLOAT16 || type == onnx::TensorProto::BFLOAT16 ? 2
                                                                                                     : 0;
    int64_t elements = 1;
    for (int64_t d : t.dims()) elements *= d;
    if (size == 0 || elements < 64 || t.data_location() == onnx::TensorProto::EXTERNAL) continue;
    t.clear_raw_data();
    t.clear_float_data();
    t.clear_int32_data();
    t.clear_double_data();
    t.set_data_location(onnx::TensorProto::EXTERNAL);
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"location", "apart-tp-check (never read)"},
                                     {"length", std::to_string(elements * size)}}) {
      auto* entry = t.add_external_data();
      entry->set_key(key);
      entry->set_value(value);
    }
  }
  return m;
}

// The regions of `left` the shard pass refuses at base's degree. All are cut at once, as a stage holding them all is;
// a region refused while it is cut is dropped and the rest cut again (one pass per refused region). A refusal while
// the shard is assembled (sequence parallelism, a table read whole) names no region: the regions left are then cut
// one by one (a copy of the graph each).
std::vector<TpRefusal> refused_at(const tp_shard::Sharder& base, const std::vector<TpShardRegion>& regions,
                                  std::vector<size_t> left, int degree) {
  std::vector<TpRefusal> refused;
  while (true) {
    tp_shard::Sharder all = base;
    std::optional<size_t> cutting;
    try {
      std::vector<TpShardRegion> kept;
      for (size_t i : left) kept.push_back(regions[i]);
      all.keep_shared_tables_whole(kept);
      for (size_t i : left) {
        cutting = i;
        if (all.present(regions[i])) all.shard(regions[i], i);
      }
      cutting.reset();
      all.finish();
      return refused;
    } catch (const Unsupported& e) {
      if (cutting) {
        refused.push_back({regions[*cutting].name, degree, e.what()});
        left.erase(std::find(left.begin(), left.end(), *cutting));
        continue;
      }
    }
    for (size_t i : left) {
      tp_shard::Sharder one = base;
      try {
        one.keep_shared_tables_whole(regions);
        if (one.present(regions[i])) one.shard(regions[i], i);
        one.finish();
      } catch (const Unsupported& e) {
        refused.push_back({regions[i].name, degree, e.what()});
      }
    }
    return refused;
  }
}

}  // namespace

std::vector<TpRefusal> tp_refused_regions(const onnx::ModelProto& model, const std::vector<TpShardRegion>& regions,
                                          const std::vector<std::pair<int, TpSequence>>& degrees) {
  std::vector<TpRefusal> refused;
  std::optional<tp_shard::Sharder> read;  // the model read once (its shapes inferred), cut at each degree
  std::vector<size_t> left(regions.size());
  std::iota(left.begin(), left.end(), size_t{0});
  for (const auto& [degree, sequence] : degrees) {
    if (degree < 2 || left.empty()) continue;
    if (!read) read.emplace(without_weight_data(model), degree, 0, TpWeights::kShapesOnly, sequence);
    for (TpRefusal& r : refused_at(read->at(degree, sequence), regions, left, degree)) {
      left.erase(std::find_if(left.begin(), left.end(), [&](size_t i) { return regions[i].name == r.region; }));
      refused.push_back(std::move(r));
    }
  }
  return refused;
}

}  // namespace apart
