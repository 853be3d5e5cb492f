// Forward+backward throughput of GPT-3-1.3B-shaped layers on the CUDA backend, as TFLOP/s and as model-FLOPs
// utilisation of the H200's dense bf16 peak, next to cuBLASLt's best plain bf16 GEMM measured in the same run.
// Prints figures, asserts nothing; scripts/gpu_check.sh runs it. Built only with APART_CUDA.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "codegen/autodiff.h"
#include "graph/error.h"
#include "models/zoo.h"
#include "profiler/device.h"
#include "runtime/backend.h"
#include "runtime/cuda/cuda_entry.h"
#include "runtime/executor.h"

namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  int64_t layers = 4, hidden = 2048, heads = 16, seq = 2048, batch = 4;
  // A small vocabulary keeps the LM head from dominating a benchmark of the layers (GPT-3 uses 50257); the
  // head's FLOPs are counted all the same.
  int64_t vocab = 2048;
  int warmup = 2, steps = 5;
  int gemm_repeats = 20;
  apart::Precision precision = apart::Precision::kMixed;
};

BenchOptions parse(int argc, char** argv) {
  BenchOptions o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--layers") o.layers = std::atoll(value);
    else if (flag == "--hidden") o.hidden = std::atoll(value);
    else if (flag == "--heads") o.heads = std::atoll(value);
    else if (flag == "--seq") o.seq = std::atoll(value);
    else if (flag == "--batch") o.batch = std::atoll(value);
    else if (flag == "--vocab") o.vocab = std::atoll(value);
    else if (flag == "--warmup") o.warmup = std::atoi(value);
    else if (flag == "--steps") o.steps = std::atoi(value);
    else if (flag == "--gemm-repeats") o.gemm_repeats = std::atoi(value);
    else if (flag == "--precision") o.precision = apart::parse_precision(value);
    else throw apart::InvalidArgument("unknown flag " + flag +
                                      " (--layers --hidden --heads --seq --batch --vocab --warmup --steps "
                                      "--gemm-repeats --precision)");
  }
  return o;
}

// Model FLOPs of one forward+backward step (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
// Clusters", SC'21, eq. 3 without recomputation): 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))
//   = 6·(12·l·h²)·B·s          the layers' weight GEMMs (forward 2·params·tokens, backward twice that)
//   + 12·B·s²·l·h              attention scores and their product with V (no causal discount)
//   + 6·V·h·B·s                the LM head.
double step_model_flops(const BenchOptions& o) {
  const double B = o.batch, s = o.seq, l = o.layers, h = o.hidden, V = o.vocab;
  return 72.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * l * h));
}

std::map<std::string, apart::Tensor> synthetic_inputs(const apart::TaskGraph& g, int64_t vocab) {
  std::map<std::string, apart::Tensor> inputs;
  std::mt19937 rng(1);
  for (apart::ValueId v : g.graph_inputs()) {
    const apart::Value& value = g.value(v);
    apart::Tensor t(value.dtype, value.shape);
    if (value.dtype == apart::DType::kInt64) {
      std::uniform_int_distribution<int64_t> ids(0, vocab - 1);
      for (auto& x : t.span<int64_t>()) x = ids(rng);
    } else if (value.dtype == apart::DType::kFloat32) {
      std::normal_distribution<float> normal(0, 1);
      for (auto& x : t.span<float>()) x = normal(rng);
    }
    inputs.emplace(value.name, std::move(t));
  }
  return inputs;
}

void gemm_row(apart::Backend& backend, const char* label, int64_t m, int64_t n, int64_t k, int repeats,
              double peak) {
  const auto g = apart::cuda::measure_best_bf16_gemm(backend, m, n, k, repeats);
  std::printf("| %s | %lld x %lld x %lld | %.3f | %.1f | %.1f%% | %d |\n", label, static_cast<long long>(m),
              static_cast<long long>(n), static_cast<long long>(k), 1e3 * g.seconds, g.flops_per_s / 1e12,
              100 * g.flops_per_s / peak, g.algorithms_tried);
  std::fflush(stdout);
}

