// partition_bench: predicted iteration time of apart vs compute lower bound, uniform and params splits, and
// planning time, on zoo models (GPT-2 XL, GPT-3 13B/175B, BERT-large, T5, ResNet-152×8) × 8…1024 devices.
// Usage: partition_bench [model-name …]   (default: all six)
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "graph/error.h"
#include "importer/importer.h"
#include "models/zoo.h"
#include "partition/partition.h"
#include "profiler/cost_model.h"
#include "profiler/device.h"

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

double plan_time(const TaskGraph& g, const CostTable& c1, const CostTable& c2, PartitionOptions o, Method m,
                 double* seconds, std::string* shape) {
  o.method = m;
  try {
    const auto start = std::chrono::steady_clock::now();
    const Plan p = partition_graph(g, c1, o, &c2);
    if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (shape) {
      int used = 0;
      for (const auto& s : p.stages) used += s.replicas;
      *shape = "S=" + std::to_string(p.stages.size()) + " m=" + std::to_string(p.microbatches) + " dev=" +
               std::to_string(used) + (p.recompute ? " rc" : "");
    }
    if (m == Method::kApart && seconds) *seconds = p.search.seconds;
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
  const Device device = device_preset("a100-80gb");
  std::printf("%-12s %5s %6s | %10s %10s %10s %10s | %6s %6s %6s | %7s  %s\n", "model", "dev", "batch", "apart s",
              "bound s", "uniform s", "params s", "/bound", "/unif", "/param", "plan s", "apart plan");
  for (const Case& c : cases) {
    ZooOptions zo = options_for(c.model);
    zo.weights = WeightsMode::kNone;
    const std::string path = (dir / (c.model + ".onnx")).string();
    write_zoo_model(zo, path);
    ImportOptions io;
    io.dims["batch"] = 1;
    const ImportedModel model = import_model(path, io);
    for (int devices : {8, 64, 512, 1024}) {
      PartitionOptions o;
      o.cluster.device = device.name;
      o.cluster.devices = devices;
      o.cluster.devices_per_node = 8;
      o.cluster.memory_bytes = device.memory_bytes;
      const Cluster cl = make_cluster(device, devices, 8);
      o.cluster.intra_node_bandwidth = cl.intra_node.bandwidth;
      o.cluster.inter_node_bandwidth = cl.inter_node.bandwidth;
      o.cluster.intra_node_latency_s = cl.intra_node.latency_s;
      o.cluster.inter_node_latency_s = cl.inter_node.latency_s;
      o.training.global_batch = c.batch;
      o.training.precision = c.precision;
      o.atomic.graph_batch = 1;
      CostOptions co;
      co.precision = c.precision == Precision::kMixed ? profiler::Precision::kMixed : profiler::Precision::kFp32;
      co.reference_batch = 1;
      co.microbatch_size = std::max<int64_t>(1, c.batch / devices);
      const CostTable c1 = estimate_costs(model.graph, device, co);
      co.microbatch_size *= 4;
      const CostTable c2 = estimate_costs(model.graph, device, co);
      double seconds = 0;
      std::string shape;
      const double apart = plan_time(model.graph, c1, c2, o, Method::kApart, &seconds, &shape);
      const double uniform = plan_time(model.graph, c1, c2, o, Method::kUniform, nullptr, nullptr);
      const double params = plan_time(model.graph, c1, c2, o, Method::kParams, nullptr, nullptr);
      // Compute lower bound: Σ per-sample forward+backward × B / devices (the plan reports it too).
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
