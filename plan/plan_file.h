// Whether a file is an apart plan: the one answer every folder asks (partition's -o check, the readers' messages),
// without reading the plan itself (plan/plan.h's read_plan does that, with every field checked).
#pragma once

#include <filesystem>

namespace apart {

// The file a plan folder holds its plan in.
inline constexpr const char* kPlanFile = "plan.json";

// Whether `file` is a plan.json apart wrote: a JSON object whose schema is apart.plan/… of any version (so that a plan
// folder of another apart release is still recognised as apart's). False for anything else, unreadable included.
bool is_apart_plan_json(const std::filesystem::path& file);

}  // namespace apart
