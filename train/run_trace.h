// `apart run --trace`: each rank's measured actions as timeline events, gathered to rank 0, which writes the
// timeline's Chrome trace (plan/trace.h), the format `apart simulate --trace` writes and `--compare` reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "plan/trace.h"
#include "runtime/communicator.h"
#include "schedule/schedule.h"

namespace apart {

// The event of `action` run by `rank` (in `role`) in step `step` (0-based) from `start_s` to `end_s` after the
// trace's origin; `bytes`: what a send or receive moved. The peer stage is the stage at the other end of the edge.
// In an interleaved plan's view (`positions` P > 0; role.stage is the rank's position) the virtual stage is the
// chunk the action is for and the peer's the chunk at the other end, whose stage is that chunk mod P.
TimelineEvent action_event(const Action& action, const RankRole& role, int rank, int64_t step, double start_s,
                           double end_s, double bytes, int positions = 0);

// Collective over `world`: every rank sends its events to rank 0 (a count, then a flat buffer of doubles), which
// writes `path` through a temporary file and a rename, one process per rank named "stage s replica j (rank r)",
// iteration_s = the last recorded step's span over every rank. Returns the events written (0 on other ranks).
size_t gather_and_write_trace(Communicator& world, const PlanDocument& plan, const std::string& plan_source,
                              const std::vector<TimelineEvent>& mine, const std::string& path);

}  // namespace apart
