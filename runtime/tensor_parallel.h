// What apart run reads of a plan's tensor-parallel regions to shard a stage (codegen/tensor_parallel_shard.h).
#pragma once

#include <vector>

#include "codegen/tensor_parallel_shard.h"
#include "plan/plan.h"

namespace apart {

// The regions a tensor-parallel stage splits, as codegen's shard pass reads them: plan.json's attention and MLP
// regions with their shard layout, and its vocabulary regions (the embedding by its Gather's output, the LM head by
// its layout).
std::vector<TpShardRegion> tp_shard_regions(const PlanDocument& plan);

}  // namespace apart
