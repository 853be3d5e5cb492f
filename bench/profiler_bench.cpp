// Times estimate_costs on long synthetic MatMul→Relu→Add chains and prints the CPU probe's figures.
#include <chrono>
#include <cstdio>
#include <string>

#include "graph/dtype.h"
#include "profiler/cost_model.h"
#include "profiler/device.h"

namespace {

apart::Value make_value(const std::string& name, std::vector<int64_t> shape, apart::ValueKind kind) {
  apart::Value v;
  v.name = name;
  v.dtype = apart::DType::kFloat32;
  v.shape = shape;
  v.shape_known = true;
  v.kind = kind;
  v.elements = 1;
  for (int64_t d : shape) v.elements *= d;
  v.bytes = v.elements * 4;
  return v;
}

apart::TaskGraph chain(int tasks) {
  using apart::ValueKind;
  apart::TaskGraph g;
  auto x = g.add_value(make_value("x", {8, 1024, 768}, ValueKind::kInput));
  g.mark_graph_input(x);
  const char* ops[] = {"MatMul", "Relu", "Add"};
  for (int i = 0; i < tasks; ++i) {
    apart::Task t;
    t.op_type = ops[i % 3];
    t.name = t.op_type + "_" + std::to_string(i);
    t.inputs.push_back(x);
    if (i % 3 == 0) t.inputs.push_back(g.add_value(make_value("w" + std::to_string(i), {768, 768}, ValueKind::kParam)));
    if (i % 3 == 2) t.inputs.push_back(g.add_value(make_value("b" + std::to_string(i), {768}, ValueKind::kParam)));
    x = g.add_value(make_value("v" + std::to_string(i), {8, 1024, 768}, ValueKind::kActivation));
    t.outputs.push_back(x);
    g.add_task(std::move(t));
  }
  g.finalize();
  g.classify_constants();
  return g;
}

}  // namespace

int main() {
  using Clock = std::chrono::steady_clock;
  const auto probe_start = Clock::now();
  const apart::CpuProbe p = apart::run_cpu_probe();
  std::printf("cpu probe: %.1f GFLOP/s fp32, %.1f GB/s, %d threads, %.2f s\n", p.fp32_flops / 1e9, p.bandwidth / 1e9,
              p.threads, std::chrono::duration<double>(Clock::now() - probe_start).count());
  const apart::Device d = apart::device_preset("a100-80gb");
  for (int n : {10'000, 100'000, 1'000'000}) {
    const apart::TaskGraph g = chain(n);
    const auto start = Clock::now();
    const apart::CostTable t = apart::estimate_costs(g, d);
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("estimate_costs: %7d tasks in %.3f s (%.2f us/task), forward[0] %.3g s\n", n, s, s / n * 1e6,
                t.tasks[0].forward_s);
  }
}
