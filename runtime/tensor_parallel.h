// What apart run reads of a plan's tensor-parallel regions to shard a stage (codegen/tensor_parallel_shard.h).
#pragma once

#include <vector>

#include "codegen/tensor_parallel_shard.h"
#include "plan/plan.h"

namespace apart {

// The regions a tensor-parallel stage splits, as codegen's shard pass reads them: plan.json's attention and MLP
// regions with their shard layout. Embeddings and LM heads stay replicated (no vocabulary split yet).
std::vector<TpShardRegion> tp_shard_regions(const PlanDocument& plan);

}  // namespace apart
