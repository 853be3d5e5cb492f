// Forward time of gpt-tiny and gpt2-small at batch 1 on the CPU runtime, as achieved GFLOP/s
// against a measured cblas_sgemm on this machine.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench/sgemm_peak.h"
#include "importer/importer.h"
#include "models/zoo.h"
#include "profiler/op_work.h"
#include "runtime/executor.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

apart::Tensor random_ids(std::mt19937& rng, std::vector<int64_t> shape, int64_t vocab) {
  apart::Tensor t(apart::DType::kInt64, std::move(shape));
  std::uniform_int_distribution<int64_t> dist(0, vocab - 1);
  for (auto& v : t.span<int64_t>()) v = dist(rng);
  return t;
}

void bench_model(const std::string& label, const fs::path& path, int64_t vocab, int reps, double peak_gflops) {
  apart::ImportOptions options;
  options.batch = 1;  // the importer's batch rule (importer.h kBatchDimNames) picks the dim
  options.batch_explicit = true;
  auto t0 = Clock::now();
  apart::ImportedModel model = apart::import_model(path, options);
  apart::Executor exec(model);
  const double load_s = seconds_since(t0);
  double flops = 0;
  for (size_t t = 0; t < model.graph.num_tasks(); ++t)
    flops += apart::forward_work(model.graph, apart::TaskId(static_cast<uint32_t>(t))).flops;
  std::map<std::string, apart::Tensor> inputs;
  std::mt19937 rng(1);
  for (apart::ValueId v : model.graph.graph_inputs()) {
    const apart::Value& value = model.graph.value(v);
    inputs.emplace(value.name, random_ids(rng, value.shape, vocab));
  }
  exec.run(inputs);  // warm-up
  std::vector<double> times;
  double loss = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t = Clock::now();
    loss = exec.run(inputs).at(0).second.scalar_as_double();
    times.push_back(seconds_since(t));
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  std::printf("%-12s %8.2f ms  %8.3f GFLOP  %7.1f GFLOP/s  %5.1f%% of sgemm  arena %7.1f MB (no reuse %7.1f MB)  params %7.1f MB  load %.2f s  loss %.4f\n",
              label.c_str(), median * 1e3, flops / 1e9, flops / median / 1e9, 100.0 * flops / median / 1e9 / peak_gflops,
              exec.memory_plan().peak_bytes / 1e6, exec.memory_plan().total_bytes / 1e6, exec.param_bytes() / 1e6, load_s, loss);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const double peak = apart::bench::sgemm_gflops(1536, 10);
  std::printf("cblas_sgemm 1536^3 (best of 10): %.1f GFLOP/s (%s)\n", peak, OPENBLAS_VERSION);
  bench_model("gpt-tiny", fs::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx", 512, reps * 4, peak);

  const fs::path gpt2 = fs::temp_directory_path() / "apart_bench" / "gpt2-small.onnx";
  apart::models::ZooOptions zoo = apart::models::options_for("gpt2-small");
  if (!fs::exists(gpt2)) {
    fs::create_directories(gpt2.parent_path());
    zoo.weights = apart::models::WeightsMode::kRandom;
    std::printf("generating %s (apart zoo gpt2-small --weights random)…\n", gpt2.c_str());
    apart::models::write_zoo_model(zoo, gpt2.string());
  }
  bench_model("gpt2-small", gpt2, zoo.vocab, std::max(1, reps / 2), peak);
  return 0;
}
