// --target: the engine's restriction of the search (partition/target.h).
#include "partition/target.h"

#include <algorithm>
#include <set>

#include "graph/error.h"
#include "graph/module_layers.h"
#include "partition/stage_dp.h"

namespace apart {
namespace {

template <typename T>
bool offers(const std::vector<T>& list, T value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

}  // namespace

ComponentLayers component_layers(const TaskGraph& graph, const AtomicGraph& atomic) {
  std::vector<std::string> paths;
  paths.reserve(atomic.size());
  for (const AtomicComponent& c : atomic.components) paths.push_back(module_path(graph.task(c.batch_task)));
  const LayerStack stack = layer_stack(paths);
  if (stack.empty())
    throw Unsupported(
        "--target: the model's node names carry no module path with a list of layers (\"/h.3/attn/"
        "MatMul\", \"/model/layers.12/...\"), which the engines cut pipelines between; plan without "
        "--target, or export the model with torch.onnx.export, which names nodes by module");
  return {stack.position, static_cast<int>(stack.layers.size())};
}

BlockAssignment layer_blocks(const ComponentLayers& layers) {
  BlockAssignment blocks;
  blocks.blocks = static_cast<uint32_t>(layers.layers);
  for (int l : layers.layer_of)
    blocks.block_of.push_back(BlockId(static_cast<uint32_t>(std::clamp(l, 0, layers.layers - 1))));
  return blocks;
}

bool target_admits(const Candidate& candidate, Engine engine, int64_t global_batch, const ComponentLayers* layers) {
  const EngineCapabilities& can = engine_capabilities(engine);
  const StageSolution& s = candidate.solution;
  for (int k = 0; k < s.stages; ++k) {
    if (s.tp_of(k) != s.tp_of(0) || s.replicas[k] != s.replicas[0]) return false;
    if (!offers(can.zero_stages, s.zero_of(k)) || s.recompute_of(k) != s.recompute_of(0)) return false;
  }
  if (!offers(can.tp_degrees, s.tp_of(0)) || !offers(can.recompute, s.recompute_of(0))) return false;
  if (s.stages > 1 && !offers(can.schedules, s.schedule)) return false;
  if (global_batch % (s.microbatches * s.replicas[0]) != 0) return false;
  if (!layers) return true;
  // Every layer in one stage; before the stack in stage 0, after it in the last.
  std::vector<int> stage_of_block(candidate.assignment->blocks, 0);
  for (int k = 0; k < s.stages; ++k)
    for (uint32_t b = s.boundaries[k]; b < s.boundaries[k + 1]; ++b) stage_of_block[b] = k;
  std::vector<int> stage_of_layer(layers->layers, -1);
  for (size_t c = 0; c < layers->layer_of.size(); ++c) {
    const int stage = stage_of_block[candidate.assignment->block_of[c].value()];
    const int l = layers->layer_of[c];
    if (l < 0 ? stage != 0 : l >= layers->layers ? stage != s.stages - 1 : false) return false;
    if (l < 0 || l >= layers->layers) continue;
    if (stage_of_layer[l] >= 0 && stage_of_layer[l] != stage) return false;
    stage_of_layer[l] = stage;
  }
  return true;
}

CandidateSet target_candidates(const TaskGraph& graph, const AtomicGraph& atomic, const PartitionOptions& options,
                               const SearchClock& clock) {
  const Engine engine = *options.stage.target;
  const EngineCapabilities& can = engine_capabilities(engine);
  const ComponentLayers layers = component_layers(graph, atomic);
  const BlockAssignment blocks = layer_blocks(layers);
  // Each choice the engine applies to every stage alike, pinned in turn where the options leave it to the search.
  std::vector<int> tps;
  for (int tp : tp_degrees(options.stage.tp, options.cluster))
    if (offers(can.tp_degrees, tp)) tps.push_back(tp);
  std::vector<Recompute> recomputes;
  if (options.stage.recompute != Recompute::kAuto)
    recomputes.push_back(options.stage.recompute);
  else
    for (RecomputeScope r : can.recompute)
      recomputes.push_back(r == RecomputeScope::kNone   ? Recompute::kOff
                           : r == RecomputeScope::kFull ? Recompute::kOn
                                                        : Recompute::kSelective);
  std::vector<std::optional<int>> zeros;
  if (options.stage.zero)
    zeros.push_back(options.stage.zero);
  else
    for (int z : can.zero_stages) zeros.push_back(z);
  const int64_t batch = options.training.global_batch;
  const int max_stages =
      std::min(layers.layers, options.stage.max_stages > 0 ? options.stage.max_stages : layers.layers);
  CandidateSet found;
  for (int tp : tps) {
    std::vector<int> replica_counts;  // every count dividing the batch that fits the devices beside TP
    for (int r = 1; static_cast<int64_t>(r) * tp <= options.cluster.devices && r <= batch; ++r)
      if (batch % r == 0 && (!options.stage.replicas || *options.stage.replicas == r)) replica_counts.push_back(r);
    for (int replicas : replica_counts)
      for (Recompute recompute : recomputes)
        for (const std::optional<int>& zero : zeros) {
          PartitionOptions pinned = options;
          pinned.stage.tp = tp;
          pinned.stage.replicas = replicas;
          pinned.stage.recompute = recompute;
          pinned.stage.zero = zero;
          pinned.stage.max_stages = std::min(max_stages, options.cluster.devices / (replicas * tp));
          if (pinned.stage.max_stages < 1 || (options.stage.stages && *options.stage.stages > pinned.stage.max_stages))
            continue;
          const SearchGrid grid = search_grid(pinned);
          const Split split =
              make_split(atomic, blocks, pinned, "layers (--target " + std::string(engine_name(engine)) + ")");
          found.add(solve_stage_dp(*split.evaluator, grid, stage_candidates(pinned.stage.max_stages, pinned.stage),
                                   pinned.stage, clock.silent()),
                    split);
        }
  }
  std::erase_if(found.candidates, [&](const Candidate& c) { return !target_admits(c, engine, batch, &layers); });
  return found;
}

}  // namespace apart
