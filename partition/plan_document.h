// The search's result as the plan document (plan/plan.h): what plan.json holds, with tasks and values by name.
#pragma once

#include "graph/task_graph.h"
#include "partition/partition.h"
#include "plan/plan.h"

namespace apart {

// `model` describes the model file (codegen/plan_writer.h describe_model). Every figure is copied as the search
// computed it, so plan_to_json(plan_document(...)) is what `apart partition` writes.
PlanDocument plan_document(const Plan& plan, const TaskGraph& graph, const PlanModel& model);
// One region as plan.json records it; `layout`: with the shard layout apart run cuts by (node and value names).
PlanTpRegion plan_tp_region(const TpRegion& region, const TaskGraph& graph, bool layout);

}  // namespace apart
