// Small plans built in code for the simulator tests.
#pragma once

#include <limits>

#include "simulator/sim_plan.h"

namespace apart::sim::testing {

// A chain of `stages` equal stages, one device each, `bytes` per boundary and micro-batch.
inline SimPlan chain_plan(int stages, int64_t microbatches, double forward_s, double backward_s, double bytes = 0,
                          Schedule schedule = Schedule::k1F1B) {
  SimPlan p;
  p.source = "test plan";
  p.cluster.devices = stages;
  p.cluster.devices_per_node = stages;
  p.cluster.intra_node = {1e9, 0.0};
  p.cluster.inter_node = {1e8, 0.0};
  p.links_source = "test";
  p.training.microbatches = microbatches;
  p.training.schedule = schedule;
  for (int s = 0; s < stages; ++s) {
    SimStage st;
    st.id = s;
    st.devices = {s};
    st.forward_s = forward_s;
    st.backward_s = backward_s;
    st.memory_static_bytes = 1000.0;
    st.activation_bytes_per_microbatch = 100.0;
    st.memory_bytes = 1000;
    st.inputs.push_back({"x" + std::to_string(s), s - 1, s == 0 ? 64.0 : bytes});
    if (s + 1 < stages) st.outputs.push_back({"x" + std::to_string(s + 1), {s + 1}, bytes});
    p.stages.push_back(st);
  }
  return p;
}

}  // namespace apart::sim::testing
