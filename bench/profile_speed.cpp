// Training-step speed of the CPU runtime: forward+backward of a model (default: gpt2-small shapes at
// seq 128, batch 1) as samples/s and as a fraction of this machine's measured cblas_sgemm GFLOP/s,
// with the per-op-type split from the measured profile. bench/speed_vs_torch.py runs it beside torch.
//   bench_profile_speed [--model FILE] [--batch N] [--repeats N] [--seq S] [--json]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "bench/sgemm_peak.h"
#include "importer/importer.h"
#include "models/zoo.h"
#include "profiler/cost_model.h"
#include "profiler/device.h"
#include "train/profile.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::string model;
  int64_t batch = 1, seq = 128;
  int repeats = 5;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--model") model = next();
    else if (a == "--batch") batch = std::atoll(next().c_str());
    else if (a == "--seq") seq = std::atoll(next().c_str());
    else if (a == "--repeats") repeats = std::atoi(next().c_str());
    else if (a == "--json") json = true;
    else {
      std::fprintf(stderr, "usage: bench_profile_speed [--model FILE] [--batch N] [--seq S] [--repeats N] [--json]\n");
      return 2;
    }
  }
  try {
    std::string label = model;
    if (model.empty()) {
      auto o = apart::models::options_for("gpt2-small");
      o.seq = seq;
      o.weights = apart::models::WeightsMode::kRandom;
      const fs::path dir = fs::temp_directory_path() / "apart_bench_profile";
      fs::create_directories(dir);
      const fs::path p = dir / ("gpt2_small_seq" + std::to_string(seq) + ".onnx");
      if (!fs::exists(p)) apart::models::write_zoo_model(o, p.string());
      model = p.string();
      label = "gpt2-small seq " + std::to_string(seq);
    }
    apart::ImportOptions import;
    import.batch = batch;  // the importer's batch rule (importer.h kBatchDimNames) picks the dim
    import.batch_explicit = true;
    const apart::ImportedModel m = apart::import_model(model, import);
    apart::ProfileOptions po;
    po.repeats = repeats;
    const apart::ProfileResult r = apart::profile_model(m, import, po);
    double flops = 0;
    for (const auto& c : r.table.tasks) flops += c.flops + c.backward_flops;
    const double sgemm = apart::bench::sgemm_gflops(1024, 5);
    const double achieved = flops / r.step_s / 1e9;
    std::map<std::string, double> by_op;
    for (uint32_t t = 0; t < m.graph.num_tasks(); ++t)
      by_op[m.graph.task(apart::TaskId(t)).op_type] += r.table.tasks[t].forward_s + r.table.tasks[t].backward_s;
    std::vector<std::pair<std::string, double>> rows(by_op.begin(), by_op.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    if (json) {
      std::printf("{\"model\": \"%s\", \"batch\": %lld, \"step_s\": %.6f, \"samples_per_s\": %.4f, \"gflop\": %.3f, "
                  "\"gflops\": %.2f, \"sgemm_gflops\": %.2f, \"by_op_s\": {",
                  label.c_str(), static_cast<long long>(batch), r.step_s, batch / r.step_s, flops / 1e9, achieved, sgemm);
      for (size_t i = 0; i < rows.size(); ++i)
        std::printf("%s\"%s\": %.6f", i ? ", " : "", rows[i].first.c_str(), rows[i].second);
      std::printf("}, \"constant_s\": %.6f, \"unattributed_s\": %.6f}\n", r.constant_s, r.unattributed_s);
    } else {
      std::printf("%s, batch %lld: step (fwd+bwd) %.1f ms, %.2f samples/s, %.1f GFLOP/step, %.1f GFLOP/s = %.0f%% of sgemm %.1f GFLOP/s\n",
                  label.c_str(), static_cast<long long>(batch), 1e3 * r.step_s, batch / r.step_s, flops / 1e9, achieved,
                  100 * achieved / sgemm, sgemm);
      std::printf("%-28s %10s %6s\n", "op", "ms", "share");
      const double total = std::max(1e-30, r.tasks_s);
      for (const auto& [op, s] : rows)
        if (s > 0) std::printf("%-28s %10.2f %5.1f%%\n", op.c_str(), 1e3 * s, 100 * s / total);
      std::printf("%-28s %10.2f %5.1f%%\n", "(constant tasks)", 1e3 * r.constant_s, 100 * r.constant_s / total);
      std::printf("%-28s %10.2f %5.1f%%\n", "(backward not tied to a task)", 1e3 * r.unattributed_s, 100 * r.unattributed_s / total);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_profile_speed: %s\n", e.what());
    return 1;
  }
  return 0;
}
