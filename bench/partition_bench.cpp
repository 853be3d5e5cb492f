// partition_bench: predicted iteration time of apart vs compute lower bound, uniform and params splits, and
// planning time, on zoo models (GPT-2 XL, GPT-3 13B/175B, BERT-large, T5, ResNet-152×8) × 8…1024 devices.
// Usage: partition_bench [model-name …]   (default: all six)
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "driver/compile.h"
#include "graph/error.h"
#include "models/zoo.h"

using namespace apart;
using apart::models::options_for;
using apart::models::write_zoo_model;
using apart::models::WeightsMode;
using apart::models::ZooOptions;

namespace {

struct Case {
  std::string model;
  int64_t batch;
  Precision precision;
};

// What `apart partition <model> --devices N --batch B --precision P --method M --no-baselines` plans.
CompileOptions compile_options(const std::string& path, const Case& c, int devices, Method method) {
  CompileOptions o;
  o.model = path;
  o.cluster.device = "a100-80gb";
  o.cluster.devices = devices;
  o.cluster.devices_per_node = 8;
  o.precision = c.precision;
  o.partition.method = method;
  o.partition.training.global_batch = c.batch;
  o.baselines = false;
  return o;
}

// The cost tables compile() plans on (also when nothing fits), for the compute lower bound.
PlanCosts costs_of(const CompileOptions& o) {
  const Cluster cluster = resolve_cluster(o.cluster);
  return plan_costs(o, resolve_partition_options(o, cluster), import_for_plan(o.model, o.import), cluster);
}

// The plan's simulated iteration time, or -1 when nothing fits.
double plan_time(const CompileOptions& o, double* seconds, std::string* shape) {
  try {
    const CompileResult r = compile(o);
    const Plan& p = r.plan;
    if (seconds) *seconds = p.search.seconds;
    if (shape) {
      int used = 0;
      for (const auto& s : p.stages) used += s.replicas;
      *shape = "S=" + std::to_string(p.stages.size()) + " m=" + std::to_string(p.microbatches) + " dev=" +
               std::to_string(used) + (p.recompute ? " rc" : "");
    }
    return p.simulated.iteration_s;
  } catch (const Infeasible&) {
    return -1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Case> cases = {{"gpt2-xl", 512, Precision::kMixed},    {"gpt3-13b", 1024, Precision::kMixed},
                             {"gpt3-175b", 1536, Precision::kMixed}, {"bert-large", 1024, Precision::kMixed},
                             {"t5-3b", 1024, Precision::kMixed},     {"resnet152x8", 1024, Precision::kMixed}};
  if (argc > 1) {
    std::vector<Case> picked;
    for (int i = 1; i < argc; ++i)
      for (const auto& c : cases)
        if (c.model == argv[i]) picked.push_back(c);
    cases = picked;
  }
  const auto dir = std::filesystem::temp_directory_path() / "apart_partition_bench";
  std::filesystem::create_directories(dir);
  std::printf("%-12s %5s %6s | %10s %10s %10s %10s | %6s %6s %6s | %7s  %s\n", "model", "dev", "batch", "apart s",
              "bound s", "uniform s", "params s", "/bound", "/unif", "/param", "plan s", "apart plan");
  for (const Case& c : cases) {
    ZooOptions zo = options_for(c.model);
    zo.weights = WeightsMode::kNone;
    const std::string path = (dir / (c.model + ".onnx")).string();
    write_zoo_model(zo, path);
    for (int devices : {8, 64, 512, 1024}) {
      double seconds = 0;
      std::string shape;
      const CompileOptions at_apart = compile_options(path, c, devices, Method::kApart);
      const double apart = plan_time(at_apart, &seconds, &shape);
      const double uniform = plan_time(compile_options(path, c, devices, Method::kUniform), nullptr, nullptr);
      const double params = plan_time(compile_options(path, c, devices, Method::kParams), nullptr, nullptr);
      // Compute lower bound: Σ per-sample forward+backward × B / devices (the plan reports it too).
      const PlanCosts costs = costs_of(at_apart);
      const CostTable& c1 = costs.table;
      const CostTable& c2 = *costs.at_other_size;
      double per_sample = 0;
      for (size_t t = 0; t < c1.tasks.size(); ++t)
        per_sample += (c2.tasks[t].forward_s + c2.tasks[t].backward_s - c1.tasks[t].forward_s - c1.tasks[t].backward_s) /
                      static_cast<double>(c2.microbatch_size - c1.microbatch_size);
      const double bound = per_sample * static_cast<double>(c.batch) / devices;
      auto ratio = [](double a, double b) { return a > 0 && b > 0 ? a / b : 0.0; };
      std::printf("%-12s %5d %6lld | %10.3f %10.3f %10.3f %10.3f | %6.2f %6.2f %6.2f | %7.2f  %s\n", c.model.c_str(),
                  devices, static_cast<long long>(c.batch), apart, bound, uniform, params, ratio(apart, bound),
                  ratio(apart, uniform), ratio(apart, params), seconds, apart < 0 ? "infeasible" : shape.c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}
