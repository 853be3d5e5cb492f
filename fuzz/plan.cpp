// Fuzz target: bytes as plan.json through its one reader (plan/plan.h read_plan). What it accepts must survive its
// own writer: read → write → read → write gives the same JSON twice.
#include <cstddef>
#include <cstdint>

#include "fuzz_target.h"
#include "plan/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return apart::fuzz::run_one([&] {
    const apart::PlanDocument plan = apart::read_plan(apart::fuzz::write_scratch("plan.json", data, size));
    const auto written = apart::plan_to_json(plan);
    const auto again = apart::plan_to_json(apart::plan_from_json(nlohmann::json::parse(written.dump()), "rewritten"));
    if (written != again) apart::fuzz::bug("plan.json", "a plan read back from its own writer differs");
  });
}
