// Per-task costs at one micro-batch size: the contract between profiler/ and partition/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace apart {

// Costs of one task for one micro-batch on one device. Times are seconds, sizes bytes.
// Constant tasks (Task::constant) cost nothing per step: zero times, zero saved bytes.
struct TaskCost {
  double flops = 0;           // forward FLOPs (a multiply-add counts 2)
  double bytes_accessed = 0;  // forward bytes read + written
  double forward_s = 0;
  double backward_s = 0;
  int64_t param_bytes = 0;      // bytes of params (initializers) this task reads
  int64_t saved_bytes = 0;      // bytes this task must keep for its backward
  int64_t output_bytes = 0;     // bytes of the values it produces
  int64_t workspace_bytes = 0;  // transient working set while it runs (fwd or bwd)
  // Added by the analytic model (profiler/cost_model.h); measured tables may leave them 0.
  double backward_flops = 0;
  double backward_bytes = 0;  // backward bytes read + written
  bool known = true;          // false: the op's cost came from the opaque fallback
  int64_t launches = 0;       // kernel launches forward + backward (analytic model; not in apart.costs/1)
};

// One row per task, indexed by TaskId (topological order), in the apart.costs/1 schema's terms.
struct CostTable {
  std::string device;          // preset name, e.g. "a100-80gb"
  int64_t microbatch_size = 0;
  std::string source = "analytic";  // "analytic" or "measured"
  std::vector<TaskCost> tasks;
  std::string precision = "fp32";     // "fp32", "tf32" or "mixed"
  std::vector<std::string> warnings;  // e.g. the op types that fell to the opaque fallback
};

}  // namespace apart
