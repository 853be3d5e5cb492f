// Fidelity of the analytic cost model on the CPU: predicted (`cpu` preset, probed) vs measured
// (apart profile) forward+backward time per op type and per whole model, for gpt-tiny, a small
// zoo GPT and a small ResNet. Run with OMP_NUM_THREADS set to the cores used (docs/profiling.md).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "graph/error.h"
#include "importer/importer.h"
#include "models/zoo.h"
#include "profiler/cost_model.h"
#include "profiler/device.h"
#include "train/profile.h"

namespace fs = std::filesystem;

namespace {

struct Case {
  std::string label;
  fs::path model;
  int64_t batch;
};

struct Totals {
  double predicted_f = 0, predicted_b = 0, measured_f = 0, measured_b = 0;
  double calibrated = 0;  // predicted f+b with the peak set to the measured BLAS sgemm rate
};

// What the kernels' BLAS reaches on a large square sgemm (all threads it is allowed).
double blas_sgemm_flops(int n = 1024, int reps = 5) {
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a), c(a.size());
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
  }
  return 2.0 * n * n * n / best;
}

void report(const Case& c, const apart::Device& cpu, const apart::Device& calibrated_cpu, int repeats) {
  apart::ImportOptions import;
  import.batch = c.batch;  // the importer's batch rule (importer.h kBatchDimNames) picks the dim
  import.batch_explicit = true;
  const apart::ImportedModel m = apart::import_model(c.model, import);
  apart::ProfileOptions po;
  po.repeats = repeats;
  const apart::ProfileResult measured = apart::profile_model(m, import, po);
  apart::CostOptions co;
  co.reference_batch = c.batch;
  const apart::CostTable predicted = apart::estimate_costs(m.graph, cpu, co);
  const apart::CostTable calibrated = apart::estimate_costs(m.graph, calibrated_cpu, co);

  std::map<std::string, Totals> by_op;
  Totals all;
  for (uint32_t t = 0; t < m.graph.num_tasks(); ++t) {
    if (m.graph.task(apart::TaskId(t)).constant) continue;
    Totals& o = by_op[m.graph.task(apart::TaskId(t)).op_type];
    const auto& p = predicted.tasks[t];
    const auto& q = measured.table.tasks[t];
    for (Totals* x : {&o, &all}) {
      x->predicted_f += p.forward_s, x->predicted_b += p.backward_s;
      x->measured_f += q.forward_s, x->measured_b += q.backward_s;
      x->calibrated += calibrated.tasks[t].forward_s + calibrated.tasks[t].backward_s;
    }
  }
  std::vector<std::pair<std::string, Totals>> rows(by_op.begin(), by_op.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.second.measured_f + a.second.measured_b > b.second.measured_f + b.second.measured_b;
  });
  std::printf("\n## %s (batch %lld, %zu tasks; step wall %.2f ms, Σ tasks %.2f ms, constant %.2f ms, untied bwd %.2f ms)\n",
              c.label.c_str(), static_cast<long long>(c.batch), static_cast<size_t>(m.graph.num_tasks()), 1e3 * measured.step_s,
              1e3 * measured.tasks_s, 1e3 * measured.constant_s, 1e3 * measured.unattributed_s);
  std::printf("| op | predicted fwd ms | measured fwd ms | predicted bwd ms | measured bwd ms | measured/predicted (f+b) | measured/calibrated (f+b) |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  auto row = [](const std::string& name, const Totals& x) {
    const double p = x.predicted_f + x.predicted_b, q = x.measured_f + x.measured_b;
    std::printf("| %s | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f |\n", name.c_str(), 1e3 * x.predicted_f, 1e3 * x.measured_f,
                1e3 * x.predicted_b, 1e3 * x.measured_b, p > 0 ? q / p : 0.0, x.calibrated > 0 ? q / x.calibrated : 0.0);
  };
  for (const auto& [op, x] : rows) row(op, x);
  row("**whole model**", all);
  std::fflush(stdout);
}

fs::path write_zoo(const fs::path& dir, const std::string& name, apart::models::ZooOptions o) {
  const fs::path p = dir / (name + ".onnx");
  if (!fs::exists(p)) apart::models::write_zoo_model(o, p.string());
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 5;
  const fs::path dir = fs::temp_directory_path() / "apart_bench_profile";
  fs::create_directories(dir);
  try {
    const apart::Device cpu = apart::cpu_device();
    apart::Device calibrated = cpu;
    calibrated.peak_fp32_flops = calibrated.peak_tf32_flops = blas_sgemm_flops();
    std::printf("cpu preset: %.1f GFLOP/s fp32 (probe), %.1f GB/s, overhead %.1f us/kernel; BLAS sgemm %.1f GFLOP/s "
                "(calibrated column); OMP_NUM_THREADS=%s\n",
                cpu.peak_fp32_flops / 1e9, cpu.memory_bandwidth / 1e9, cpu.kernel_overhead_s * 1e6, calibrated.peak_fp32_flops / 1e9,
                std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "(unset)");
    std::vector<Case> cases;
    cases.push_back({"gpt-tiny", fs::path(APART_SOURCE_DIR) / "models" / "gpt-tiny.onnx", 8});
    auto gpt = apart::models::options_for("gpt");
    gpt.layers = 2, gpt.hidden = 256, gpt.heads = 4, gpt.seq = 128, gpt.vocab = 2048;
    cases.push_back({"zoo gpt 2x256 seq128 vocab2048", write_zoo(dir, "gpt_2x256", gpt), 2});
    auto resnet = apart::models::options_for("resnet");
    resnet.layers = 50, resnet.image = 32, resnet.classes = 10;
    cases.push_back({"zoo resnet50 image32 classes10", write_zoo(dir, "resnet50_32", resnet), 2});
    for (const auto& c : cases) report(c, cpu, calibrated, repeats);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_profile_fidelity: %s\n", e.what());
    return 1;
  }
  return 0;
}