int run(const BenchOptions& o) {
  if (!apart::cuda_built()) {
    std::printf("gpu_layers_bench: built without CUDA; nothing to measure\n");
    return 0;
  }
  if (apart::cuda_device_count() == 0) {
    std::printf("gpu_layers_bench: no CUDA device visible; nothing to measure\n");
    return 0;
  }
  const apart::Device h200 = apart::device_preset("h200-141gb");
  const double peak = h200.peak_fp16_flops;  // dense bf16 tensor cores
  auto backend = apart::make_backend(apart::BackendKind::kCuda, apart::BackendOptions{0, o.precision});
  std::printf("backend: %s; precision %s; peak (h200-141gb preset, dense bf16) %.1f TFLOP/s\n",
              backend->describe().c_str(), std::string(apart::precision_name(o.precision)).c_str(), peak / 1e12);

  // The yardstick first: a GEMM of 8192³ and the layer's own shapes (tokens × out × in).
  const int64_t tokens = o.batch * o.seq, h = o.hidden;
  std::printf("\n## cuBLASLt best plain bf16 GEMM (TN, fp32 accumulation), this run\n");
  std::printf("| GEMM | m x n x k | ms | TFLOP/s | of peak | algorithms |\n|---|---|---:|---:|---:|---:|\n");
  gemm_row(*backend, "square 8192", 8192, 8192, 8192, o.gemm_repeats, peak);
  gemm_row(*backend, "QKV projection", tokens, 3 * h, h, o.gemm_repeats, peak);
  gemm_row(*backend, "attention output", tokens, h, h, o.gemm_repeats, peak);
  gemm_row(*backend, "MLP up", tokens, 4 * h, h, o.gemm_repeats, peak);
  gemm_row(*backend, "MLP down", tokens, h, 4 * h, o.gemm_repeats, peak);

  apart::models::ZooOptions zoo = apart::models::options_for("gpt");
  zoo.layers = o.layers, zoo.hidden = o.hidden, zoo.heads = o.heads, zoo.seq = o.seq, zoo.vocab = o.vocab;
  zoo.batch = o.batch;
  zoo.weights = apart::models::WeightsMode::kRandom;
  zoo.seed = 1;
  zoo.validate();
  auto t0 = Clock::now();
  const onnx::ModelProto forward = apart::models::build_zoo_model(zoo);
  const apart::TrainingGraph training = apart::build_training_graph(forward);
  apart::ExecutorOptions exec_options;
  exec_options.backend = backend.get();
  exec_options.outputs_on_backend = true;  // gradients stay on the GPU, as the trainer keeps them
  apart::Executor executor(training.model, ".", exec_options);
  const auto inputs = synthetic_inputs(executor.model().graph, o.vocab);
  const double setup_s = std::chrono::duration<double>(Clock::now() - t0).count();

  for (int i = 0; i < o.warmup; ++i) executor.run(inputs);
  backend->synchronize();
  std::vector<double> step_s;
  double loss = 0;
  for (int i = 0; i < o.steps; ++i) {
    const auto t = Clock::now();
    apart::NamedTensors outputs = executor.run(inputs);
    backend->synchronize();
    step_s.push_back(std::chrono::duration<double>(Clock::now() - t).count());
    if (i + 1 == o.steps) loss = backend->to_host(outputs.at(0).second).scalar_as_double();
  }
  std::sort(step_s.begin(), step_s.end());
  const double median_s = step_s[step_s.size() / 2];
  const double flops = step_model_flops(o);
  const double params_in_layers = static_cast<double>(o.layers) * (12.0 * h * h + 13.0 * h);
  std::printf("\n## GPT layers, forward + backward (no optimizer step), CUDA backend\n");
  std::printf("model: %lld layers, hidden %lld, heads %lld, seq %lld, batch %lld, vocab %lld; %.1fM params in the "
              "layers (12h²+13h each); setup %.1f s; loss %.4f\n",
              static_cast<long long>(o.layers), static_cast<long long>(o.hidden), static_cast<long long>(o.heads),
              static_cast<long long>(o.seq), static_cast<long long>(o.batch), static_cast<long long>(o.vocab),
              params_in_layers / 1e6, setup_s, loss);
  std::printf("FLOPs per step: 72·B·s·l·h²·(1 + s/(6h) + V/(12lh)) = %.2f TFLOP (Narayanan et al. 2021, eq. 3)\n",
              flops / 1e12);
  std::printf("| steps | median step ms | min ms | max ms | TFLOP/s | MFU (of %.1f) | tokens/s |\n",
              peak / 1e12);
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  std::printf("| %d | %.2f | %.2f | %.2f | %.1f | %.1f%% | %.0f |\n", o.steps, 1e3 * median_s, 1e3 * step_s.front(),
              1e3 * step_s.back(), flops / median_s / 1e12, 100 * flops / median_s / peak,
              static_cast<double>(tokens) / median_s);
  std::printf("MFU_PERCENT=%.2f\n", 100 * flops / median_s / peak);  // for scripts/gpu_check.sh's summary
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const apart::Error& e) {
    std::fprintf(stderr, "gpu_layers_bench: %s\n", e.what());
    return apart::exit_code(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_layers_bench: %s\n", e.what());
    return 1;
  }
}
