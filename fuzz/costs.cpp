// Fuzz target: bytes as an apart.costs/1 file (what --profile reads) through its reader without a model
// (plan/costs_json.h read_costs_document, what the report uses).
#include <cstddef>
#include <cstdint>

#include "fuzz_target.h"
#include "plan/costs_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return apart::fuzz::run_one(
      [&] { apart::read_costs_document(apart::fuzz::write_scratch("costs.json", data, size)); });
}
